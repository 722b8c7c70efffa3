#!/usr/bin/env node
// The hello server of bench/shared.sh: "Hello World", keep-alive, and nothing else on
// the request path. Serves the socket drover passes as fd 3 (LISTEN_FDS, shared mode)
// or PORT (Node's cluster module shares that one through its primary).
//
// With COUNT_DIR set, every 200 ms it writes how many requests it has answered and how
// many connections it has accepted to COUNT_DIR/<pid> ("REQUESTS CONNECTIONS"): the
// bench counts at the workers without touching the request path (a wrk script that
// reads each response would slow the load generator).
'use strict';
const http = require('node:http');
const fs = require('node:fs');
const path = require('node:path');

let served = 0;
let accepted = 0;
const server = http.createServer((req, res) => {
  served++;
  res.writeHead(200, { 'content-type': 'text/plain' });
  res.end('Hello World\n');
});
const dir = process.env.COUNT_DIR;
server.on('connection', () => accepted++);
if (dir) {
  let written = '';
  setInterval(() => {
    const now = `${served} ${accepted}`;
    if (now !== written) {
      written = now;
      fs.writeFileSync(path.join(dir, String(process.pid)), now);
    }
  }, 200).unref();
}
const fds = process.env.LISTEN_FDS;
const inherited = /^[1-9][0-9]*$/.test(fds ?? '')
  && (process.env.LISTEN_PID ?? String(process.pid)) === String(process.pid);
if (inherited) server.listen({ fd: 3 });
else server.listen(Number(process.env.PORT || 3000), '127.0.0.1');
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
