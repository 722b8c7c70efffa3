#!/usr/bin/env bash
# Memory per idle keep-alive connection: drover side by side with nginx and HAProxy
# (issue 11, item 10). For each peer: one serving thread/worker in front of one Node
# backend; RSS before, then N client connections that each send ONE keep-alive `GET /`,
# read the whole answer and stay open and idle; RSS again after a settle time.
# (RSS after - RSS before) / N is the figure, in bytes per idle connection.
#
#   bash bench/idle.sh                                            # 10,000 connections, 3 rounds
#   BENCH_CONNS=2000 BENCH_ROUNDS=1 bash bench/idle.sh             # smoke run (~20 s)
#   BENCH_WEBSOCKET=1 BENCH_CONNS=2000 bash bench/idle.sh         # idle WebSockets instead
#   DROVER_BIN=/work/variants/v0 DROVER_ALT_BIN=/work/variants/v2 \
#     BENCH_PEERS="drover drover-alt nginx haproxy" bash bench/idle.sh   # two binaries, A/B
#
# Environment (all optional):
#   BENCH_CONNS        idle connections held open per measurement          (10000)
#   BENCH_ROUNDS       rounds; the peer order alternates between rounds    (3)
#   BENCH_PEERS        (drover nginx haproxy); also drover-alt ($DROVER_ALT_BIN)
#   BENCH_SETTLE       seconds between the last answer and the second RSS reading (3)
#   BENCH_CONCURRENCY  connections the client opens and serves at a time (64): bounds the
#                      proxy's connections to the backend, which would count as client ones
#   BENCH_WARM         warm-up connections (one request each, then closed) before the
#                      first RSS reading (50)
#   DROVER_BIN         drover binary to measure (default: target/release/drover, built
#                      unless BENCH_SKIP_BUILD=1; never built when DROVER_BIN is set)
#   DROVER_ALT_BIN     a second drover binary, the drover-alt peer
#   BENCH_WEBSOCKET=1  each connection upgrades to a WebSocket (`GET /ws`, answered 101 by
#                      bench/matrix/backend.js, which then sends a small frame each second)
#                      instead of one keep-alive GET: memory per open WebSocket
#   BENCH_SKIP_BUILD=1 do not run cargo build
#   BENCH_NO_INSTALL=1 never call apt-get
#
# What is counted: VmRSS of every process of the peer: drover's one process (all threads),
# HAProxy's one process (-db, nbthread 1), nginx's master + its one worker (the master's
# RSS does not move; the worker holds the connections). Kernel socket buffers are not in
# RSS and are the same for every peer. Each peer's idle timeouts are 600 s (drover
# --idle-timeout/--header-timeout, nginx keepalive_timeout, HAProxy timeout
# http-keep-alive/client): far longer than a measurement; the client reports any
# connection closed before the reading, and such a measurement is marked.
#
# Output: progress lines, one line per measurement, then the medians and ratios on stdout;
# bench/results/idle-raw-STAMP.jsonl (one record per measurement).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
N="${BENCH_CONNS:-10000}"
ROUNDS="${BENCH_ROUNDS:-3}"
CLIENT_MODE=()
[[ "${BENCH_WEBSOCKET:-0}" == 1 ]] && CLIENT_MODE=(--websocket)
SETTLE="${BENCH_SETTLE:-3}"
CONC="${BENCH_CONCURRENCY:-64}"
WARM="${BENCH_WARM:-50}"
PEERS_WANTED="${BENCH_PEERS:-drover nginx haproxy}"
IDLE_S=600           # every peer's idle timeouts: far beyond one measurement
CONNECT_TIMEOUT_MS=120000 # the client gives up on connections still unanswered after this

LOG_TAG=idle
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
[[ "$N" =~ ^[0-9]+$ && "$N" -ge 1 ]] || die "BENCH_CONNS must be a positive integer"
[[ "$ROUNDS" =~ ^[0-9]+$ && "$ROUNDS" -ge 1 ]] || die "BENCH_ROUNDS must be a positive integer"
[[ "$SETTLE" =~ ^[0-9]+$ && "$SETTLE" -le 300 ]] || die "BENCH_SETTLE must be a whole number of seconds <= 300"
[[ "$CONC" =~ ^[0-9]+$ && "$CONC" -ge 1 ]] || die "BENCH_CONCURRENCY must be a positive integer"
[[ "$WARM" =~ ^[0-9]+$ ]] || die "BENCH_WARM must be a whole number"
command -v node >/dev/null || die "node is needed (backend and client)"

