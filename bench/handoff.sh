#!/usr/bin/env bash
# Issue 21's hello target: the second post's hello server (examples/seeds/hello.js), 2
# workers, `wrk -t1 -c50` (keep-alive) on the same 2 cores, four ways:
#
#   cluster          Node's cluster module (bench/node-cluster.js): the primary accepts
#                    and hands each connection to a worker in turn
#   drover           drover run -w 2 (default mode, auto): drover places requests until
#                    it has seen that they cost alike, then hands the connections over
#   drover-proxy     drover run -w 2 --mode proxy: drover places every request
#   drover-handoff   drover run -w 2 --mode handoff: drover hands each connection to the
#                    worker least behind, which then serves it directly
#
#   bash bench/handoff.sh                   # 10 s x 3 rounds, order alternating
#   DURATION=5 ROUNDS=1 bash bench/handoff.sh
#
# Prints per peer the median req/s, its ratio to cluster's, p99, errors and the share of
# requests each worker answered (from hello.js's x-worker header).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
LOG_TAG=handoff
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
DURATION="${DURATION:-10}"
ROUNDS="${ROUNDS:-3}"
CONNS="${CONNS:-50}"
check_run_length "$DURATION" "$ROUNDS"
command -v wrk >/dev/null || die "wrk is needed (apt-get install wrk)"
command -v node >/dev/null || die "node is needed"
build_binaries
HELLO="$ROOT/examples/seeds/hello.js"
PEERS=(cluster drover drover-proxy drover-handoff)
TMP="$(mktemp -d /tmp/drover-handoff.XXXXXX)"
PID=""
cleanup() {
  [[ -n "$PID" ]] && kill -TERM -- "-$PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

start() { # peer port
  case "$1" in
    cluster) PORT="$2" WORKERS=2 setsid node "$BENCH_DIR/node-cluster.js" "$HELLO" >"$TMP/$1.log" 2>&1 & ;;
    drover) setsid "$DROVER" run -w 2 -l "127.0.0.1:$2" --admin off -- node "$HELLO" >"$TMP/$1.log" 2>&1 & ;;
    drover-proxy) setsid "$DROVER" run -w 2 --mode proxy -l "127.0.0.1:$2" --admin off -- node "$HELLO" >"$TMP/$1.log" 2>&1 & ;;
    drover-handoff) setsid "$DROVER" run -w 2 --mode handoff -l "127.0.0.1:$2" --admin off -- node "$HELLO" >"$TMP/$1.log" 2>&1 & ;;
  esac
  PID=$!
  wait_port "$2" "$PID" 30 || die "$1 did not start: $(tail -n 5 "$TMP/$1.log")"
  # Both workers answer before the measurement starts.
  local i seen=""
  for ((i = 0; i < 200; i++)); do
    seen+=" $(curl -s -D - -o /dev/null "http://127.0.0.1:$2/" | awk -F': ' 'tolower($1)=="x-worker"{print $2}' | tr -d '\r')"
    [[ "$(tr ' ' '\n' <<<"$seen" | sort -u | grep -c .)" -ge 2 ]] && return 0
    sleep 0.02
  done
  die "$1: both workers never answered"
}

stop() {
  kill -TERM -- "-$PID" 2>/dev/null || true
  local i
  for ((i = 0; i < 100; i++)); do kill -0 "$PID" 2>/dev/null || break; sleep 0.05; done
  kill -KILL -- "-$PID" 2>/dev/null || true
  PID=""
}

RESULTS="$TMP/results.jsonl"
for ((round = 1; round <= ROUNDS; round++)); do
  order=("${PEERS[@]}")
  if ((round % 2 == 0)); then
    order=()
    for ((i = ${#PEERS[@]} - 1; i >= 0; i--)); do order+=("${PEERS[i]}"); done
  fi
  for peer in "${order[@]}"; do
    port="$(quick_port)"
    start "$peer" "$port"
    out="$(wrk -t1 -c "$CONNS" -d "${DURATION}s" -s "$BENCH_DIR/wrk-workers.lua" "http://127.0.0.1:$port/" | tail -n 1)"
    # The primary's (drover's, or cluster's primary) resident memory after the load.
    rss="$(rss_kb "$PID")"
    stop
    log "round $round $peer: $out, primary RSS ${rss} kB"
    echo "{\"peer\":\"$peer\",\"round\":$round,\"rss_kb\":$rss,\"r\":$out}" >>"$RESULTS"
  done
done

node - "$RESULTS" <<'JS'
const fs = require('fs');
const rows = fs.readFileSync(process.argv[2], 'utf8').trim().split('\n').map(JSON.parse);
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const peers = [...new Set(rows.map((r) => r.peer))];
const by = (p) => rows.filter((r) => r.peer === p).map((r) => r.r);
const base = median(by('cluster').map((r) => r.rps));
console.log('peer             req/s (median)  x cluster  p99 ms  errors  primary RSS MB  worker shares per round');
for (const p of peers) {
  const rs = by(p);
  const rps = median(rs.map((r) => r.rps));
  const shares = rs.map((r) => { const n = Object.values(r.workers); const t = n.reduce((a, b) => a + b, 0); return n.map((x) => (100 * x / t).toFixed(0) + '%').join('/'); });
  console.log(`${p.padEnd(16)} ${rps.toFixed(0).padStart(14)}  ${(rps / base).toFixed(2).padStart(9)}  ${(median(rs.map((r) => r.p99_us)) / 1000).toFixed(2).padStart(6)}  ${String(rs.reduce((a, r) => a + r.errors, 0)).padStart(6)}  ${(median(rows.filter((r) => r.peer === p).map((r) => r.rss_kb)) / 1024).toFixed(1).padStart(14)}  ${shares.join(' ')}`);
}
JS
