#!/usr/bin/env node
// A demo backend for drover, no dependencies: estimates pi by Monte-Carlo sampling, so
// each request costs CPU in proportion to `iterations`. That makes it a good subject for
// load-aware balancing: /mixed sends a realistic mix of cheap and expensive requests.
//
//   GET /                      same as /pi
//   GET /pi?iterations=N       estimate pi from N random points (default 100000)
//   GET /mixed[?n=K]           90% cheap (1e4 points), 10% expensive (5e5 points);
//                              with n, request K is expensive when K % 10 === 0, so a
//                              load generator can make the mix deterministic
//   GET /health                200 "ok"
//
// Reads PORT (default 3000), or serves the listening socket drover passes as fd 3 when
// LISTEN_FDS is set (systemd's convention; LISTEN_PID, when set, must be this pid).
// Reports DROVER_WORKER_ID and its pid in every answer, and DROVER_WORKER_ID (or the
// pid) in an `x-worker` header on every response, errors included.
// On SIGTERM or SIGINT it stops accepting connections, finishes requests in flight and
// exits 0, which is what drover's supervisor expects before its SIGKILL deadline.
// pi-server.py and go/pi-server answer the same way, byte for byte on errors.
'use strict';

const http = require('node:http');

const PORT = Number(process.env.PORT || 3000);
const WORKER = process.env.DROVER_WORKER_ID ?? null;
const WORKER_HEADER = WORKER ?? String(process.pid);
const DEFAULT_ITERATIONS = 100000;
const CHEAP = 1e4;
const EXPENSIVE = 5e5;
// Bounds the CPU one request may ask for, so a typo cannot wedge a worker for minutes.
const MAX_ITERATIONS = 1e8;

function estimatePi(iterations) {
  let inside = 0;
  for (let i = 0; i < iterations; i++) {
    const x = Math.random();
    const y = Math.random();
    if (x * x + y * y <= 1) inside++;
  }
  return (4 * inside) / iterations;
}

function send(res, status, body, type = 'application/json') {
  const text = typeof body === 'string' ? body : JSON.stringify(body) + '\n';
  res.writeHead(status, {
    'content-type': type,
    'content-length': Buffer.byteLength(text),
    'x-worker': WORKER_HEADER,
    // While draining, tell keep-alive clients (drover) not to reuse this connection.
    ...(closing ? { connection: 'close' } : {}),
  });
  res.end(text);
}

function piAnswer(res, iterations, extra = {}) {
  const started = process.hrtime.bigint();
  const pi = estimatePi(iterations);
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  send(res, 200, { pi, iterations, worker: WORKER, pid: process.pid, ms, ...extra });
}

function handle(req, res) {
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    return send(res, 405, 'method not allowed\n', 'text/plain');
  }
  // Split by hand rather than with `new URL`, which would normalise dot segments and
  // re-encode characters: the Python and Go servers see the path exactly as sent.
  const at = req.url.indexOf('?');
  const path = at < 0 ? req.url : req.url.slice(0, at);
  const query = new URLSearchParams(at < 0 ? '' : req.url.slice(at + 1));
  switch (path) {
    case '/health':
      return send(res, 200, 'ok', 'text/plain');
    case '/':
    case '/pi': {
      const raw = query.get('iterations');
      // Digits only: Number() would also take '1e3', ' 7 ' or '0x10', which the other
      // languages' parsers read differently.
      const iterations = raw === null ? DEFAULT_ITERATIONS : /^[0-9]+$/.test(raw) ? Number(raw) : NaN;
      if (!(iterations >= 1 && iterations <= MAX_ITERATIONS)) {
        return send(res, 400, `iterations must be an integer in 1..${MAX_ITERATIONS}\n`, 'text/plain');
      }
      return piAnswer(res, iterations);
    }
    case '/mixed': {
      const n = query.get('n');
      if (n !== null && !/^-?[0-9]+$/.test(n)) {
        return send(res, 400, 'n must be an integer\n', 'text/plain');
      }
      // The last digit decides, so a K too long for a double still counts exactly.
      const expensive = n === null ? Math.random() < 0.1 : n.endsWith('0');
      return piAnswer(res, expensive ? EXPENSIVE : CHEAP, { kind: expensive ? 'expensive' : 'cheap' });
    }
    default:
      return send(res, 404, 'not found\n', 'text/plain');
  }
}

// The socket drover passed as fd 3, if it was meant for this process: a LISTEN_PID of
// another process means the variables leaked through a wrapper (npx, a shell script),
// and that process, not this one, owns the socket.
function inheritedFd() {
  const fds = process.env.LISTEN_FDS;
  if (fds === undefined || !/^[0-9]+$/.test(fds) || Number(fds) < 1) return null;
  const pid = process.env.LISTEN_PID;
  if (pid !== undefined && pid !== String(process.pid)) return null;
  return 3;
}

let closing = false;

// Run as a program it serves; required (as examples/pi-server-sdk.js does), it only
// lends its routes.
module.exports = { handle };
if (require.main === module) {
  const server = http.createServer((req, res) => {
    res.on('finish', () => {
      // A keep-alive connection that just finished its last request is now idle.
      if (closing) server.closeIdleConnections();
    });
    handle(req, res);
  });

  function shutdown(signal) {
    if (closing) return;
    closing = true;
    console.log(`pi-server ${WORKER ?? ''} (pid ${process.pid}): ${signal}, draining`);
    // close() stops accepting and calls back once every connection has ended; idle
    // keep-alive connections are closed now, busy ones after their response.
    server.close(() => process.exit(0));
    server.closeIdleConnections();
  }
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));

  const fd = inheritedFd();
  const ready = () => {
    const { address, port } = server.address();
    const host = address.includes(':') ? `[${address}]` : address;
    const how = fd === null ? '' : ' (fd 3 from LISTEN_FDS)';
    console.log(`pi-server worker ${WORKER ?? '-'} (pid ${process.pid}) listening on ${host}:${port}${how}`);
  };
  if (fd === null) server.listen(PORT, '127.0.0.1', ready);
  else server.listen({ fd }, ready);
}
