#!/usr/bin/env node
// Workload-matrix HTTP client for the loads drover bench does not do (no npm dependencies).
//
//   node client.js closed URL --conns 50 --duration 10 --mix "100:/io?ms=20"
//   node client.js burst  URL --rate 3000 --on 1 --period 5 --duration 6 --mix "90:/a,10:/b"
//   node client.js seq    URL --n 1000 --path "/cpu?us=20" [--new-conn]
//
// * closed: --conns loops, each sends its next request when the previous answer is in.
// * burst: open loop that is on for --on seconds at the start of every --period seconds
//   and off otherwise; request i of an on-phase is due at i/--rate; latency counts from
//   the due time (queueing in the client's pool of at most --conns connections included).
// * seq: --n requests one after another over one keep-alive connection, or over a new
//   connection each (--new-conn: `Connection: close`, agent without keep-alive).
//
// Prints one JSON object in drover bench's shape: requests, ok, rps, ok_rps,
// latency_us (all answers) and ok_latency_us (2xx only) with p50/p90/p99/p99_9/max,
// errors {connect, status (non-2xx), timeout, io}, errors_total, status codes, and
// header_counts for --count-header (default x-backend).
'use strict';
const http = require('http');

const argv = process.argv.slice(2);
const cmd = argv[0];
const url = new URL(argv[1] && argv[1].includes('://') ? argv[1] : `http://${argv[1]}`);
const opt = { conns: 50, duration: 10, rate: 0, on: 1, period: 5, n: 1000, timeout: 10, 'count-header': 'x-backend', mix: '', path: '' };
for (let i = 2; i < argv.length; i++) {
  const k = argv[i].replace(/^--/, '');
  if (k === 'new-conn') { opt.newConn = true; continue; }
  if (!(k in opt)) { console.error(`client.js: unknown option ${argv[i]}`); process.exit(2); }
  const v = argv[++i];
  opt[k] = typeof opt[k] === 'number' ? Number(v) : v;
}
if (!['closed', 'burst', 'seq'].includes(cmd)) {
  console.error('usage: client.js closed|burst|seq URL [options] (see the head of this file)');
  process.exit(2);
}

// ---------------------------------------------------------------- paths
const mix = (opt.mix || `1:${opt.path || url.pathname + url.search || '/'}`).split(',').map((s) => {
  const c = s.indexOf(':');
  return { w: Number(s.slice(0, c)), path: s.slice(c + 1) };
});
const wsum = mix.reduce((a, m) => a + m.w, 0);
let seed = 12345;
function rnd() { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed / 0x80000000; }
function pickPath() {
  let x = rnd() * wsum;
  for (const m of mix) { if ((x -= m.w) < 0) return m.path; }
  return mix[mix.length - 1].path;
}

// ---------------------------------------------------------------- recording
const lat = [];
const okLat = [];
const errors = { connect: 0, status: 0, timeout: 0, io: 0 };
const status = {};
const counts = {};
let missing = 0;
let ok = 0;
const hdr = String(opt['count-header']).toLowerCase();

function record(latUs, code, headerValue) {
  lat.push(latUs);
  status[code] = (status[code] || 0) + 1;
  if (code >= 200 && code < 300) { ok++; okLat.push(latUs); } else errors.status++;
  if (headerValue === undefined) missing++;
  else counts[headerValue] = (counts[headerValue] || 0) + 1;
}
function recordError(err) {
  const c = err && err.code;
  if (c === 'ETIMEDOUT_CLIENT') errors.timeout++;
  else if (c === 'ECONNREFUSED' || c === 'EADDRNOTAVAIL') errors.connect++;
  else errors.io++;
}

const agent = new http.Agent({
  keepAlive: !opt.newConn,
  maxSockets: cmd === 'seq' ? 1 : opt.conns,
  scheduling: cmd === 'burst' ? 'fifo' : 'lifo',
});

