#!/usr/bin/env node
// The workload-matrix table from bench/matrix.sh's raw records: medians over rounds, one
// row per workload, each peer's figures, drover ÷ best peer and PASS/MISS per row.
//
//   node bench/matrix/report.js bench/results/matrix-raw-STAMP.jsonl [META.json] [SUMMARY_OUT.json]
//   node bench/matrix/report.js --line RECORD_JSON      (one progress line, used by matrix.sh)
//
// Targets (the workload matrix), for every drover peer against the best of the
// others: throughput >= 0.95 x the best peer's, p99 <= 1.05 x the best peer's, an error
// share no more than 0.1 point above the best peer's; light-seq rows: every backend's
// share between 1/(2N) and 2/N; long-lived: no more failed long-lived connections than
// the best peer.
'use strict';
const fs = require('fs');

const ROWS = ['cpu-mixed-closed', 'cpu-mixed-open75', 'io-c10', 'io-c10-cold', 'io-c100', 'io-c100-cold',
  'io-c1000', 'io-c1000-cold', 'long-lived', 'light-seq', 'light-seq-newconn', 'hetero', 'hetero-io',
  'degrade', 'fail-fast', 'burst'];
const TPUT_MIN = 0.95;
const P99_MAX = 1.05;
const ERR_SLACK = 0.001;
const isDrover = (p) => p === 'drover' || p.startsWith('drover-');

const median = require('../median');

// One record -> the figures the table uses.
function normalise(r) {
  const x = r.result;
  if (!x) return null;
  const elapsed = x.elapsed_s || 0;
  const requests = x.requests || 0;
  const errors = x.errors_total || 0;
  const ok = x.ok ?? requests - errors;
  // client.js reports the 2xx answers' latency apart; drover bench all answers'.
  const lat = (r.client === 'client' ? x.ok_latency_us : x.latency_us) || {};
  const n = {
    tput: elapsed ? ok / elapsed : null, // successful answers per second
    requests, errors, err_share: requests ? errors / requests : null,
    p50: lat.p50 ?? null, p99: lat.p99 ?? null, max: lat.max ?? null,
    cpu_us_per_req: r.clk_tck && requests ? (r.cpu_ticks * 1e6) / r.clk_tck / requests : null,
    rss_kb: r.rss_kb || null, backends: r.backends || null,
    share_min: null, share_max: null, shares: null,
    ll_failed: null, ll_opened: null, ll_completed: null,
  };
  const hc = x.header_counts;
  if (hc && r.backends) {
    const vals = Object.values(hc.values || {});
    const total = vals.reduce((a, b) => a + b, 0) + (hc.other || 0) + (hc.missing || 0);
    if (total) {
      const shares = vals.map((v) => v / total).sort((a, b) => b - a);
      while (shares.length < r.backends) shares.push(0);
      n.shares = Object.fromEntries(Object.entries(hc.values).sort().map(([k, v]) => [k, v / total]));
      n.share_min = Math.min(...shares);
      n.share_max = Math.max(...shares);
    }
  }
  if (r.longlived) {
    n.ll_failed = r.longlived.failed;
    n.ll_opened = r.longlived.opened;
    n.ll_completed = r.longlived.completed;
    n.ll_failures = r.longlived.failures;
  } else if (r.row === 'long-lived') {
    n.ll_failed = null;
  }
  return n;
}

// ---------------------------------------------------------------- formatting
const fmtRate = (v) => (v === null ? '-' : v >= 100 ? `${Math.round(v)}` : v >= 10 ? v.toFixed(1) : v.toFixed(2));
const fmtLat = (us) => (us === null ? '-' : us >= 1e6 ? `${(us / 1e6).toFixed(2)}s` : us >= 1e4 ? `${(us / 1e3).toFixed(0)}ms` : us >= 1e3 ? `${(us / 1e3).toFixed(1)}ms` : `${(us / 1e3).toFixed(2)}ms`);
const fmtPct = (v) => (v === null ? '-' : v === 0 ? '0%' : v < 0.001 ? '<0.1%' : v < 0.1 ? `${(v * 100).toFixed(1)}%` : `${Math.round(v * 100)}%`);
const fmtRatio = (v) => (v === null || !Number.isFinite(v) ? '-' : v.toFixed(2));

