#!/usr/bin/env bash
# What TLS to the backends costs (backend_tls): one nginx answers "ok" on a plain port
# and on a TLS port (the same certificate a test CA signs), and in front of it, one at
# a time, each one process with one thread pinned to the last core:
#   drover-plain   drover proxy -b PLAIN
#   drover-tls     drover proxy -b TLS --backend-ca ca.pem --backend-server-name backend.test
#   nginx-plain    proxy_pass http:// with keepalive 64
#   nginx-tls      proxy_pass https:// with keepalive 64, proxy_ssl_verify on,
#                  proxy_ssl_session_reuse on, proxy_ssl_server_name on
# wrk -t1 -c50 over plain keep-alive connections from the client, `GET /`; requests/s,
# median over the rounds (each round in an order rotated from the last).
#
#   bash bench/backend-tls.sh                          # 3 rounds, 10 s per measurement
#   BENCH_ROUNDS=1 BENCH_DURATION=3 bash bench/backend-tls.sh   # smoke
#
# Environment (all optional): BENCH_ROUNDS (3), BENCH_DURATION (10), BENCH_SKIP_BUILD=1,
# PROXY_CPU (last core), LOADGEN_CPU (0; the backend and wrk share it).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${BENCH_ROUNDS:-3}"
D="${BENCH_DURATION:-10}"
PEERS=(drover-plain drover-tls nginx-plain nginx-tls)

LOG_TAG=backend-tls
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
[[ -x "$NGINX" ]] || die "nginx is needed (apt-get install nginx)"
command -v wrk >/dev/null || die "wrk is needed (apt-get install wrk)"
command -v openssl >/dev/null || die "openssl is needed"

build_binaries
scratch_and_cleanup backend-tls 1
LAST=$(($(nproc) - 1))
PROXY_PIN="taskset -c ${PROXY_CPU:-$LAST}"
LOAD_PIN="taskset -c ${LOADGEN_CPU:-0}"
command -v taskset >/dev/null && [[ "$LAST" -ge 1 ]] || { PROXY_PIN=""; LOAD_PIN=""; }

# The test CA and the backend's certificate, for backend.test and 127.0.0.1.
(
  cd "$TMP"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
    -out ca.pem -days 30 -subj "/CN=bench CA" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout be.key \
    -out be.csr -subj "/CN=backend.test" 2>/dev/null
  printf 'subjectAltName=DNS:backend.test,IP:127.0.0.1\n' >be.ext
  openssl x509 -req -in be.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out be.pem \
    -days 30 -extfile be.ext 2>/dev/null
)

PLAIN=$(quick_port)
TLS=$(quick_port)
mkdir -p "$TMP/backend/tmp"
{
  nginx_preamble "$TMP/backend" 8192
  echo "  server {"
  echo "    listen 127.0.0.1:$PLAIN backlog=4096;"
  echo "    listen 127.0.0.1:$TLS ssl backlog=4096;"
  echo "    ssl_certificate $TMP/be.pem;"
  echo "    ssl_certificate_key $TMP/be.key;"
  echo '    location / { return 200 "ok"; }'
  echo "  }"
  echo "}"
} >"$TMP/backend/nginx.conf"
# shellcheck disable=SC2086 # the pin is words on purpose
nice -n 19 $LOAD_PIN "$NGINX" -p "$TMP/backend" -e "$TMP/backend/error.log" -c "$TMP/backend/nginx.conf" 2>"$TMP/backend/stderr.log" &
PIDS+=($!)
wait_port "$PLAIN" "${PIDS[-1]}" 10 && wait_port "$TLS" "${PIDS[-1]}" 10 || die "the nginx backend did not start"

start_peer() { # peer port -> PEER_PID
  local peer=$1 port=$2 dir="$TMP/$1"
  mkdir -p "$dir/tmp"
  case "$peer" in
    drover-plain)
      # shellcheck disable=SC2086
      nice -n 19 $PROXY_PIN "$DROVER" proxy -l "127.0.0.1:$port" -t 1 -b "127.0.0.1:$PLAIN" >"$dir/log" 2>&1 &
      ;;
    drover-tls)
      # shellcheck disable=SC2086
      nice -n 19 $PROXY_PIN "$DROVER" proxy -l "127.0.0.1:$port" -t 1 -b "127.0.0.1:$TLS" \
        --backend-ca "$TMP/ca.pem" --backend-server-name backend.test >"$dir/log" 2>&1 &
      ;;
    nginx-plain | nginx-tls)
      local scheme=http target=$PLAIN
      [[ "$peer" == nginx-tls ]] && scheme=https target=$TLS
      {
        nginx_preamble "$dir" 8192
        echo "  upstream be { server 127.0.0.1:$target; keepalive 64; }"
        echo "  server {"
        echo "    listen 127.0.0.1:$port backlog=4096;"
        echo "    location / {"
        echo "      proxy_pass $scheme://be;"
        echo "      proxy_http_version 1.1;"
        echo '      proxy_set_header Connection "";'
        if [[ "$scheme" == https ]]; then
          echo "      proxy_ssl_verify on;"
          echo "      proxy_ssl_trusted_certificate $TMP/ca.pem;"
          echo "      proxy_ssl_name backend.test;"
          echo "      proxy_ssl_server_name on;"
          echo "      proxy_ssl_session_reuse on;"
        fi
        echo "    }"
        echo "  }"
        echo "}"
      } >"$dir/nginx.conf"
      # shellcheck disable=SC2086
      nice -n 19 $PROXY_PIN "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" >"$dir/log" 2>&1 &
      ;;
  esac
  PEER_PID=$!
  wait_port "$port" "$PEER_PID" 10 || { cat "$dir/log" >&2; die "$peer did not start"; }
}

declare -A RESULTS
for ((round = 1; round <= ROUNDS; round++)); do
  read -r -a order <<<"$(order_for_round "$round")"
  for peer in "${order[@]}"; do
    port=$(quick_port)
    start_peer "$peer" "$port"
    # A check that it proxies at all, then the measurement.
    curl -fsS "http://127.0.0.1:$port/" >/dev/null || die "$peer does not answer"
    # shellcheck disable=SC2086
    rps=$(nice -n 19 $LOAD_PIN wrk -t1 -c50 -d"${D}s" "http://127.0.0.1:$port/" |
      awk '/^Requests\/sec:/{print $2}')
    errors=$(curl -fsS "http://127.0.0.1:$port/" >/dev/null && echo 0 || echo 1)
    kill "$PEER_PID" 2>/dev/null || true
    wait "$PEER_PID" 2>/dev/null || true
    log "round $round: $peer ${rps} req/s"
    RESULTS[$peer]+="$rps "
    [[ "$errors" == 0 ]] || log "warning: $peer stopped answering after the run"
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
printf '\n| peer | req/s (median of %s x %s s) | rounds |\n|---|---|---|\n' "$ROUNDS" "$D"
for peer in "${PEERS[@]}"; do
  printf '| %s | %.0f | %s|\n' "$peer" "$(echo "${RESULTS[$peer]}" | median)" "${RESULTS[$peer]}"
done
