#!/usr/bin/env bash
# gRPC unary calls from ONE client channel (one HTTP/2 connection) to 3 gRPC backends
# (@grpc/grpc-js, bench/grpc-server.js), on unequal costs: each call is light (1 ms of
# CPU) or, 5 % of them, heavy (25 ms), as the client draws them. In front, one at a time:
#   drover        drover proxy --h2c --backend-protocol h2c (the default strategy)
#   nginx-lc      nginx grpc_pass with least_conn (and keepalive)
#   nginx-rr      nginx grpc_pass, round robin (its default)
# An L4 balancer would pin the channel to one backend; these place each call.
# Capacity is measured first, in the same run: a closed loop of 16 calls at a time
# through drover and through nginx-lc (the higher of the two); then each peer gets
# Poisson arrivals at 75 % of it (bench/grpc-load.js, seeded: the same arrivals and
# mix for every peer). Prints p50/p99 and the light calls' p99, medians over the
# rounds (each round's order rotated from the last), and drover's p99 against the
# best nginx's.
#
#   bash bench/grpc.sh                                     # 3 rounds, 15 s each (~4 min)
#   BENCH_ROUNDS=1 BENCH_DURATION=5 bash bench/grpc.sh     # smoke
#
# Environment (all optional): BENCH_ROUNDS (3), BENCH_DURATION (15), BENCH_SKIP_BUILD=1,
# BENCH_LOAD (0.75), BENCH_MIX ("1000:25000:0.05": light µs, heavy µs, heavy share),
# BENCH_REPORT=1: the backends report their event-loop utilisation in each answer's
# metadata (endpoint-load-metrics, as sdk/node does for HTTP), which drover reads and
# nginx passes on. BENCH_METHODS=2: heavy calls are a method of their own
# (/bench.Work/Heavy), as in an app whose costly work has its own RPC; by default every
# call is /bench.Work/Call with its cost in the payload. DROVER_B_BIN=/path/to/drover adds a peer `drover-b` running that
# binary the same way (an A/B of two builds in one run).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${BENCH_ROUNDS:-3}"
D="${BENCH_DURATION:-15}"
LOAD="${BENCH_LOAD:-0.75}"
MIX="${BENCH_MIX:-1000:25000:0.05}"
PEERS=(drover nginx-lc nginx-rr)
[[ -n "${DROVER_B_BIN:-}" ]] && PEERS+=(drover-b)

LOG_TAG=grpc
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
[[ -x "$NGINX" ]] || die "nginx is needed (apt-get install nginx)"
command -v node >/dev/null || die "node is needed"

build_binaries
GRPC_MODULES="$ROOT/crates/drover/tests/fixtures/grpc"
if [[ ! -d "$GRPC_MODULES/node_modules/@grpc/grpc-js" ]]; then
  log "npm ci (@grpc/grpc-js, the test fixtures' own)"
  npm ci --prefix "$GRPC_MODULES" --no-audit --no-fund >&2
fi
export NODE_PATH="$GRPC_MODULES/node_modules"
export METHODS="${BENCH_METHODS:-1}"
scratch_and_cleanup grpc 1

BACKENDS=()
for i in 1 2 3; do
  if [[ "${BENCH_REPORT:-0}" == 1 ]]; then
    node "$BENCH_DIR/grpc-server.js" report >"$TMP/backend$i.log" 2>&1 &
  else
    node "$BENCH_DIR/grpc-server.js" >"$TMP/backend$i.log" 2>&1 &
  fi
  PIDS+=($!)
done
for i in 1 2 3; do
  for _ in $(seq 100); do
    port=$(awk '/^listening/{print $2}' "$TMP/backend$i.log")
    [[ -n "$port" ]] && break
    sleep 0.1
  done
  [[ -n "$port" ]] || die "backend $i did not start: $(cat "$TMP/backend$i.log")"
  BACKENDS+=("127.0.0.1:$port")
done
log "backends ${BACKENDS[*]}"