// One request; resolves once the answer is read (or failed). due: hrtime ns it counts from.
function request(path, due) {
  return new Promise((resolve) => {
    let done = false;
    const finish = (fn) => { if (!done) { done = true; clearTimeout(timer); fn(); resolve(); } };
    const headers = opt.newConn ? { connection: 'close' } : {};
    const req = http.request({ host: url.hostname, port: url.port || 80, path, agent, headers }, (res) => {
      res.on('data', () => {});
      res.on('end', () => finish(() => record(Number(process.hrtime.bigint() - due) / 1e3, res.statusCode, res.headers[hdr])));
      res.on('error', (e) => finish(() => recordError(e)));
    });
    const timer = setTimeout(() => {
      finish(() => recordError({ code: 'ETIMEDOUT_CLIENT' }));
      req.destroy();
    }, opt.timeout * 1000);
    req.on('error', (e) => finish(() => recordError(e)));
    req.end();
  });
}

function pct(sorted, p) {
  if (!sorted.length) return null;
  return Math.round(sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]);
}
function summary(xs) {
  const s = Float64Array.from(xs).sort();
  const mean = s.length ? s.reduce((a, b) => a + b, 0) / s.length : null;
  return { count: s.length, min: s.length ? Math.round(s[0]) : null, mean: mean === null ? null : Math.round(mean * 10) / 10, p50: pct(s, 50), p90: pct(s, 90), p99: pct(s, 99), p99_9: pct(s, 99.9), max: s.length ? Math.round(s[s.length - 1]) : null };
}
function report(elapsedS, extra) {
  const requests = lat.length + errors.connect + errors.timeout + errors.io;
  const errorsTotal = Object.values(errors).reduce((a, b) => a + b, 0);
  console.log(JSON.stringify({
    tool: 'matrix-client', mode: cmd, target: url.host, mix: mix.map((m) => `${m.w}:${m.path}`).join(','),
    connections: cmd === 'seq' ? 1 : opt.conns, new_conn: !!opt.newConn, ...extra,
    elapsed_s: Math.round(elapsedS * 1e4) / 1e4, requests, ok,
    rps: Math.round((requests / elapsedS) * 10) / 10, ok_rps: Math.round((ok / elapsedS) * 10) / 10,
    latency_us: summary(lat), ok_latency_us: summary(okLat),
    errors, errors_total: errorsTotal, status,
    header_counts: { header: hdr, values: counts, other: 0, missing },
  }));
}

// ---------------------------------------------------------------- modes
async function closed() {
  const t0 = process.hrtime.bigint();
  const end = t0 + BigInt(Math.round(opt.duration * 1e9));
  const loop = async () => {
    while (process.hrtime.bigint() < end) await request(pickPath(), process.hrtime.bigint());
  };
  await Promise.all(Array.from({ length: opt.conns }, loop));
  report(Number(process.hrtime.bigint() - t0) / 1e9, { duration_s: opt.duration });
}

async function seq() {
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < opt.n; i++) await request(pickPath(), process.hrtime.bigint());
  report(Number(process.hrtime.bigint() - t0) / 1e9, { n: opt.n });
}

async function burst() {
  // The due times (seconds from start) of every request of every on-phase.
  const due = [];
  for (let start = 0; start < opt.duration; start += opt.period) {
    const on = Math.min(opt.on, opt.duration - start);
    const n = Math.round(on * opt.rate);
    for (let i = 0; i < n; i++) due.push(start + i / opt.rate);
  }
  const t0 = process.hrtime.bigint();
  const pending = [];
  let next = 0;
  await new Promise((resolve) => {
    const pace = () => {
      const now = Number(process.hrtime.bigint() - t0) / 1e9;
      while (next < due.length && due[next] <= now) {
        pending.push(request(pickPath(), t0 + BigInt(Math.round(due[next] * 1e9))));
        next++;
      }
      if (next >= due.length) return resolve();
      const wait = (due[next] - now) * 1000;
      if (wait > 2) setTimeout(pace, Math.min(wait - 1, 100)); else setImmediate(pace);
    };
    pace();
  });
  await Promise.all(pending);
  const elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
  report(elapsed, { duration_s: opt.duration, rate: opt.rate, on_s: opt.on, period_s: opt.period, offered: due.length });
}

({ closed, burst, seq })[cmd]().then(() => { agent.destroy(); process.exit(0); }, (e) => { console.error(e); process.exit(1); });
