#!/usr/bin/env node
// Reads a load generator's output on stdin and prints its figures as one JSON object:
//
//   wrk --latency ... | node parse.js wrk       {"rps", "p50_ms", "p99_ms", "errors"}
//   ab ...           | node parse.js ab        {"rps", "mean_ms", "p50_ms", "p99_ms", "failed", "non2xx"}
//   loadtest ...     | node parse.js loadtest  {"completed", "errors", "rps" (effective), "mean_ms", "p50_ms", "p99_ms"}
//   siege ...        | node parse.js siege     {"transactions", "failed", "rps", "mean_ms", "availability"}
'use strict';

const kind = process.argv[2];
const text = require('node:fs').readFileSync(0, 'utf8');
const num = (re) => {
  const m = text.match(re);
  return m ? Number(m[1]) : null;
};
const ms = (v, unit) => Number(v) * { us: 1e-3, ms: 1, s: 1e3, m: 6e4 }[unit];
const wrkLat = (q) => {
  const m = text.match(new RegExp(`^\\s*${q}%\\s+([0-9.]+)(us|ms|s|m)\\s*$`, 'm'));
  return m ? ms(m[1], m[2]) : null;
};

let out;
switch (kind) {
  case 'wrk': {
    const sock = text.match(/Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/);
    out = {
      rps: num(/Requests\/sec:\s+([0-9.]+)/),
      p50_ms: wrkLat(50),
      p99_ms: wrkLat(99),
      errors: (num(/Non-2xx or 3xx responses:\s+(\d+)/) || 0) + (sock ? sock.slice(1).reduce((a, b) => a + Number(b), 0) : 0),
    };
    break;
  }
  case 'ab':
    out = {
      rps: num(/Requests per second:\s+([0-9.]+)/),
      mean_ms: num(/Time per request:\s+([0-9.]+) \[ms\] \(mean\)/),
      p50_ms: num(/^\s*50%\s+(\d+)/m),
      p99_ms: num(/^\s*99%\s+(\d+)/m),
      failed: num(/Failed requests:\s+(\d+)/),
      non2xx: num(/Non-2xx responses:\s+(\d+)/) || 0,
    };
    break;
  case 'loadtest':
    out = {
      completed: num(/Completed requests:\s+(\d+)/),
      errors: num(/Total errors:\s+(\d+)/),
      rps: num(/Effective rps:\s+([0-9.]+)/),
      mean_ms: num(/Mean latency:\s+([0-9.]+) ms/),
      p50_ms: num(/^\s*50%\s+([0-9.]+) ms/m),
      p99_ms: num(/^\s*99%\s+([0-9.]+) ms/m),
    };
    break;
  case 'siege':
    out = {
      transactions: num(/"transactions":\s*([0-9.]+)/) ?? num(/Transactions:\s+([0-9.]+)/),
      failed: num(/"failed_transactions":\s*([0-9.]+)/) ?? num(/Failed transactions:\s+([0-9.]+)/),
      rps: num(/"transaction_rate":\s*([0-9.]+)/) ?? num(/Transaction rate:\s+([0-9.]+)/),
      mean_ms: (num(/"response_time":\s*([0-9.]+)/) ?? num(/Response time:\s+([0-9.]+)/)) * 1000,
      availability: num(/"availability":\s*([0-9.]+)/) ?? num(/Availability:\s+([0-9.]+)/),
    };
    break;
  default:
    console.error('usage: parse.js wrk|ab|loadtest|siege < output');
    process.exit(2);
}
console.log(JSON.stringify(out));
