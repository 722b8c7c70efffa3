#!/usr/bin/env bash
# A crowd of I/O-bound requests: many connections whose requests each wait on a timer
# (a database call, another service) and cost the worker only their HTTP work. At
# 1,000 connections that HTTP work saturates 2 workers' CPU, which is where a limit
# learned for CPU-bound work would throttle requests that mostly wait.
#
#   bash bench/io-crowd.sh                  # 3 rounds, alternating order (~2 min here)
#   ROUNDS=1 CONNS=500 WAIT_MS=20 DURATION=3 bash bench/io-crowd.sh
#
# Systems, 2 workers each, over crates/drover/tests/fixtures/workloads/timer-server.js:
# `drover run` (the default mode, auto), `drover run --mode proxy` (every request placed
# by drover) and Node's cluster module (bench/node-cluster.js). Each is started fresh
# per measurement: a closed loop of CONNS (1000) keep-alive connections on
# /sleep/WAIT_MS (50) for DURATION seconds (5), from drover bench. Per system and round:
# req/s, p99, errors, and the req/s of each second (the first shows the cold start);
# then medians and ratios to cluster's.
# BENCH_SKIP_BUILD=1 skips cargo build; DROVER_BIN measures another binary.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${ROUNDS:-3}" CONNS="${CONNS:-1000}" WAIT_MS="${WAIT_MS:-50}" DURATION="${DURATION:-5}"
for v in ROUNDS CONNS WAIT_MS DURATION; do
  [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -ge 1 ]] || { echo "io-crowd.sh: $v must be a positive whole number" >&2; exit 2; }
done
APP="$ROOT/crates/drover/tests/fixtures/workloads/timer-server.js"
LOG_TAG=io-crowd
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch io-crowd
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

run_one() { # system round -> one JSON line on stdout
  local sys=$1 round=$2 port i
  port="$(quick_port)"
  case "$sys" in
    drover) start_system "$TMP/$sys.log" "$DROVER" run -w 2 -l "127.0.0.1:$port" --admin off -- node "$APP" ;;
    drover-proxy) start_system "$TMP/$sys.log" "$DROVER" run -w 2 --mode proxy -l "127.0.0.1:$port" --admin off -- node "$APP" ;;
    cluster) start_system "$TMP/$sys.log" env PORT="$port" WORKERS=2 node "$BENCH_DIR/node-cluster.js" "$APP" ;;
  esac
  for ((i = 0; i < 300; i++)); do # ready: both workers answer
    [[ "$("$LOADGEN" bench -n 8 -c 2 --json "http://127.0.0.1:$port/health" 2>/dev/null)" == *'"ok":8,'* ]] && break
    sleep 0.1
  done
  "$LOADGEN" bench -c "$CONNS" -d "${DURATION}s" --json "http://127.0.0.1:$port/sleep/$WAIT_MS" >"$TMP/out" 2>"$TMP/err" || true
  stop_system
  node -e 'const [sys, round] = process.argv.slice(1); const t = require("fs").readFileSync(0, "utf8");
    const r = JSON.parse(t.split("\n").filter((l) => l.startsWith("{")).pop() || "null");
    console.log(JSON.stringify({ system: sys, round: +round, rps: r && Math.round(r.rps),
      p99_ms: r && Math.round(r.latency_us.p99 / 1000), errors: r && r.errors_total,
      per_second: r && r.intervals.map((i) => Math.round(i.rps)) }))' "$sys" "$round" <"$TMP/out"
}

log "$CONNS connections on /sleep/$WAIT_MS, ${DURATION} s, $ROUNDS round(s); drover: $DROVER"
alternate_rounds "$TMP/results.jsonl" drover drover-proxy cluster
node - "$TMP/results.jsonl" "$BENCH_DIR/median.js" <<'EOF'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const med = require(process.argv[3]);
const m = {};
console.log('\n| system | req/s (median) | p99 ms (median) | errors (all rounds) | req/s per round |');
console.log('|---|---:|---:|---:|---|');
for (const sys of ['drover', 'drover-proxy', 'cluster']) {
  const r = rows.filter((x) => x.system === sys);
  m[sys] = { rps: med(r.map((x) => x.rps)), p99: med(r.map((x) => x.p99_ms)) };
  console.log(`| ${sys} | ${m[sys].rps} | ${m[sys].p99} | ${r.reduce((a, x) => a + (x.errors || 0), 0)} | ${r.map((x) => x.rps).join(', ')} |`);
}
for (const sys of ['drover', 'drover-proxy']) {
  console.log(`${sys} / cluster: req/s ${(m[sys].rps / m.cluster.rps).toFixed(2)} x, p99 ${(m[sys].p99 / m.cluster.p99).toFixed(2)} x`);
}
EOF
