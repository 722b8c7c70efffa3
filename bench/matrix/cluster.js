#!/usr/bin/env node
// The node-cluster peer of bench/matrix.sh: Node's cluster module (SCHED_RR: the primary
// accepts every connection and hands it to the workers in turn) with WORKERS copies of
// bench/matrix/backend.js sharing one port. No proxy hop: after the handoff a connection
// belongs to its worker, so every request on it goes to that worker.
//
//   PORT=8000 WORKERS=2 ADMIN_PORT=8001 node bench/matrix/cluster.js
//
// Worker i (0-based) gets BACKEND_ID=w<i> (its x-backend header) and MATRIX_MODE from
// MATRIX_MODE_<i> when set (e.g. MATRIX_MODE_1="slow=2"). ADMIN_PORT, when set, answers
// GET /__mode?worker=I&<mode> by passing the mode to worker I over IPC (every worker when
// no worker=), the same modes as backend.js's own /__mode route.
'use strict';
const cluster = require('node:cluster');
const http = require('node:http');
const path = require('node:path');

const port = Number(process.env.PORT);
const workers = Number(process.env.WORKERS || 2);
cluster.schedulingPolicy = cluster.SCHED_RR;
cluster.setupPrimary({ exec: path.join(__dirname, 'backend.js'), args: [String(port)] });

const byIndex = [];
let stopping = false;
function fork(i) {
  const env = { BACKEND_ID: `w${i}` };
  if (process.env[`MATRIX_MODE_${i}`]) env.MATRIX_MODE = process.env[`MATRIX_MODE_${i}`];
  const w = cluster.fork(env);
  byIndex[i] = w;
  w.on('exit', () => { if (!stopping) fork(i); });
}
for (let i = 0; i < workers; i++) fork(i);

let listening = 0;
cluster.on('listening', () => {
  if (++listening === workers) console.error(`node-cluster: ${workers} workers on 127.0.0.1:${port} (primary pid ${process.pid})`);
});

let seq = 0;
if (process.env.ADMIN_PORT) {
  http.createServer((req, res) => {
    const q = new URLSearchParams(req.url.split('?')[1] || '');
    const which = q.has('worker') ? [byIndex[Number(q.get('worker'))]] : byIndex;
    q.delete('worker');
    const mode = q.toString();
    Promise.all(which.filter(Boolean).map((w) => new Promise((resolve) => {
      const s = ++seq;
      const onMsg = (m) => { if (m && m.seq === s) { w.off('message', onMsg); resolve(m.modeSet); } };
      w.on('message', onMsg);
      w.send({ mode, seq: s });
      setTimeout(() => { w.off('message', onMsg); resolve(null); }, 2000).unref();
    }))).then((states) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(states));
    });
  }).listen(Number(process.env.ADMIN_PORT), '127.0.0.1');
}

function stop(signal) {
  if (stopping) return;
  stopping = true;
  for (const w of Object.values(cluster.workers)) w.process.kill(signal);
  setTimeout(() => process.exit(0), 2000).unref();
  cluster.on('exit', () => { if (Object.keys(cluster.workers).length === 0) process.exit(0); });
}
process.on('SIGTERM', () => stop('SIGTERM'));
process.on('SIGINT', () => stop('SIGINT'));
