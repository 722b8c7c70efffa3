#!/usr/bin/env node
// The fifth post's tetration app on Express (see ../README.md):
//
//   GET /          "OK, no problema!"
//   GET /tetra/:x  x**x as a decimal integer (BigInt, so exact); x: 1 to 4 ASCII
//                  digits, at most 1000, else 400 "x must be an integer in 0..1000"
//   GET /health    200 "ok"
//
// Reads PORT (default 3000) and binds 127.0.0.1:PORT, or serves the socket drover's
// shared mode passes as fd 3 (LISTEN_FDS; LISTEN_PID, when set, must be this pid).
// Every response carries `x-worker`: DROVER_WORKER_ID, or the pid without it.
// On SIGTERM or SIGINT it stops accepting, finishes requests in flight and exits 0.
'use strict';

const express = require('express');

const PORT = Number(process.env.PORT || 3000);
const WORKER = process.env.DROVER_WORKER_ID ?? String(process.pid);
// 1000**1000 has 3001 digits: bounded work and a bounded answer per request.
const MAX_X = 1000;

const app = express();
app.disable('x-powered-by');
// Before every route, so 404s carry it too.
app.use((req, res, next) => {
  res.set('x-worker', WORKER);
  next();
});

app.get('/', (req, res) => res.type('text').send('OK, no problema!'));
app.get('/health', (req, res) => res.type('text').send('ok'));
app.get('/tetra/:x', (req, res) => {
  const raw = req.params.x;
  // The same grammar in all five apps: Number() or BigInt() alone would take '0x10',
  // ' 7' or '1e3'.
  if (!/^[0-9]{1,4}$/.test(raw) || Number(raw) > MAX_X) {
    return res.status(400).type('text').send(`x must be an integer in 0..${MAX_X}`);
  }
  const x = BigInt(raw);
  res.type('text').send(String(x ** x));
});

// The socket drover passed as fd 3, if it was meant for this process: a LISTEN_PID of
// another process means the variables leaked through a wrapper (npx, a shell script).
function inheritedFd() {
  const fds = process.env.LISTEN_FDS;
  if (fds === undefined || !/^[0-9]+$/.test(fds) || Number(fds) < 1) return null;
  const pid = process.env.LISTEN_PID;
  if (pid !== undefined && pid !== String(process.pid)) return null;
  return 3;
}

const fd = inheritedFd();
const ready = () => {
  const { address, port } = server.address();
  const how = fd === null ? '' : ' (fd 3 from LISTEN_FDS)';
  console.log(`tetra (express) worker ${WORKER} (pid ${process.pid}) listening on ${address}:${port}${how}`);
};
// app.listen hands its arguments to http.Server#listen, which takes { fd }.
const server = fd === null ? app.listen(PORT, '127.0.0.1', ready) : app.listen({ fd }, ready);

function shutdown() {
  // close() stops accepting and calls back once every connection has ended; idle
  // keep-alive connections (drover's pool) would otherwise hold it open.
  server.close(() => process.exit(0));
  server.closeIdleConnections();
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
