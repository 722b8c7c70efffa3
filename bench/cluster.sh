#!/usr/bin/env bash
# drover as a process supervisor + balancer, side by side with the classic ways to run a
# Node app on every core: one process, Node's cluster module, PM2 cluster mode.
#
#   bash bench/cluster.sh                                   # full run (10 s x 3 rounds)
#   BENCH_DURATION=3 BENCH_ROUNDS=1 bash bench/cluster.sh   # smoke run, ~3 minutes
#
# Every peer serves examples/pi-server.js with the same number of workers (one per core)
# on 127.0.0.1; all peers are started up front and sit idle while another is measured.
#
# Environment (all optional):
#   BENCH_DURATION   seconds per measurement                        (10)
#   BENCH_ROUNDS     rounds; peer order alternates between rounds   (3)
#   BENCH_PEERS      peers to measure, space separated
#                    (node node-cluster pm2 drover-rr drover-p2c drover-shared);
#                    also drover-p2c-mc0 (p2c with --max-conns 0: never queues in drover)
#                    and drover-handoff (--mode handoff: connections handed to the workers)
#                    and drover-proxy (--mode proxy: every request placed, never handed);
#                    drover-rr and drover-p2c run the default mode (auto)
#   BENCH_SCENARIOS  (pi-closed mixed-closed mixed-open50 mixed-open75); any mixed-openNN
#                    runs the mixed load open loop at NN % of capacity
#   BENCH_CAPACITY   mixed-load capacity in req/s; default: measured (median of the
#                    multi-worker peers' mixed-closed throughput in round 1)
#   BENCH_WORKERS    workers per peer                               (nproc)
#   BENCH_WARMUP     seconds of warm-up per peer before round 1     (2)
#   BENCH_SKIP_BUILD=1  use the binaries already in target/release
#   BENCH_NO_INSTALL=1  never install PM2 (the pm2 peer is skipped when it is missing)
#   DROVER_THREADS   pass -t N to drover run (default: drover's own default, one per core)
#   PI_ITERATIONS    cost of the pi workload's request                 (100000, ~2 ms)
#   BENCH_REUSE      open loop: idle connection a request goes out on (random)
#                    random: like many independent clients; newest: the connection that
#                    answered last, which steers requests to the worker that just finished
#                    and so does the per-connection peers' balancing for them
#
# Results: tables on stdout, raw records and a summary under bench/results/.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
D="${BENCH_DURATION:-10}"
ROUNDS="${BENCH_ROUNDS:-3}"
WARMUP="${BENCH_WARMUP:-2}"
PEERS_WANTED="${BENCH_PEERS:-node node-cluster pm2 drover-rr drover-p2c drover-shared}"
SCENARIOS="${BENCH_SCENARIOS:-pi-closed mixed-closed mixed-open50 mixed-open75}"
NCPU="$(nproc)"
WORKERS="${BENCH_WORKERS:-$NCPU}"
APP="$ROOT/examples/pi-server.js"
PI_PATH="/pi?iterations=${PI_ITERATIONS:-100000}"
# 10 % of requests cost ~50x the others (5e5 vs 1e4 points: ~10 ms vs ~0.2 ms).
MIX="90:/pi?iterations=10000,10:/pi?iterations=500000"
CLOSED_CONNS=50
OPEN_CONNS=512
REUSE="${BENCH_REUSE:-random}"
COUNT_HEADER=x-worker

LOG_TAG=cluster
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
[[ "$REUSE" == random || "$REUSE" == newest ]] || die "BENCH_REUSE must be random or newest, not \"$REUSE\""
[[ "$WORKERS" =~ ^[0-9]+$ && "$WORKERS" -ge 1 ]] || die "BENCH_WORKERS must be a positive integer"
command -v node >/dev/null || die "node is needed (the peers are Node apps)"

# ------------------------------------------------------------------ processes and cleanup
TMP="$(mktemp -d /tmp/drover-cluster.XXXXXX)"
PIDS=()       # peers started by this script; each leads its own process group (setsid)
PM2_PID=""    # PM2's God daemon detaches from us; `pm2 kill` stops it
PM2=""
LOAD_PID=""
export PM2_HOME="$TMP/pm2"

descendants() { # pid -> every descendant pid, one per line
  local kid
  for kid in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$kid"
    descendants "$kid"
  done
}

any_alive() { # pid... -> true while one of them runs
  local p
  for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}

