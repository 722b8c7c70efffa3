#!/usr/bin/env node
// What the best balancer could do: a queueing model of the mixed load.
//
//   node bench/queue-model.js [--workers 2] [--cheap-ms 0.25] [--expensive-ms 10]
//                             [--expensive-share 10] [--loads 50,75] [--requests 200000]
//
// Simulates single-threaded workers (one request at a time, first come first served)
// under the open-loop load of bench/run.sh and bench/cluster.sh: requests due at fixed
// intervals, each expensive with the given chance, latency from the due time. No network,
// no proxy cost, no noise: only where each policy puts each request. It answers "how much
// lower can a balancer's p99 be than round-robin's at this load, with this many workers?",
// which is the limit the measured ratios in bench/README.md should be read against.
//
// Policies:
//   random          each request to a worker at random (per-connection balancing with
//                   independent clients: Node cluster, PM2, a shared socket)
//   round-robin     each request to the next worker in turn
//   least-conn      to the worker with the fewest requests sent and not answered (nginx
//                   least_conn, HAProxy leastconn); it queues inside that worker
//   late-fifo       one queue in the balancer, a worker takes the next request when it is
//                   idle (late binding with a limit of 1 and a free hop)
//   late-bypass     the same, but a request joins ahead of queued ones costing over 4x
//                   its own, passing each at most 8 times (drover's queue order)
'use strict';

const args = parseArgs(process.argv.slice(2));
const WORKERS = int(args.workers ?? '2', 'workers');
const CHEAP = num(args['cheap-ms'] ?? '0.25', 'cheap-ms');
const EXPENSIVE = num(args['expensive-ms'] ?? '10', 'expensive-ms');
const SHARE = num(args['expensive-share'] ?? '10', 'expensive-share') / 100;
const LOADS = (args.loads ?? '50,75').split(',').map((s) => num(s, 'loads') / 100);
const N = int(args.requests ?? '200000', 'requests');
const PASS_RATIO = 4;
const MAX_PASSES = 8;

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(argv[i]);
    if (!m) fail(`unexpected argument ${JSON.stringify(argv[i])}`);
    out[m[1]] = m[2] ?? argv[++i];
    if (out[m[1]] === undefined) fail(`--${m[1]} needs a value`);
  }
  const known = ['workers', 'cheap-ms', 'expensive-ms', 'expensive-share', 'loads', 'requests'];
  for (const k of Object.keys(out)) if (!known.includes(k)) fail(`unknown option --${k}`);
  return out;
}
function fail(msg) {
  console.error(`queue-model: ${msg}`);
  process.exit(2);
}
function num(s, name) {
  const v = Number(s);
  if (!Number.isFinite(v) || v <= 0) fail(`--${name} must be a positive number, not ${JSON.stringify(s)}`);
  return v;
}
function int(s, name) {
  const v = num(s, name);
  if (!Number.isInteger(v)) fail(`--${name} must be a whole number, not ${JSON.stringify(s)}`);
  return v;
}
if (SHARE >= 1) fail('--expensive-share must be below 100');

// A small seeded generator (mulberry32), so every policy sees the same requests.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The requests of one run: due time and cost, in ms. */
function workload(rate) {
  const r = rng(1);
  const reqs = [];
  for (let i = 0; i < N; i++) {
    reqs.push({ due: (i * 1000) / rate, cost: r() < SHARE ? EXPENSIVE : CHEAP });
  }
  return reqs;
}

/** Policies that bind a request to a worker on arrival; each worker serves in order. */
function bindOnArrival(reqs, choose) {
  const free = new Array(WORKERS).fill(0); // when each worker finishes what it holds
  const pending = Array.from({ length: WORKERS }, () => []); // finish times, in order
  const pick = rng(2);
  return reqs.map((q, i) => {
    for (const p of pending) while (p.length && p[0] <= q.due) p.shift();
    const w = choose(i, pending, pick);
    const done = Math.max(free[w], q.due) + q.cost;
    free[w] = done;
    pending[w].push(done);
    return done - q.due;
  });
}