# ------------------------------------------------------------------ processes and cleanup
TMP="$(mktemp -d /tmp/drover-idle.XXXXXX)"
BACKEND_PID=""
CUR_PID=""     # the peer being measured (nginx: its master)
CUR_KIDS=()    # nginx's worker
CLIENT_PID=""
stop_client() {
  [[ -n "$CLIENT_PID" ]] || return 0
  kill -TERM "$CLIENT_PID" 2>/dev/null || true
  local i
  for ((i = 0; i < 100; i++)); do kill -0 "$CLIENT_PID" 2>/dev/null || break; sleep 0.05; done
  kill -9 "$CLIENT_PID" 2>/dev/null || true
  wait "$CLIENT_PID" 2>/dev/null || true
  CLIENT_PID=""
}
stop_peer() {
  [[ -n "$CUR_PID" ]] || return 0
  local i p
  kill -TERM "$CUR_PID" 2>/dev/null || true
  for ((i = 0; i < 60; i++)); do kill -0 "$CUR_PID" 2>/dev/null || break; sleep 0.05; done
  for p in "$CUR_PID" "${CUR_KIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait "$CUR_PID" 2>/dev/null || true
  CUR_PID="" CUR_KIDS=()
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_client
  stop_peer
  if [[ -n "$BACKEND_PID" ]]; then
    kill "$BACKEND_PID" 2>/dev/null || true
    sleep 0.2
    kill -9 "$BACKEND_PID" 2>/dev/null || true
    wait "$BACKEND_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ tools and limits
setup_proxy_bench # nginx, HAProxy; raises the soft open-file limit to the hard one
# The client holds N sockets; the proxy N client sockets plus up to CONC to the backend;
# each also needs a few hundred for itself (and nginx/HAProxy reserve some).
NEED_FDS=$((N + CONC + 1024))
if (($(ulimit -n) < NEED_FDS)); then
  ulimit -Hn "$NEED_FDS" 2>/dev/null || true # works as root
  ulimit -n "$NEED_FDS" 2>/dev/null || true
fi
(($(ulimit -n) >= NEED_FDS)) ||
  die "open-file limit $(ulimit -n) (hard $(ulimit -Hn)) is below the $NEED_FDS that $N connections need: raise it (as root: ulimit -Hn $NEED_FDS) or lower BENCH_CONNS"
NR_OPEN="$(cat /proc/sys/fs/nr_open 2>/dev/null || echo 1048576)"
((NR_OPEN >= NEED_FDS)) || die "fs.nr_open is $NR_OPEN, below $NEED_FDS: lower BENCH_CONNS"

# ------------------------------------------------------------------ binaries
DROVER="${CARGO_TARGET_DIR:-$ROOT/target}/release/drover"
if [[ -n "${DROVER_BIN:-}" ]]; then
  DROVER="$DROVER_BIN"
elif [[ "${BENCH_SKIP_BUILD:-0}" != 1 && " $PEERS_WANTED " == *" drover "* ]]; then
  log "cargo build --release -p drover"
  (cd "$ROOT" && cargo build --release -p drover >&2) || die "drover does not build"
fi


PEERS=()
for name in $PEERS_WANTED; do
  case "$name" in
    nginx | haproxy) ;;
    drover) [[ -x "$DROVER" ]] || die "no drover binary at $DROVER (set DROVER_BIN or build it)" ;;
    drover-alt) [[ -x "${DROVER_ALT_BIN:-}" ]] || die "drover-alt needs DROVER_ALT_BIN, an executable" ;;
    *) die "unknown peer $name (peers: drover drover-alt nginx haproxy)" ;;
  esac
  PEERS+=("$name")
