#!/usr/bin/env bash
# What recording metrics costs per request, in CPU instructions: deterministic where
# req/s on a shared 2-core machine is not (bench/metrics-cost.sh saw the same binary
# run at ~53k or ~45k req/s from one start to the next). Runs drover from this tree and
# drover from the commit before recording (see bench/metrics-cost.sh for the binaries)
# under valgrind's callgrind, each proxying the same N requests one at a time (`drover
# bench -n N -c 1`, so each takes the same path) to an nginx "ok" backend, and prints
# instructions per request and their ratio. Event-loop wake-ups still vary: the same
# binary against itself differs by up to ~1 % (about 230 instructions per request), so
# repeat it; `callgrind_annotate` on the kept output attributes the recording's own share.
# One serving thread, no admin API: the data plane alone.
#
#   DROVER_BIN=... DROVER_BASE_BIN=... bash bench/metrics-instructions.sh
#   METRICS_REQUESTS  requests per binary (20000)
#   LOADGEN_BIN       the drover whose `bench` sends the load (DROVER_BIN)
#   DROVER_FLAGS      more flags for DROVER_BIN's proxy, e.g. "--access-log json
#                     --access-log-path /tmp/x.log" (none); DROVER_BASE_FLAGS: the base's
#   BASE_FIRST=1      measure the base first (run both orders: the first run warms caches)
#
# What an access log costs (bench/README.md): DROVER_BIN=DROVER_BASE_BIN=the same build,
# DROVER_FLAGS="--access-log json --access-log-path /tmp/x.log".
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=metrics-instructions
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
N="${METRICS_REQUESTS:-20000}"
command -v valgrind >/dev/null || die "valgrind is needed"
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
[[ -x "$NGINX" ]] || die "nginx is needed for the backend (apt-get install nginx)"
[[ -x "${DROVER_BIN:-}" && -x "${DROVER_BASE_BIN:-}" ]] ||
  die "set DROVER_BIN (with metrics) and DROVER_BASE_BIN (before them), e.g. from bench/metrics-cost.sh"
LOADGEN_BIN="${LOADGEN_BIN:-$DROVER_BIN}"
scratch_and_cleanup metrics-instructions 2

BE=("$(quick_port)" "$(quick_port)")
start_nginx_ok_backend "$TMP/backend" "" "${BE[@]}"
PIDS+=("$NGINX_BACKEND_PID")

# Sets INSTRUCTIONS to the proxy's instructions over its whole life. Not run in a
# command substitution: the processes it starts must be in this shell's PIDS.
instructions() { # name binary extra-flags
  local name=$1 bin=$2 port pid
  local -a extra
  read -r -a extra <<<"${3:-}"
  port="$(quick_port)"
  valgrind --tool=callgrind --callgrind-out-file="$TMP/$name.out" \
    "$bin" proxy --listen "127.0.0.1:$port" --threads 1 \
    --backend "127.0.0.1:${BE[0]}" --backend "127.0.0.1:${BE[1]}" "${extra[@]}" 2>"$TMP/$name.log" &
  pid=$!
  PIDS+=("$pid")
  wait_port "$port" "$pid" 120 || { cat "$TMP/$name.log" >&2; die "$name did not start"; }
  "$LOADGEN_BIN" bench -n "$N" -c 1 "http://127.0.0.1:$port/" >"$TMP/$name.bench" 2>&1 ||
    { cat "$TMP/$name.bench" >&2; die "$name: the load failed"; }
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  INSTRUCTIONS="$(awk '/^(summary|totals):/ {print $2; exit}' "$TMP/$name.out")"
}

if [[ "${BASE_FIRST:-}" == 1 ]]; then
  instructions base "$DROVER_BASE_BIN" "${DROVER_BASE_FLAGS:-}"
  b=$INSTRUCTIONS
  instructions metrics "$DROVER_BIN" "${DROVER_FLAGS:-}"
  m=$INSTRUCTIONS
else
  instructions metrics "$DROVER_BIN" "${DROVER_FLAGS:-}"
  m=$INSTRUCTIONS
  instructions base "$DROVER_BASE_BIN" "${DROVER_BASE_FLAGS:-}"
  b=$INSTRUCTIONS
fi
awk -v m="$m" -v b="$b" -v n="$N" 'BEGIN {
  printf "instructions per request (start-up and shutdown included, %d requests):\n", n
  printf "  metrics %.0f, baseline %.0f: ratio %.4f (+%.0f per request)\n", m / n, b / n, m / b, (m - b) / n
}'
