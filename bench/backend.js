#!/usr/bin/env node
// Benchmark backend: `node bench/backend.js PORT`
//
//   /           "ok", no work (tiny response)
//   /cheap      "cheap", burns CHEAP_US microseconds of CPU (default 20)
//   /expensive  "expensive", burns EXPENSIVE_MS milliseconds of CPU (default 10)
//
// Single-threaded and synchronous on purpose, like a typical Node app: while /expensive
// burns the CPU, every other request on this process waits. Keep-alive on.
'use strict';
const http = require('http');

// A port in argv, else PORT (under Node's cluster module, argv[2] is the app's own path).
const argPort = Number(process.argv[2]);
const port = Number.isInteger(argPort) && argPort > 0 ? argPort : Number(process.env.PORT || 0);
const cheapNs = BigInt(Math.round(Number(process.env.CHEAP_US ?? 20) * 1e3));
const expensiveNs = BigInt(Math.round(Number(process.env.EXPENSIVE_MS ?? 10) * 1e6));
const id = process.env.BACKEND_ID || String(port);

// Burns ns of this process's CPU time, not of wall time: fixed work, as a real handler
// does, takes longer when the process waits for a core (see bench/matrix/backend.js).
function cpuNs() {
  const used = process.cpuUsage();
  return BigInt(used.user + used.system) * 1000n;
}
function burn(ns) {
  if (ns <= 0n) return;
  const end = cpuNs() + ns;
  while (cpuNs() < end) { /* busy */ }
}

const OK = Buffer.from('ok');
const CHEAP = Buffer.from('cheap');
const EXPENSIVE = Buffer.from('expensive');
const NOT_FOUND = Buffer.from('not found');
let served = 0;

function send(res, status, body) {
  res.writeHead(status, {
    'content-type': 'text/plain',
    'content-length': body.length,
    'x-backend': id,
  });
  res.end(body);
}

const server = http.createServer((req, res) => {
  served++;
  const q = req.url.indexOf('?');
  const path = q < 0 ? req.url : req.url.slice(0, q);
  switch (path) {
    case '/': send(res, 200, OK); break;
    case '/cheap': burn(cheapNs); send(res, 200, CHEAP); break;
    case '/expensive': burn(expensiveNs); send(res, 200, EXPENSIVE); break;
    case '/stats': send(res, 200, Buffer.from(JSON.stringify({ id, served }))); break;
    default: send(res, 404, NOT_FOUND);
  }
});
// Outlive every proxy's idle timeout so upstream keep-alive connections are reused.
server.keepAliveTimeout = 300e3;
server.headersTimeout = 301e3;
server.requestTimeout = 0;
server.listen(port, '127.0.0.1', () => {
  const a = server.address();
  console.error(`backend ${id} listening on ${a.address}:${a.port} (cheap ${Number(cheapNs) / 1e3}µs, expensive ${Number(expensiveNs) / 1e6}ms)`);
});
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
