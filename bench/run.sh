#!/usr/bin/env bash
# drover side-by-side benchmark: drover vs nginx vs HAProxy over two Node backends.
#
#   bash bench/run.sh                                   # full run (10 s x 3 rounds)
#   BENCH_DURATION=2 BENCH_ROUNDS=1 bash bench/run.sh   # smoke run, a couple of minutes
#
# Environment (all optional):
#   BENCH_DURATION   seconds per measurement                       (10)
#   BENCH_ROUNDS     rounds; peer order alternates between rounds  (3)
#   BENCH_PEERS      peers to measure, space separated
#                    (nginx-lc nginx-rr haproxy-lc haproxy-rr drover-p2c drover-rr drover-default)
#   BENCH_SCENARIOS  (tiny-c50 tiny-c1 mixed-closed mixed-open50 mixed-open75)
#   BENCH_CAPACITY   mixed-load capacity in req/s; default: measured (median of the
#                    peers' closed-loop mixed throughput in round 1)
#   BENCH_BACKEND    node (default): two Node processes, bench/backend.js, every scenario.
#                    nginx: one nginx worker answering "ok" on two ports, for the tiny
#                    scenarios only. Node backends are the bottleneck of tiny-c50 on 2
#                    cores; nginx costs so little that the proxy's own core is, so the
#                    req/s compare the proxies themselves.
#   BENCH_WARMUP     seconds of warm-up per peer before round 1     (1)
#   BENCH_SKIP_BUILD=1  use the binaries already in target/release
#   BENCH_NO_INSTALL=1  never call apt-get
#   PROXY_CPU        core the proxy under test is pinned to        (last core)
#   LOADGEN_CPU      core wrk / drover bench is pinned to          (0)
#   CHEAP_US, EXPENSIVE_MS   backend costs (20 µs, 10 ms), see bench/backend.js
#
# Results: a table on stdout, raw records and a summary under bench/results/.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
D="${BENCH_DURATION:-10}"
ROUNDS="${BENCH_ROUNDS:-3}"
WARMUP="${BENCH_WARMUP:-1}"
PEERS_WANTED="${BENCH_PEERS:-nginx-lc nginx-rr haproxy-lc haproxy-rr drover-p2c drover-rr drover-default}"
BACKEND="${BENCH_BACKEND:-node}"
if [[ "$BACKEND" == nginx ]]; then
  SCENARIOS="${BENCH_SCENARIOS:-tiny-c50 tiny-c1}"
else
  SCENARIOS="${BENCH_SCENARIOS:-tiny-c50 tiny-c1 mixed-closed mixed-open50 mixed-open75}"
fi
MIX="90:/cheap,10:/expensive"
export CHEAP_US="${CHEAP_US:-20}" EXPENSIVE_MS="${EXPENSIVE_MS:-10}"

LOG_TAG=bench
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
case "$BACKEND" in
  node) ;;
  nginx)
    for scen in $SCENARIOS; do
      [[ "$scen" == tiny-* ]] || die "BENCH_BACKEND=nginx serves the tiny scenarios only, not $scen (set BENCH_SCENARIOS=\"tiny-c50 tiny-c1\")"
    done
    ;;
  *) die "BENCH_BACKEND must be node or nginx, not \"$BACKEND\"" ;;
esac

# ------------------------------------------------------------------ processes and cleanup
TMP="$(mktemp -d /tmp/drover-bench.XXXXXX)"
PIDS=()
LOAD_PID=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$LOAD_PID" ]]; then kill "$LOAD_PID" 2>/dev/null || true; fi
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  sleep 0.2
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ tools
setup_proxy_bench

# ------------------------------------------------------------------ build
build_binaries
if ((HAVE_DROVER)) && ! "$DROVER" proxy --help >/dev/null 2>&1; then
  log "$DROVER has no working 'proxy' command; measuring the peers only"
  HAVE_DROVER=0
fi

