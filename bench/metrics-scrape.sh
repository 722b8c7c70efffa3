#!/usr/bin/env bash
# How big and how slow a /metrics scrape is on a large set-up: two balancers of 64
# endpoints each (one nginx answering on 64 ports) and an app of 16 workers, after
# traffic has reached every endpoint. Prints the scrape's size, lines and series, and
# the median and max time of 20 scrapes (curl, from request to last byte).
#
#   bash bench/metrics-scrape.sh          # DROVER_BIN to skip the build
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
LOG_TAG=metrics-scrape
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
command -v wrk >/dev/null || die "wrk is needed (apt-get install wrk)"
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
[[ -x "$NGINX" ]] || die "nginx is needed for the backends (apt-get install nginx)"
ENDPOINTS="${SCRAPE_ENDPOINTS:-64}"
WORKERS="${SCRAPE_WORKERS:-16}"

scratch_and_cleanup metrics-scrape 0.5

if [[ -z "${DROVER_BIN:-}" ]]; then
  (cd "$ROOT" && cargo build --release -p drover >&2)
  DROVER_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/drover"
fi

# ------------------------------------------------------------------ backends
ports=()
for ((i = 0; i < ENDPOINTS; i++)); do ports+=("$(quick_port)"); done
start_nginx_ok_backend "$TMP/nginx" "" "${ports[@]}"
PIDS+=("$NGINX_BACKEND_PID")

# ------------------------------------------------------------------ drover
admin="$(quick_port)"
listen=("$(quick_port)" "$(quick_port)")
backends="$(printf '"127.0.0.1:%s",' "${ports[@]}")"
cat >"$TMP/drover.toml" <<CONF
[admin]
listen = "127.0.0.1:$admin"

[[app]]
name = "workers"
command = ["node", "$ROOT/examples/pi-server.js"]
workers = $WORKERS
mode = "shared"
listen = "127.0.0.1:$(quick_port)"

[[balancer]]
name = "api"
listen = "127.0.0.1:${listen[0]}"
backends = [${backends%,}]

[[balancer]]
name = "web"
listen = "127.0.0.1:${listen[1]}"
backends = [${backends%,}]
CONF
"$DROVER_BIN" up --config "$TMP/drover.toml" 2>"$TMP/drover.log" &
PIDS+=($!)
wait_port "$admin" $! 20 || { cat "$TMP/drover.log" >&2; die "drover did not start"; }
for l in "${listen[@]}"; do wait_port "$l" "${PIDS[-1]}" 20 || die "balancer did not start"; done
# Every worker up, then traffic on every endpoint of both balancers.
for ((i = 0; i < 100; i++)); do
  up="$(curl -s "http://127.0.0.1:$admin/metrics" | grep -c '^drover_worker_up{.*} 1$' || true)"
  [[ "$up" -ge "$WORKERS" ]] && break
  sleep 0.2
done
for l in "${listen[@]}"; do wrk -t1 -c64 -d2s "http://127.0.0.1:$l/" >/dev/null; done

# ------------------------------------------------------------------ scrapes
curl -s "http://127.0.0.1:$admin/metrics" >"$TMP/scrape.txt"
size="$(wc -c <"$TMP/scrape.txt")"
lines="$(wc -l <"$TMP/scrape.txt")"
series="$(grep -vc '^#' "$TMP/scrape.txt")"
for ((i = 0; i < 20; i++)); do
  curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$admin/metrics"
done | sort -g >"$TMP/times"
median="$(awk '{a[NR]=$1} END {print a[int((NR+1)/2)] * 1000}' "$TMP/times")"
max="$(tail -1 "$TMP/times" | awk '{print $1 * 1000}')"
endpoints_seen="$(grep -c '^drover_endpoint_up{' "$TMP/scrape.txt")"
workers_seen="$(grep -c '^drover_worker_up{' "$TMP/scrape.txt")"
echo "set-up: 2 balancers x $ENDPOINTS endpoints ($endpoints_seen endpoint series of drover_endpoint_up), $workers_seen workers"
echo "scrape: $size bytes, $lines lines, $series samples"
echo "time:   median ${median} ms, max ${max} ms over 20 scrapes"