done
((${#PEERS[@]})) || die "no peer to measure"

# ------------------------------------------------------------------ backend
BE_PORT="$(quick_port)"
node "$BENCH_DIR/matrix/backend.js" "$BE_PORT" 2>"$TMP/backend.log" &
BACKEND_PID=$!
wait_port "$BE_PORT" "$BACKEND_PID" 10 || { cat "$TMP/backend.log" >&2; die "backend did not start"; }
log "backend: node bench/matrix/backend.js on 127.0.0.1:$BE_PORT; $N ${CLIENT_MODE[*]:+WebSocket }connections, ulimit -n $(ulimit -n)"

# ------------------------------------------------------------------ peers
RUN_N=0
CUR_PORT=""
start_peer() { # name
  local name=$1 dir port i
  RUN_N=$((RUN_N + 1))
  dir="$TMP/run$RUN_N-$name"
  mkdir -p "$dir/tmp"
  port="$(quick_port)"
  case "$name" in
    nginx)
      {
        # lib.sh's head runs nginx as one process; here it runs as deployed, a master and
        # one worker, and both are counted.
        # worker_connections 2N: when fewer than 1/16 of its slots are free, nginx closes
        # idle keep-alive connections to make room (ngx_drain_connections). The slots are
        # allocated at start, so they are in the RSS before, not in the difference.
        nginx_preamble "$dir" $((2 * N + 1024)) |
          sed -e 's/^master_process off;/master_process on;/' -e 's/^# one process serves everything.*/# a master and one worker/'
        cat <<EOF
  upstream backends {
    server 127.0.0.1:$BE_PORT max_fails=0;
    keepalive 64;
    keepalive_requests 10000000;
    keepalive_timeout ${IDLE_S}s;
  }
  server {
    listen 127.0.0.1:$port backlog=4096;
    keepalive_timeout ${IDLE_S}s;
    client_header_timeout ${IDLE_S}s;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    location / { proxy_pass http://backends; }
    location /ws {
      proxy_pass http://backends;
      proxy_set_header Upgrade \$http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_read_timeout ${IDLE_S}s;
      proxy_send_timeout ${IDLE_S}s;
    }
  }
}
EOF
      } >"$dir/nginx.conf"
      "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" 2>"$dir/stderr.log" &
      ;;
    haproxy)
      cat >"$dir/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn $((N + CONC + 512))
  # HAProxy wants 2 descriptors per maxconn (client and server side) and by default
  # refuses to start when it cannot raise its limit that far; N idle clients need one.
  no strict-limits
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client ${IDLE_S}s
  timeout server ${IDLE_S}s
  timeout http-keep-alive ${IDLE_S}s
  timeout http-request ${IDLE_S}s
  timeout tunnel ${IDLE_S}s
frontend fe
  bind 127.0.0.1:$port backlog 4096
  default_backend be
backend be
  server be1 127.0.0.1:$BE_PORT
EOF
      "$HAPROXY" -db -f "$dir/haproxy.cfg" >"$dir/stderr.log" 2>&1 &
      ;;
    drover | drover-alt)
      local bin="$DROVER"
      [[ "$name" == drover-alt ]] && bin="$DROVER_ALT_BIN"
      "$bin" proxy --listen "127.0.0.1:$port" --backend "127.0.0.1:$BE_PORT" --threads 1 \
        --idle-timeout "${IDLE_S}s" --header-timeout "${IDLE_S}s" \
        >"$dir/stdout.log" 2>"$dir/stderr.log" &
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
  CUR_KIDS=()
  if [[ "$name" == nginx ]]; then
    for ((i = 0; i < 100; i++)); do
      mapfile -t CUR_KIDS < <(pgrep -P "$CUR_PID" || true)
      ((${#CUR_KIDS[@]})) && break
      sleep 0.05
    done
    ((${#CUR_KIDS[@]})) || { stop_peer; log "nginx started no worker"; return 1; }
  fi
  return 0
}

peer_rss_kb() { # the peer's processes, summed
  local p sum=0
  for p in "$CUR_PID" "${CUR_KIDS[@]}"; do sum=$((sum + $(rss_kb "$p"))); done
  echo "$sum"
}
peer_fds() {
  local p sum=0 n
  for p in "$CUR_PID" "${CUR_KIDS[@]}"; do
    n="$(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"
    sum=$((sum + n))
  done
  echo "$sum"
}
peer_label() {
  case "$1" in
    drover) echo "drover ($DROVER)" ;;
    drover-alt) echo "drover-alt ($DROVER_ALT_BIN)" ;;
    nginx) echo "nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///')" ;;
    haproxy) echo "haproxy $("$HAPROXY" -v | awk 'NR==1{print $3}')" ;;
  esac
}

# ------------------------------------------------------------------ measurements
mkdir -p "$BENCH_DIR/results"
STAMP="$(date +%Y%m%d-%H%M%S)"
RAW="$BENCH_DIR/results/idle-raw-$STAMP.jsonl"
: >"$RAW"

measure() { # round peer
  local round=$1 name=$2 rss0 rss1 fd0 fd1 ready end_line client_out
  start_peer "$name" || { log "round $round $name: skipped (did not start)"; return 0; }
  if ((WARM > 0)); then
    node "$BENCH_DIR/idle/client.js" --port "$CUR_PORT" --conns "$WARM" --concurrency 10 \
      --timeout-ms 10000 --close >"$TMP/warm.out" 2>&1 || true
    grep -q '"failed":0' "$TMP/warm.out" || log "round $round $name: warm-up failed: $(cat "$TMP/warm.out")"
  fi
  sleep 1 # the warm-up's connections are closed and freed
  rss0="$(peer_rss_kb)" fd0="$(peer_fds)"
  client_out="$TMP/client-$round-$name.out"
  node "$BENCH_DIR/idle/client.js" --port "$CUR_PORT" --conns "$N" --concurrency "$CONC" \
    --timeout-ms "$CONNECT_TIMEOUT_MS" --hold-ms $(((IDLE_S - 60) * 1000)) "${CLIENT_MODE[@]}" \
    >"$client_out" 2>"$client_out.err" &
  CLIENT_PID=$!
  local i
  for ((i = 0; i < (CONNECT_TIMEOUT_MS / 1000 + 10) * 10; i++)); do
    grep -q '"event":"ready"' "$client_out" 2>/dev/null && break
    kill -0 "$CLIENT_PID" 2>/dev/null || break
    sleep 0.1
  done
  ready="$(grep '"event":"ready"' "$client_out" || true)"
  if [[ -z "$ready" ]]; then
    log "round $round $name: the client did not finish: $(cat "$client_out" "$client_out.err")"
    stop_client
    stop_peer
    return 0
  fi
  sleep "$SETTLE"
  rss1="$(peer_rss_kb)" fd1="$(peer_fds)"
  stop_client
  end_line="$(grep '"event":"end"' "$client_out" || echo '{}')"
  stop_peer
  # shellcheck disable=SC2016 # JavaScript, not shell
  node -e '
    const [round, peer, label, n, rss0, rss1, fd0, fd1] = process.argv.slice(1, 9);
    const ready = JSON.parse(process.argv[9]), end = JSON.parse(process.argv[10]);
    const rec = { round: +round, peer, label, conns: +n, rss_before_kb: +rss0, rss_after_kb: +rss1,
      fds_before: +fd0, fds_after: +fd1, ready, end,
      bytes_per_conn: ((+rss1 - +rss0) * 1024) / +n,
      valid: ready.ok === +n && ready.failed === 0 && end.open === +n && end.closed_by_peer === 0 };
    console.log(JSON.stringify(rec));
  ' "$round" "$name" "$(peer_label "$name")" "$N" "$rss0" "$rss1" "$fd0" "$fd1" "$ready" "$end_line" >>"$RAW"
  # shellcheck disable=SC2016 # JavaScript, not shell
  node -e '
    const r = JSON.parse(process.argv[1]);
    const bad = r.valid ? "" : `  INVALID: ok ${r.ready.ok} failed ${r.ready.failed} open at end ${r.end.open} closed by proxy ${r.end.closed_by_peer}`;
    console.error(`[idle] round ${r.round} ${r.peer.padEnd(10)} RSS ${(r.rss_before_kb / 1024).toFixed(1)} -> ${(r.rss_after_kb / 1024).toFixed(1)} MiB, fds ${r.fds_before} -> ${r.fds_after}, ${Math.round(r.bytes_per_conn)} B/conn (connected in ${r.ready.ms} ms)${bad}`);
  ' "$(tail -n 1 "$RAW")"
}

for ((round = 1; round <= ROUNDS; round++)); do
  read -r -a order <<<"$(order_for_round "$round")"
  log "round $round/$ROUNDS: ${order[*]}"
  for name in "${order[@]}"; do measure "$round" "$name"; done
done

# ------------------------------------------------------------------ report
node "$BENCH_DIR/idle/report.js" "$RAW"
log "raw records: $RAW"
