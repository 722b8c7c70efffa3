#!/usr/bin/env node
// Reads the JSON lines the run-*.sh scripts record ({"system", "round", figures...}) and
// prints each round, then a Markdown table of each figure's median per system.
//
//   node examples/seeds/median.js results.jsonl rps p99_ms ...
'use strict';

const fs = require('node:fs');

const [file, ...figures] = process.argv.slice(2);
const rows = fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
const systems = [...new Set(rows.map((r) => r.system))];

function median(xs) {
  const v = xs.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const m = Math.floor(v.length / 2);
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}
const fmt = (x) => (x === null ? 'n/a' : Math.abs(x) >= 100 ? String(Math.round(x)) : String(+x.toPrecision(3)));

console.log('rounds:');
for (const r of rows) {
  console.log(`  round ${r.round} ${r.system}: ` + figures.map((f) => `${f}=${r[f] === undefined ? 'n/a' : fmt(r[f])}`).join(' ') + (r.note ? ` (${r.note})` : ''));
}
console.log(`\nmedians of ${Math.max(...rows.map((r) => r.round))} rounds:\n`);
console.log(`| system | ${figures.join(' | ')} |`);
console.log(`|---|${figures.map(() => '---:').join('|')}|`);
for (const s of systems) {
  const mine = rows.filter((r) => r.system === s);
  console.log(`| ${s} | ${figures.map((f) => fmt(median(mine.map((r) => r[f])))).join(' | ')} |`);
}
