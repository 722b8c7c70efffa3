// The open-loop client of bench/fault.sh: npm loadtest (examples/seeds/tools, 8.2.1) as a
// library, so every answer is seen: a new connection per request (loadtest's default),
// --rps RATE for SECONDS, a 10 s timeout per request. Prints one JSON object: requests,
// ok, status codes, drover-error header values, transport errors by kind, p50/p99/max ms.
//
//   node bench/fault-client.mjs URL RATE SECONDS
import { loadTest } from '../examples/seeds/tools/node_modules/loadtest/index.js';

const [url, rate, seconds] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
const status = {};
const droverError = {};
const transport = {};
const lat = [];
let ok = 0;
let n = 0;
function statusCallback(error, result) {
  n++;
  if (result && result.statusCode) {
    status[result.statusCode] = (status[result.statusCode] || 0) + 1;
    if (result.statusCode < 400) ok++;
    const de = result.headers && result.headers['drover-error'];
    if (de) droverError[de] = (droverError[de] || 0) + 1;
    if (result.requestElapsed !== undefined) lat.push(result.requestElapsed);
  } else if (error) {
    // "Connection N failed: Error: connect ECONNREFUSED ..." -> ECONNREFUSED; timeouts too.
    const m = String(error).match(/\b(E[A-Z]+)\b/) || String(error).match(/(timeout|socket hang up)/i);
    const kind = m ? m[1] : String(error).slice(0, 60);
    transport[kind] = (transport[kind] || 0) + 1;
  }
}
const t0 = Date.now();
loadTest({ url, requestsPerSecond: rate, maxRequests: Math.round(rate * seconds), timeout: 10000, statusCallback, quiet: true }, (err) => {
  lat.sort((a, b) => a - b);
  const q = (p) => (lat.length ? Math.round(lat[Math.min(lat.length - 1, Math.ceil(p * lat.length) - 1)]) : null);
  console.log(JSON.stringify({
    rate, seconds, elapsed_s: (Date.now() - t0) / 1000, requests: n, ok, failed: n - ok,
    status, drover_error: droverError, transport, p50_ms: q(0.5), p99_ms: q(0.99), max_ms: lat.length ? Math.round(lat[lat.length - 1]) : null,
    error: err ? String(err) : undefined,
  }));
  process.exit(0);
});
