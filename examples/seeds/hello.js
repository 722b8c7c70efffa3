// The second post's app: hello world, one Node process.
//
//   PORT=3000 node examples/seeds/hello.js
//
// Adds `x-worker` (DROVER_WORKER_ID, else the pid) so a client can count who answered.
'use strict';

const http = require('node:http');

const worker = process.env.DROVER_WORKER_ID ?? String(process.pid);
const port = Number(process.env.PORT || 3000);
const server = http.createServer((req, res) => {
  res.writeHead(200, { 'content-type': 'text/plain', 'x-worker': worker });
  res.end('Hello World\n');
});
server.listen(port, '127.0.0.1', () => console.log(`hello listening on 127.0.0.1:${port} (pid ${process.pid})`));

function stop() {
  server.close(() => process.exit(0));
  server.closeIdleConnections();
  setTimeout(() => process.exit(0), 5000).unref();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
