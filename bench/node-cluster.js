#!/usr/bin/env node
// The classic way to use every core with Node: the `cluster` module. The primary forks
// WORKERS copies of an app (default examples/pi-server.js); each worker's listen(PORT)
// is shared through the primary, which accepts every connection and hands it to the
// workers in turn (round-robin, SCHED_RR, Node's default except on Windows). After the
// handoff a connection belongs to its worker: the primary sees no requests.
//
//   PORT=8000 WORKERS=2 node bench/node-cluster.js [APP.js]
//
// Like a typical production primary it replaces a worker that dies, and on SIGTERM or
// SIGINT it passes the signal on to the workers and exits once they are gone.
'use strict';

const cluster = require('node:cluster');
const os = require('node:os');
const path = require('node:path');

const app = path.resolve(process.argv[2] || path.join(__dirname, '..', 'examples', 'pi-server.js'));
const workers = Number(process.env.WORKERS || os.availableParallelism());
if (!Number.isInteger(workers) || workers < 1) {
  console.error(`node-cluster: WORKERS must be a positive integer, not ${process.env.WORKERS}`);
  process.exit(2);
}

// Set before the first fork; the env knob NODE_CLUSTER_SCHED_POLICY would override it.
cluster.schedulingPolicy = cluster.SCHED_RR;
cluster.setupPrimary({ exec: app });

let stopping = false;
let listening = 0;
cluster.on('listening', (w, addr) => {
  listening++;
  if (listening === workers) {
    console.log(`node-cluster: ${workers} workers of ${app} listening on ${addr.address}:${addr.port} (primary pid ${process.pid})`);
  }
});
cluster.on('exit', (w, code, signal) => {
  if (stopping) {
    if (Object.keys(cluster.workers).length === 0) process.exit(0);
    return;
  }
  console.error(`node-cluster: worker pid ${w.process.pid} exited (${signal || code}); starting another`);
  cluster.fork();
});

function stop(signal) {
  if (stopping) return;
  stopping = true;
  const alive = Object.values(cluster.workers);
  if (alive.length === 0) process.exit(0);
  for (const w of alive) w.process.kill(signal);
  // A worker stuck in a long request must not keep the primary alive forever.
  setTimeout(() => process.exit(0), 5000).unref();
}
process.on('SIGTERM', () => stop('SIGTERM'));
process.on('SIGINT', () => stop('SIGINT'));

for (let i = 0; i < workers; i++) cluster.fork();