if (process.argv[2] === '--line') {
  const r = JSON.parse(process.argv[3]);
  const n = normalise(r);
  if (!n) { console.log(`  r${r.round} ${r.peer.padEnd(12)} ${r.row.padEnd(18)} no result${r.error ? ` (${r.error})` : ''}`); process.exit(0); }
  const parts = [`${fmtRate(n.tput).padStart(7)} ok/s`, `p50 ${fmtLat(n.p50)}`, `p99 ${fmtLat(n.p99)}`, `errors ${n.errors} (${fmtPct(n.err_share)})`];
  if (n.shares) parts.push(`per backend ${Object.entries(n.shares).map(([k, v]) => `${k} ${fmtPct(v)}`).join(' ')}`);
  if (r.longlived) parts.push(`long-lived failed ${n.ll_failed}/${n.ll_opened}${n.ll_failed ? ` ${JSON.stringify(n.ll_failures)}` : ''}`);
  if (n.cpu_us_per_req !== null) parts.push(`cpu/req ${n.cpu_us_per_req.toFixed(0)}µs`);
  console.log(`  r${r.round} ${r.peer.padEnd(12)} ${r.row.padEnd(18)} ${parts.join('  ')}`);
  process.exit(0);
}

const [rawPath, metaPath, outPath] = process.argv.slice(2);
if (!rawPath) {
  console.error('usage: node bench/matrix/report.js RAW.jsonl [META.json] [SUMMARY_OUT.json]');
  process.exit(2);
}
let meta = {};
if (metaPath) meta = JSON.parse(fs.readFileSync(metaPath, 'utf8'));
else {
  const guess = rawPath.replace('matrix-raw-', 'matrix-meta-').replace(/\.jsonl$/, '.json');
  if (guess !== rawPath && fs.existsSync(guess)) meta = JSON.parse(fs.readFileSync(guess, 'utf8'));
}
const records = fs.readFileSync(rawPath, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));

// ---------------------------------------------------------------- medians
const FIELDS = ['tput', 'requests', 'errors', 'err_share', 'p50', 'p99', 'max', 'cpu_us_per_req', 'rss_kb', 'backends', 'share_min', 'share_max', 'll_failed', 'll_opened', 'll_completed'];
const med = {}; // row -> peer -> medians
const peerOrder = [];
for (const r of records) {
  if (!peerOrder.includes(r.peer)) peerOrder.push(r.peer);
  ((med[r.row] ||= {})[r.peer] ||= []).push({ n: normalise(r), round: r.round });
}
for (const row of Object.keys(med)) {
  for (const peer of Object.keys(med[row])) {
    const runs = med[row][peer];
    const ok = runs.map((x) => x.n).filter(Boolean);
    const m = { rounds: ok.length, failed_rounds: runs.length - ok.length };
    for (const f of FIELDS) m[f] = median(ok.map((n) => n[f]));
    m.p99_by_round = runs.map((x) => (x.n ? x.n.p99 : null));
    m.tput_by_round = runs.map((x) => (x.n ? x.n.tput : null));
    med[row][peer] = m;
  }
}
const peers = [...peerOrder].sort((a, b) => (isDrover(b) - isDrover(a)) || peerOrder.indexOf(a) - peerOrder.indexOf(b));
const drovers = peers.filter(isDrover);
const others = peers.filter((p) => !isDrover(p));
const rows = [...ROWS.filter((r) => med[r]), ...Object.keys(med).filter((r) => !ROWS.includes(r))];

// ---------------------------------------------------------------- verdicts
const summary = { meta, targets: { tput_min: TPUT_MIN, p99_max: P99_MAX, err_slack: ERR_SLACK }, rows: {} };
const pick = (row, f, better) => {
  let best = null;
  for (const p of others) {
    const v = med[row][p] && med[row][p][f];
    if (v === null || v === undefined) continue;
    if (!best || better(v, best.value)) best = { peer: p, value: v };
  }
  return best;
};
for (const row of rows) {
  const best = {
    tput: pick(row, 'tput', (a, b) => a > b),
    p99: pick(row, 'p99', (a, b) => a < b),
    err_share: pick(row, 'err_share', (a, b) => a < b),
    ll_failed: row === 'long-lived' ? pick(row, 'll_failed', (a, b) => a < b) : null,
  };
  const verdicts = {};
  for (const d of drovers) {
    const m = med[row][d];
    if (!m || !m.rounds) { verdicts[d] = { verdict: 'NO DATA', checks: {} }; continue; }
    const checks = {};
    const tputRatio = best.tput && best.tput.value ? m.tput / best.tput.value : null;
    const p99Ratio = best.p99 && best.p99.value ? m.p99 / best.p99.value : null;
    if (tputRatio !== null) checks.tput = tputRatio >= TPUT_MIN;
    if (p99Ratio !== null) checks.p99 = p99Ratio <= P99_MAX;
    if (m.err_share !== null) checks.err = m.err_share <= (best.err_share ? best.err_share.value : 0) + ERR_SLACK;
    if (row.startsWith('light-seq') && m.share_min !== null) {
      const nb = m.backends || 3;
      checks.share = m.share_min >= 1 / (2 * nb) && m.share_max <= 2 / nb;
    }
    if (row === 'long-lived') checks.longlived = m.ll_failed !== null && m.ll_failed <= (best.ll_failed ? best.ll_failed.value : 0);
    const missed = Object.entries(checks).filter(([, v]) => !v).map(([k]) => k);
    verdicts[d] = { tput_ratio: tputRatio, p99_ratio: p99Ratio, checks, verdict: missed.length ? `MISS ${missed.join(',')}` : 'PASS' };
  }
  summary.rows[row] = { peers: med[row], best, drover: verdicts };
}

