// What each of drover's measurements did, from the files `SWEEP_PROBE=1 bash
// bench/sweep.sh` keeps (NAME-before.txt and NAME-after.txt per measurement):
//
//   node bench/sweep/probe.js bench/results/sweep-probe-STAMP
//
// One line per measurement, the after minus the before: requests drover placed,
// connections handed to workers, connections drover opened to the endpoints, the
// mean wait in its queue, and the CPU time (clock ticks, 1/100 s) of drover and of all
// its workers together.
'use strict';
const fs = require('fs');
const path = require('path');

const dir = process.argv[2];
if (!dir) {
  console.error('usage: node bench/sweep/probe.js bench/results/sweep-probe-STAMP');
  process.exit(2);
}

// "cpu NAME TICKS" lines and Prometheus samples, summed over labels by metric name.
function parse(text) {
  const m = {};
  for (const line of text.split('\n')) {
    let r = line.match(/^cpu (\S+) (\d+)$/);
    if (r) {
      const key = r[1].startsWith('worker') ? 'cpu workers' : `cpu ${r[1]}`;
      m[key] = (m[key] || 0) + Number(r[2]);
      continue;
    }
    r = line.match(/^(drover_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$/);
    if (r) m[r[1]] = (m[r[1]] || 0) + Number(r[3]);
  }
  return m;
}

const names = fs.readdirSync(dir).filter((f) => f.endsWith('-after.txt')).sort();
for (const name of names) {
  const after = parse(fs.readFileSync(path.join(dir, name), 'utf8'));
  const beforeFile = path.join(dir, name.replace(/-after\.txt$/, '-before.txt'));
  if (!fs.existsSync(beforeFile)) continue;
  const before = parse(fs.readFileSync(beforeFile, 'utf8'));
  const d = (k) => (after[k] || 0) - (before[k] || 0);
  const requests = d('drover_requests_total');
  const wait = requests ? (d('drover_queue_wait_seconds_sum') / requests) * 1000 : 0;
  console.log(
    [
      name.replace(/-after\.txt$/, '').padEnd(22),
      `requests ${requests}`,
      `handoffs ${d('drover_handoffs_total')}`,
      `connects ${d('drover_endpoint_connect_seconds_count')}`,
      `queue wait ${wait.toFixed(1)} ms`,
      `cpu drover ${d('cpu drover')}`,
      `workers ${d('cpu workers')}`,
    ].join('  '),
  );
}
