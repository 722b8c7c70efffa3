// The fourth post's app: every request runs a loop of 1e7 iterations before answering,
// so one Node process serves requests one at a time, each a few milliseconds of CPU.
//
//   PORT=3000 node examples/seeds/loop-server.js
'use strict';

const http = require('node:http');

const worker = process.env.DROVER_WORKER_ID ?? String(process.pid);
const port = Number(process.env.PORT || 3000);
const server = http.createServer((req, res) => {
  let sum = 0;
  for (let i = 0; i < 1e7; i++) sum += i; // summed, so the loop cannot be optimised away
  res.writeHead(200, { 'content-type': 'text/plain', 'x-worker': worker });
  res.end(`done ${sum}\n`);
});
server.listen(port, '127.0.0.1', () => console.log(`loop-server listening on 127.0.0.1:${port} (pid ${process.pid})`));

function stop() {
  server.close(() => process.exit(0));
  server.closeIdleConnections();
  setTimeout(() => process.exit(0), 5000).unref();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
