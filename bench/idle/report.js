#!/usr/bin/env node
// Tables of bench/idle.sh: `node bench/idle/report.js bench/results/idle-raw-STAMP.jsonl`.
// Per peer: bytes per idle connection in each round and the median over rounds (valid
// measurements only: every connection answered and still open at the reading), RSS before
// and after (medians), then drover / nginx and drover / HAProxy.
'use strict';
const fs = require('fs');
const path = require('path');
const median = require(path.join(__dirname, '..', 'median.js'));

const recs = fs.readFileSync(process.argv[2], 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
if (!recs.length) {
  console.log('no measurements');
  process.exit(1);
}
const peers = [...new Set(recs.map((r) => r.peer))];
const rounds = Math.max(...recs.map((r) => r.round));
const conns = recs[0].conns;
const med = {};

console.log(`\nbytes of RSS per idle keep-alive connection, ${conns} connections (lower is better)\n`);
const roundCols = Array.from({ length: rounds }, (_, i) => `round ${i + 1}`.padStart(9)).join('');
console.log(`${'peer'.padEnd(12)}${'median'.padStart(8)}${roundCols}${'RSS before'.padStart(12)}${'RSS after'.padStart(11)}  binary`);
for (const p of peers) {
  const mine = recs.filter((r) => r.peer === p);
  const valid = mine.filter((r) => r.valid);
  med[p] = median(valid.map((r) => r.bytes_per_conn));
  const cells = [];
  for (let i = 1; i <= rounds; i++) {
    const r = mine.find((x) => x.round === i);
    cells.push((r ? `${Math.round(r.bytes_per_conn)}${r.valid ? '' : '!'}` : '-').padStart(9));
  }
  const mb = (kb) => (kb === null ? '-' : `${(kb / 1024).toFixed(1)} MiB`);
  const before = median(valid.map((r) => r.rss_before_kb));
  const after = median(valid.map((r) => r.rss_after_kb));
  console.log(`${p.padEnd(12)}${(med[p] === null ? '-' : String(Math.round(med[p]))).padStart(8)}${cells.join('')}` +
    `${mb(before).padStart(12)}${mb(after).padStart(11)}  ${mine[0].label}`);
}
if (recs.some((r) => !r.valid)) console.log('\n! invalid: a connection failed or was closed before the reading; not in the median');

const drovers = peers.filter((p) => p.startsWith('drover'));
const others = peers.filter((p) => !p.startsWith('drover'));
if (drovers.length && others.length) {
  console.log('\nratios (bytes per idle connection, lower is better)');
  for (const d of drovers) {
    const parts = others.map((o) => `${d} / ${o} = ${med[d] && med[o] ? (med[d] / med[o]).toFixed(2) : '-'}`);
    console.log(`  ${parts.join('   ')}`);
  }
}
