#!/usr/bin/env node
// What the best balancer could do: a queueing model of the mixed load.
//
//   node bench/queue-model.js [--workers 2] [--cheap-ms 0.25] [--expensive-ms 10]
//                             [--expensive-share 10] [--loads 50,75] [--closed 50|none]
//                             [--requests 200000]
//
// Simulates single-threaded workers (one request at a time, first come first served)
// under the loads of bench/run.sh and bench/cluster.sh: open loop, requests due at fixed
// intervals (--loads, in % of capacity); closed loop, clients that each send the next
// request as soon as the last is answered (--closed, client counts). Each request is
// expensive with the given chance; latency counts from its due time. No network, no proxy
// cost, no noise: only where each policy puts each request. It answers "how much lower
// can a balancer's p99 be than round-robin's at this load, with this many workers?",
// which is the limit the measured ratios in bench/README.md should be read against, and
// why drover bounds how often a queued request may be passed (closed loop).
//
// Policies:
//   random          each request to a worker at random (per-connection balancing with
//                   independent clients: Node cluster, PM2, a shared socket)
//   round-robin     each request to the next worker in turn
//   least-conn      to the worker with the fewest requests sent and not answered (nginx
//                   least_conn, HAProxy leastconn); it queues inside that worker
//   least-work      to the worker whose unanswered requests cost least in all (each at
//                   its full cost, as drover counts pending work by learned cost): what
//                   drover's p2c does when no backend is known to be saturated, in
//                   pools of up to three (it scans those in full)
//   p2c-work        two workers drawn at random, the one with less pending work: drover's
//                   p2c in larger pools
//   late-fifo       one queue in the balancer, a worker takes the next request when it is
//                   idle (late binding with a limit of 1 and a free hop)
//   late-bypass     the same, but a request joins ahead of queued ones costing over 4x
//                   its own, passing each at most 8 times (drover's queue order)
//   late-sjf        the same with no bound on passes: shortest job first among classes
'use strict';

const args = parseArgs(process.argv.slice(2));
const WORKERS = int(args.workers ?? '2', 'workers');
const CHEAP = num(args['cheap-ms'] ?? '0.25', 'cheap-ms');
const EXPENSIVE = num(args['expensive-ms'] ?? '10', 'expensive-ms');
const SHARE = num(args['expensive-share'] ?? '10', 'expensive-share') / 100;
const LOADS = (args.loads ?? '50,75').split(',').map((s) => num(s, 'loads') / 100);
const N = int(args.requests ?? '200000', 'requests');
const CLOSED = args.closed === 'none' ? [] : (args.closed ?? '50').split(',').map((s) => int(s, 'closed'));
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
  const known = ['workers', 'cheap-ms', 'expensive-ms', 'expensive-share', 'loads', 'closed', 'requests'];
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

/**
 * Where requests come from. Open loop: N requests due at fixed intervals, costs drawn up
 * front. Closed loop: `clients` clients, each sending its next request the moment the
 * last one is answered (drover bench -c), until N have been sent.
 */
function openLoop(rate) {
  const r = rng(1);
  const due = [];
  for (let i = 0; i < N; i++) due.push({ due: (i * 1000) / rate, cost: r() < SHARE ? EXPENSIVE : CHEAP });
  return { first: due, next: () => null };
}
function closedLoop(clients) {
  const r = rng(1);
  let sent = 0;
  const request = (at) => (sent++ < N ? { due: at, cost: r() < SHARE ? EXPENSIVE : CHEAP } : null);
  return { first: Array.from({ length: clients }, () => request(0)), next: request };
}

/** A binary min-heap of requests by due time (ties: the one created first). */
class DueHeap {
  constructor() {
    this.items = [];
    this.made = 0;
  }
  get size() {
    return this.items.length;
  }
  peek() {
    return this.items[0];
  }
  push(q) {
    q.seq = this.made++;
    const a = this.items;
    a.push(q);
    for (let i = a.length - 1; i > 0; ) {
      const up = (i - 1) >> 1;
      if (!this.before(a[i], a[up])) break;
      [a[i], a[up]] = [a[up], a[i]];
      i = up;
    }
  }
  pop() {
    const a = this.items;
    const top = a[0];
    const last = a.pop();
    if (a.length) {
      a[0] = last;
      for (let i = 0; ; ) {
        let m = i;
        for (const c of [2 * i + 1, 2 * i + 2]) if (c < a.length && this.before(a[c], a[m])) m = c;
        if (m === i) break;
        [a[i], a[m]] = [a[m], a[i]];
        i = m;
      }
    }
    return top;
  }
  before(x, y) {
    return x.due < y.due || (x.due === y.due && x.seq < y.seq);
  }
}

