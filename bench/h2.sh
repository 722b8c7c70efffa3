#!/usr/bin/env bash
# HTTP/2 from clients side by side (issue 24's HTTP/2 target): drover proxy --tls-cert and
# nginx `listen ... ssl http2`, each one process pinned to one core, serving the same
# certificate in front of the same tiny HTTP/1.1 backend (nginx answering "ok" over
# keep-alive), measured one at a time in one run with h2load: BENCH_CONNS (10)
# connections with BENCH_STREAMS (10) concurrent streams each, 100 streams in all,
# `GET /` for BENCH_DURATION seconds. Over TLS (ALPN h2), as browsers speak it.
#
#   bash bench/h2.sh                               # 3 rounds, 10 s per measurement
#   BENCH_ROUNDS=1 BENCH_DURATION=3 bash bench/h2.sh   # smoke
#
# Each round measures every peer in an order rotated (and reversed on even rounds) from
# the last; the table gives each peer's median req/s over the rounds, its CPU time per
# 1,000 requests, and drover's ratio. Needs h2load (Debian: nghttp2-client, installed
# unless BENCH_NO_INSTALL=1) and openssl.
#
# Environment (all optional): BENCH_ROUNDS (3), BENCH_DURATION (10), BENCH_CONNS (10),
# BENCH_STREAMS (10), BENCH_PEERS ("drover nginx"), BENCH_SKIP_BUILD=1,
# BENCH_NO_INSTALL=1, PROXY_CPU (last core), LOADGEN_CPU (0; the backend and h2load
# share it).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${BENCH_ROUNDS:-3}"
D="${BENCH_DURATION:-10}"
CONNS="${BENCH_CONNS:-10}"
STREAMS="${BENCH_STREAMS:-10}"
read -r -a PEERS <<<"${BENCH_PEERS:-drover nginx}"

LOG_TAG=h2
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
scratch_and_cleanup h2-bench 1
setup_proxy_bench
if ! command -v h2load >/dev/null; then
  [[ "${BENCH_NO_INSTALL:-0}" == 1 ]] && die "missing: h2load (nghttp2-client; BENCH_NO_INSTALL=1)"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  log "installing nghttp2-client with apt-get"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends nghttp2-client >&2
fi
command -v openssl >/dev/null || die "openssl (the CLI) is needed for the certificates"
build_binaries
# A copy: the shared target directory may be rebuilt from another branch mid-run.
cp "$DROVER" "$TMP/drover"

# One test CA and one ECDSA P-256 server certificate it signs, for every peer.
CERTS="$TMP/certs"
mkdir -p "$CERTS"
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$CERTS/ca.key" 2>/dev/null
openssl req -x509 -new -key "$CERTS/ca.key" -subj "/CN=drover bench CA" -days 2 \
  -addext "basicConstraints=critical,CA:true" -addext "keyUsage=critical,keyCertSign" \
  -out "$CERTS/ca.pem" 2>/dev/null
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$CERTS/server.key" 2>/dev/null
openssl req -new -key "$CERTS/server.key" -subj "/CN=localhost" -out "$CERTS/server.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:false\nextendedKeyUsage=serverAuth\n' >"$CERTS/ext.cnf"
openssl x509 -req -in "$CERTS/server.csr" -CA "$CERTS/ca.pem" -CAkey "$CERTS/ca.key" \
  -CAcreateserial -days 2 -extfile "$CERTS/ext.cnf" -out "$CERTS/server.pem" 2>/dev/null
cat "$CERTS/server.pem" "$CERTS/ca.pem" >"$CERTS/chain.pem"

BE_PORT="$(quick_port)"
start_nginx_ok_backend "$TMP/backend" "${PIN_LOAD[*]}" "$BE_PORT"
PIDS+=("$NGINX_BACKEND_PID")

