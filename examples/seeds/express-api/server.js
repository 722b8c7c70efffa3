// The third post's app: an Express JSON API with one route.
//
//   PORT=3000 node examples/seeds/express-api/server.js
//   curl localhost:3000/      # {"message":"Welcome to the API"}
//
// Reads PORT (drover run gives each worker its own). On SIGTERM or SIGINT it stops
// accepting, finishes what it holds and exits 0, as drover expects.
'use strict';

const express = require('express');

const app = express();
app.get('/', (req, res) => res.json({ message: 'Welcome to the API' }));

const port = Number(process.env.PORT || 3000);
const server = app.listen(port, '127.0.0.1', () => console.log(`express-api listening on 127.0.0.1:${port}`));

function stop() {
  server.close(() => process.exit(0));
  server.closeIdleConnections();
  setTimeout(() => process.exit(0), 5000).unref();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
