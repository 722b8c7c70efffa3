#!/usr/bin/env bash
# Sustained overload with clients that give up (issue 20): `drover run -w 2` and Node's
# cluster module (bench/node-cluster.js) side by side, each serving bench/backend.js's
# CPU-bound /expensive (20 ms of CPU a request), an open loop at twice the capacity
# measured in the same run, every client giving up after 1 s (the request's connection
# closes, as a browser's or an app's timeout does).
#
#   bash bench/impatient.sh                          # 2 rounds of 12 s, alternating order (~2 min)
#   DROVER_B_BIN=/path/to/old/drover bash bench/impatient.sh   # a second drover beside
#   IMPATIENT_TIMEOUT=5s IMPATIENT_OVERLOAD=1.5 bash bench/impatient.sh
#   IMPATIENT_MODE=proxy bash bench/impatient.sh     # drover proxy, HAProxy, nginx
#   IMPATIENT_MODE=proxy IMPATIENT_MAX_CONNS=1 bash bench/impatient.sh  # queues in the proxies
#
# IMPATIENT_MODE=proxy: two Node processes of bench/backend.js, and in front of them,
# one at a time, `drover proxy` (its defaults), HAProxy (balance leastconn, no per-server
# maxconn: its default, so no queue of its own) and nginx (least_conn, keep-alive).
# IMPATIENT_MAX_CONNS=N gives drover `--max-conns N` and HAProxy `maxconn N` on each
# server, so both hold the rest in their queues (nginx has no queue outside nginx Plus,
# and is left as it is). IMPATIENT_ABORTONCLOSE=1 adds HAProxy's `option abortonclose`
# (requests whose client closed are dropped from its queue).
#
# Capacity: per system, a 3 s closed loop of 8 keep-alive connections; the median of the
# systems. Then per round and system: `drover bench --rate` at IMPATIENT_OVERLOAD x that
# for IMPATIENT_SECONDS, --timeout IMPATIENT_TIMEOUT. Prints, per run, the requests
# answered in time, what that is of the capacity, their p50, and the workers' CPU: the
# share of it spent on answers a client took ("useful"), the rest on requests whose
# clients had gone. BENCH_SKIP_BUILD=1 uses the built binary; DROVER_BIN another one.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${ROUNDS:-2}"
LOAD_S="${IMPATIENT_SECONDS:-12}"
TIMEOUT="${IMPATIENT_TIMEOUT:-1s}"
OVERLOAD="${IMPATIENT_OVERLOAD:-2}"
COST_MS=20
MODE="${IMPATIENT_MODE:-run}"
MAX_CONNS="${IMPATIENT_MAX_CONNS:-}"
[[ "$MODE" == run || "$MODE" == proxy ]] || { echo "IMPATIENT_MODE must be run or proxy" >&2; exit 2; }
LOG_TAG=impatient
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch impatient
OTHERS=(cluster)
[[ "$MODE" == proxy ]] && OTHERS=(haproxy nginx)
SYSTEMS=(drover "${OTHERS[@]}")
if [[ -n "${DROVER_B_BIN:-}" ]]; then
  cp "$DROVER_B_BIN" "$TMP/drover-b"
  SYSTEMS=(drover drover-b "${OTHERS[@]}")
fi
export EXPENSIVE_MS=$COST_MS
BACKEND_PIDS=()
[[ "$MODE" == proxy ]] && setup_proxy_bench

# Two fresh backends per run: a Node backend goes on running the requests it read after
# their clients (and the proxy's connections) have gone, so one kept from the run before
# would still be busy with its backlog.
start_backends() { # -> BACKEND_PORTS, BACKEND_PIDS
  local i p
  BACKEND_PORTS=() BACKEND_PIDS=()
  for i in 1 2; do
    p="$(quick_port)"
    node "$BENCH_DIR/backend.js" "$p" >/dev/null 2>&1 &
    PIDS+=($!) BACKEND_PIDS+=($!)
    wait_port "$p" $! 10 || die "backend $p did not start"
    BACKEND_PORTS+=("$p")
  done
}
stop_backends() {
  ((${#BACKEND_PIDS[@]})) || return 0
  kill -9 "${BACKEND_PIDS[@]}" 2>/dev/null || true
  wait "${BACKEND_PIDS[@]}" 2>/dev/null || true
  BACKEND_PIDS=()
}

start_proxy() { # system -> SYS_PID, SYS_PORT: a proxy in front of BACKEND_PORTS
  local p bin=$DROVER
  case "$1" in
    drover | drover-b)
      [[ "$1" == drover-b ]] && bin="$TMP/drover-b"
      local args=(proxy --listen "127.0.0.1:$SYS_PORT")
      for p in "${BACKEND_PORTS[@]}"; do args+=(--backend "127.0.0.1:$p"); done
      [[ -n "$MAX_CONNS" ]] && args+=(--max-conns "$MAX_CONNS")
      start_system "$TMP/$1.log" "$bin" "${args[@]}"
      ;;
    haproxy)
      {
        haproxy_preamble 8000 "$SYS_PORT"
        echo "  balance leastconn"
        [[ "${IMPATIENT_ABORTONCLOSE:-0}" == 1 ]] && echo "  option abortonclose"
        for p in "${BACKEND_PORTS[@]}"; do echo "  server s$p 127.0.0.1:$p${MAX_CONNS:+ maxconn $MAX_CONNS}"; done
      } >"$TMP/haproxy.cfg"
      start_system "$TMP/$1.log" "$HAPROXY" -f "$TMP/haproxy.cfg"
      ;;
    nginx)
      mkdir -p "$TMP/nginx/tmp"
      {
        nginx_preamble "$TMP/nginx" 8000
        echo "  upstream be { least_conn; keepalive 64;"
        for p in "${BACKEND_PORTS[@]}"; do echo "    server 127.0.0.1:$p;"; done
        echo "  }"
        echo "  server { listen 127.0.0.1:$SYS_PORT backlog=4096;"
        echo '    location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; }'
        echo "  }"
        echo "}"
      } >"$TMP/nginx/nginx.conf"
      start_system "$TMP/$1.log" "$NGINX" -p "$TMP/nginx" -e "$TMP/nginx/error.log" -c "$TMP/nginx/nginx.conf"
      ;;
  esac
}