# Stops primaries the way their users do, with SIGTERM to the primary alone (a worker
# killed first could be replaced by its primary), then SIGKILLs whatever is left of the
# trees after 3 s.
stop_tree() { # primary pid...
  local all=() kids=() p
  for p in "$@"; do
    mapfile -t kids < <(descendants "$p")
    all+=("$p" "${kids[@]}")
  done
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq 30); do
    any_alive "${all[@]}" || return 0
    sleep 0.1
  done
  for p in "$@"; do
    mapfile -t kids < <(descendants "$p")
    all+=("${kids[@]}")
  done
  kill -KILL "${all[@]}" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$LOAD_PID" ]]; then kill "$LOAD_PID" 2>/dev/null || true; fi
  if [[ -n "$PM2" && -d "$PM2_HOME" ]]; then "$PM2" kill >/dev/null 2>&1 || true; fi
  local left=("${PIDS[@]}")
  [[ -n "$PM2_PID" ]] && kill -0 "$PM2_PID" 2>/dev/null && left+=("$PM2_PID")
  ((${#left[@]})) && stop_tree "${left[@]}"
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ build and tools
build_binaries
"$LOADGEN" bench --help | grep -q -- --count-header || die "$LOADGEN bench has no --count-header; rebuild it"
DROVER_HELP=""
if ((HAVE_DROVER)); then
  DROVER_HELP="$("$DROVER" run --help 2>&1)" || {
    log "$DROVER has no working 'run' command; skipping the drover peers"
    HAVE_DROVER=0
  }
fi

if [[ " $PEERS_WANTED " == *" pm2 "* ]] && ! find_pm2; then
  log "no pm2 and it could not be installed; skipping the pm2 peer"
  PM2=""
fi

# ------------------------------------------------------------------ peers
# PID[peer] is the peer's "primary": the process that owns the listening socket and
# supervises the workers (single node: the process itself; node-cluster: the cluster
# primary; pm2: the God daemon; drover: drover). Its descendants are the workers.
declare -A PORT PID MULTI
NOTES=()
SKIP_WHY=""
ADMIN_FLAG=()
if [[ "$DROVER_HELP" == *--admin* ]]; then ADMIN_FLAG=(--admin 127.0.0.1:0); fi
THREADS_FLAG=()
if [[ -n "${DROVER_THREADS:-}" ]]; then THREADS_FLAG=(-t "$DROVER_THREADS"); fi

start_peer() { # name -> sets PORT/PID, or returns 1 with the reason in SKIP_WHY
  local name=$1 dir="$TMP/$1" port
  port="$(free_port)"
  mkdir -p "$dir"
  PORT[$name]=$port
  MULTI[$name]=1
  case "$name" in
    node)
      MULTI[$name]=0
      PORT="$port" setsid node "$APP" >"$dir/stdout.log" 2>"$dir/stderr.log" &
      PID[$name]=$!
      ;;
    node-cluster)
      PORT="$port" WORKERS="$WORKERS" setsid node "$BENCH_DIR/node-cluster.js" "$APP" \
        >"$dir/stdout.log" 2>"$dir/stderr.log" &
      PID[$name]=$!
      ;;
    pm2)
      [[ -n "$PM2" ]] || { SKIP_WHY="pm2 is not installed"; return 1; }
      PORT="$port" WORKERS="$WORKERS" "$PM2" start "$BENCH_DIR/pm2/ecosystem.config.js" \
        >"$dir/stdout.log" 2>"$dir/stderr.log" || return 1
      PM2_PID="$(cat "$PM2_HOME/pm2.pid" 2>/dev/null || true)"
      [[ -n "$PM2_PID" ]] || return 1
      PID[$name]=$PM2_PID
      ;;
    drover-rr | drover-p2c | drover-p2c-mc0 | drover-shared | drover-handoff | drover-proxy)
      ((HAVE_DROVER)) || { SKIP_WHY="no working drover binary"; return 1; }
      local mode=()
      case "$name" in
        drover-rr) mode=(-s round-robin) ;;
        drover-p2c) mode=(-s p2c) ;;
        # No limit and no queue in drover even when a worker is saturated: what the
        # saturated queue of the default adds, measured.
        drover-p2c-mc0) mode=(-s p2c --max-conns 0) ;;
        # Each connection handed to the Node worker least behind, then no hop.
        drover-handoff) mode=(--mode handoff) ;;
        # Every request placed by drover, none handed over.
        drover-proxy) mode=(--mode proxy) ;;
        drover-shared)
          if [[ "$DROVER_HELP" != *--mode* ]]; then
            SKIP_WHY="this drover run has no --mode (shared listening socket) yet"
            return 1
          fi
          mode=(--mode shared)
          ;;
      esac
      setsid "$DROVER" run -w "$WORKERS" -l "127.0.0.1:$port" "${mode[@]}" "${THREADS_FLAG[@]}" \
        "${ADMIN_FLAG[@]}" -- node "$APP" >"$dir/stdout.log" 2>"$dir/stderr.log" &
      PID[$name]=$!
      ;;
    *) die "unknown peer $name" ;;
  esac
  [[ "$name" == pm2 ]] || PIDS+=("${PID[$name]}")
}

