#!/usr/bin/env bash
# A burst of CPU-heavy gRPC calls against a gRPC app under `drover run` with its health
# checks on (`--health-grpc`, the README's way): LANES (100) calls at once on one
# client channel, each spinning its worker's CPU for COST_MS (300), over 2 workers of a
# grpc-js server (crates/drover/tests/fixtures/grpc/server.js, /test.Echo/Work). A
# grpc-js worker answers the calls of one read together, after running them all, so
# each worker completes nothing for LANES / 2 x COST_MS; drover took that for a hang
# and restarted the worker with every call it held.
#
#   bash bench/grpc-burst.sh                     # 2 rounds, alternating order (~3 min)
#   ROUNDS=1 LANES=40 COST_MS=150 bash bench/grpc-burst.sh
#
# Systems, started fresh per round: `drover run -w 2 --h2c --backend-protocol h2c
# --health-grpc` (drover), the same with DROVER_B_BIN when set (drover-b: an older build,
# say), and Node's cluster module (bench/node-cluster.js; it has no health checks, and
# hands the channel's one connection to one worker). Per system and round: calls
# answered and failed, health restarts (drover's log), and the seconds until the last
# call ended. BENCH_SKIP_BUILD=1 skips cargo build; DROVER_BIN measures another binary.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROUNDS="${ROUNDS:-2}" LANES="${LANES:-100}" COST_MS="${COST_MS:-300}"
for v in ROUNDS LANES COST_MS; do
  [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -ge 1 ]] || { echo "grpc-burst.sh: $v must be a positive whole number" >&2; exit 2; }
done
FIXTURE="$(cd "$BENCH_DIR/.." && pwd)/crates/drover/tests/fixtures/grpc"
[[ -d "$FIXTURE/node_modules/@grpc/grpc-js" ]] || (cd "$FIXTURE" && npm ci --no-audit --no-fund >/dev/null)
LOG_TAG=grpc-burst
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch grpc-burst
SYSTEMS=(drover cluster)
if [[ -n "${DROVER_B_BIN:-}" ]]; then
  cp "$DROVER_B_BIN" "$TMP/drover-b"
  SYSTEMS=(drover drover-b cluster)
fi

run_one() { # system round -> one JSON line on stdout
  local sys=$1 round=$2 port i started ended restarts
  port="$(quick_port)"
  case "$sys" in
    drover | drover-b)
      start_system "$TMP/$sys.log" "$TMP/$sys" run -w 2 -l "127.0.0.1:$port" --admin off \
        --h2c --backend-protocol h2c --health-grpc -- node "$FIXTURE/server.js" "" "$COST_MS" 0.0.0.0:50051 ;;
    cluster)
      start_system "$TMP/$sys.log" env WORKERS=2 DELAY_MS="$COST_MS" ADDRESS="127.0.0.1:$port" \
        node "$BENCH_DIR/node-cluster.js" "$FIXTURE/server.js" ;;
  esac
  for ((i = 0; i < 300; i++)); do # ready: a call is answered
    [[ "$(DEADLINE_MS=1000 node "$FIXTURE/client.js" "127.0.0.1:$port" Name 1 2>/dev/null)" == *'"code":0'* ]] && break
    sleep 0.1
  done
  sleep 1 # both workers
  started=$(date +%s.%N)
  DEADLINE_MS=120000 node "$FIXTURE/client.js" "127.0.0.1:$port" Work "$LANES" >"$TMP/out" 2>"$TMP/err" || true
  ended=$(date +%s.%N)
  restarts="$(grep -c 'unhealthy:' "$TMP/$sys.log" || true)"
  stop_system
  node -e 'const [sys, round, started, ended, restarts] = process.argv.slice(1);
    const secs = ended - started;
    let calls = [];
    try { calls = JSON.parse(require("fs").readFileSync(0, "utf8")); } catch (e) {}
    const ok = calls.filter((c) => c.code === 0).length;
    console.log(JSON.stringify({ system: sys, round: +round, ok, failed: calls.length ? calls.length - ok : -1,
      health_restarts: +restarts, seconds: Math.round(+secs * 10) / 10 }))' \
    "$sys" "$round" "$started" "$ended" "$restarts" <"$TMP/out"
}

log "$LANES calls of $COST_MS ms at once on one channel over 2 workers, $ROUNDS round(s); drover: $DROVER"
alternate_rounds "$TMP/results.jsonl" "${SYSTEMS[@]}"
node - "$TMP/results.jsonl" "${SYSTEMS[@]}" <<'EOF2'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
console.log('\n| system | calls answered / failed (all rounds) | health restarts, per round | seconds to the last answer, per round |');
console.log('|---|---:|---|---|');
for (const sys of process.argv.slice(3)) {
  const r = rows.filter((x) => x.system === sys);
  const sum = (k) => r.reduce((a, x) => a + x[k], 0);
  console.log(`| ${sys} | ${sum('ok')} / ${sum('failed')} | ${r.map((x) => x.health_restarts).join(', ')} | ${r.map((x) => x.seconds).join(', ')} |`);
}
EOF2
