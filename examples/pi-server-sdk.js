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
// The routes are pi-server.js's own.
const { handle } = require('./pi-server.js');

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
