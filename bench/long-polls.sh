#!/usr/bin/env bash
# Long-polls beside CPU-bound requests: POLLS (40) requests held open for POLL_S (25)
# seconds, as a chat's or socket.io's polling clients hold them, while CONNS (20)
# keep-alive connections send a CPU-bound mix that saturates both workers. A learned
# limit that counted the long-polls as work once kept every other request in drover's
# queue (62 answered in 10 s where Node cluster answered 10,115).
#
#   bash bench/long-polls.sh                # 3 rounds, alternating order (~2 min here)
#   ROUNDS=1 POLLS=100 DURATION=5 bash bench/long-polls.sh
#
# Systems, 2 workers of bench/matrix/backend.js each: `drover run` (the default mode),
# `drover run --mode proxy` and Node's cluster module (bench/matrix/cluster.js), each
# started fresh per measurement: 3 s of the mix to warm up, then the long-polls, then
# DURATION (10) seconds of the mix (90 % /cpu?us=1000, 10 % /cpu?us=10000) from drover
# bench. Per system and round: req/s, p99 and errors of the mix, and how many
# long-polls were answered 200; then medians and ratios to cluster's.
# BENCH_SKIP_BUILD=1 skips cargo build; DROVER_BIN measures another binary.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROUNDS="${ROUNDS:-3}" POLLS="${POLLS:-40}" POLL_S="${POLL_S:-25}" CONNS="${CONNS:-20}" DURATION="${DURATION:-10}"
for v in ROUNDS POLLS POLL_S CONNS DURATION; do
  [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -ge 1 ]] || { echo "long-polls.sh: $v must be a positive whole number" >&2; exit 2; }
done
((POLL_S > DURATION + 2)) || { echo "long-polls.sh: POLL_S must exceed DURATION + 2, so the long-polls stay open while the mix runs" >&2; exit 2; }
APP="$BENCH_DIR/matrix/backend.js"
MIX="90:/cpu?us=1000,10:/cpu?us=10000"
LOG_TAG=long-polls
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch long-polls
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

run_one() { # system round -> one JSON line on stdout
  local sys=$1 round=$2 port i polls
  port="$(quick_port)"
  case "$sys" in
    drover) start_system "$TMP/$sys.log" "$DROVER" run -w 2 -l "127.0.0.1:$port" --admin off -- node "$APP" ;;
    drover-proxy) start_system "$TMP/$sys.log" "$DROVER" run -w 2 --mode proxy -l "127.0.0.1:$port" --admin off -- node "$APP" ;;
    cluster) start_system "$TMP/$sys.log" env PORT="$port" WORKERS=2 node "$BENCH_DIR/matrix/cluster.js" ;;
  esac
  for ((i = 0; i < 300; i++)); do # ready: both workers answer
    [[ "$("$LOADGEN" bench -n 8 -c 2 --json "http://127.0.0.1:$port/" 2>/dev/null)" == *'"ok":8,'* ]] && break
    sleep 0.1
  done
  "$LOADGEN" bench -c 8 -d 3s --mix "$MIX" "http://127.0.0.1:$port/" >/dev/null 2>&1 || true
  "$LOADGEN" bench -c "$POLLS" -n "$POLLS" --timeout "$((POLL_S + 30))s" --json \
    "http://127.0.0.1:$port/poll?ms=$((POLL_S * 1000))" >"$TMP/polls" 2>/dev/null &
  polls=$!
  sleep 1
  "$LOADGEN" bench -c "$CONNS" -d "${DURATION}s" --mix "$MIX" --json "http://127.0.0.1:$port/" >"$TMP/out" 2>"$TMP/err" || true
  wait "$polls" || true
  stop_system
  node -e 'const [sys, round, pollsFile] = process.argv.slice(1); const fs = require("fs");
    const last = (t) => JSON.parse(t.split("\n").filter((l) => l.startsWith("{")).pop() || "null");
    const r = last(fs.readFileSync(0, "utf8")), p = last(fs.readFileSync(pollsFile, "utf8"));
    console.log(JSON.stringify({ system: sys, round: +round, rps: r && Math.round(r.rps),
      p99_ms: r && Math.round(r.latency_us.p99 / 1000), errors: r && r.errors_total,
      polls_ok: p && p.ok }))' "$sys" "$round" "$TMP/polls" <"$TMP/out"
}

log "$POLLS long-polls of ${POLL_S} s beside $CONNS connections of $MIX, ${DURATION} s, $ROUNDS round(s); drover: $DROVER"
alternate_rounds "$TMP/results.jsonl" drover drover-proxy cluster
node - "$TMP/results.jsonl" "$BENCH_DIR/median.js" "$POLLS" <<'EOF2'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const med = require(process.argv[3]);
const polls = +process.argv[4];
const m = {};
console.log('\n| system | req/s (median) | p99 ms (median) | errors (all rounds) | long-polls answered | req/s per round |');
console.log('|---|---:|---:|---:|---:|---|');
for (const sys of ['drover', 'drover-proxy', 'cluster']) {
  const r = rows.filter((x) => x.system === sys);
  m[sys] = { rps: med(r.map((x) => x.rps)), p99: med(r.map((x) => x.p99_ms)) };
  const answered = r.reduce((a, x) => a + (x.polls_ok || 0), 0);
  console.log(`| ${sys} | ${m[sys].rps} | ${m[sys].p99} | ${r.reduce((a, x) => a + (x.errors || 0), 0)} | ${answered} of ${polls * r.length} | ${r.map((x) => x.rps).join(', ')} |`);
}
for (const sys of ['drover', 'drover-proxy']) {
  console.log(`${sys} / cluster: req/s ${(m[sys].rps / m.cluster.rps).toFixed(2)} x, p99 ${(m[sys].p99 / m.cluster.p99).toFixed(2)} x`);
}
EOF2
