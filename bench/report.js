#!/usr/bin/env node
// Summarises bench/run.sh records: medians over rounds, a table, and the ratios that
// drover's performance targets are written in.
//
//   node bench/report.js RAW.jsonl [META.json] [SUMMARY_OUT.json]
'use strict';
const fs = require('fs');

const [rawPath, metaPath, outPath] = process.argv.slice(2);
if (!rawPath) {
  console.error('usage: node bench/report.js RAW.jsonl [META.json] [SUMMARY_OUT.json]');
  process.exit(2);
}
const meta = metaPath ? JSON.parse(fs.readFileSync(metaPath, 'utf8')) : {};
const records = fs.readFileSync(rawPath, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));

const SCENARIOS = ['tiny-c50', 'tiny-c1', 'mixed-closed', 'mixed-open50', 'mixed-open75'];

const median = require('./median');

// One normalised row per record.
function normalise(r) {
  const x = r.result;
  if (!x) return { failed: true };
  const l = x.latency_us || {};
  const errors = x.tool === 'wrk'
    ? Object.values(x.errors || {}).reduce((a, b) => a + b, 0)
    : x.errors_total ?? 0;
  const cpuUs = r.clk_tck && x.requests && r.peer !== 'direct' ? (r.cpu_ticks * 1e6) / r.clk_tck / x.requests : null;
  const per = (t) => (cpuUs === null || t === undefined ? null : (t * 1e6) / r.clk_tck / x.requests);
  return {
    rps: x.rps,
    requests: x.requests,
    p50: l.p50, p90: l.p90, p99: l.p99, p999: l.p99_9, max: l.max,
    errors,
    cpu_us_per_req: cpuUs,
    user_us_per_req: per(r.user_ticks),
    sys_us_per_req: per(r.sys_ticks),
    rss_kb: r.peer === 'direct' ? null : r.rss_kb || null,
    hwm_kb: r.peer === 'direct' ? null : r.hwm_kb || null,
    rate: x.rate ?? null,
  };
}

const groups = new Map(); // "peer|scenario" -> rows
for (const r of records) {
  const k = `${r.peer}|${r.scenario}`;
  if (!groups.has(k)) groups.set(k, []);
  groups.get(k).push(normalise(r));
}

const medians = {};
for (const [k, rows] of groups) {
  const [peer, scen] = k.split('|');
  const ok = rows.filter((r) => !r.failed);
  const m = { rounds: ok.length, failed_rounds: rows.length - ok.length };
  for (const f of ['rps', 'requests', 'p50', 'p90', 'p99', 'p999', 'max', 'errors', 'cpu_us_per_req', 'user_us_per_req', 'sys_us_per_req', 'rss_kb', 'hwm_kb', 'rate']) {
    m[f] = median(ok.map((r) => r[f]));
  }
  (medians[peer] ||= {})[scen] = m;
}

const peers = Object.keys(medians).sort((a, b) => {
  const rank = (p) => (p === 'direct' ? 0 : p.startsWith('drover') ? 2 : 1);
  return rank(a) - rank(b) || a.localeCompare(b);
});

// ---------------------------------------------------------------- table
const fmtUs = (v) => (v === null || v === undefined ? '-' : v >= 10000 ? `${(v / 1000).toFixed(1)}ms` : v >= 1000 ? `${(v / 1000).toFixed(2)}ms` : `${Math.round(v)}µs`);
const fmtN = (v, d = 0) => (v === null || v === undefined ? '-' : v.toFixed(d));
const cols = ['peer', 'scenario', 'req/s', 'p50', 'p99', 'max', 'errors', 'cpu µs/req', 'RSS MB'];
const rows = [];
for (const scen of SCENARIOS) {
  for (const p of peers) {
    const m = medians[p][scen];
    if (!m) continue;
    rows.push([
      p, scen + (m.rate ? ` @${Math.round(m.rate)}` : ''), fmtN(m.rps), fmtUs(m.p50), fmtUs(m.p99), fmtUs(m.max),
      fmtN(m.errors), fmtN(m.cpu_us_per_req, 1), m.rss_kb ? (m.rss_kb / 1024).toFixed(1) : '-',
    ]);
  }
}
const widths = cols.map((c, i) => Math.max(c.length, ...rows.map((r) => String(r[i]).length)));
const line = (r) => r.map((c, i) => (i < 2 ? String(c).padEnd(widths[i]) : String(c).padStart(widths[i]))).join('  ');
console.log('');
console.log(`drover bench — medians of ${meta.rounds ?? '?'} round(s), ${meta.duration_s ?? '?'}s each, ${meta.cpus ?? '?'} cores` +
  (meta.proxy_cpu !== undefined && meta.proxy_cpu !== '' ? `, proxy pinned to cpu ${meta.proxy_cpu}, load generator to cpu ${meta.loadgen_cpu}` : ''));
if (meta.backend === 'nginx') {
  console.log('backends: one nginx worker answering "ok" (the proxy\'s own core is the bottleneck)');
} else if (meta.backend) {
  console.log('backends: two Node processes (bench/backend.js)');
}
if (meta.capacity_rps) {
  console.log(`mixed load ${meta.mix}: cheap ${meta.cheap_us}µs, expensive ${meta.expensive_ms}ms; capacity ${meta.capacity_rps} req/s from ${meta.capacity_from}`);
}
console.log('');
console.log(line(cols));
console.log(widths.map((w) => '-'.repeat(w)).join('  '));
let last = null;
for (const r of rows) {
  if (last && r[1].split(' ')[0] !== last) console.log('');
  last = r[1].split(' ')[0];
  console.log(line(r));
}

