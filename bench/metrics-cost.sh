#!/usr/bin/env bash
# What recording metrics costs the data plane: drover with its recording (this tree)
# against drover built from the last commit before recording landed, side by side in
# one run, on the load where a proxy's own cost shows most (tiny responses from a
# backend that costs next to nothing, the proxy pinned to one core and saturated).
#
#   bash bench/metrics-cost.sh                        # 10 s x 6 rounds, alternating
#   BENCH_DURATION=3 BENCH_ROUNDS=2 bash bench/metrics-cost.sh   # smoke run
#
# Environment (all optional):
#   METRICS_BASE     commit to build the baseline from           (63f0f89: before metrics)
#   DROVER_BIN       drover with metrics; default: cargo build --release here
#   DROVER_BASE_BIN  the baseline; default: built from METRICS_BASE in a git worktree
#                    under target/metrics-base
#   BENCH_DURATION   seconds per measurement                       (10)
#   BENCH_ROUNDS     rounds; the order alternates between rounds   (6)
#   BENCH_CONNECTIONS  wrk connections                             (50)
#   DROVER_FLAGS, DROVER_BASE_FLAGS  extra `drover proxy` flags for each peer, e.g. the
#                    same binary twice with DROVER_FLAGS="--access-log json
#                    --access-log-path /tmp/access.log": what an access log costs
#   PROXY_CPU / LOADGEN_CPU  cores the proxy and wrk are pinned to (last core / 0)
#
# Both binaries run with the admin API on, and /metrics is scraped once a second during
# every measurement (a 404 on the baseline): the recording and the rendering are both
# paid for. Prints req/s and proxy CPU per request for each, their medians and ratios.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
D="${BENCH_DURATION:-10}"
ROUNDS="${BENCH_ROUNDS:-6}"
CONNS="${BENCH_CONNECTIONS:-50}"
BASE="${METRICS_BASE:-63f0f89}"
LOG_TAG=metrics-cost
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
command -v wrk >/dev/null || die "wrk is needed (apt-get install wrk)"
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
[[ -x "$NGINX" ]] || die "nginx is needed for the backend (apt-get install nginx)"
CORES="$(nproc)"
PROXY_CPU="${PROXY_CPU:-$((CORES - 1))}"
LOADGEN_CPU="${LOADGEN_CPU:-0}"

scratch_and_cleanup metrics-cost 0.2

# ------------------------------------------------------------------ the two binaries
if [[ -z "${DROVER_BIN:-}" ]]; then
  log "cargo build --release -p drover"
  (cd "$ROOT" && cargo build --release -p drover >&2)
  DROVER_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/drover"
fi
if [[ -z "${DROVER_BASE_BIN:-}" ]]; then
  base_tree="$ROOT/target/metrics-base"
  if [[ ! -d "$base_tree" ]]; then
    git -C "$ROOT" worktree add --detach "$base_tree" "$BASE" >&2
  else
    git -C "$base_tree" checkout -q --detach "$BASE"
  fi
  log "building the baseline ($BASE) in $base_tree"
  (cd "$base_tree" && CARGO_TARGET_DIR="$base_tree/target" cargo build --release -p drover >&2)
  DROVER_BASE_BIN="$base_tree/target/release/drover"
fi
[[ -x "$DROVER_BIN" && -x "$DROVER_BASE_BIN" ]] || die "missing a binary: $DROVER_BIN, $DROVER_BASE_BIN"

# ------------------------------------------------------------------ backend
BE=("$(free_port)" "$(free_port)")
start_nginx_ok_backend "$TMP/backend" "taskset -c $LOADGEN_CPU" "${BE[@]}"
PIDS+=("$NGINX_BACKEND_PID")

