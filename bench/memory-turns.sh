#!/usr/bin/env bash
# Workers that leak alike under `max_memory` (issue 21's PM2 parity, issue 20's "a
# safety mechanism must never be the outage"): `drover run -w 4 --max-memory 100M` of
# bench/leak-app.js (256 KiB kept per request), at two leak rates:
#   fast: a closed loop of 8 connections for 8 s (about 160 MB/s per worker here)
#   slow: an open loop of 400 req/s for 12 s (100 req/s a worker: 25 MB/s each)
# Prints per run the replacements, the peak of the workers' summed RSS (sampled every
# 10 ms), p99 and p99.9 of the load, and errors. With DROVER_B_BIN, a second drover runs
# beside in alternating order (to compare replacement policies).
#
#   bash bench/memory-turns.sh                         # 2 rounds (~2 min)
#   DROVER_B_BIN=/path/to/other/drover ROUNDS=3 bash bench/memory-turns.sh
#
# BENCH_SKIP_BUILD=1 uses the built binary; DROVER_BIN another one.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROUNDS="${ROUNDS:-2}"
LOG_TAG=memory-turns
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch memory-turns
SYSTEMS=(drover)
if [[ -n "${DROVER_B_BIN:-}" ]]; then
  cp "$DROVER_B_BIN" "$TMP/drover-b"
  SYSTEMS=(drover drover-b)
fi

children_rss_kb() { # the summed RSS of SYS_PID's children, in KiB
  local pid total=0 r
  for pid in $(pgrep -P "$SYS_PID" || true); do
    r="$(rss_kb "$pid")"
    total=$((total + ${r:-0}))
  done
  echo "$total"
}

run_one() { # "system leak" round -> one JSON line
  local sys=${1% *} leak=${1#* } bin=$DROVER load peak=0 now
  [[ "$sys" == drover-b ]] && bin="$TMP/drover-b"
  SYS_PORT="$(quick_port)"
  start_system "$TMP/$sys.log" "$bin" run -w 4 -l "127.0.0.1:$SYS_PORT" --admin off \
    --max-memory 100M -- node "$BENCH_DIR/leak-app.js"
  two_workers_serve "$sys"
  case "$leak" in
    fast) load=(-c 8 -d 8s) ;;
    slow) load=(--rate 400 -d 12s) ;;
  esac
  "$LOADGEN" bench "${load[@]}" --json "http://127.0.0.1:$SYS_PORT/" >"$TMP/out.bench" 2>/dev/null &
  local bench_pid=$!
  while kill -0 "$bench_pid" 2>/dev/null; do
    now="$(children_rss_kb)"
    ((now > peak)) && peak=$now
    sleep 0.01
  done
  wait "$bench_pid" || true
  local replaced
  replaced="$(grep -c 'over max_memory' "$TMP/$sys.log" || true)"
  stop_system
  node -e 'const [s, leak, r, peak, replaced] = process.argv.slice(1);
    const t = require("fs").readFileSync(0, "utf8").split("\n").filter((l) => l.startsWith("{")).pop();
    const x = JSON.parse(t);
    console.log(JSON.stringify({ system: s, leak, round: +r, replaced: +replaced,
      peak_rss_mib: Math.round(+peak / 1024), ok: x.ok, errors: x.errors_total,
      p99_ms: +(x.latency_us.p99 / 1000).toFixed(2), p999_ms: +(x.latency_us.p99_9 / 1000).toFixed(2) }))' \
    "$sys" "$leak" "$2" "$peak" "$replaced" <"$TMP/out.bench"
}
RUNS=()
for leak in fast slow; do
  for sys in "${SYSTEMS[@]}"; do RUNS+=("$sys $leak"); done
done
alternate_rounds "$TMP/results.jsonl" "${RUNS[@]}"

node - "$TMP/results.jsonl" <<'JS'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
console.log('\n| system | leak | round | replaced | peak RSS MiB | p99 ms | p99.9 ms | ok | errors |');
console.log('|---|---|---:|---:|---:|---:|---:|---:|---:|');
for (const x of rows) {
  console.log(`| ${x.system} | ${x.leak} | ${x.round} | ${x.replaced} | ${x.peak_rss_mib} | ${x.p99_ms} | ${x.p999_ms} | ${x.ok} | ${x.errors} |`);
}
JS
