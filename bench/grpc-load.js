// The gRPC load of bench/grpc.sh (@grpc/grpc-js), every call on ONE channel (one HTTP/2
// connection), each call a light or a heavy one by MIX = "LIGHT_US:HEAVY_US:SHARE"
// (a heavy call with probability SHARE):
//   node grpc-load.js TARGET capacity LANES SECONDS MIX   closed loop: calls/s
//   node grpc-load.js TARGET open RATE SECONDS MIX SEED   Poisson arrivals at RATE/s
// Prints one JSON line: calls, errors, rate, and latency percentiles in ms (p99_light:
// the light calls' own).
const grpc = require('@grpc/grpc-js');
const [target, mode, a, seconds, mix, seed] = process.argv.slice(2);
const [lightUs, heavyUs, share] = mix.split(':').map(Number);
const raw = { requestSerialize: (b) => b, requestDeserialize: (b) => b,
  responseSerialize: (b) => b, responseDeserialize: (b) => b };
const method = (path) => ({ path, requestStream: false, responseStream: false, ...raw });
// METHODS=2: heavy calls go to a method of their own (/bench.Work/Heavy), light ones to
// /bench.Work/Call; otherwise every call is /bench.Work/Call, its cost in its payload.
const Client = grpc.makeGenericClientConstructor({
  Call: method('/bench.Work/Call'),
  Heavy: method('/bench.Work/Heavy'),
});
const heavyMethod = process.env.METHODS === '2' ? 'Heavy' : 'Call';
const client = new Client(target, grpc.credentials.createInsecure());
// A small seeded generator (mulberry32): the same seed, the same arrivals and mix.
let state = Number(seed || 1) >>> 0;
const random = () => {
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const light = [], heavy = [];
let errors = 0;
const one = () => new Promise((resolve) => {
  const isHeavy = random() < share;
  const started = process.hrtime.bigint();
  const deadline = new Date(Date.now() + 30000);
  const call = isHeavy ? heavyMethod : 'Call';
  client[call](Buffer.from(String(isHeavy ? heavyUs : lightUs)), { deadline }, (err) => {
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    if (err) errors++;
    else (isHeavy ? heavy : light).push(ms);
    resolve();
  });
});
const pct = (xs, p) => {
  if (!xs.length) return null;
  const s = [...xs].sort((x, y) => x - y);
  return +s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)].toFixed(2);
};
const report = (elapsed) => {
  const all = light.concat(heavy);
  console.log(JSON.stringify({
    calls: all.length, errors, rate: +(all.length / elapsed).toFixed(1),
    p50: pct(all, 50), p90: pct(all, 90), p99: pct(all, 99), p99_light: pct(light, 99),
  }));
  client.close();
};
const run = async () => {
  // One call first, so the channel is connected before the clock starts.
  await one();
  light.length = 0; heavy.length = 0; errors = 0;
  const start = Date.now();
  const end = start + Number(seconds) * 1000;
  if (mode === 'capacity') {
    const lane = async () => { while (Date.now() < end) await one(); };
    await Promise.all(Array.from({ length: Number(a) }, lane));
    return report((Date.now() - start) / 1000);
  }
  const rate = Number(a);
  const pending = [];
  let next = start;
  while (next < end) {
    const wait = next - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    // Calls due by now go out together (a timer is coarser than the gaps at high rates).
    while (next <= Date.now() && next < end) {
      pending.push(one());
      next += (-Math.log(1 - random()) / rate) * 1000;
    }
  }
  await Promise.all(pending);
  report(Number(seconds));
};
run();
