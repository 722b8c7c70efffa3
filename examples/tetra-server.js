#!/usr/bin/env node
// A demo backend for drover, no dependencies: tetration, the power tower
//
//   x↑↑n = x^(x^(...^x))   (n copies of x, evaluated from the top down; x↑↑0 = 1)
//
// computed in 64-bit floats with n calls to pow. There is no shortcut when the tower
// converges (for e^-e ≤ x ≤ e^(1/e) it does), so the height n is also the cost knob:
// a request costs CPU in proportion to n.
//
//   GET /tetra/:x[?n=N]        x↑↑N (default N = 4): {x, n, value, worker, pid, ms}
//                              x: a positive finite decimal number (1.5, 2e-3);
//                              N: an integer in 0..10000000; anything else is a 400
//                              naming the parameter, and a tower beyond the largest
//                              double (2↑↑5 = 2^65536) is a 422
//   GET /mixed[?n=K]           90% cheap (1.2↑↑1e4), 10% expensive (1.2↑↑5e5, ~50×);
//                              with n, request K is expensive when K % 10 === 0; adds
//                              "kind"
//   GET /health                200 "ok"
//
// Reads PORT (default 3000), or serves the listening socket drover passes as fd 3 when
// LISTEN_FDS is set (systemd's convention; LISTEN_PID, when set, must be this pid).
// Reports DROVER_WORKER_ID and its pid in every answer, and DROVER_WORKER_ID (or the
// pid) in an `x-worker` header on every response, errors included.
// On SIGTERM or SIGINT it stops accepting connections, finishes requests in flight and
// exits 0. tetra-server.py and go/tetra-server answer the same way: equal values to
// within an ulp or so of pow, and byte-equal error messages.
'use strict';

const http = require('node:http');

const PORT = Number(process.env.PORT || 3000);
const WORKER = process.env.DROVER_WORKER_ID ?? null;
const WORKER_HEADER = WORKER ?? String(process.pid);
const DEFAULT_HEIGHT = 4;
// Bounds the CPU one request may ask for (about a second in CPython).
const MAX_HEIGHT = 10000000;
// 1.2 lies in the convergent range, so even the expensive tower stays finite.
const MIXED_X = 1.2;
const CHEAP = 1e4;
const EXPENSIVE = 5e5;
// ASCII digits only, the same grammar in all three languages: each one's own number
// parser accepts different extras (hex, '_', 'Infinity', surrounding blanks).
const DECIMAL = /^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$/;

function tower(x, n) {
  let t = 1;
  for (let i = 0; i < n; i++) {
    t = Math.pow(x, t);
    if (t === Infinity) break;
  }
  return t;
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

// `label` is x as the client wrote it, so error text is the same in every language.
function tetraAnswer(res, x, label, n, extra = {}) {
  const started = process.hrtime.bigint();
  const value = tower(x, n);
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  if (value === Infinity) {
    return send(res, 422, `${label}^^${n} overflows a 64-bit float (it exceeds 1.8e308)\n`, 'text/plain');
  }
  send(res, 200, { x, n, value, worker: WORKER, pid: process.pid, ms, ...extra });
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
  if (path === '/health') return send(res, 200, 'ok', 'text/plain');
  if (path === '/mixed') {
    const n = query.get('n');
    if (n !== null && !/^-?[0-9]+$/.test(n)) {
      return send(res, 400, 'n must be an integer\n', 'text/plain');
    }
    // The last digit decides, so a K too long for a double still counts exactly.
    const expensive = n === null ? Math.random() < 0.1 : n.endsWith('0');
    const height = expensive ? EXPENSIVE : CHEAP;
    return tetraAnswer(res, MIXED_X, String(MIXED_X), height, { kind: expensive ? 'expensive' : 'cheap' });
  }
  if (path.startsWith('/tetra/') && !path.slice(7).includes('/')) {
    const rawX = path.slice(7);
    const x = DECIMAL.test(rawX) ? Number(rawX) : NaN;
    if (!(x > 0 && x < Infinity)) {
      return send(res, 400, `x must be a positive finite decimal number, got "${rawX}"\n`, 'text/plain');
    }
    const rawN = query.get('n');
    const n = rawN === null ? DEFAULT_HEIGHT : /^[0-9]+$/.test(rawN) ? Number(rawN) : NaN;
    if (!(n <= MAX_HEIGHT)) {
      return send(res, 400, `n must be an integer in 0..${MAX_HEIGHT}, got "${rawN}"\n`, 'text/plain');
    }
    return tetraAnswer(res, x, rawX, n);
  }
  return send(res, 404, 'not found\n', 'text/plain');
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
  console.log(`tetra-server ${WORKER ?? ''} (pid ${process.pid}): ${signal}, draining`);
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
  console.log(`tetra-server worker ${WORKER ?? '-'} (pid ${process.pid}) listening on ${host}:${port}${how}`);
};
if (fd === null) server.listen(PORT, '127.0.0.1', ready);
else server.listen({ fd }, ready);