// ---------------------------------------------------------------- headline figures
const get = (p, s, f) => medians[p]?.[s]?.[f] ?? null;
const direct50 = get('direct', 'tiny-c1', 'p50');
const headline = {};
for (const p of peers.filter((x) => x !== 'direct')) {
  const p50 = get(p, 'tiny-c1', 'p50');
  headline[p] = {
    tiny_rps: get(p, 'tiny-c50', 'rps'),
    cpu_us_per_req: get(p, 'tiny-c50', 'cpu_us_per_req'),
    user_us_per_req: get(p, 'tiny-c50', 'user_us_per_req'),
    sys_us_per_req: get(p, 'tiny-c50', 'sys_us_per_req'),
    added_p50_us_c1: p50 !== null && direct50 !== null ? p50 - direct50 : null,
    rss_mb: get(p, 'tiny-c50', 'rss_kb') !== null ? get(p, 'tiny-c50', 'rss_kb') / 1024 : null,
    mixed_closed_p99_us: get(p, 'mixed-closed', 'p99'),
    open50_p99_us: get(p, 'mixed-open50', 'p99'),
    open75_p99_us: get(p, 'mixed-open75', 'p99'),
  };
}
console.log('');
console.log('headline (the performance targets' figures; tiny = wrk -c50 on "/", +p50 = wrk -c1 p50 minus direct-to-backend p50' +
  (direct50 !== null ? ` ${direct50}µs` : '') + ')');
const hcols = ['peer', 'tiny req/s', 'cpu µs/req', '(user+sys)', '+p50 µs @c1', 'RSS MB', 'open75 p99'];
const hrows = Object.entries(headline).map(([p, h]) => [p, fmtN(h.tiny_rps), fmtN(h.cpu_us_per_req, 1),
  h.user_us_per_req === null ? '-' : `${fmtN(h.user_us_per_req, 1)}+${fmtN(h.sys_us_per_req, 1)}`,
  fmtN(h.added_p50_us_c1), fmtN(h.rss_mb, 1), fmtUs(h.open75_p99_us)]);
const hw = hcols.map((c, i) => Math.max(c.length, ...hrows.map((r) => String(r[i]).length)));
const hline = (r) => r.map((c, i) => (i === 0 ? String(c).padEnd(hw[i]) : String(c).padStart(hw[i]))).join('  ');
console.log(hline(hcols));
for (const r of hrows) console.log(hline(r));

// ---------------------------------------------------------------- ratios
const ratio = (a, b) => (a === null || b === null || !b ? null : a / b);
const ratios = {};
const drovers = peers.filter((p) => p.startsWith('drover'));
const refs = ['nginx-lc', 'haproxy-lc'];
console.log('');
if (!drovers.length) {
  console.log('ratios: no drover peer was measured (binary missing or failed to start)');
} else {
  console.log('ratios (drover / peer): throughput on tiny (higher is better; target ≥ 1.2 nginx, ≥ 1.1 HAProxy),');
  console.log('                        p99 on mixed (lower is better; target open75 ≤ 0.8 HAProxy leastconn)');
  const rc = ['drover', 'vs', 'tiny rps', 'closed p99', 'open50 p99', 'open75 p99', 'cpu/req'];
  const rr = [];
  for (const d of drovers) {
    for (const ref of refs) {
      if (!medians[ref]) continue;
      const r = {
        tiny_throughput: ratio(get(d, 'tiny-c50', 'rps'), get(ref, 'tiny-c50', 'rps')),
        mixed_closed_p99: ratio(get(d, 'mixed-closed', 'p99'), get(ref, 'mixed-closed', 'p99')),
        mixed_open50_p99: ratio(get(d, 'mixed-open50', 'p99'), get(ref, 'mixed-open50', 'p99')),
        mixed_open75_p99: ratio(get(d, 'mixed-open75', 'p99'), get(ref, 'mixed-open75', 'p99')),
        cpu_per_request: ratio(get(d, 'tiny-c50', 'cpu_us_per_req'), get(ref, 'tiny-c50', 'cpu_us_per_req')),
      };
      (ratios[d] ||= {})[ref] = r;
      const f = (v) => (v === null ? '-' : `${v.toFixed(2)}x`);
      rr.push([d, ref, f(r.tiny_throughput), f(r.mixed_closed_p99), f(r.mixed_open50_p99), f(r.mixed_open75_p99), f(r.cpu_per_request)]);
    }
  }
  const rw = rc.map((c, i) => Math.max(c.length, ...rr.map((r) => String(r[i]).length)));
  const rl = (r) => r.map((c, i) => (i < 2 ? String(c).padEnd(rw[i]) : String(c).padStart(rw[i]))).join('  ');
  console.log(rl(rc));
  for (const r of rr) console.log(rl(r));
}

if (outPath) {
  fs.writeFileSync(outPath, JSON.stringify({ meta, medians, headline, ratios, raw: rawPath }, null, 2) + '\n');
}