# ------------------------------------------------------------------ one measurement
measure() { # name binary [extra flags...] -> "req/s cpu_us_per_request p50_ms"
  local name=$1 bin=$2 port admin pid scraper cpu0 cpu1 out rps reqs p50
  shift 2
  port="$(quick_port)"
  admin="$(quick_port)"
  taskset -c "$PROXY_CPU" "$bin" proxy --listen "127.0.0.1:$port" --threads 1 \
    --backend "127.0.0.1:${BE[0]}" --backend "127.0.0.1:${BE[1]}" \
    --admin "127.0.0.1:$admin" "$@" 2>"$TMP/$name.log" &
  pid=$!
  PIDS+=("$pid")
  wait_port "$port" "$pid" 10 || { cat "$TMP/$name.log" >&2; die "$name did not start"; }
  taskset -c "$LOADGEN_CPU" wrk -t1 -c"$CONNS" -d1s "http://127.0.0.1:$port/" >/dev/null
  (while :; do curl -s -o /dev/null "http://127.0.0.1:$admin/metrics"; sleep 1; done) &
  scraper=$!
  cpu0="$(cpu_total "$pid")"
  out="$(taskset -c "$LOADGEN_CPU" wrk -t1 -c"$CONNS" -d"${D}s" --latency "http://127.0.0.1:$port/")"
  cpu1="$(cpu_total "$pid")"
  kill "$scraper" 2>/dev/null || true
  wait "$scraper" 2>/dev/null || true
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rps="$(awk '/^Requests\/sec/{print $2}' <<<"$out")"
  reqs="$(awk '/requests in/{print $1}' <<<"$out")"
  p50="$(awk '$1=="50%"{v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}' <<<"$out")"
  grep -q "Non-2xx\|Socket errors" <<<"$out" && log "$name: $(grep "Non-2xx\|Socket errors" <<<"$out")"
  awk -v c=$((cpu1 - cpu0)) -v n="$reqs" -v tck="$CLK_TCK" -v r="$rps" -v p="$p50" \
    'BEGIN { printf "%s %.2f %s\n", r, c / tck * 1e6 / n, p }'
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

log "metrics: $DROVER_BIN; baseline: $DROVER_BASE_BIN ($BASE); ${D}s x $ROUNDS rounds, wrk -c$CONNS"
printf '%-8s %-9s %12s %14s %8s\n' round peer "req/s" "cpu µs/req" "p50 ms"
declare -A RPS CPU
PAIRED=""
for ((r = 1; r <= ROUNDS; r++)); do
  declare -A ROUND=()
  if ((r % 2)); then order=(metrics base); else order=(base metrics); fi
  for name in "${order[@]}"; do
    bin="$DROVER_BIN"
    flags="${DROVER_FLAGS:-}"
    if [[ "$name" == base ]]; then
      bin="$DROVER_BASE_BIN"
      flags="${DROVER_BASE_FLAGS:-}"
    fi
    # shellcheck disable=SC2086 # flags are words on purpose
    read -r rps cpu p50 < <(measure "$name" "$bin" $flags)
    printf '%-8s %-9s %12s %14s %8s\n' "$r" "$name" "$rps" "$cpu" "$p50"
    RPS[$name]+="$rps "
    CPU[$name]+="$cpu "
    ROUND[$name]="$rps"
  done
  # The machine drifts between rounds; the two peers of one round ran back to back.
  PAIRED+="$(awk -v m="${ROUND[metrics]}" -v b="${ROUND[base]}" 'BEGIN {print m / b}') "
done
m_rps="$(tr ' ' '\n' <<<"${RPS[metrics]}" | grep . | median)"
b_rps="$(tr ' ' '\n' <<<"${RPS[base]}" | grep . | median)"
m_cpu="$(tr ' ' '\n' <<<"${CPU[metrics]}" | grep . | median)"
b_cpu="$(tr ' ' '\n' <<<"${CPU[base]}" | grep . | median)"
paired="$(tr ' ' '\n' <<<"$PAIRED" | grep . | median)"
echo
echo "median of per-round ratios (metrics / baseline req/s): $paired"
awk -v mr="$m_rps" -v br="$b_rps" -v mc="$m_cpu" -v bc="$b_cpu" 'BEGIN {
  printf "median req/s:        metrics %.0f, baseline %.0f: ratio %.3f (cost %.1f %%)\n", mr, br, mr / br, (1 - mr / br) * 100
  printf "median CPU per req:  metrics %.2f µs, baseline %.2f µs: ratio %.3f\n", mc, bc, mc / bc
}'
