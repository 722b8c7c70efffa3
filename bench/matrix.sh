#!/usr/bin/env bash
# The workload matrix: drover's DEFAULT configuration side by side with nginx and HAProxy
# on the same Node backends and cores, one row per workload, medians over rounds, ratios
# against the best peer and a PASS/MISS per row (the workload-matrix targets).
#
#   bash bench/matrix.sh                                   # full run (10 s x 3 rounds, ~28 min)
#   BENCH_DURATION=3 BENCH_ROUNDS=1 bash bench/matrix.sh   # smoke run (~5-6 min)
#   DROVER_BIN=/work/baseline/drover BENCH_SKIP_BUILD=1 bash bench/matrix.sh   # an older binary
#   BENCH_ROWS="io-c100 io-c100-cold long-lived" BENCH_PEERS="drover drover-mc0 nginx-lc" bash bench/matrix.sh
#
# Environment (all optional):
#   BENCH_DURATION   seconds per measurement                          (10)
#   BENCH_ROUNDS     rounds; the peer order alternates between rounds (3)
#   BENCH_ROWS       rows to run, space separated (default: every row of DEFAULT_ROWS below;
#                    "all" adds the optional hetero-io)
#   BENCH_PEERS      (drover nginx-lc haproxy-lc haproxy-rr). Also: nginx-rr,
#                    drover-mcN (drover --max-conns N, e.g. drover-mc0),
#                    drover-alt (a second binary, $DROVER_ALT_BIN, for A/B runs),
#                    drover-STRATEGY (--strategy, e.g. drover-least-conn, drover-rr),
#                    node-cluster (Node's cluster module over the same backend app: no proxy)
#   BENCH_WARMUP     seconds of the row's own load before each warm measurement
#                    (1; 0.5 when BENCH_DURATION < 5). A warm io row instead follows its
#                    cold row on the same proxy process: the cold run is its warm-up
#   BENCH_COLD_DURATION  seconds measured right after a fresh start in *-cold rows (5)
#   BENCH_POLL_MS    long-poll and SSE length in long-lived (20000)
#   BENCH_LONG_DURATION  seconds of the long-lived row (max(BENCH_DURATION, poll + 2 s) = 22)
#   BENCH_BURST_DURATION  seconds of the burst row (6: on-phases at 0 s and 5 s)
#   BENCH_SEQ_N      requests in the light-seq rows (1000)
#   BENCH_REPORT_LOAD=1  the backends report their event-loop utilisation on every answer
#                    (endpoint-load-metrics, as a Node app with drover's SDK would)
#   BENCH_CAPACITY   cpu-mixed capacity in req/s; default: measured in round 1 (median of
#                    the peers' cpu-mixed-closed throughput)
#   DROVER_BIN       drover binary to measure (default: target/release/drover, built)
#   LOADGEN          drover binary whose `drover bench` generates the load (default: target/release/drover, built)
#   BENCH_SKIP_BUILD=1  do not run cargo build
#   BENCH_NO_INSTALL=1  never call apt-get
#   PROXY_CPU / LOADGEN_CPU  cores for the proxy under test / the load generator (last / 0)
#
# Output: the table on stdout; bench/results/matrix-raw-STAMP.jsonl (one record per
# measurement) and matrix-summary-STAMP.json. `node bench/matrix/report.js RAW` re-prints.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
M="$BENCH_DIR/matrix"
D="${BENCH_DURATION:-10}"
ROUNDS="${BENCH_ROUNDS:-3}"
WARMUP="${BENCH_WARMUP:-$( ((D >= 5)) && echo 1 || echo 0.5)}"
COLD_D="${BENCH_COLD_DURATION:-5}"
POLL_MS="${BENCH_POLL_MS:-20000}"
SEQ_N="${BENCH_SEQ_N:-1000}"
PEERS_WANTED="${BENCH_PEERS:-drover nginx-lc haproxy-lc haproxy-rr}"
ALL_ROWS="cpu-mixed-closed cpu-mixed-open75 io-c10 io-c10-cold io-c100 io-c100-cold io-c1000 io-c1000-cold long-lived light-seq light-seq-newconn hetero hetero-io degrade fail-fast burst"
DEFAULT_ROWS="${ALL_ROWS/ hetero-io/}"
ROWS_WANTED="${BENCH_ROWS:-$DEFAULT_ROWS}"
[[ "$ROWS_WANTED" == all ]] && ROWS_WANTED="$ALL_ROWS"
MIX="90:/cpu?us=20,10:/cpu?ms=10"
BURST_ON=1 BURST_PERIOD=5