# Ready = listening, every worker running, and a burst of requests all answered 2xx.
wait_ready() { # name
  local name=$1 port=${PORT[$1]} pid=${PID[$1]} i out want=$WORKERS
  ((MULTI[$name])) || want=0
  for ((i = 0; i < 300; i++)); do
    kill -0 "$pid" 2>/dev/null || return 1
    if port_open "$port" && (($(descendants "$pid" | wc -l) >= want)); then
      out="$("$LOADGEN" bench -n 20 -c 4 --json "http://127.0.0.1:$port/pi?iterations=1000" 2>/dev/null || true)"
      [[ "$out" == *'"ok":20'* ]] && return 0
    fi
    sleep 0.1
  done
  return 1
}

PEERS=()
for name in $PEERS_WANTED; do
  SKIP_WHY="it did not start"
  if ! start_peer "$name"; then
    log "skipping $name: $SKIP_WHY"
    NOTES+=("$name skipped: $SKIP_WHY")
    continue
  fi
  if ! wait_ready "$name"; then
    log "$name does not answer; skipping it. Its log:"
    tail -n 20 "$TMP/$name"/*.log >&2 2>/dev/null || true
    NOTES+=("$name skipped: it did not answer")
    [[ "$name" == pm2 ]] || stop_tree "${PID[$name]}"
    continue
  fi
  PEERS+=("$name")
  log "$name on 127.0.0.1:${PORT[$name]} (primary pid ${PID[$name]}, workers: $(descendants "${PID[$name]}" | tr '\n' ' '))"
done
((${#PEERS[@]})) || die "no peer started"

# ------------------------------------------------------------------ measuring
STAMP="$(date +%Y%m%d-%H%M%S)"
RESULTS="$BENCH_DIR/results"
mkdir -p "$RESULTS"
RAW="$RESULTS/cluster-raw-$STAMP.jsonl"
: >"$RAW"
CAPACITY="${BENCH_CAPACITY:-}"
CAPACITY_FROM="BENCH_CAPACITY"

run_one() { # round peer scenario
  local round=$1 peer=$2 scen=$3 port=${PORT[$2]} pid=${PID[$2]} url cmd out
  url="http://127.0.0.1:$port"
  case "$scen" in
    pi-closed) cmd=("$LOADGEN" bench -c "$CLOSED_CONNS" -d "${D}s" --path "$PI_PATH") ;;
    mixed-closed) cmd=("$LOADGEN" bench -c "$CLOSED_CONNS" -d "${D}s" --mix "$MIX") ;;
    mixed-open*)
      local pct=${scen#mixed-open} rate
      [[ "$pct" =~ ^[0-9]+$ ]] || die "unknown scenario $scen"
      rate="$(awk -v c="$CAPACITY" -v p="$pct" 'BEGIN{printf "%.0f", c*p/100}')"
      cmd=("$LOADGEN" bench --rate "$rate" -c "$OPEN_CONNS" --reuse "$REUSE" -d "${D}s" --mix "$MIX")
      ;;
    *) die "unknown scenario $scen" ;;
  esac
  cmd+=(--count-header "$COUNT_HEADER" --json "$url/")
  local workers p0 p1 w0=0 w1=0 rss hwm wrss=()
  workers="$(descendants "$pid" | tr '\n' ' ')"
  p0="$(cpu_total "$pid")"
  for w in $workers; do w0=$((w0 + $(cpu_total "$w"))); done
  # The load generator floats like everything else: see bench/README.md for why.
  "${cmd[@]}" >"$TMP/out" 2>"$TMP/err" &
  local lp=$!
  LOAD_PID=$lp
  sleep "$(awk -v d="$D" 'BEGIN{print d*0.8}')"
  rss="$(rss_kb "$pid")"
  hwm="$(hwm_kb "$pid")"
  for w in $(descendants "$pid"); do wrss+=("$(rss_kb "$w")"); done
  if ! wait "$lp"; then
    log "load generator failed for $peer/$scen: $(tail -3 "$TMP/err")"
  fi
  LOAD_PID=""
  p1="$(cpu_total "$pid")"
  for w in $workers; do w1=$((w1 + $(cpu_total "$w"))); done
  out="$(grep '^{' "$TMP/out" | tail -1 || true)"
  [[ -n "$out" ]] || out='null'
  local wj
  wj="$(IFS=,; echo "${wrss[*]:-}")"
  printf '{"round":%d,"peer":"%s","scenario":"%s","workers":%d,"primary_ticks":%d,"worker_ticks":%d,"clk_tck":%d,"primary_rss_kb":%d,"primary_hwm_kb":%d,"worker_rss_kb":[%s],"result":%s}\n' \
    "$round" "$peer" "$scen" "$((MULTI[$peer] ? WORKERS : 1))" "$((p1 - p0))" "$((w1 - w0))" "$CLK_TCK" \
    "${rss:-0}" "${hwm:-0}" "$wj" "$out" >>"$RAW"
  node "$BENCH_DIR/cluster-report.js" --line "$(tail -1 "$RAW")" >&2 || true
  sleep 0.5
}

if ((WARMUP > 0)); then
  log "warming up (${WARMUP}s of mixed load per peer)"
  for peer in "${PEERS[@]}"; do
    "$LOADGEN" bench -c "$CLOSED_CONNS" -d "${WARMUP}s" --mix "$MIX" "http://127.0.0.1:${PORT[$peer]}/" >/dev/null 2>&1 || true
  done
fi

log "measuring ${#PEERS[@]} peers x [$SCENARIOS], ${D}s each, $ROUNDS round(s), $WORKERS workers per peer; raw records in $RAW"
for ((round = 1; round <= ROUNDS; round++)); do
  read -r -a order <<<"$(order_for_round "$round")"
  log "round $round: ${order[*]}"
  for scen in $SCENARIOS; do
    if [[ "$scen" == mixed-open* && -z "$CAPACITY" ]]; then
      # From peers that use every core: a single process cannot set the pace for them.
      read -r CAPACITY CAPACITY_FROM < <(measured_capacity "$RAW" 2)
      [[ -n "$CAPACITY" ]] || die "no capacity: run mixed-closed with a multi-worker peer before the open-loop scenarios, or set BENCH_CAPACITY"
      log "capacity $CAPACITY req/s (closed-loop mixed, round 1, multi-worker peers: $CAPACITY_FROM)"
    fi
    for peer in "${order[@]}"; do
      if [[ "$scen" == mixed-open* ]] && ((!MULTI[$peer])); then
        # Offered 50-75 % of what all workers manage, one process is at or past its own
        # capacity: its queue and latency grow for the whole run, which says nothing new.
        ((round == 1)) && log "  $peer skipped in $scen: the rate is above a single process's capacity"
        continue
      fi
      run_one "$round" "$peer" "$scen"
    done
  done
done

# ------------------------------------------------------------------ report
META="$TMP/meta.json"
DROVER_REV="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
node -e '
  const a = process.argv.slice(1);
  console.log(JSON.stringify({
    stamp: a[0], duration_s: +a[1], rounds: +a[2], cpus: +a[3], workers: +a[4],
    capacity_rps: a[5] ? +a[5] : null, capacity_from: a[6], pi_path: a[7], mix: a[8],
    drover_threads: a[9] || "default", pinning: "none",
    closed_connections: +a[10], open_max_connections: +a[11],
    versions: { node: process.version, pm2: a[12] || null, drover: a[13] },
    notes: a[14] ? a[14].split("\n") : [],
  }));' \
  "$STAMP" "$D" "$ROUNDS" "$NCPU" "$WORKERS" "$CAPACITY" "$CAPACITY_FROM" "$PI_PATH" "$MIX" \
  "${DROVER_THREADS:-}" "$CLOSED_CONNS" "$OPEN_CONNS" "$PM2_VERSION" "$DROVER_REV" \
  "$(printf '%s\n' "${NOTES[@]}" | sed '/^$/d')" >"$META"
node "$BENCH_DIR/cluster-report.js" "$RAW" "$META" "$RESULTS/cluster-summary-$STAMP.json"
log "summary written to $RESULTS/cluster-summary-$STAMP.json"
