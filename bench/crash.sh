#!/usr/bin/env bash
# A request of death: one GET whose handler throws an uncaught exception (a bug on one
# route), sent while CONNS (20) keep-alive connections load 3 workers. Under Node's
# cluster module it ends the worker it ran on. drover retried such a GET on the other
# workers (it cannot tell a worker that a request crashed from one killed from
# outside), and one GET ended all three within 30 ms; now the supervisor tells the
# balancer how each worker ended, and the GET fails with 502 backend-crashed.
#
#   bash bench/crash.sh                  # 3 rounds, alternating order (~1 min here)
#   ROUNDS=1 CONNS=50 bash bench/crash.sh
#
# Systems, 3 workers of crates/drover/tests/fixtures/liveness/server.js each, started
# fresh per round: `drover run` (the default mode), `drover run --mode proxy` and Node's
# cluster module (bench/node-cluster.js, which replaces a dead worker). The load is
# drover bench on /work?ms=1 for DURATION (6) seconds; 2 s in, one GET /crash on a new
# connection. Per system and round: the load's req/s and errors, what the GET got, and
# how many workers the GET ended (each crash prints the exception once).
# BENCH_SKIP_BUILD=1 skips cargo build; DROVER_BIN measures another binary.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROUNDS="${ROUNDS:-3}" CONNS="${CONNS:-20}" DURATION="${DURATION:-6}"
for v in ROUNDS CONNS DURATION; do
  [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -ge 1 ]] || { echo "crash.sh: $v must be a positive whole number" >&2; exit 2; }
done
((DURATION >= 3)) || { echo "crash.sh: DURATION must be at least 3 (the GET goes 2 s in)" >&2; exit 2; }
APP="$(cd "$BENCH_DIR/.." && pwd)/crates/drover/tests/fixtures/liveness/server.js"
LOG_TAG=crash
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch crash

run_one() { # system round -> one JSON line on stdout
  local sys=$1 round=$2 port i crash
  port="$(quick_port)"
  case "$sys" in
    drover) start_system "$TMP/$sys.log" "$DROVER" run -w 3 -l "127.0.0.1:$port" --admin off -- node "$APP" ;;
    drover-proxy) start_system "$TMP/$sys.log" "$DROVER" run -w 3 --mode proxy -l "127.0.0.1:$port" --admin off -- node "$APP" ;;
    cluster) start_system "$TMP/$sys.log" env PORT="$port" WORKERS=3 node "$BENCH_DIR/node-cluster.js" "$APP" ;;
  esac
  for ((i = 0; i < 300; i++)); do # ready: the workers answer
    [[ "$("$LOADGEN" bench -n 12 -c 3 --json "http://127.0.0.1:$port/" 2>/dev/null)" == *'"ok":12,'* ]] && break
    sleep 0.1
  done
  "$LOADGEN" bench -c "$CONNS" -d "${DURATION}s" --json "http://127.0.0.1:$port/work?ms=1" >"$TMP/out" 2>"$TMP/err" &
  local load=$!
  sleep 2
  crash="$(curl -s -o /dev/null -w '%{http_code} %header{drover-error}' -m 10 "http://127.0.0.1:$port/crash" || true)"
  wait "$load" || true
  sleep 0.5
  local crashed
  crashed="$(grep -c 'Error: a bug on /crash' "$TMP/$sys.log" || true)"
  stop_system
  node -e 'const [sys, round, crash, crashed] = process.argv.slice(1);
    const last = (t) => JSON.parse(t.split("\n").filter((l) => l.startsWith("{")).pop() || "null");
    const r = last(require("fs").readFileSync(0, "utf8"));
    console.log(JSON.stringify({ system: sys, round: +round, rps: r && Math.round(r.rps),
      errors: r && r.errors_total, crash: crash.trim() || "no answer", workers_ended: +crashed }))' \
    "$sys" "$round" "$crash" "$crashed" <"$TMP/out"
}

log "one GET /crash beside $CONNS connections of /work?ms=1 over 3 workers, ${DURATION} s, $ROUNDS round(s); drover: $DROVER"
alternate_rounds "$TMP/results.jsonl" drover drover-proxy cluster
node - "$TMP/results.jsonl" "$BENCH_DIR/median.js" <<'EOF2'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const med = require(process.argv[3]);
console.log('\n| system | workers the GET ended, per round | what the GET got | load errors (all rounds) | load req/s (median) |');
console.log('|---|---|---|---:|---:|');
for (const sys of ['drover', 'drover-proxy', 'cluster']) {
  const r = rows.filter((x) => x.system === sys);
  const got = [...new Set(r.map((x) => x.crash))].join('; ');
  console.log(`| ${sys} | ${r.map((x) => x.workers_ended).join(', ')} | ${got} | ${r.reduce((a, x) => a + (x.errors || 0), 0)} | ${med(r.map((x) => x.rps))} |`);
}
EOF2