LOG_TAG=matrix
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
[[ "$WARMUP" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "BENCH_WARMUP must be a number of seconds"
WARMUP_MS="$(awk -v w="$WARMUP" 'BEGIN{printf "%d", w*1000}')"
[[ "$COLD_D" =~ ^[0-9]+$ && "$COLD_D" -ge 1 ]] || die "BENCH_COLD_DURATION must be a positive whole number"
[[ "$POLL_MS" =~ ^[0-9]+$ && "$POLL_MS" -ge 1000 ]] || die "BENCH_POLL_MS must be a whole number >= 1000"
[[ "$SEQ_N" =~ ^[0-9]+$ && "$SEQ_N" -ge 10 ]] || die "BENCH_SEQ_N must be a whole number >= 10"
LONG_D="${BENCH_LONG_DURATION:-$(((POLL_MS + 999) / 1000 + 2 > D ? (POLL_MS + 999) / 1000 + 2 : D))}"
[[ "$LONG_D" =~ ^[0-9]+$ && "$LONG_D" -ge 1 ]] || die "BENCH_LONG_DURATION must be a positive whole number"
# Two on-phases: at 0 s and at BURST_PERIOD s.
BURST_D="${BENCH_BURST_DURATION:-$((BURST_PERIOD + BURST_ON))}"
[[ "$BURST_D" =~ ^[0-9]+$ && "$BURST_D" -ge 1 ]] || die "BENCH_BURST_DURATION must be a positive whole number"

ROWS=()
for row in $ROWS_WANTED; do
  [[ " $ALL_ROWS " == *" $row "* ]] || die "unknown row $row (rows: $ALL_ROWS)"
done
for row in $ALL_ROWS; do # canonical order
  [[ " $ROWS_WANTED " == *" $row "* ]] && ROWS+=("$row")
done
CAPACITY="${BENCH_CAPACITY:-}"
CAPACITY_FROM="BENCH_CAPACITY"
if [[ -z "$CAPACITY" && " ${ROWS[*]} " =~ \ (cpu-mixed-open75|burst)\  && " ${ROWS[*]} " != *" cpu-mixed-closed "* ]]; then
  log "cpu-mixed-open75 and burst need the capacity: adding cpu-mixed-closed (or set BENCH_CAPACITY)"
  ROWS=(cpu-mixed-closed "${ROWS[@]}")
fi

# ------------------------------------------------------------------ processes and cleanup
TMP="$(mktemp -d /tmp/drover-matrix.XXXXXX)"
PIDS=()     # backends, for the whole run
CUR_PID=""  # the peer being measured (CUR_GROUP=1: the leader of its own process group)
CUR_ADMIN="" CUR_GROUP=0
BG_PIDS=()  # load generators and clients of the current measurement
kill_bg() {
  local p
  for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  BG_PIDS=()
}
stop_peer() {
  [[ -n "$CUR_PID" ]] || return 0
  local i target=$CUR_PID
  ((CUR_GROUP)) && target="-$CUR_PID"
  kill -TERM -- "$target" 2>/dev/null || true
  for ((i = 0; i < 40; i++)); do
    kill -0 -- "$target" 2>/dev/null || break
    sleep 0.05
  done
  kill -9 -- "$target" 2>/dev/null || true
  wait "$CUR_PID" 2>/dev/null || true
  CUR_PID="" CUR_ADMIN="" CUR_GROUP=0
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  kill_bg
  stop_peer
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  sleep 0.3
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ tools
setup_proxy_bench

# ------------------------------------------------------------------ binaries
LOADGEN_WANTED="${LOADGEN:-}"
if [[ "${BENCH_SKIP_BUILD:-0}" == 1 && -n "$LOADGEN_WANTED" ]]; then
  DROVER="${CARGO_TARGET_DIR:-$ROOT/target}/release/drover"
  HAVE_DROVER=0
  [[ -x "$DROVER" ]] && HAVE_DROVER=1
else
  build_binaries
fi
[[ -n "$LOADGEN_WANTED" ]] && LOADGEN="$LOADGEN_WANTED"
[[ -x "$LOADGEN" ]] || die "no drover binary at LOADGEN=$LOADGEN (the load generator is drover bench)"
if [[ -n "${DROVER_BIN:-}" ]]; then
  [[ -x "$DROVER_BIN" ]] || die "DROVER_BIN=$DROVER_BIN is not an executable"
  DROVER="$DROVER_BIN"
  HAVE_DROVER=1
fi
if ((HAVE_DROVER)) && ! "$DROVER" proxy --help >/dev/null 2>&1; then
  log "$DROVER has no working 'proxy' command; measuring the peers only"
  HAVE_DROVER=0
fi


# ------------------------------------------------------------------ backends
BE_PORTS=("$(quick_port)" "$(quick_port)" "$(quick_port)")
for i in 1 2 3; do
  port="${BE_PORTS[$((i - 1))]}"
  REPORT_LOAD="${BENCH_REPORT_LOAD:-0}" BACKEND_ID="be$i" node "$M/backend.js" "$port" 2>"$TMP/backend$i.log" &
  PIDS+=($!)
  wait_port "$port" $! 10 || { cat "$TMP/backend$i.log" >&2; die "backend $i did not start"; }
done
log "backends: node bench/matrix/backend.js on 127.0.0.1:${BE_PORTS[0]}, :${BE_PORTS[1]}, :${BE_PORTS[2]} (the third only in light-seq rows)"

# ------------------------------------------------------------------ peers
PEERS=()
for name in $PEERS_WANTED; do
  case "$name" in
    nginx-lc | nginx-rr | haproxy-lc | haproxy-rr | node-cluster) ;;
    drover | drover-*)
      if ((!HAVE_DROVER)); then log "skipping $name: no drover binary"; continue; fi
      ;;
    *) die "unknown peer $name" ;;
  esac
  PEERS+=("$name")
