#!/usr/bin/env node
// One sweep record from drover bench's JSON: `node record.js META_JSON "SAMPLE WORDS" < out`
// where out has one JSON line per run (a burst has one per on-phase). Prints one line:
// the meta, the sample's parameters and the result the report compares.
//   thr  closed loop: answered 2xx per second of the run; open loop: 2xx per second of
//        the schedule (the offered rate when every request is answered), so a peer is
//        not credited or charged for how long its tail took to drain
//   p99  over all of the runs' requests; for several on-phases it is merged from each
//        run's percentile spectrum (a step function, read conservatively)
//   work CPU time asked for per second of the run (each path's requests x its /cpu cost,
//        in ms/s): in a closed loop with mixed costs, req/s depends on which requests a
//        peer served, and a peer that lets heavy requests wait serves more light ones;
//        work is what the workers did, whatever the mix
//   Lines `before {...}` are the results of the `overload` load that ran just before the
//   measurement (bench/sweep.sh, before()): its requests waited in the backlog that the
//   measurement starts with, so p99, max and errors are over them too; thr, work and the
//   workers' shares are the measurement's alone.
//   reached, even  how many workers answered (by x-backend), and the smallest worker's
//        share of the answers x the sample's workers (1 = even, 0 = a worker got none):
//        not a target, since load-aware placement gives a busy worker less; the report
//        flags a worker drover left out while a peer reached them all (bench/README.md)
'use strict';
const fs = require('fs');
const meta = JSON.parse(process.argv[2]);
const params = {};
for (const kv of process.argv[3].split(' ')) {
  const i = kv.indexOf('=');
  const v = kv.slice(i + 1);
  params[kv.slice(0, i)] = v !== '' && !Number.isNaN(Number(v)) ? Number(v) : v;
}
const lines = fs.readFileSync(0, 'utf8').split('\n');
const runs = lines.filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
const beforeRuns = lines.filter((l) => l.startsWith('before {')).map((l) => JSON.parse(l.slice('before '.length)));
const sum = (f) => runs.reduce((a, r) => a + f(r), 0);
let result = null;
if (runs.length) {
  const open = runs[0].mode === 'open';
  const ok = sum((r) => r.ok);
  const requests = sum((r) => r.requests);
  // The requests whose latency and errors count: the measurement's and its before's.
  const all = [...runs, ...beforeRuns];
  const sumAll = (f) => all.reduce((a, r) => a + f(r), 0);
  let p99 = all[0].latency_us.p99;
  if (all.length > 1) {
    // Smallest latency v at which at least 99 % of all requests are <= v.
    const below = (r, v) => {
      let pct = 0;
      for (const s of r.spectrum) if (s.latency_us <= v) pct = s.percentile;
      return (pct / 100) * r.latency_us.count;
    };
    const cands = [...new Set(all.flatMap((r) => r.spectrum.map((s) => s.latency_us)))].sort((a, b) => a - b);
    const total = sumAll((r) => r.latency_us.count);
    p99 = cands.find((v) => sumAll((r) => below(r, v)) >= 0.99 * total) ?? Math.max(...all.map((r) => r.latency_us.max));
  }
  const costMs = (path) => {
    const m = /[?&](us|ms)=([0-9.]+)/.exec(path);
    return m ? Number(m[2]) / (m[1] === 'us' ? 1000 : 1) : 0;
  };
  const work = sum((r) => Object.entries(r.paths || {}).reduce((a, [path, v]) => a + v.requests * costMs(path), 0));
  // The light requests' own p99 (the cheapest path's), where one run holds them all: on
  // a sample whose heavy share is above 1 %, the overall p99 is a heavy request's latency,
  // and no balancer takes it below that request's own cost; the light requests' tail is
  // what placement still decides there.
  let p99Light = null;
  if (runs.length === 1 && runs[0].paths && Object.keys(runs[0].paths).length > 1) {
    const [, light] = Object.entries(runs[0].paths).reduce((a, e) => (costMs(e[0]) < costMs(a[0]) ? e : a));
    p99Light = light.latency_us.p99;
  }
  const errors = {};
  for (const r of all) for (const [k, v] of Object.entries(r.errors)) errors[k] = (errors[k] || 0) + v;
  const counts = {};
  for (const r of runs) for (const [k, v] of Object.entries(r.header_counts?.values || {})) counts[k] = (counts[k] || 0) + v;
  const answered = Object.values(counts);
  const answeredAll = answered.reduce((a, v) => a + v, 0);
  const reached = answered.length;
  const even = answeredAll && reached >= params.workers ? Math.round((Math.min(...answered) / answeredAll) * params.workers * 100) / 100 : 0;
  result = {
    thr: Math.round((ok / sum((r) => (open ? r.duration_s : r.elapsed_s))) * 10) / 10,
    work: Math.round(work / sum((r) => (open ? r.duration_s : r.elapsed_s))),
    p50: runs.length === 1 ? runs[0].latency_us.p50 : null,
    p99,
    p99_light: p99Light,
    max: Math.max(...all.map((r) => r.latency_us.max)),
    requests,
    ok,
    errors_total: sumAll((r) => r.errors_total),
    before_requests: beforeRuns.length ? beforeRuns.reduce((a, r) => a + r.requests, 0) : undefined,
    errors,
    connections_opened: sum((r) => r.connections_opened),
    phases: runs.length,
    reached,
    even,
  };
}
console.log(JSON.stringify({ ...meta, params, result }));