start_app() { # system -> SYS_PID, SYS_PORT: the app under it, both workers ready
  SYS_PORT="$(quick_port)"
  if [[ "$MODE" == proxy ]]; then
    start_backends
    start_proxy "$1"
    wait_port "$SYS_PORT" "$SYS_PID" 10 || die "$1 did not start: $(tail -5 "$TMP/$1.log")"
    return 0
  fi
  case "$1" in
    drover) start_system "$TMP/$1.log" "$DROVER" run -w 2 -l "127.0.0.1:$SYS_PORT" --admin off -- node "$BENCH_DIR/backend.js" ;;
    drover-b) start_system "$TMP/$1.log" "$TMP/drover-b" run -w 2 -l "127.0.0.1:$SYS_PORT" --admin off -- node "$BENCH_DIR/backend.js" ;;
    cluster) start_system "$TMP/$1.log" env WORKERS=2 PORT="$SYS_PORT" node "$BENCH_DIR/node-cluster.js" "$BENCH_DIR/backend.js" ;;
  esac
  two_workers_serve "$1"
}

workers_cpu_ticks() { # the CPU ticks (utime + stime) of the node backends or workers
  local pid total=0 pids=("${BACKEND_PIDS[@]}")
  ((${#pids[@]})) || mapfile -t pids < <(pgrep -P "$SYS_PID" node || true)
  for pid in "${pids[@]}"; do
    read -r -a f <"/proc/$pid/stat" || continue
    total=$((total + f[13] + f[14]))
  done
  echo "$total"
}

# ---------------------------------------------------------------- capacity, same run
CAPS=()
for sys in "${SYSTEMS[@]}"; do
  start_app "$sys"
  out="$("$LOADGEN" bench -c 8 -d 3s --json "http://127.0.0.1:$SYS_PORT/expensive" 2>/dev/null || true)"
  [[ "$out" =~ \"ok\":([0-9]+) ]] && CAPS+=("$((BASH_REMATCH[1] / 3))")
  log "capacity through $sys: ${CAPS[-1]:-?} req/s"
  stop_system
  stop_backends
done
((${#CAPS[@]} == ${#SYSTEMS[@]})) || die "no capacity measured"
CAP="$(printf '%s\n' "${CAPS[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
RATE="$(awk -v c="$CAP" -v o="$OVERLOAD" 'BEGIN {printf "%d", c * o}')"
log "open loop at $RATE req/s ($OVERLOAD x $CAP) for ${LOAD_S}s, clients give up after $TIMEOUT; $ROUNDS round(s)"
TICK="$(getconf CLK_TCK)"

run_one() { # system round -> one JSON line
  start_app "$1"
  local before after
  before="$(workers_cpu_ticks)"
  "$LOADGEN" bench --rate "$RATE" -d "${LOAD_S}s" --timeout "$TIMEOUT" --json \
    "http://127.0.0.1:$SYS_PORT/expensive" >"$TMP/out.bench" 2>/dev/null || true
  after="$(workers_cpu_ticks)"
  node -e 'const [s, r, cpu, cap, cost] = process.argv.slice(1);
    const t = require("fs").readFileSync(0, "utf8").split("\n").filter((l) => l.startsWith("{")).pop();
    const x = JSON.parse(t); const secs = x.duration_s;
    const useful = x.ok * +cost / 1000;
    console.log(JSON.stringify({ system: s, round: +r, sent: x.requests + x.errors.connect + x.errors.timeout + x.errors.io,
      ok: x.ok, ok_per_s: +(x.ok / secs).toFixed(1), of_capacity: +(x.ok / secs / +cap).toFixed(2),
      p50_ms: Math.round(x.latency_us.p50 / 1000), timeouts: x.errors.timeout,
      workers_cpu_s: +(+cpu).toFixed(1), useful: +Math.min(1, useful / +cpu).toFixed(2) }))' \
    "$1" "$2" "$(awk -v a="$before" -v b="$after" -v t="$TICK" 'BEGIN {print (b - a) / t}')" "$CAP" "$COST_MS" <"$TMP/out.bench"
  stop_system
  stop_backends
}
alternate_rounds "$TMP/results.jsonl" "${SYSTEMS[@]}"

node - "$TMP/results.jsonl" <<'EOF'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
console.log('\n| system | round | sent | answered in time | per s | of capacity | p50 ms | workers CPU s | useful |');
console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|');
for (const x of rows) {
  console.log(`| ${x.system} | ${x.round} | ${x.sent} | ${x.ok} | ${x.ok_per_s} | ${x.of_capacity} | ${x.p50_ms} | ${x.workers_cpu_s} | ${x.useful} |`);
}
const med = (xs) => { const s = xs.slice().sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const systems = [...new Set(rows.map((x) => x.system))];
console.log('\nmedian answered in time, of capacity: ' + systems.map((s) => `${s} ${med(rows.filter((x) => x.system === s).map((x) => x.of_capacity))}`).join(', '));
EOF
