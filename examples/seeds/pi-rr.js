#!/usr/bin/env node
// The first post's own balancer: node-http-proxy handing requests to a fixed list of
// pi servers in turn (round-robin), the backends written into the code.
//
//   PORT=8000 node examples/seeds/pi-rr.js 127.0.0.1:3001 127.0.0.1:3002 127.0.0.1:3003
//
// Needs `npm ci --prefix examples/seeds/tools` (http-proxy).
'use strict';

const http = require('node:http');
const httpProxy = require('./tools/node_modules/http-proxy');

const backends = process.argv.slice(2).map((a) => `http://${a}`);
if (!backends.length) {
  console.error('usage: pi-rr.js HOST:PORT...');
  process.exit(2);
}
const proxy = httpProxy.createProxyServer({ agent: new http.Agent({ keepAlive: true }) });
proxy.on('error', (err, req, res) => {
  res.writeHead(502, { 'content-type': 'text/plain' });
  res.end(`bad gateway: ${err.message}\n`);
});

let next = 0;
const port = Number(process.env.PORT || 8000);
const server = http.createServer((req, res) => {
  const target = backends[next];
  next = (next + 1) % backends.length;
  proxy.web(req, res, { target });
});
server.listen(port, '127.0.0.1', () => console.log(`pi-rr: 127.0.0.1:${port} -> ${backends.join(' ')}`));
process.on('SIGTERM', () => process.exit(0));
process.on('SIGINT', () => process.exit(0));
