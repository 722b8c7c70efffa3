#!/usr/bin/env node
// Summarises bench/cluster.sh records: medians over rounds, tables, and drover's ratios
// to Node cluster and PM2.
//
//   node bench/cluster-report.js RAW.jsonl [META.json] [SUMMARY_OUT.json]
//   node bench/cluster-report.js --line RECORD_JSON      (one progress line, on stdout)
'use strict';
const fs = require('fs');

const median = (xs) => {
  const v = xs.filter((x) => typeof x === 'number' && !Number.isNaN(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const m = v.length >> 1;
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
};
const sum = (xs) => xs.reduce((a, b) => a + b, 0);
const fmtUs = (v) => (v == null ? '-' : v >= 10000 ? `${(v / 1000).toFixed(1)}ms` : v >= 1000 ? `${(v / 1000).toFixed(2)}ms` : `${Math.round(v)}µs`);
const fmtN = (v, d = 0) => (v == null ? '-' : v.toFixed(d));
const fmtMB = (kb) => (kb == null ? '-' : (kb / 1024).toFixed(1));
const fmtR = (v) => (v == null ? '-' : v.toFixed(2));

// Worker keys in natural order (worker 2 before worker 10, numbers before text).
const natural = (a, b) => {
  const x = /^\d+$/.test(a), y = /^\d+$/.test(b);
  return x && y ? Number(a) - Number(b) : x ? -1 : y ? 1 : a < b ? -1 : a > b ? 1 : 0;
};

// Requests per worker as percentages, "50.1/49.9"; "-" when no response named its worker.
function spread(hc) {
  if (!hc) return '-';
  const keys = Object.keys(hc.values || {}).sort(natural);
  const total = sum(keys.map((k) => hc.values[k])) + (hc.other || 0) + (hc.missing || 0);
  if (!keys.length || !total) return '-';
  let s = keys.map((k) => ((hc.values[k] * 100) / total).toFixed(1)).join('/');
  if (hc.other) s += ` +other ${((hc.other * 100) / total).toFixed(1)}`;
  if (hc.missing) s += ` (no header ${((hc.missing * 100) / total).toFixed(1)}%)`;
  return s;
}

function normalise(r) {
  const x = r.result;
  if (!x) return { failed: true };
  const l = x.latency_us || {};
  const perReq = (ticks) => (x.requests ? (ticks * 1e6) / r.clk_tck / x.requests : null);
  const wrss = r.worker_rss_kb || [];
  return {
    rps: x.rps,
    requests: x.requests,
    p50: l.p50, p90: l.p90, p99: l.p99, p999: l.p99_9, max: l.max,
    errors: x.errors_total ?? 0,
    primary_rss_kb: r.primary_rss_kb || null,
    primary_hwm_kb: r.primary_hwm_kb || null,
    workers_rss_kb: wrss.length ? sum(wrss) : null,
    worker_rss_kb_each: wrss.length ? sum(wrss) / wrss.length : null,
    primary_cpu_us_per_req: perReq(r.primary_ticks),
    all_cpu_us_per_req: perReq(r.primary_ticks + r.worker_ticks),
    header_counts: x.header_counts || null,
    offered: x.rate ?? null,
  };
}

if (process.argv[2] === '--line') {
  const r = JSON.parse(process.argv[3]);
  const n = normalise(r);
  if (n.failed) {
    console.log(`  r${r.round} ${r.peer.padEnd(14)} ${r.scenario.padEnd(13)} no result`);
  } else {
    const offered = n.offered ? ` (of ${fmtN(n.offered)})` : '';
    console.log(`  r${r.round} ${r.peer.padEnd(14)} ${r.scenario.padEnd(13)} ${fmtN(n.rps).padStart(6)} req/s${offered}  ` +
      `p50 ${fmtUs(n.p50)}  p99 ${fmtUs(n.p99)}  max ${fmtUs(n.max)}  errors ${n.errors}  ` +
      `per worker ${spread(n.header_counts)}  primary ${fmtMB(n.primary_rss_kb)}MB ` +
      `${fmtN(n.primary_cpu_us_per_req, 1)}µs/req  workers ${fmtMB(n.workers_rss_kb)}MB`);
  }
  process.exit(0);
}

const [rawPath, metaPath, outPath] = process.argv.slice(2);
if (!rawPath) {
  console.error('usage: node bench/cluster-report.js RAW.jsonl [META.json] [SUMMARY_OUT.json]');
  process.exit(2);
}
const meta = metaPath ? JSON.parse(fs.readFileSync(metaPath, 'utf8')) : {};
const records = fs.readFileSync(rawPath, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));

const PEER_ORDER = ['node', 'node-cluster', 'pm2', 'drover-rr', 'drover-p2c', 'drover-shared'];
const rank = (p) => (PEER_ORDER.includes(p) ? PEER_ORDER.indexOf(p) : PEER_ORDER.length);
const peers = [...new Set(records.map((r) => r.peer))].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
const scenarios = [...new Set(records.map((r) => r.scenario))];
const FIELDS = ['rps', 'requests', 'p50', 'p90', 'p99', 'p999', 'max', 'errors', 'primary_rss_kb', 'primary_hwm_kb',
  'workers_rss_kb', 'worker_rss_kb_each', 'primary_cpu_us_per_req', 'all_cpu_us_per_req'];

// Per worker, counts are summed over rounds: worker ids stay put within a peer's run.
function sumCounts(rows) {
  const out = { values: {}, other: 0, missing: 0 };
  let any = false;
  for (const r of rows) {
    const hc = r.header_counts;
    if (!hc) continue;
    any = true;
    for (const [k, v] of Object.entries(hc.values || {})) out.values[k] = (out.values[k] || 0) + v;
    out.other += hc.other || 0;
    out.missing += hc.missing || 0;
  }
  return any ? out : null;
}

const medians = {};
for (const peer of peers) {
  for (const scen of scenarios) {
    const recs = records.filter((r) => r.peer === peer && r.scenario === scen).sort((a, b) => a.round - b.round);
    const rows = recs.map(normalise);
    if (!rows.length) continue;
    const ok = rows.filter((r) => !r.failed);
    const m = { rounds: ok.length, failed_rounds: rows.length - ok.length };
    for (const f of FIELDS) m[f] = median(ok.map((r) => r[f]));
    m.offered = median(ok.map((r) => r.offered));
    // How far apart the rounds were: a wide spread means the machine, not the peer, moved.
    const rps = ok.map((r) => r.rps);
    m.rps_spread = ok.length > 1 && m.rps ? (Math.max(...rps) - Math.min(...rps)) / m.rps : null;
    m.per_worker = sumCounts(ok);
    m.p99_by_round = rows.map((r) => (r.failed ? null : r.p99));
    (medians[peer] ||= {})[scen] = m;
  }
}

// Memory under load, over every measurement of a peer.
const memory = {};
for (const peer of peers) {
  const rows = records.filter((r) => r.peer === peer).map(normalise).filter((r) => !r.failed);
  memory[peer] = {
    primary_rss_kb: median(rows.map((r) => r.primary_rss_kb)),
    primary_hwm_kb: Math.max(0, ...rows.map((r) => r.primary_hwm_kb || 0)) || null,
    workers_rss_kb: median(rows.map((r) => r.workers_rss_kb)),
    worker_rss_kb_each: median(rows.map((r) => r.worker_rss_kb_each)),
  };
  const m = memory[peer];
  m.total_rss_kb = m.primary_rss_kb == null ? null : m.primary_rss_kb + (m.workers_rss_kb || 0);
}

// ---------------------------------------------------------------- tables
function table(cols, rows) {
  const w = cols.map((c, i) => Math.max(c.length, ...rows.map((r) => String(r[i]).length)));
  const line = (cells) => cells.map((c, i) => (i < 2 ? String(c).padEnd(w[i]) : String(c).padStart(w[i]))).join('  ');
  console.log(line(cols));
  console.log(w.map((n) => '-'.repeat(n)).join('  '));
  for (const r of rows) console.log(line(r));
}

const what = {
  node: 'one node process',
  'node-cluster': 'node cluster module, round-robin',
  pm2: `PM2 cluster mode${meta.versions?.pm2 ? ` ${meta.versions.pm2}` : ''}`,
  'drover-rr': 'drover run -s round-robin',
  'drover-p2c': 'drover run -s p2c (default)',
  'drover-shared': 'drover run --mode shared',
};

console.log('');
console.log(`drover vs Node cluster vs PM2 — ${meta.stamp || rawPath}: ${meta.workers ?? '?'} workers per peer on ` +
  `${meta.cpus ?? '?'} cores, nothing pinned, ${meta.duration_s ?? '?'}s per measurement, median of ${meta.rounds ?? '?'} round(s)`);
console.log(`pi: GET ${meta.pi_path || '/pi'}, closed loop, ${meta.closed_connections ?? 50} connections; ` +
  `mixed: ${meta.mix || '?'}`);
if (meta.capacity_rps) {
  console.log(`capacity (mixed, closed loop, round 1, ${meta.capacity_from}): ` +
    `${Math.round(meta.capacity_rps)} req/s; open loop offers a share of it, latency from each request's scheduled time`);
}
for (const n of meta.notes || []) console.log(`note: ${n}`);
console.log('');

const rows = [];
for (const scen of scenarios) {
  for (const p of peers) {
    const m = medians[p]?.[scen];
    if (!m) continue;
    rows.push([p, scen, fmtN(m.rps), fmtN(m.offered), m.rps_spread == null ? '-' : `${Math.round(m.rps_spread * 100)}%`, fmtUs(m.p50), fmtUs(m.p99), fmtUs(m.max), fmtN(m.errors),
      m.p99_by_round.map(fmtUs).join(' '), spread(m.per_worker), fmtMB(m.primary_rss_kb), fmtN(m.primary_cpu_us_per_req, 1),
      fmtMB(m.workers_rss_kb), fmtN(m.all_cpu_us_per_req, 1)]);
  }
}
table(['peer', 'scenario', 'req/s', 'offered', 'spread', 'p50', 'p99', 'max', 'errors', 'p99 by round', 'per worker %', 'primary MB',
  'primary µs/req', 'workers MB', 'all µs/req'], rows);

console.log('');
table(['peer', 'what', 'primary RSS MB', 'primary peak MB', 'per worker MB', 'total MB'],
  peers.map((p) => {
    const m = memory[p];
    return [p, what[p] || '', fmtMB(m.primary_rss_kb), fmtMB(m.primary_hwm_kb), fmtMB(m.worker_rss_kb_each), fmtMB(m.total_rss_kb)];
  }));

// ---------------------------------------------------------------- ratios
const openScens = scenarios.filter((s) => s.startsWith('mixed-open'))
  .sort((a, b) => Number(a.slice(10)) - Number(b.slice(10)));
// The targets are written for 75 % of capacity; without that run, the highest load there is.
const openScen = openScens.includes('mixed-open75') ? 'mixed-open75' : openScens[openScens.length - 1];
const get = (p, s, f) => medians[p]?.[s]?.[f] ?? null;
const ratio = (a, b) => (a == null || b == null || b === 0 ? null : a / b);
const ratios = {};
const bases = ['node-cluster', 'pm2', 'node'].filter((b) => medians[b]);
const drovers = peers.filter((p) => p.startsWith('drover'));
for (const d of drovers) {
  for (const b of bases) {
    (ratios[d] ||= {})[b] = {
      pi_rps: ratio(get(d, 'pi-closed', 'rps'), get(b, 'pi-closed', 'rps')),
      mixed_closed_rps: ratio(get(d, 'mixed-closed', 'rps'), get(b, 'mixed-closed', 'rps')),
      mixed_closed_p99: ratio(get(d, 'mixed-closed', 'p99'), get(b, 'mixed-closed', 'p99')),
      open_p99: Object.fromEntries(openScens.map((o) => [o, ratio(get(d, o, 'p99'), get(b, o, 'p99'))])),
      primary_rss: ratio(memory[d].primary_rss_kb, memory[b].primary_rss_kb),
      total_rss: ratio(memory[d].total_rss_kb, memory[b].total_rss_kb),
    };
  }
}
if (drovers.length && bases.length) {
  console.log('');
  console.log(`ratios drover / peer (throughput: higher is better; p99 and memory: lower is better)`);
  const rrows = [];
  for (const d of drovers) {
    for (const b of bases) {
      const r = ratios[d][b];
      rrows.push([d, b, fmtR(r.pi_rps), fmtR(r.mixed_closed_rps), fmtR(r.mixed_closed_p99),
        ...openScens.map((o) => fmtR(r.open_p99[o])), fmtR(r.primary_rss), fmtR(r.total_rss)]);
    }
  }
  table(['drover', 'vs', 'pi rps', 'mixed-closed rps', 'mixed-closed p99', ...openScens.map((o) => `${o} p99`),
    'primary RSS', 'total RSS'], rrows);
}

// The targets, for drover's default strategy.
const targets = [];
const check = (label, value, op, limit) => {
  if (value == null) return;
  const met = op === '<=' ? value <= limit : value >= limit;
  targets.push({ label, value, op, limit, met });
};
const dflt = ratios['drover-p2c'] || {};
if (openScen) {
  check(`${openScen} p99, drover-p2c / node-cluster`, dflt['node-cluster']?.open_p99[openScen], '<=', 0.5);
}
check('primary RSS, drover-p2c / node-cluster primary', dflt['node-cluster']?.primary_rss, '<=', 0.25);
check('primary RSS, drover-p2c / pm2 daemon', dflt.pm2?.primary_rss, '<=', 0.25);
check('pi rps, drover-shared / node-cluster', ratios['drover-shared']?.['node-cluster']?.pi_rps, '>=', 1.0);
if (targets.length) {
  console.log('');
  console.log('targets');
  for (const t of targets) {
    console.log(`  ${t.label.padEnd(48)} ${fmtR(t.value).padStart(6)}  (target ${t.op} ${t.limit})  ${t.met ? 'met' : 'MISSED'}`);
  }
}

if (outPath) {
  fs.writeFileSync(outPath, JSON.stringify({ meta, medians, memory, ratios, targets }, null, 2) + '\n');
}
