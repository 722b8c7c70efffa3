#!/usr/bin/env node
// pi-server.js with the drover SDK (sdk/node): instead of being started by drover, it
// joins a running drover's balancer by itself, heartbeats its event-loop load, reports
// that load on every response, and drains itself on SIGTERM/SIGINT.
//
//   drover proxy --listen 127.0.0.1:8080 --admin 127.0.0.1:9900      # no backends yet
//   DROVER_ADMIN=127.0.0.1:9900 PORT=0 node examples/pi-server-sdk.js # run a few of these
//
//   GET /                      same as /pi
//   GET /pi?iterations=N       estimate pi from N random points (default 100000)
//   GET /mixed[?n=K]           90% cheap (1e4 points), 10% expensive (5e5 points);
//                              with n, request K is expensive when K % 10 === 0
//   GET /health                200 "ok"
//
// Environment: PORT (default 3000; 0 picks a free port), DROVER_ADMIN (the admin API;
// unset: serve without registering), DROVER_BALANCER (default "default", the name of
// `drover proxy`'s balancer), DROVER_ADMIN_TOKEN (when the admin API needs one).
// Under `drover run` (DROVER_WORKER_ID set) registration is skipped: drover already
// balances over its workers; the load header is still sent.
'use strict';

const http = require('node:http');
const drover = require('../sdk/node');

const PORT = Number(process.env.PORT ?? 3000);
const WORKER = process.env.DROVER_WORKER_ID ?? null;
const DEFAULT_ITERATIONS = 100000;
const CHEAP = 1e4;
const EXPENSIVE = 5e5;
// Bounds the CPU one request may ask for, so a typo cannot wedge the server for minutes.
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
    'x-worker': WORKER ?? String(process.pid),
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
  const at = req.url.indexOf('?');
  const path = at < 0 ? req.url : req.url.slice(0, at);
  const query = new URLSearchParams(at < 0 ? '' : req.url.slice(at + 1));
  switch (path) {
    case '/health':
      return send(res, 200, 'ok', 'text/plain');
    case '/':
    case '/pi': {
      const raw = query.get('iterations');
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
      const expensive = n === null ? Math.random() < 0.1 : n.endsWith('0');
      return piAnswer(res, expensive ? EXPENSIVE : CHEAP, { kind: expensive ? 'expensive' : 'cheap' });
    }
    default:
      return send(res, 404, 'not found\n', 'text/plain');
  }
}

// loadReporter adds `endpoint-load-metrics` (event-loop utilisation) to every answer.
const server = http.createServer(drover.loadReporter(handle));

server.listen(PORT, '127.0.0.1', () => {
  const { port } = server.address();
  console.log(`pi-server-sdk (pid ${process.pid}) listening on 127.0.0.1:${port}`);
});

if (process.env.DROVER_ADMIN || WORKER !== null) {
  // Registers once listening; on SIGTERM/SIGINT drains, closes the server and exits.
  const member = drover.register({
    drover: process.env.DROVER_ADMIN,
    balancer: process.env.DROVER_BALANCER || 'default',
    server,
  });
  member.on('registered', (m, { created }) => {
    console.log(`pi-server-sdk: ${created ? 'joined' : 'rejoined'} balancer ${member.balancer} as ${m.id} (${m.address})`);
  });
  member.on('deregistered', (m) => console.log(`pi-server-sdk: left, ${m ? m.state : 'not registered'}`));
  member.on('warning', (err) => console.warn(`pi-server-sdk: ${err.message}`));
  member.on('error', (err) => console.error(`pi-server-sdk: ${err.message}`));
} else {
  console.log('pi-server-sdk: DROVER_ADMIN is not set; serving without registering');
  const stop = () => server.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
