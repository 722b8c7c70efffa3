#!/usr/bin/env bash
# Shared mode's connection placement against Node's cluster module, on the second
# post's load: a hello server, 2 workers, `wrk -t1 -c50` with keep-alive, everything on
# the same cores. For each peer: requests/s, and the share of the requests each worker
# answered and of the connections it accepted (counted at the workers, see
# bench/hello-count.js). The connection split is what placement decides; the request
# split also depends on how the kernel shares the cores among the workers and wrk.
#
#   bash bench/shared.sh                              # 10 s x 3 rounds, alternating order
#   BENCH_DURATION=5 BENCH_ROUNDS=5 bash bench/shared.sh
#
# Peers: node-cluster (bench/node-cluster.js, round-robin handoff through the primary)
# and drover-shared (`drover run --mode shared`: a socket per worker, placed by load);
# with DROVER_SINGLE_BIN=PATH also drover-single, that binary's `--mode shared` (a
# drover from before per-worker sockets: one socket every worker accepts on, so an
# idle worker pulls the next connection). Each run starts its peer afresh, so wrk's
# connections are placed on workers that hold none: the split is the placement's.
#
# Scenarios (BENCH_SCENARIOS, all by default):
#   hello        bench/hello-count.js, wrk -t1 -c50 keep-alive: req/s and the shares
#   mixed-c5     examples/pi-server.js, 90 % ~0.2 ms and 10 % ~10 ms requests, a new
#   mixed-c20    connection per request (bench/mix-close.lua), 5 or 20 connections:
#                req/s, p50, p99 (every request is a placement)
#
# Environment: BENCH_DURATION (10), BENCH_ROUNDS (3), BENCH_WORKERS (2), CONNS (50),
# BENCH_SCENARIOS, DROVER_SINGLE_BIN, BENCH_SKIP_BUILD=1 (use target/release as it is).
# Prints a table of medians and writes the raw runs to
# bench/results/shared-raw-STAMP.jsonl.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
D="${BENCH_DURATION:-10}"
ROUNDS="${BENCH_ROUNDS:-3}"
WORKERS="${BENCH_WORKERS:-2}"
CONNS="${CONNS:-50}"
LOG_TAG=shared
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
command -v node >/dev/null || die "node is needed"
command -v wrk >/dev/null || die "wrk is needed (apt-get install wrk)"
build_binaries
((HAVE_DROVER)) || die "no drover binary"

TMP="$(mktemp -d)"
PEER_PID=""
cleanup() {
  [[ -n "$PEER_PID" ]] && kill -TERM -- "-$PEER_PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
HELLO="$BENCH_DIR/hello-count.js"
PI="$ROOT/examples/pi-server.js"
PEERS=(node-cluster drover-shared)
if [[ -n "${DROVER_SINGLE_BIN:-}" ]]; then
  [[ -x "$DROVER_SINGLE_BIN" ]] || die "DROVER_SINGLE_BIN=$DROVER_SINGLE_BIN is not executable"
  PEERS+=(drover-single)
fi
SCENARIOS="${BENCH_SCENARIOS:-hello mixed-c5 mixed-c20}"
export WRK_JSON="$BENCH_DIR/wrk-json.lua"
RESULTS="$BENCH_DIR/results"
mkdir -p "$RESULTS"
RAW="$RESULTS/shared-raw-$(date +%Y%m%d-%H%M%S).jsonl"
: >"$RAW"

start_peer() { # name port countdir app -> PEER_PID
  local name=$1 port=$2 dir=$3 app=$4 bin=$DROVER
  case "$name" in
    node-cluster)
      COUNT_DIR="$dir" PORT="$port" WORKERS="$WORKERS" setsid node "$BENCH_DIR/node-cluster.js" "$app" \
        >"$TMP/$name.log" 2>&1 &
      ;;
    drover-shared | drover-single)
      [[ "$name" == drover-single ]] && bin=$DROVER_SINGLE_BIN
      COUNT_DIR="$dir" setsid "$bin" run -w "$WORKERS" -l "127.0.0.1:$port" --admin off --mode shared \
        -- node "$app" >"$TMP/$name.log" 2>&1 &
      ;;
  esac
  PEER_PID=$!
}

# Ready: it answers, and every worker has answered at least once (each writes its count
# file on its first answer). The warm-up requests are subtracted below.
# (pi-server.js writes no counts: it is ready once it answers and has had a second.)
wait_ready() { # port countdir scenario
  local i
  for ((i = 0; i < 300; i++)); do
    if port_open "$1"; then
      if [[ "$3" != hello ]]; then sleep 1; return 0; fi
      wrk -t1 -c4 -d0.2s "http://127.0.0.1:$1/" >/dev/null 2>&1 || true
      (($(find "$2" -type f | wc -l) >= WORKERS)) && return 0
    fi
    sleep 0.1
  done
  return 1
}

