#!/usr/bin/env node
// The first post's client: USERS concurrent users, each sending REQUESTS requests one
// after another (a user's next request leaves when the previous answer is in). Each user
// keeps its own keep-alive connection, as a browser would.
//
//   node examples/seeds/users.js URL [USERS=10] [REQUESTS=5]
//
// Prints one JSON line: total wall time, per-request latency (mean, p50, max), errors
// (no answer, or a status other than 200) and how many answers each worker (x-worker) gave.
'use strict';

const http = require('node:http');

const [url, users = '10', requests = '5'] = process.argv.slice(2);
if (!url) {
  console.error('usage: users.js URL [USERS] [REQUESTS]');
  process.exit(2);
}
const latencies = [];
const workers = {};
let errors = 0;

function get(agent) {
  return new Promise((resolve) => {
    const t0 = process.hrtime.bigint();
    const req = http.get(url, { agent, timeout: 120000 }, (res) => {
      res.resume();
      res.on('end', () => {
        latencies.push(Number(process.hrtime.bigint() - t0) / 1e6);
        const w = res.headers['x-worker'] ?? '?';
        workers[w] = (workers[w] || 0) + 1;
        if (res.statusCode !== 200) errors++;
        resolve();
      });
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', () => {
      errors++;
      resolve();
    });
  });
}

async function user() {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  for (let i = 0; i < Number(requests); i++) await get(agent);
  agent.destroy();
}

(async () => {
  const t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: Number(users) }, user));
  const total = Number(process.hrtime.bigint() - t0) / 1e6;
  const v = [...latencies].sort((a, b) => a - b);
  const pick = (q) => (v.length ? v[Math.min(v.length - 1, Math.ceil(q * v.length) - 1)] : null);
  const mean = v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
  console.log(JSON.stringify({ total_ms: total, mean_ms: mean, p50_ms: pick(0.5), max_ms: pick(1), requests: v.length, errors, workers }));
})();