declare -A PORT PID
start_peer() { # name
  local name=$1 port dir
  port="$(quick_port)"
  dir="$TMP/peer-$name"
  mkdir -p "$dir/tmp"
  case "$name" in
    drover)
      "${PIN_PROXY[@]}" "$TMP/drover" proxy --listen "127.0.0.1:$port" --threads 1 \
        --backend "127.0.0.1:$BE_PORT" --tls-cert "$CERTS/chain.pem" --tls-key "$CERTS/server.key" \
        >"$dir/stdout.log" 2>"$dir/stderr.log" &
      ;;
    nginx)
      {
        nginx_preamble "$dir" 4096
        cat <<EOF
  http2_max_concurrent_streams 128;
  upstream backends {
    server 127.0.0.1:$BE_PORT max_fails=0;
    keepalive 64;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$port ssl http2 backlog=4096;
    ssl_certificate $CERTS/chain.pem;
    ssl_certificate_key $CERTS/server.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    location / { proxy_pass http://backends; }
  }
}
EOF
      } >"$dir/nginx.conf"
      "${PIN_PROXY[@]}" "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" 2>"$dir/stderr.log" &
      ;;
    *) die "unknown peer $name (drover, nginx)" ;;
  esac
  PID[$name]=$!
  PIDS+=($!)
  PORT[$name]=$port
  wait_port "$port" "${PID[$name]}" 10 || { cat "$dir"/*.log >&2; die "$name did not start"; }
  # It must answer over HTTP/2 with the test CA's certificate before it is measured.
  local answer
  answer="$(curl -sS --http2 --max-time 5 --cacert "$CERTS/ca.pem" -w ' %{http_version}' \
    "https://localhost:$port/" --resolve "localhost:$port:127.0.0.1")" ||
    { cat "$dir"/*.log >&2; die "$name does not answer over HTTPS"; }
  [[ "$answer" == "ok 2" ]] || die "$name answered '$answer', not 'ok' over HTTP/2"
}

for peer in "${PEERS[@]}"; do start_peer "$peer"; done
log "peers: $(for p in "${PEERS[@]}"; do printf '%s=%s ' "$p" "${PORT[$p]}"; done)"

RESULTS="$TMP/results.tsv"
: >"$RESULTS"
measure() { # round peer
  local before after out rps ok failed cpu
  before="$(cpu_total "${PID[$2]}")"
  out="$("${PIN_LOAD[@]}" h2load -c "$CONNS" -m "$STREAMS" -D "$D" "https://127.0.0.1:${PORT[$2]}/" 2>&1)"
  after="$(cpu_total "${PID[$2]}")"
  rps="$(sed -n 's/^finished in [0-9.]*s, \([0-9.]*\) req\/s.*/\1/p' <<<"$out")"
  ok="$(sed -n 's/^requests: .* \([0-9]*\) succeeded.*/\1/p' <<<"$out")"
  failed="$(sed -n 's/^requests: .*succeeded, \([0-9]*\) failed, \([0-9]*\) errored.*/\1+\2/p' <<<"$out")"
  [[ -n "$rps" && -n "$ok" ]] || { echo "$out" >&2; die "round $1 $2: no h2load result"; }
  cpu="$(awk -v t=$((after - before)) -v hz="$CLK_TCK" -v n="$ok" 'BEGIN{printf "%.1f", n ? t / hz * 1e6 / n : 0}')"
  printf '%s\t%s\t%s\t%s\n' "$2" "$rps" "$cpu" "$failed" >>"$RESULTS"
  log "round $1 $2: $rps req/s ($ok succeeded, $failed failed+errored), proxy CPU $cpu ms per 1,000 requests"
}

# Warm up every peer's backend connections.
for peer in "${PEERS[@]}"; do
  "${PIN_LOAD[@]}" h2load -c "$CONNS" -m "$STREAMS" -D 2 "https://127.0.0.1:${PORT[$peer]}/" >/dev/null 2>&1 || true
done
for ((round = 1; round <= ROUNDS; round++)); do
  read -r -a order <<<"$(order_for_round "$round")"
  for peer in "${order[@]}"; do
    measure "$round" "$peer"
    sleep 1
  done
done

median() { sort -n | awk '{v[NR]=$1} END{print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
echo
echo "h2load -c $CONNS -m $STREAMS -D $D over TLS (ALPN h2), $ROUNDS round(s); proxies on core $PROXY_CPU, load and backend on core $LOADGEN_CPU"
printf '%-8s %12s %22s %10s\n' peer "req/s" "CPU ms / 1,000 req" "vs drover"
drover_rps="$(awk -F'\t' '$1=="drover"{print $2}' "$RESULTS" | median)"
for peer in "${PEERS[@]}"; do
  rps="$(awk -F'\t' -v p="$peer" '$1==p{print $2}' "$RESULTS" | median)"
  cpu="$(awk -F'\t' -v p="$peer" '$1==p{print $3}' "$RESULTS" | median)"
  ratio="$(awk -v a="$drover_rps" -v b="$rps" 'BEGIN{printf "%.2f", b ? a / b : 0}')"
  printf '%-8s %12.0f %22s %10s\n' "$peer" "$rps" "$cpu" "$ratio x"
done