const random = (_i, _p, r) => Math.floor(r() * WORKERS);
const roundRobin = (i) => i % WORKERS;
function leastConn(i, pending) {
  let best = -1;
  // Ties go round-robin, as nginx and HAProxy break them.
  for (let k = 0; k < WORKERS; k++) {
    const w = (i + k) % WORKERS;
    if (best < 0 || pending[w].length < pending[best].length) best = w;
  }
  return best;
}

/** One queue in the balancer; an idle worker takes the head. */
function lateBinding(reqs, bypass) {
  const free = new Array(WORKERS).fill(0);
  const queue = []; // {i, passed}
  const lat = new Array(reqs.length);
  const earliest = () => free.reduce((b, f, w) => (f < free[b] ? w : b), 0);
  const start = (i, at) => {
    const w = earliest();
    free[w] = Math.max(free[w], at) + reqs[i].cost;
    lat[i] = free[w] - reqs[i].due;
  };
  const drainUntil = (t) => {
    while (queue.length && free[earliest()] <= t) start(queue.shift().i, free[earliest()]);
  };
  reqs.forEach((q, i) => {
    drainUntil(q.due);
    if (!queue.length && free[earliest()] <= q.due) return start(i, q.due);
    let at = queue.length;
    if (bypass) {
      while (at > 0) {
        const ahead = queue[at - 1];
        if (reqs[ahead.i].cost > PASS_RATIO * q.cost && ahead.passed < MAX_PASSES) at--;
        else break;
      }
      for (let k = at; k < queue.length; k++) queue[k].passed++;
    }
    queue.splice(at, 0, { i, passed: 0 });
  });
  drainUntil(Infinity);
  return lat;
}

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

const policies = {
  random: (reqs) => bindOnArrival(reqs, random),
  'round-robin': (reqs) => bindOnArrival(reqs, roundRobin),
  'least-conn': (reqs) => bindOnArrival(reqs, leastConn),
  'late-fifo': (reqs) => lateBinding(reqs, false),
  'late-bypass': (reqs) => lateBinding(reqs, true),
};

const mean = (1 - SHARE) * CHEAP + SHARE * EXPENSIVE;
const capacity = (WORKERS * 1000) / mean;
console.log(
  `queue model: ${WORKERS} single-threaded workers, ${100 - SHARE * 100}% at ${CHEAP} ms, ` +
    `${SHARE * 100}% at ${EXPENSIVE} ms; capacity ${capacity.toFixed(0)} req/s; ` +
    `${N} requests at fixed intervals; no proxy cost`,
);
const fmt = (ms) => (ms >= 100 ? ms.toFixed(0) : ms.toFixed(1)).padStart(7);
for (const load of LOADS) {
  const reqs = workload(load * capacity);
  console.log(`\nload ${Math.round(load * 100)}% (${(load * capacity).toFixed(0)} req/s)`);
  console.log('policy          p50 ms   p99 ms  cheap p99  p99 / random  p99 / least-conn');
  const p99 = {};
  const rows = [];
  for (const [name, run] of Object.entries(policies)) {
    const lat = run(reqs);
    const all = [...lat].sort((a, b) => a - b);
    const cheap = lat.filter((_, i) => reqs[i].cost === CHEAP).sort((a, b) => a - b);
    p99[name] = percentile(all, 99);
    rows.push([name, percentile(all, 50), p99[name], percentile(cheap, 99)]);
  }
  for (const [name, p50, p, cp] of rows) {
    console.log(
      `${name.padEnd(14)} ${fmt(p50)}  ${fmt(p)}  ${fmt(cp)}    ` +
        `${(p / p99.random).toFixed(2).padStart(10)}  ${(p / p99['least-conn']).toFixed(2).padStart(16)}`,
    );
  }
}