// ---------------------------------------------------------------- the table
const showErr = (row) => ['degrade', 'fail-fast', 'burst', 'long-lived'].includes(row) || others.concat(drovers).some((p) => med[row][p] && med[row][p].errors);
function cell(row, p) {
  const m = med[row][p];
  if (!m) return 'n/a';
  if (!m.rounds) return 'failed';
  let s;
  if (row.startsWith('light-seq')) s = `${fmtPct(m.share_min)}-${fmtPct(m.share_max)} ${fmtLat(m.p99)}`;
  else s = `${fmtRate(m.tput)}/s ${fmtLat(m.p99)}`;
  if (showErr(row)) s += ` e${fmtPct(m.err_share)}`;
  if (row === 'long-lived') s += ` f${m.ll_failed === null ? '?' : Math.round(m.ll_failed)}`;
  return s;
}
const header = ['row', ...peers];
for (const d of drovers) {
  const pre = drovers.length > 1 ? `${d} ` : '';
  header.push(`${pre}tput÷best`, `${pre}p99÷best`, `${pre}verdict`);
}
const table = [header];
for (const row of rows) {
  const line = [row, ...peers.map((p) => cell(row, p))];
  for (const d of drovers) {
    const v = summary.rows[row].drover[d];
    line.push(fmtRatio(v.tput_ratio), fmtRatio(v.p99_ratio), v.verdict);
  }
  table.push(line);
}
const widths = header.map((_, i) => Math.max(...table.map((l) => String(l[i]).length)));
const print = (l) => console.log(l.map((c, i) => (i === 0 ? String(c).padEnd(widths[i]) : String(c).padStart(widths[i]))).join('  '));
console.log('');
const when = meta.stamp ? ` (${meta.stamp})` : '';
console.log(`Workload matrix${when}: medians over ${meta.rounds ?? '?'} round(s); drover = ${meta.drover || 'drover'}`);
print(table[0]);
console.log(widths.map((w) => '-'.repeat(w)).join('  '));
for (const l of table.slice(1)) print(l);
const passed = drovers.map((d) => `${d}: ${rows.filter((r) => summary.rows[r].drover[d].verdict === 'PASS').length}/${rows.length} rows PASS`);
console.log('');
console.log(`Cells: successful answers/s, p99 (e = share of requests with an error: non-2xx, reset, timeout; f = failed long-lived connections;`);
console.log(`light-seq: smallest-largest share of requests per backend, then p99). Ratios: drover ÷ the best other peer (throughput: highest;`);
console.log(`p99: lowest). Targets: throughput >= ${TPUT_MIN}, p99 <= ${P99_MAX}, error share <= the best peer's + ${ERR_SLACK * 100} point,`);
console.log(`light-seq every backend between 1/(2N) and 2/N, long-lived no more failures than the best peer. ${passed.join('; ')}`);
if (meta.duration_s) {
  console.log(`Durations: ${meta.duration_s}s per measurement, cold rows the first ${meta.cold_s}s after a fresh start, long-lived ${meta.long_s}s, burst ${meta.burst_s}s; warm-up ${meta.warmup_s}s; capacity ${meta.capacity_rps ?? '-'} req/s (${meta.capacity_from || '-'}).`);
}
if (outPath) fs.writeFileSync(outPath, JSON.stringify(summary, null, 1) + '\n');