/**
 * Runs one policy over one source; returns each request's latency (ms, from its due
 * time) and cost, in the order they were answered.
 *
 * `policy.bind(i, pending, pick)` binds a request to a worker on arrival (each worker
 * serves what it holds in order); without it, requests wait in one balancer queue that
 * an idle worker takes the head of, and `policy.passes(ahead, q)` says whether a newcomer
 * joins ahead of a queued request.
 */
function simulate(source, policy) {
  const free = new Array(WORKERS).fill(0); // when each worker finishes what it holds
  const pending = Array.from({ length: WORKERS }, () => []); // bound: {at: finish, cost}, in order
  const queue = []; // late binding: requests waiting in the balancer
  const arrivals = new DueHeap();
  source.first.forEach((q) => arrivals.push(q));
  const out = [];
  const pick = rng(2);
  let arrived = 0;
  const earliest = () => free.reduce((b, f, w) => (f < free[b] ? w : b), 0);
  const serve = (q, w, at) => {
    free[w] = Math.max(free[w], at) + q.cost;
    out.push({ latency: free[w] - q.due, cost: q.cost });
    const next = source.next(free[w]);
    if (next) arrivals.push(next);
    return free[w];
  };
  for (;;) {
    const w = earliest();
    if (queue.length && (!arrivals.size || free[w] <= arrivals.peek().due)) {
      serve(queue.shift(), w, free[w]);
      continue;
    }
    if (!arrivals.size) break;
    const q = arrivals.pop();
    if (policy.bind) {
      for (const p of pending) while (p.length && p[0].at <= q.due) p.shift();
      const b = policy.bind(arrived++, pending, pick);
      pending[b].push({ at: serve(q, b, q.due), cost: q.cost });
    } else if (!queue.length && free[w] <= q.due) {
      serve(q, w, q.due);
    } else {
      let at = queue.length;
      while (at > 0 && policy.passes(queue[at - 1], q)) at--;
      for (let k = at; k < queue.length; k++) queue[k].passed++;
      queue.splice(at, 0, { ...q, passed: 0 });
    }
  }
  return out;
}

const random = (_i, _p, r) => Math.floor(r() * WORKERS);
const roundRobin = (i) => i % WORKERS;
/** The worker with the least `load(pending)`; ties go round-robin, as nginx and HAProxy
 * break them. */
function leastBy(load) {
  return (i, pending) => {
    let best = -1;
    for (let k = 0; k < WORKERS; k++) {
      const w = (i + k) % WORKERS;
      if (best < 0 || load(pending[w]) < load(pending[best])) best = w;
    }
    return best;
  };
}
const work = (p) => p.reduce((sum, r) => sum + r.cost, 0);
const leastConn = leastBy((p) => p.length);
const leastWork = leastBy(work);
/** Two distinct workers at random, the one with less pending work (ties: the first). */
function p2cWork(_i, pending, r) {
  if (WORKERS < 2) return 0;
  const a = Math.floor(r() * WORKERS);
  const b = (a + 1 + Math.floor(r() * (WORKERS - 1))) % WORKERS;
  return work(pending[b]) < work(pending[a]) ? b : a;
}
const costlier = (ahead, q) => ahead.cost > PASS_RATIO * q.cost;

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

const policies = {
  random: { bind: random },
  'round-robin': { bind: roundRobin },
  'least-conn': { bind: leastConn },
  'least-work': { bind: leastWork },
  'p2c-work': { bind: p2cWork },
  'late-fifo': { passes: () => false },
  'late-bypass': { passes: (ahead, q) => costlier(ahead, q) && ahead.passed < MAX_PASSES },
  'late-sjf': { passes: costlier },
};

const mean = (1 - SHARE) * CHEAP + SHARE * EXPENSIVE;
const capacity = (WORKERS * 1000) / mean;
console.log(
  `queue model: ${WORKERS} single-threaded workers, ${100 - SHARE * 100}% at ${CHEAP} ms, ` +
    `${SHARE * 100}% at ${EXPENSIVE} ms; capacity ${capacity.toFixed(0)} req/s; ` +
    `${N} requests per run; no proxy cost`,
);
const fmt = (ms) => (ms >= 100 ? ms.toFixed(0) : ms.toFixed(1)).padStart(7);
function table(source) {
  console.log('policy          p50 ms   p99 ms  cheap p99  p99 / random  p99 / least-conn');
  const rows = [];
  const p99 = {};
  for (const [name, policy] of Object.entries(policies)) {
    const out = simulate(source(), policy);
    const all = out.map((o) => o.latency).sort((a, b) => a - b);
    const cheap = out.filter((o) => o.cost === CHEAP).map((o) => o.latency).sort((a, b) => a - b);
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
for (const load of LOADS) {
  console.log(`\nopen loop, load ${Math.round(load * 100)}% (${(load * capacity).toFixed(0)} req/s)`);
  table(() => openLoop(load * capacity));
}
for (const clients of CLOSED) {
  console.log(`\nclosed loop, ${clients} clients (a standing queue: the balancer is saturated)`);
  table(() => closedLoop(clients));
}