counts() { # countdir -> "pid:requests:connections ..."
  local f
  for f in "$1"/*; do printf '%s:%s ' "$(basename "$f")" "$(tr ' ' ':' <"$f")"; done
}

run_one() { # round peer scenario
  local round=$1 peer=$2 scen=$3 port dir before after out rps shares conns app=$HELLO
  port="$(free_port)"
  dir="$TMP/count-$peer-$scen-$round"
  mkdir -p "$dir"
  [[ "$scen" == hello ]] || app=$PI
  start_peer "$peer" "$port" "$dir" "$app"
  wait_ready "$port" "$dir" "$scen" || die "$peer did not start: $(tail -5 "$TMP/$peer.log")"
  if [[ "$scen" != hello ]]; then
    out="$(wrk -t1 -c"${scen#mixed-c}" -d"${D}s" --latency -s "$BENCH_DIR/mix-close.lua" "http://127.0.0.1:$port/" | grep '^{')"
    kill -TERM -- "-$PEER_PID" 2>/dev/null || true
    wait "$PEER_PID" 2>/dev/null || true
    PEER_PID=""
    printf '{"round":%d,"peer":"%s","scenario":"%s","wrk":%s}\n' "$round" "$peer" "$scen" "$out" | tee -a "$RAW" >&2
    return
  fi
  sleep 0.5 # the count files settle (written every 200 ms)
  before="$(counts "$dir")"
  out="$(wrk -t1 -c"$CONNS" -d"${D}s" -s "$BENCH_DIR/wrk-json.lua" "http://127.0.0.1:$port/" | grep '^{')"
  sleep 0.5
  after="$(counts "$dir")"
  kill -TERM -- "-$PEER_PID" 2>/dev/null || true
  wait "$PEER_PID" 2>/dev/null || true
  PEER_PID=""
  rps="$(node -e 'console.log(JSON.parse(process.argv[1]).rps)' "$out")"
  # Each worker's share of the requests answered (or connections accepted) during the
  # run, largest first.
  share() { # field before after
    node -e '
      const f = Number(process.argv[1]);
      const parse = (s) => Object.fromEntries(s.trim().split(/\s+/).filter(Boolean).map((x) => { const v = x.split(":").map(Number); return [v[0], v[f]]; }));
      const b = parse(process.argv[2]), a = parse(process.argv[3]);
      const d = Object.keys(a).map((p) => a[p] - (b[p] || 0));
      const total = d.reduce((x, y) => x + y, 0);
      console.log(JSON.stringify(d.map((x) => +(100 * x / total).toFixed(1)).sort((x, y) => y - x)));
    ' "$@"
  }
  shares="$(share 1 "$before" "$after")"
  conns="$(share 2 "$before" "$after")"
  printf '{"round":%d,"peer":"%s","scenario":"hello","rps":%s,"worker_shares_pct":%s,"worker_conn_shares_pct":%s}\n' \
    "$round" "$peer" "$rps" "$shares" "$conns" | tee -a "$RAW" >&2
}

log "$WORKERS workers, ${D}s runs, $ROUNDS rounds, scenarios: $SCENARIOS; peers: ${PEERS[*]}; drover: $DROVER"
for ((r = 1; r <= ROUNDS; r++)); do
  order=("${PEERS[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#PEERS[@]} - 1; i >= 0; i--)); do order+=("${PEERS[i]}"); done
  fi
  for scen in $SCENARIOS; do
    for peer in "${order[@]}"; do run_one "$r" "$peer" "$scen"; done
  done
done

node -e '
  const all = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
  const rows = all.filter((r) => r.scenario === "hello");
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
  const peers = [...new Set(all.map((r) => r.peer))];
  const base = median(rows.filter((r) => r.peer === "node-cluster").map((r) => r.rps));
  if (rows.length) {
    console.log("hello: keep-alive, wrk -t1 -c50\n");
    console.log("| peer | req/s (median) | x cluster | largest worker share of requests, median (each round) | of connections |");
    console.log("|---|---|---|---|---|");
  }
  for (const p of rows.length ? peers : []) {
    const mine = rows.filter((r) => r.peer === p);
    const rps = median(mine.map((r) => r.rps));
    const top = mine.map((r) => r.worker_shares_pct[0]);
    const conns = mine.map((r) => r.worker_conn_shares_pct[0]);
    console.log(`| ${p} | ${rps.toFixed(0)} | ${(rps / base).toFixed(2)} | ${median(top)} % (${top.join(", ")}) | ${median(conns)} % (${conns.join(", ")}) |`);
  }
  for (const scen of [...new Set(all.map((r) => r.scenario))].filter((s) => s !== "hello")) {
    const mine = all.filter((r) => r.scenario === scen);
    const ms = (us) => (us / 1000).toFixed(1);
    const cluster = median(mine.filter((r) => r.peer === "node-cluster").map((r) => r.wrk.latency_us.p99));
    console.log(`\n${scen}: a new connection per request, 10 % of requests ~50x dearer (medians)\n`);
    console.log("| peer | req/s | p50 ms | p99 ms | p99 x cluster | errors |");
    console.log("|---|---|---|---|---|---|");
    for (const p of peers) {
      const w = mine.filter((r) => r.peer === p).map((r) => r.wrk);
      if (!w.length) continue;
      const p99 = median(w.map((x) => x.latency_us.p99));
      const errors = w.reduce((n, x) => n + x.errors.connect + x.errors.read + x.errors.write + x.errors.status + x.errors.timeout, 0);
      console.log(`| ${p} | ${median(w.map((x) => x.rps)).toFixed(0)} | ${ms(median(w.map((x) => x.latency_us.p50)))} | ${ms(p99)} | ${(p99 / cluster).toFixed(2)} | ${errors} |`);
    }
  }
' "$RAW"
log "raw rounds: $RAW"