done
((${#PEERS[@]})) || die "no peer to measure"

# A fresh peer for each measurement, over the row's backends: no state (learned limits,
# ejections, pooled connections) carries from one row or peer to the next.
RUN_N=0
CUR_PORT=""
start_peer() { # name nbackends
  local name=$1 nb=$2 dir port i ups=() servers="" be_args=()
  RUN_N=$((RUN_N + 1))
  dir="$TMP/run$RUN_N-$name"
  mkdir -p "$dir/tmp"
  port="$(quick_port)"
  for ((i = 0; i < nb; i++)); do ups+=("127.0.0.1:${BE_PORTS[$i]}"); done
  case "$name" in
    nginx-lc | nginx-rr)
      local lb=""
      [[ "$name" == nginx-lc ]] && lb="least_conn;"
      for i in "${ups[@]}"; do servers+="    server $i max_fails=0;"$'\n'; done
      {
        nginx_preamble "$dir" 16384
        cat <<EOF
  # WebSockets: pass Upgrade on; keep upstream keep-alive (Connection "") otherwise.
  map \$http_upgrade \$connection_upgrade { default upgrade; '' ""; }
  upstream backends {
    $lb
$servers    keepalive 64;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
  }
  server {
    listen 127.0.0.1:$port backlog=4096;
    proxy_http_version 1.1;
    proxy_set_header Upgrade \$http_upgrade;
    proxy_set_header Connection \$connection_upgrade;
    # 20 s long-polls, SSE streams and WebSockets must outlive the timeouts.
    proxy_read_timeout 60s;
    proxy_send_timeout 60s;
    location / { proxy_pass http://backends; }
    location /sse { proxy_pass http://backends; proxy_buffering off; }
  }
}
EOF
      } >"$dir/nginx.conf"
      "${PIN_PROXY[@]}" "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" 2>"$dir/stderr.log" &
      ;;
    haproxy-lc | haproxy-rr)
      local balance=leastconn
      [[ "$name" == haproxy-rr ]] && balance=roundrobin
      for ((i = 0; i < nb; i++)); do servers+="  server be$((i + 1)) ${ups[$i]}"$'\n'; done
      {
        haproxy_preamble 8192 "$port"
        echo "  balance $balance"
        echo "$servers"
      } >"$dir/haproxy.cfg"
      "${PIN_PROXY[@]}" "$HAPROXY" -db -f "$dir/haproxy.cfg" >"$dir/stderr.log" 2>&1 &
      ;;
    drover | drover-*)
      local flags=() s="${name#drover}" bin="$DROVER"
      s="${s#-}"
      case "$s" in
        "") ;;
        alt) bin="${DROVER_ALT_BIN:?drover-alt needs DROVER_ALT_BIN}" ;;
        mc*) flags=(--max-conns "${s#mc}") ;;
        rr) flags=(--strategy round-robin) ;;
        *) flags=(--strategy "$s") ;;
      esac
      for i in "${ups[@]}"; do be_args+=(--backend "$i"); done
      "${PIN_PROXY[@]}" "$bin" proxy --listen "127.0.0.1:$port" "${be_args[@]}" "${flags[@]}" \
        --threads 1 >"$dir/stdout.log" 2>"$dir/stderr.log" &
      ;;
    node-cluster)
      # Unpinned: its workers are the backends, and forked children inherit the affinity.
      # Its own process group (setsid), so stopping it takes the workers along for sure.
      CUR_ADMIN="$(quick_port)"
      PORT="$port" WORKERS="$nb" ADMIN_PORT="$CUR_ADMIN" MATRIX_MODE_1="${CLUSTER_MODE_1:-}" \
        setsid node "$M/cluster.js" >"$dir/stdout.log" 2>"$dir/stderr.log" &
      CUR_GROUP=1
      ;;
  esac
  CUR_PID=$!
  CUR_PORT=$port
  if ! wait_port "$port" "$CUR_PID" 10; then
    log "$name did not start listening. Its log:"
    cat "$dir"/*.log >&2 2>/dev/null || true
    stop_peer
    return 1
  fi
  if [[ "$name" == node-cluster ]]; then
    wait_port "$CUR_ADMIN" "$CUR_PID" 10 || true
    # Every worker must listen before the first request (the primary accepts earlier).
    for ((i = 0; i < 100; i++)); do
      [[ "$(grep -c 'listening on' "$dir/stderr.log" 2>/dev/null || true)" -ge "$nb" ]] && break
      sleep 0.05
    done
  fi
  return 0
}


# Backend modes (slow, degrade, fail): on the shared backends, or on node-cluster's workers.
set_mode() { # peer backend-index query
  local url
  if [[ "$1" == node-cluster ]]; then
    url="http://127.0.0.1:$CUR_ADMIN/__mode?worker=$2&$3"
  else
    url="http://127.0.0.1:${BE_PORTS[$2]}/__mode?$3"
  fi
  MODES_SET=1
  curl -fsS --max-time 3 "$url" >/dev/null || log "could not set mode $3 on backend $2"
}
MODES_SET=1
reset_modes() {
  local p
  ((MODES_SET)) || return 0
  for p in "${BE_PORTS[@]}"; do curl -fsS --max-time 3 "http://127.0.0.1:$p/__mode?reset=1" >/dev/null || true; done
  MODES_SET=0
}

# ------------------------------------------------------------------ rows
row_backends() { case "$1" in light-seq*) echo 3 ;; *) echo 2 ;; esac; }

# Sets CMD (the measuring command) and CLIENT (loadgen or client) for a row, a URL and a
# duration in milliseconds.
row_cmd() { # row url ms
  local row=$1 url=$2 ms=$3 s
  s="$(awk -v m="$ms" 'BEGIN{print m/1000}')"
  CLIENT=loadgen
  case "$row" in
    cpu-mixed-closed) CMD=("$LOADGEN" bench -c 50 -d "${ms}ms" --mix "$MIX") ;;
    cpu-mixed-open75) CMD=("$LOADGEN" bench --rate "$(awk -v c="$CAPACITY" 'BEGIN{printf "%.0f", c*0.75}')" -c 512 -d "${ms}ms" --mix "$MIX") ;;
    io-c*)
      local c=${row#io-c}
      c=${c%-cold}
      CMD=("$LOADGEN" bench -c "$c" -d "${ms}ms" --path "/io?ms=100")
      ;;
    long-lived) CMD=("$LOADGEN" bench -c 20 -d "${ms}ms" --path "/io?ms=5") ;;
    light-seq) CMD=("$LOADGEN" bench -n "$SEQ_N" -c 1 -d 120s --path "/cpu?us=20") ;;
    light-seq-newconn)
      CLIENT=client
      CMD=(node "$M/client.js" seq "$url" --n "$SEQ_N" --path "/cpu?us=20" --new-conn)
      return
      ;;
    hetero) CMD=("$LOADGEN" bench -c 20 -d "${ms}ms" --path "/cpu?ms=2") ;;
    hetero-io) CMD=("$LOADGEN" bench -c 100 -d "${ms}ms" --path "/io?ms=50") ;;
    degrade | fail-fast)
      # client.js: it reports the successful answers' latency apart from the errors'.
      CLIENT=client
      CMD=(node "$M/client.js" closed "$url" --conns 50 --duration "$s" --mix "1:/io?ms=20")
      return
      ;;
    burst)
      CLIENT=client
      CMD=(node "$M/client.js" burst "$url" --rate "$(awk -v c="$CAPACITY" 'BEGIN{printf "%.0f", c*2}')"
        --on "$BURST_ON" --period "$BURST_PERIOD" --duration "$s" --conns 512 --mix "$MIX" --timeout 10)
      return
      ;;
    *) die "no command for row $row" ;;
  esac
  CMD+=(--count-header x-backend --json "$url/")
}

row_seconds() {
  case "$1" in
    *-cold) echo "$COLD_D" ;;
    long-lived) echo "$LONG_D" ;;
    burst) echo "$BURST_D" ;;
    light-seq*) echo 0 ;; # a count, not a duration
    *) echo "$D" ;;
  esac
}

# The warm-up: the row's own load (closed loop for the open-loop rows) for BENCH_WARMUP.
warm_up() { # row url
  local row=$1 url=$2
  ((WARMUP_MS > 0)) || return 0
  case "$row" in
    light-seq*) CMD=("$LOADGEN" bench -c 1 -d "${WARMUP_MS}ms" --path "/cpu?us=20" "$url/") ;;
    degrade | fail-fast) CMD=("$LOADGEN" bench -c 50 -d "${WARMUP_MS}ms" --path "/io?ms=20" "$url/") ;;
    burst | cpu-mixed-open75) CMD=("$LOADGEN" bench -c 50 -d "${WARMUP_MS}ms" --mix "$MIX" "$url/") ;;
    *) row_cmd "$row" "$url" "$WARMUP_MS" ;;
  esac
  "${PIN_LOAD[@]}" "${CMD[@]}" >/dev/null 2>&1 || true
}

STAMP="$(date +%Y%m%d-%H%M%S)"
RESULTS="$BENCH_DIR/results"
mkdir -p "$RESULTS"
RAW="$RESULTS/matrix-raw-$STAMP.jsonl"
: >"$RAW"

# A progress line from a record, without starting node (which is slow on a busy machine).
progress() { # record
  local r=$1 rps="?" p99="?" err="?" per="" ll=""
  [[ "$r" =~ \"rps\":([0-9.]+) ]] && rps=${BASH_REMATCH[1]}
  [[ "$r" =~ \"latency_us\":\{[^}]*\"p99\":([0-9]+) ]] && p99=${BASH_REMATCH[1]}
  [[ "$r" =~ \"errors_total\":([0-9]+) ]] && err=${BASH_REMATCH[1]}
  [[ "$r" =~ \"values\":\{([^}]*)\} ]] && per=" per backend {${BASH_REMATCH[1]}}"
  [[ "$r" =~ \"longlived\":\{[^}]*\"failed\":([0-9]+) ]] && ll=" long-lived failed ${BASH_REMATCH[1]}"
  printf '  r%s %-12s %-18s %8s req/s  p99 %8sµs  errors %s%s%s\n' "$ROUND" "$PEER" "$ROW" "$rps" "$p99" "$err" "$per" "$ll" >&2
}

# One measurement. Starts a fresh peer unless reuse=1 (then the peer of the previous
# measurement, without warm-up); stops it afterwards unless keep=1.
run_one() { # round peer row [keep] [reuse]
  local round=$1 peer=$2 row=$3 keep=${4:-0} reuse=${5:-0} nb d url out ll='null' llp="" t0 t1 u0 s0 u1 s1 rss i
  ROUND=$round PEER=$peer ROW=$row
  [[ -z "$CUR_PID" ]] && reuse=0 # the previous measurement's peer did not start
  nb="$(row_backends "$row")"
  d="$(row_seconds "$row")"
  if ((!reuse)); then
    reset_modes
    CLUSTER_MODE_1=""
    [[ "$row" == hetero* ]] && CLUSTER_MODE_1="slow=2"
    if ! start_peer "$peer" "$nb"; then
      printf '{"round":%d,"peer":"%s","row":"%s","error":"did not start","result":null}\n' "$round" "$peer" "$row" >>"$RAW"
      return 0
    fi
    # Heterogeneous backends: the second one 2x slower for the whole measurement.
    [[ "$row" == hetero* && "$peer" != node-cluster ]] && set_mode "$peer" 1 "slow=2"
    [[ "$row" == *-cold ]] || warm_up "$row" "http://127.0.0.1:$CUR_PORT"
  fi
  url="http://127.0.0.1:$CUR_PORT"
  case "$row" in
    degrade) set_mode "$peer" 1 "degrade_in_ms=$((d * 1000 / 3))&degrade_factor=10" ;;
    fail-fast) set_mode "$peer" 1 "fail=1" ;;
  esac
  row_cmd "$row" "$url" "$((d * 1000))"
  if [[ "$row" == long-lived ]]; then
    # The long-lived connections first (ready once all are open), then the short requests.
    "${PIN_LOAD[@]}" node "$M/longlived.js" "$url" --polls 20 --sse 10 --ws 10 --ms "$POLL_MS" \
      --duration "$((d + 10))" >"$TMP/ll.out" 2>"$TMP/ll.err" &
    llp=$!
    BG_PIDS+=("$llp")
    for ((i = 0; i < 100; i++)); do
      grep -q '^ready' "$TMP/ll.err" 2>/dev/null && break
      sleep 0.05
    done
  fi
  read -r u0 s0 < <(cpu_ticks "$CUR_PID")
  t0="$(date +%s.%N)"
  "${PIN_LOAD[@]}" "${CMD[@]}" >"$TMP/out" 2>"$TMP/err" &
  local lp=$!
  BG_PIDS+=("$lp")
  wait "$lp" || log "load generator failed for $peer/$row: $(tail -3 "$TMP/err")"
  t1="$(date +%s.%N)"
  read -r u1 s1 < <(cpu_ticks "$CUR_PID")
  rss="$(rss_kb "$CUR_PID")"
  if [[ -n "$llp" ]]; then
    kill -TERM "$llp" 2>/dev/null || true
    wait "$llp" || log "long-lived client failed for $peer: $(tail -3 "$TMP/ll.err")"
    ll="$(grep '^{' "$TMP/ll.out" | tail -1 || true)"
    [[ -n "$ll" ]] || ll='null'
  fi
  BG_PIDS=()
  out="$(grep '^{' "$TMP/out" | tail -1 || true)"
  [[ -n "$out" ]] || out='null'
  printf '{"round":%d,"peer":"%s","row":"%s","client":"%s","duration_s":%s,"wall_s":%s,"fresh":%s,"backends":%d,"capacity":%s,"cpu_ticks":%d,"clk_tck":%d,"rss_kb":%d,"result":%s,"longlived":%s}\n' \
    "$round" "$peer" "$row" "$CLIENT" "$d" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}')" \
    "$([[ "$row" == *-cold ]] && echo true || echo false)" "$nb" \
    "${CAPACITY:-null}" "$((u1 + s1 - u0 - s0))" "$CLK_TCK" "${rss:-0}" "$out" "$ll" >>"$RAW"
  if ((!keep)); then
    stop_peer
    reset_modes
  fi
  progress "$(tail -1 "$RAW")"
}

capacity_from_raw() { # prints "RPS DESCRIPTION" from round 1's cpu-mixed-closed records
  # shellcheck disable=SC2016 # JavaScript, not shell
  node -e '
    const fs = require("fs"); const runs = [];
    for (const line of fs.readFileSync(process.argv[1], "utf8").split("\n")) {
      if (!line) continue; const r = JSON.parse(line);
      if (r.round === 1 && r.row === "cpu-mixed-closed" && r.result && r.result.errors_total === 0) runs.push(r);
    }
    if (!runs.length) process.exit(0);
    runs.sort((a, b) => a.result.rps - b.result.rps);
    const n = runs.length, mid = n >> 1;
    const rps = n % 2 ? runs[mid].result.rps : (runs[mid - 1].result.rps + runs[mid].result.rps) / 2;
    console.log(`${Math.round(rps)} median-of-${n}:${runs.map((r) => `${r.peer}=${Math.round(r.result.rps)}`).join(",")}`);
  ' "$RAW"
}

selected() { [[ " ${ROWS[*]} " == *" $1 "* ]]; }

log "peers: ${PEERS[*]} (proxies pinned: ${PIN_PROXY[*]:-no}; load: ${PIN_LOAD[*]:-unpinned}); drover: ${DROVER:-none}"
log "rows: ${ROWS[*]}"
log "${D}s per measurement (cold ${COLD_D}s, long-lived ${LONG_D}s, burst ${BURST_D}s), warm-up ${WARMUP}s, $ROUNDS round(s); raw records in $RAW"
START_S=$SECONDS
for ((round = 1; round <= ROUNDS; round++)); do
  read -r -a order <<<"$(order_for_round "$round")"
  log "round $round: ${order[*]}"
  for row in "${ROWS[@]}"; do
    if [[ ("$row" == cpu-mixed-open75 || "$row" == burst) && -z "$CAPACITY" ]]; then
      read -r CAPACITY CAPACITY_FROM < <(capacity_from_raw) || true
      [[ -n "$CAPACITY" ]] || die "no capacity: cpu-mixed-closed gave no error-free result; set BENCH_CAPACITY"
      log "capacity $CAPACITY req/s (cpu-mixed-closed, round 1, $CAPACITY_FROM): open75 at 75 %, burst at 200 %"
    fi
    # A cold io row and its warm row share one proxy process: the fresh start is measured
    # for COLD_D seconds, then the same load again, warm, for D seconds.
    [[ "$row" == io-*-cold ]] && selected "${row%-cold}" && continue
    for peer in "${order[@]}"; do
      if [[ "$row" == io-* ]] && selected "$row-cold"; then
        run_one "$round" "$peer" "$row-cold" 1
        run_one "$round" "$peer" "$row" 0 1
      else
        run_one "$round" "$peer" "$row"
      fi
    done
  done
done
log "measured in $((SECONDS - START_S)) s"

# ------------------------------------------------------------------ report
META="$TMP/meta.json"
node -e 'console.log(JSON.stringify({
  stamp: process.argv[1], duration_s: +process.argv[2], rounds: +process.argv[3], cpus: +process.argv[4],
  proxy_cpu: process.argv[5], loadgen_cpu: process.argv[6],
  capacity_rps: process.argv[7] ? +process.argv[7] : null, capacity_from: process.argv[8],
  cold_s: +process.argv[9], long_s: +process.argv[10], burst_s: +process.argv[11], warmup_s: +process.argv[12],
  poll_ms: +process.argv[13], seq_n: +process.argv[14], mix: process.argv[15], drover: process.argv[16],
  peers: process.argv[17].split(" "), rows: process.argv[18].split(" "),
  versions: { nginx: process.argv[19], haproxy: process.argv[20], node: process.version } }))' \
  "$STAMP" "$D" "$ROUNDS" "$NCPU" "${PIN_PROXY[*]:+$PROXY_CPU}" "${PIN_LOAD[*]:+$LOADGEN_CPU}" \
  "${CAPACITY:-}" "$CAPACITY_FROM" "$COLD_D" "$LONG_D" "$BURST_D" "$WARMUP" "$POLL_MS" "$SEQ_N" "$MIX" \
  "${DROVER:-}" "${PEERS[*]}" "${ROWS[*]}" \
  "$("$NGINX" -v 2>&1 | sed 's/.*: //')" "$("$HAPROXY" -v 2>&1 | head -1 | awk '{print $3}')" >"$META"
cp "$META" "$RESULTS/matrix-meta-$STAMP.json"
node "$M/report.js" "$RAW" "$META" "$RESULTS/matrix-summary-$STAMP.json"
log "raw: $RAW; summary: $RESULTS/matrix-summary-$STAMP.json"