# ------------------------------------------------------------------ backends
BE_PORTS=("$(free_port)" "$(free_port)")
if [[ "$BACKEND" == nginx ]]; then
  start_nginx_ok_backend "$TMP/backend" "" "${BE_PORTS[@]}"
  PIDS+=("$NGINX_BACKEND_PID")
  log "backend: one nginx worker answering \"ok\" on 127.0.0.1:${BE_PORTS[0]} and :${BE_PORTS[1]}"
else
  for i in 1 2; do
    port="${BE_PORTS[$((i - 1))]}"
    BACKEND_ID="be$i" node "$BENCH_DIR/backend.js" "$port" 2>"$TMP/backend$i.log" &
    PIDS+=($!)
    wait_port "$port" $! 10 || { cat "$TMP/backend$i.log" >&2; die "backend $i did not start"; }
  done
  log "backends: two Node processes on 127.0.0.1:${BE_PORTS[0]} and :${BE_PORTS[1]} (cheap ${CHEAP_US}µs, expensive ${EXPENSIVE_MS}ms)"
fi

# ------------------------------------------------------------------ peers
declare -A PORT PID
start_nginx() { # name lb-directive
  local name=$1 dir="$TMP/$1" port
  port="$(free_port)"
  mkdir -p "$dir/tmp"
  {
    nginx_preamble "$dir" 8192
    cat <<EOF
  upstream backends {
    $2
    server 127.0.0.1:${BE_PORTS[0]} max_fails=0;
    server 127.0.0.1:${BE_PORTS[1]} max_fails=0;
    keepalive 64;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
  }
  server {
    listen 127.0.0.1:$port backlog=4096;
    location / {
      proxy_pass http://backends;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
  } >"$dir/nginx.conf"
  "${PIN_PROXY[@]}" "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" 2>"$dir/stderr.log" &
  PID[$name]=$!
  PORT[$name]=$port
}

start_haproxy() { # name balance
  local name=$1 dir="$TMP/$1" port
  port="$(free_port)"
  mkdir -p "$dir"
  {
    haproxy_preamble 4096 "$port"
    echo "  balance $2"
    echo "  server be1 127.0.0.1:${BE_PORTS[0]}"
    echo "  server be2 127.0.0.1:${BE_PORTS[1]}"
  } >"$dir/haproxy.cfg"
  "${PIN_PROXY[@]}" "$HAPROXY" -db -f "$dir/haproxy.cfg" >"$dir/stderr.log" 2>&1 &
  PID[$name]=$!
  PORT[$name]=$port
}

start_drover() { # name [strategy] [extra flags...]
  local name=$1 dir="$TMP/$1" port strat=()
  port="$(free_port)"
  mkdir -p "$dir"
  [[ -n "${2:-}" ]] && strat=(--strategy "$2")
  "${PIN_PROXY[@]}" "$DROVER" proxy --listen "127.0.0.1:$port" \
    --backend "127.0.0.1:${BE_PORTS[0]}" --backend "127.0.0.1:${BE_PORTS[1]}" \
    "${strat[@]}" "${@:3}" --threads 1 >"$dir/stdout.log" 2>"$dir/stderr.log" &
  PID[$name]=$!
  PORT[$name]=$port
}

PEERS=()
for name in $PEERS_WANTED; do
  case "$name" in
    nginx-lc) start_nginx "$name" "least_conn;" ;;
    nginx-rr) start_nginx "$name" "" ;;
    haproxy-lc) start_haproxy "$name" leastconn ;;
    haproxy-rr) start_haproxy "$name" roundrobin ;;
    drover-*)
      # drover-STRATEGY, optionally +mcN for --max-conns N (e.g. drover-p2c+mc2).
      if ((!HAVE_DROVER)); then log "skipping $name: no drover binary"; continue; fi
      s="${name#drover-}"
      extra=()
      if [[ "$s" == *+mc* ]]; then extra=(--max-conns "${s##*+mc}"); s="${s%%+mc*}"; fi
      case "$s" in default) s="" ;; rr) s="round-robin" ;; esac
      start_drover "$name" "$s" "${extra[@]}"
      ;;
    *) die "unknown peer $name" ;;
  esac
  PIDS+=("${PID[$name]}")
  if ! wait_port "${PORT[$name]}" "${PID[$name]}" 10; then
    log "$name did not start listening; skipping it. Its log:"
    cat "$TMP/$name"/*.log >&2 2>/dev/null || true
    kill "${PID[$name]}" 2>/dev/null || true
    continue
  fi
  # It must answer through both backends before it is measured.
  if ! out="$("$LOADGEN" bench -n 4 -c 1 --json "http://127.0.0.1:${PORT[$name]}/" 2>&1)" ||
    [[ "$out" != *'"ok":4'* ]]; then
    log "$name does not answer correctly; skipping it: $out"
    kill "${PID[$name]}" 2>/dev/null || true
    continue
  fi
  PEERS+=("$name")
  log "$name on 127.0.0.1:${PORT[$name]} (pid ${PID[$name]}, cpu ${PIN_PROXY[*]:-unpinned})"
done
((${#PEERS[@]})) || die "no peer started"
PORT[direct]="${BE_PORTS[0]}"
PID[direct]=""

# ------------------------------------------------------------------ measuring
STAMP="$(date +%Y%m%d-%H%M%S)"
RESULTS="$BENCH_DIR/results"
mkdir -p "$RESULTS"
RAW="$RESULTS/raw-$STAMP.jsonl"
: >"$RAW"
CAPACITY="${BENCH_CAPACITY:-}"
CAPACITY_FROM="BENCH_CAPACITY"

run_one() { # round peer scenario
  local round=$1 peer=$2 scen=$3 port=${PORT[$2]} pid=${PID[$2]} url cmd out
  url="http://127.0.0.1:$port"
  case "$scen" in
    tiny-c50) cmd=(wrk -t1 -c50 "-d${D}s" --latency -s "$BENCH_DIR/wrk-json.lua" "$url/") ;;
    tiny-c1) cmd=(wrk -t1 -c1 "-d${D}s" --latency -s "$BENCH_DIR/wrk-json.lua" "$url/") ;;
    mixed-closed) cmd=("$LOADGEN" bench -c 50 -d "${D}s" --mix "$MIX" --json "$url/") ;;
    mixed-open50 | mixed-open75)
      local pct=${scen#mixed-open} rate
      rate="$(awk -v c="$CAPACITY" -v p="$pct" 'BEGIN{printf "%.0f", c*p/100}')"
      cmd=("$LOADGEN" bench --rate "$rate" -c 512 -d "${D}s" --mix "$MIX" --json "$url/")
      ;;
    *) die "unknown scenario $scen" ;;
  esac
  local u0=0 s0=0 u1=0 s1=0 rss=0 hwm=0
  [[ -n "$pid" ]] && read -r u0 s0 < <(cpu_ticks "$pid")
  "${PIN_LOAD[@]}" "${cmd[@]}" >"$TMP/out" 2>"$TMP/err" &
  local lp=$!
  LOAD_PID=$lp
  sleep "$(awk -v d="$D" 'BEGIN{print d*0.8}')"
  [[ -n "$pid" ]] && { rss="$(rss_kb "$pid")"; hwm="$(hwm_kb "$pid")"; }
  if ! wait "$lp"; then
    log "load generator failed for $peer/$scen: $(tail -3 "$TMP/err")"
  fi
  LOAD_PID=""
  [[ -n "$pid" ]] && read -r u1 s1 < <(cpu_ticks "$pid")
  out="$(grep '^{' "$TMP/out" | tail -1 || true)"
  [[ -n "$out" ]] || out='null'
  printf '{"round":%d,"peer":"%s","scenario":"%s","cpu_ticks":%d,"user_ticks":%d,"sys_ticks":%d,"clk_tck":%d,"rss_kb":%d,"hwm_kb":%d,"result":%s}\n' \
    "$round" "$peer" "$scen" "$((u1 + s1 - u0 - s0))" "$((u1 - u0))" "$((s1 - s0))" "$CLK_TCK" "${rss:-0}" "${hwm:-0}" "$out" >>"$RAW"
  node -e '
    const r = JSON.parse(process.argv[1]); const x = r.result || {};
    const l = x.latency_us || {}; const e = x.errors || {};
    const errs = Object.values(e).reduce((a, b) => a + b, 0);
    const proxy = r.peer !== "direct";
    const cpu = proxy && x.requests ? `  cpu/req ${(r.cpu_ticks * 1e6 / r.clk_tck / x.requests).toFixed(1)}µs` : "";
    const rss = proxy ? `  rss ${(r.rss_kb / 1024).toFixed(1)}MB` : "";
    console.error(`  r${r.round} ${r.peer.padEnd(15)} ${r.scenario.padEnd(13)} ${(x.rps || 0).toFixed(0).padStart(7)} req/s  p50 ${l.p50}µs  p99 ${l.p99}µs  max ${l.max}µs  errors ${errs}${cpu}${rss}`);
  ' "$(tail -1 "$RAW")" || true
  sleep 0.3
}

# Warm up the backends' JIT and every peer's upstream connections.
if ((WARMUP > 0)); then
  log "warming up (${WARMUP}s per peer)"
  for peer in "${PEERS[@]}"; do
    "${PIN_LOAD[@]}" wrk -t1 -c50 "-d${WARMUP}s" "http://127.0.0.1:${PORT[$peer]}/cheap" >/dev/null 2>&1 || true
  done
fi

log "measuring ${#PEERS[@]} peers x [$SCENARIOS], ${D}s each, $ROUNDS round(s); raw records in $RAW"
for ((round = 1; round <= ROUNDS; round++)); do
  read -r -a order <<<"$(order_for_round "$round")"
  log "round $round: ${order[*]}"
  for scen in $SCENARIOS; do
    if [[ "$scen" == mixed-open* && -z "$CAPACITY" ]]; then
      read -r CAPACITY CAPACITY_FROM < <(measured_capacity "$RAW" 1)
      [[ -n "$CAPACITY" ]] || die "no capacity: run mixed-closed before the open-loop scenarios or set BENCH_CAPACITY"
      log "capacity $CAPACITY req/s (closed-loop mixed, round 1, $CAPACITY_FROM); open loop at 50% and 75%"
    fi
    if [[ "$scen" == tiny-c1 ]]; then
      run_one "$round" direct "$scen"
    fi
    for peer in "${order[@]}"; do
      run_one "$round" "$peer" "$scen"
    done
  done
done

# ------------------------------------------------------------------ report
META="$TMP/meta.json"
BACKEND="$BACKEND" node -e 'console.log(JSON.stringify({
  stamp: process.argv[1], duration_s: +process.argv[2], rounds: +process.argv[3],
  cpus: +process.argv[4], proxy_cpu: process.argv[5], loadgen_cpu: process.argv[6],
  capacity_rps: process.argv[7] ? +process.argv[7] : null, capacity_from: process.argv[8],
  backend: process.env.BACKEND,
  cheap_us: +process.env.CHEAP_US, expensive_ms: +process.env.EXPENSIVE_MS, mix: process.argv[9],
  versions: JSON.parse(process.argv[10]) }))' \
  "$STAMP" "$D" "$ROUNDS" "$NCPU" "${PIN_PROXY[*]:+$PROXY_CPU}" "${PIN_LOAD[*]:+$LOADGEN_CPU}" \
  "$CAPACITY" "$CAPACITY_FROM" "$MIX" \
  "$(node -e 'console.log(JSON.stringify({nginx: process.argv[1], haproxy: process.argv[2], node: process.version, wrk: process.argv[3]}))' \
    "$("$NGINX" -v 2>&1 | sed 's/.*: //')" "$("$HAPROXY" -v 2>&1 | head -1 | awk '{print $3}')" \
    "$(wrk -v 2>&1 | head -1 | awk '{print $2}')")" >"$META"
node "$BENCH_DIR/report.js" "$RAW" "$META" "$RESULTS/summary-$STAMP.json"
log "summary written to $RESULTS/summary-$STAMP.json"