start_peer() { # peer port -> PEER_PID
  local peer=$1 port=$2 dir="$TMP/$1" b
  mkdir -p "$dir/tmp"
  case "$peer" in
    drover | drover-b)
      local args=(proxy -l "127.0.0.1:$port" --h2c --backend-protocol h2c) bin=$DROVER
      [[ "$peer" == drover-b ]] && bin=$DROVER_B_BIN
      for b in "${BACKENDS[@]}"; do args+=(-b "$b"); done
      "$bin" "${args[@]}" >"$dir/log" 2>&1 &
      ;;
    nginx-lc | nginx-rr)
      {
        nginx_preamble "$dir" 8192
        echo "  upstream be {"
        [[ "$peer" == nginx-lc ]] && echo "    least_conn;"
        for b in "${BACKENDS[@]}"; do echo "    server $b;"; done
        echo "    keepalive 32;"
        echo "  }"
        echo "  server {"
        echo "    listen 127.0.0.1:$port http2;"
        echo "    location / { grpc_pass grpc://be; }"
        echo "  }"
        echo "}"
      } >"$dir/nginx.conf"
      "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" >"$dir/log" 2>&1 &
      ;;
  esac
  PEER_PID=$!
  wait_port "$port" "$PEER_PID" 10 || { cat "$dir/log" >&2; die "$peer did not start"; }
}

stop_peer() {
  kill "$PEER_PID" 2>/dev/null || true
  wait "$PEER_PID" 2>/dev/null || true
}

field() { node -e 'const r=JSON.parse(process.argv[1]); const v=r[process.argv[2]]; console.log(v===null?"-":v)' "$1" "$2"; }

# Capacity, in this run: the closed loop through drover and through nginx-lc.
CAPACITY=0
for peer in drover nginx-lc; do
  port=$(quick_port)
  start_peer "$peer" "$port"
  out=$(node "$BENCH_DIR/grpc-load.js" "127.0.0.1:$port" capacity 16 "$D" "$MIX")
  stop_peer
  rate=$(field "$out" rate)
  log "capacity through $peer: $rate calls/s ($out)"
  CAPACITY=$(node -e "console.log(Math.max($CAPACITY, $rate))")
done
RATE=$(node -e "console.log(Math.round($CAPACITY * $LOAD))")
log "open loop at $RATE calls/s ($LOAD of $CAPACITY)"

declare -A P50 P99 LIGHT ERRS
for ((round = 1; round <= ROUNDS; round++)); do
  read -r -a order <<<"$(order_for_round "$round")"
  for peer in "${order[@]}"; do
    port=$(quick_port)
    start_peer "$peer" "$port"
    out=$(node "$BENCH_DIR/grpc-load.js" "127.0.0.1:$port" open "$RATE" "$D" "$MIX" "$round")
    stop_peer
    log "round $round: $peer $out"
    P50[$peer]+="$(field "$out" p50) "
    P99[$peer]+="$(field "$out" p99) "
    LIGHT[$peer]+="$(field "$out" p99_light) "
    ERRS[$peer]+="$(field "$out" errors) "
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
printf '\ngRPC, one channel, 3 backends (load reports: %s), mix %s, %s method(s), %s calls/s (%s of %s), %s rounds x %s s\n' \
  "$([[ "${BENCH_REPORT:-0}" == 1 ]] && echo on || echo off)" "$MIX" "$METHODS" "$RATE" "$LOAD" "$CAPACITY" "$ROUNDS" "$D"
printf '| peer | p50 ms | p99 ms | light p99 ms | errors | p99 of each round |\n|---|---:|---:|---:|---:|---|\n'
for peer in "${PEERS[@]}"; do
  printf '| %s | %s | %s | %s | %s | %s|\n' "$peer" "$(echo "${P50[$peer]}" | median)" \
    "$(echo "${P99[$peer]}" | median)" "$(echo "${LIGHT[$peer]}" | median)" \
    "$(echo "${ERRS[$peer]}" | tr ' ' '\n' | awk '{s+=$1} END {print s}')" "${P99[$peer]}"
done
best=$(for peer in nginx-lc nginx-rr; do echo "${P99[$peer]}" | median; done | sort -g | head -1)
printf '\ndrover p99 / best nginx p99: %s\n' "$(node -e "console.log(($(echo "${P99[drover]}" | median) / $best).toFixed(2))")"
