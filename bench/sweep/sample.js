#!/usr/bin/env node
// The sweep's samples: `node bench/sweep/sample.js SEED INDEX [HEAVY_MAX_US]` prints sample
// INDEX of the sweep seeded SEED as one line of shell words (KEY=VALUE), the same on every
// machine, so `bash bench/sweep.sh --seed S --only I` measures exactly that sample again.
//
// The class (issue 20, item 4), each parameter drawn on its own:
//   mode      proxy (drover proxy in front of N node backends) | run (drover run -w N)
//   workers   2..8
//   heavy     share of heavy requests, 1..30 %          (log-uniform: small shares are the
//   ratio     heavy:light cost, 10..1000 x              common case and the hard one for
//   light_us  light request's CPU cost, 100..5000 µs    a p99, so they get their share)
//   arrivals  poisson (open loop at load 0.25..0.9 of the capacity measured for the sample)
//             | burst (on/off: on-phases at 1..3 x capacity, off until the backlog drains)
//             | closed (1..500 connections, log-uniform)
//   conn      keepalive | new (a new connection per request: Connection: close)
//   health    on | off (active health checks where the peer has them)
//   before    what the peer served just before the measurement, the same for every peer
//             (drawn last, so the samples of a seed drawn before it are unchanged):
//               none        nothing since the warm-up (half of the samples)
//               one-client  one keep-alive connection in a closed loop: under drover run
//                           every request of it stays on one worker, as under cluster
//               overload    an open loop at 2 x capacity, measured from it at once: the
//                           measurement starts with the backlog it left
//               heavy-only  only the mix's heavy requests, a closed loop of 2 per worker:
//                           whatever a peer learnt of the costs is wrong when the mix comes
// The heavy cost is capped at HEAVY_MAX_US (default 250 ms): a 5 ms light request x 1000
// would be a 5 s request, which a measurement of a few seconds cannot hold.
'use strict';
const [seed, index] = [Number(process.argv[2] ?? 1), Number(process.argv[3] ?? 0)];
const heavyMaxUs = Number(process.argv[4] ?? 250000);

// mulberry32 on a hash of (seed, index): each sample has its own stream, so a sample does
// not change when the number of samples does.
let a = (Math.imul(seed ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(index + 1, 0xc2b2ae35)) >>> 0;
function rnd() {
  a = (a + 0x6d2b79f5) >>> 0;
  let t = a;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
for (let i = 0; i < 4; i++) rnd(); // let the hash settle
const uni = (lo, hi) => lo + (hi - lo) * rnd();
const logUni = (lo, hi) => Math.exp(uni(Math.log(lo), Math.log(hi)));
const pick = (xs) => xs[Math.floor(rnd() * xs.length)];

const s = {};
s.mode = pick(['proxy', 'run']);
s.workers = 2 + Math.floor(rnd() * 7);
s.heavy_pct = Math.round(logUni(1, 30) * 10) / 10;
s.ratio = Math.round(logUni(10, 1000));
s.light_us = Math.round(logUni(100, 5000));
s.heavy_us = Math.min(heavyMaxUs, s.light_us * s.ratio);
s.arrivals = pick(['poisson', 'burst', 'closed']);
s.conns = s.arrivals === 'closed' ? Math.round(logUni(1, 500)) : 0;
s.load = s.arrivals === 'poisson' ? Math.round(uni(0.25, 0.9) * 100) / 100 : s.arrivals === 'burst' ? Math.round(uni(1, 3) * 100) / 100 : 0;
s.conn = pick(['keepalive', 'new']);
s.health = pick(['on', 'off']);
s.before = pick(['none', 'none', 'none', 'one-client', 'overload', 'heavy-only']);
// The mix for drover bench: weights in tenths of a percent.
const hw = Math.round(s.heavy_pct * 10);
s.mix = `${1000 - hw}:/cpu?us=${s.light_us},${hw}:/cpu?us=${s.heavy_us}`;
console.log(Object.entries(s).map(([k, v]) => `${k}=${v}`).join(' '));
