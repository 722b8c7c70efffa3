#!/usr/bin/env node
// The table of bench/tls.sh: `node bench/tls-report.js bench/results/tls-raw-STAMP.jsonl [NOTE]`.
// Per peer, the median over rounds of: keep-alive HTTPS requests/s and the proxy's CPU
// ms per 1,000 requests; new connections/s with full handshakes and with resumed ones
// (s_time; and resumed from h2load, a client that keeps the proxy's core busy), and CPU
// ms per 1,000 of each; bytes of RSS per idle TLS connection. Then drover's
// ratios to each other peer, and issue 24's targets met or missed.
'use strict';
const fs = require('fs');
const path = require('path');
const median = require(path.join(__dirname, 'median.js'));

const recs = fs.readFileSync(process.argv[2], 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
if (!recs.length) {
  console.log('no measurements');
  process.exit(1);
}
const peers = [...new Set(recs.map((r) => r.peer))];
const SCENARIOS = ['keepalive', 'full', 'resumed-h2load', 'resumed', 'idle'];
const rounds = Math.max(...recs.map((r) => r.round));
// A measurement counts when it had no errors; a resumed one when >= 90 % of its
// connections resumed; an idle one when every connection stayed open.
function ok(r) {
  if (r.errors) return false;
  if (r.scenario === 'resumed') return r.marked_resumed >= 0.9 * r.count;
  if (r.scenario === 'idle') return r.valid;
  return true;
}
const m = {};
for (const p of peers) {
  m[p] = {};
  for (const s of SCENARIOS) {
    const mine = recs.filter((r) => r.peer === p && r.scenario === s && ok(r));
    m[p][s] = median(mine.map((r) => r.rate));
    m[p][`${s}_cpu`] = median(mine.map((r) => (r.count ? (r.cpu_s * 1e6) / r.count : null)));
    m[p][`${s}_n`] = mine.length;
    // How busy the proxy's core was: its CPU time over the measurement's wall time.
    const wall = (r) => (r.wrk ? r.wrk.duration_us / 1e6 : r.wall_s);
    m[p][`${s}_busy`] = median(mine.filter((r) => wall(r)).map((r) => (100 * r.cpu_s) / wall(r)));
    m[p][`${s}_bad`] = recs.filter((r) => r.peer === p && r.scenario === s && !ok(r)).length;
  }
}
const f = (v, d = 0) => (v === null || v === undefined ? '-' : v.toFixed(d));
console.log(`\nHTTPS side by side, ${rounds} round(s), medians (${recs[0].label ? 'peers: ' + peers.map((p) => recs.find((r) => r.peer === p).label).join(', ') : ''})`);
if (process.argv[3]) console.log(process.argv[3]);
console.log('');
const head = ['peer', 'keep-alive req/s', 'CPU ms/1k req', 'full hs conn/s', 'CPU ms/1k full', 'h2load res./s', 'CPU ms/1k', 'resumed conn/s', 'CPU ms/1k res.', 'B/idle TLS conn'];
const w = [8, 17, 14, 15, 15, 14, 10, 15, 15, 16];
console.log(head.map((h, i) => (i ? h.padStart(w[i]) : h.padEnd(w[i]))).join(''));
for (const p of peers) {
  const x = m[p];
  const cells = [p, f(x.keepalive), f(x.keepalive_cpu, 2), f(x.full), f(x.full_cpu, 1), f(x['resumed-h2load']), f(x['resumed-h2load_cpu'], 1), f(x.resumed), f(x.resumed_cpu, 1), f(x.idle)];
  console.log(cells.map((c, i) => (i ? c.padStart(w[i]) : c.padEnd(w[i]))).join(''));
}
console.log(`\nthe proxy's core busy (CPU time / wall time, %): ` +
  peers.map((p) => `${p} keep-alive ${f(m[p].keepalive_busy)}, full ${f(m[p].full_busy)}, h2load resumed ${f(m[p]['resumed-h2load_busy'])}, resumed ${f(m[p].resumed_busy)}`).join('; '));
const bad = peers.flatMap((p) => SCENARIOS.filter((s) => m[p][`${s}_bad`]).map((s) => `${p} ${s}: ${m[p][`${s}_bad`]}`));
if (bad.length) console.log(`\nleft out of the medians (errors, < 90 % resumed, or an idle connection closed): ${bad.join(', ')}`);

if (m.drover) {
  const r = (a, b) => (a && b ? a / b : null);
  console.log('\ndrover / peer (throughput: higher is better; CPU and memory: lower is better)');
  for (const p of peers.filter((q) => q !== 'drover')) {
    const d = m.drover, o = m[p];
    console.log(`  drover / ${p.padEnd(8)} keep-alive ${f(r(d.keepalive, o.keepalive), 2)} x (CPU/req ${f(r(d.keepalive_cpu, o.keepalive_cpu), 2)} x), ` +
      `full ${f(r(d.full, o.full), 2)} x (CPU/hs ${f(r(d.full_cpu, o.full_cpu), 2)} x), ` +
      `h2load resumed ${f(r(d['resumed-h2load'], o['resumed-h2load']), 2)} x (CPU/hs ${f(r(d['resumed-h2load_cpu'], o['resumed-h2load_cpu']), 2)} x), ` +
      `resumed ${f(r(d.resumed, o.resumed), 2)} x (CPU/hs ${f(r(d.resumed_cpu, o.resumed_cpu), 2)} x), ` +
      `idle memory ${f(r(d.idle, o.idle), 2)} x`);
  }
  const others = peers.filter((q) => q !== 'drover');
  const d = m.drover;
  const atLeast = (k) => others.every((p) => d[k] !== null && m[p][k] !== null && d[k] >= m[p][k]);
  // The same by CPU: what one saturated core would do is 1 / (CPU per request); the
  // figure that counts when the clients, not the proxy, set the measured rate.
  const cheaper = (k) => others.every((p) => d[`${k}_cpu`] !== null && m[p][`${k}_cpu`] !== null && d[`${k}_cpu`] <= m[p][`${k}_cpu`]);
  const yes = (b) => (b ? 'met' : 'MISSED');
  const both = (k) => d[k] === null ? 'not measured in this run (BENCH_SCENARIOS)' : `${yes(atLeast(k))} by the measured rate, ${yes(cheaper(k))} by CPU per ${k === 'keepalive' ? 'request' : 'handshake'} ` +
    `(${others.map((p) => `${p} ${f(r(d[k], m[p][k]), 2)} x / ${f(r(m[p][`${k}_cpu`], d[`${k}_cpu`]), 2)} x`).join(', ')})`;
  console.log('\nissue 24 targets (drover / peer: rate, then capacity = peer CPU / drover CPU)');
  console.log(`  keep-alive req/s >= 1.0 x ${others.join(' and ')}: ${both('keepalive')}`);
  console.log(`  full-handshake conn/s >= 1.0 x both: ${both('full')}`);
  console.log(`  resumed conn/s >= 1.0 x both (s_time): ${both('resumed')}`);
  console.log(`  resumed conn/s >= 1.0 x both (h2load): ${both('resumed-h2load')}`);
  if (d.idle !== null) console.log(`  idle memory <= 40 KiB per connection: ${yes(d.idle <= 40 * 1024)} (${f(d.idle / 1024, 1)} KiB)`);
  if (m.nginx && d.idle !== null) console.log(`  idle memory <= 1.2 x nginx's: ${yes(d.idle !== null && m.nginx.idle && d.idle <= 1.2 * m.nginx.idle)} (${f(r(d.idle, m.nginx.idle), 2)} x)`);
}
