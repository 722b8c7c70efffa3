#!/usr/bin/env bash
# TLS ended by a TCP balancer, side by side: drover proxy --tcp --tls-cert, HAProxy
# `mode tcp` with `bind … ssl crt`, and nginx `stream` with `listen … ssl`, each one
# process with one thread pinned to one core, in front of the same redis-server, with
# the same certificate (ECDSA P-256), measured one at a time in one run by
# redis-benchmark speaking TLS.
#
#   bash bench/tcp-tls.sh                                         # 3 rounds
#   BENCH_ROUNDS=1 BENCH_KEPT_REQUESTS=20000 BENCH_NEW_REQUESTS=1000 bash bench/tcp-tls.sh  # smoke
#
# Scenarios:
#   kept  `redis-benchmark --tls -t get -c 20 -n BENCH_KEPT_REQUESTS (100000)`: 20
#         connections kept open, GETs/s through the sessions; and the proxy's CPU time
#         per 100,000 GETs.
#   new   the same with `-k 0 -n BENCH_NEW_REQUESTS (5000)`: a new connection, so a full
#         TLS handshake (redis-benchmark resumes no session), per GET: handshakes/s, and
#         the proxy's CPU time per 1,000 handshakes.
# Each round measures every peer in an order rotated (and reversed on even rounds) from
# the last; the table gives each figure's median over the rounds and drover's ratio to
# each other peer.
#
# Environment (all optional): BENCH_ROUNDS (3), BENCH_KEPT_REQUESTS (100000),
# BENCH_NEW_REQUESTS (5000), BENCH_PEERS ("drover haproxy nginx"), BENCH_SKIP_BUILD=1,
# BENCH_NO_INSTALL=1, PROXY_CPU (last core), LOADGEN_CPU (0; redis and
# redis-benchmark share it).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${BENCH_ROUNDS:-3}"
KEPT="${BENCH_KEPT_REQUESTS:-100000}"
NEW="${BENCH_NEW_REQUESTS:-5000}"
read -r -a PEERS <<<"${BENCH_PEERS:-drover haproxy nginx}"

LOG_TAG=tcp-tls
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length 1 "$ROUNDS"
[[ "$KEPT" =~ ^[0-9]+$ && "$NEW" =~ ^[0-9]+$ ]] || die "BENCH_KEPT_REQUESTS and BENCH_NEW_REQUESTS must be whole numbers"
scratch_and_cleanup tcp-tls-bench 1
setup_proxy_bench
STREAM_MODULE=/usr/lib/nginx/modules/ngx_stream_module.so
missing=()
[[ -f "$STREAM_MODULE" ]] || missing+=(libnginx-mod-stream)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-benchmark >/dev/null || missing+=(redis-tools)
command -v openssl >/dev/null || missing+=(openssl)
if ((${#missing[@]})); then
  [[ "${BENCH_NO_INSTALL:-0}" == 1 ]] && die "missing: ${missing[*]}"
  log "installing ${missing[*]} with apt-get"
  apt-get install -y -qq "${missing[@]}" >&2 || die "cannot install ${missing[*]}"
fi

build_binaries
cp "$DROVER" "$TMP/drover"

# ------------------------------------------------------------------ certificate, backend
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
  -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>/dev/null || die "openssl cannot make a certificate"
cat "$TMP/cert.pem" "$TMP/key.pem" >"$TMP/combined.pem"

REDIS="$(quick_port)"
"${PIN_LOAD[@]}" redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$TMP" >"$TMP/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$REDIS" $! 10 || die "redis-server did not start"

declare -A PORT PID
start_peer() { # name
  local name=$1 port dir="$TMP/peer-$1"
  port="$(quick_port)"
  mkdir -p "$dir"
  case "$name" in
    drover)
      "${PIN_PROXY[@]}" "$TMP/drover" proxy --tcp --listen "127.0.0.1:$port" --threads 1 \
        --tls-cert "$TMP/cert.pem" --tls-key "$TMP/key.pem" -b "127.0.0.1:$REDIS" 2>"$dir/stderr.log" &
      ;;
    haproxy)
      cat >"$dir/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 8000
  tune.ssl.default-dh-param 2048
defaults
  mode tcp
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind 127.0.0.1:$port ssl crt $TMP/combined.pem
  default_backend be
backend be
  server r 127.0.0.1:$REDIS
EOF
      "${PIN_PROXY[@]}" "$HAPROXY" -db -f "$dir/haproxy.cfg" 2>"$dir/stderr.log" &
      ;;
    nginx)
      cat >"$dir/nginx.conf" <<EOF
load_module $STREAM_MODULE;
daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 20000;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 8000; multi_accept on; }
stream {
  server {
    listen 127.0.0.1:$port ssl backlog=4096;
    ssl_certificate $TMP/cert.pem;
    ssl_certificate_key $TMP/key.pem;
    proxy_pass 127.0.0.1:$REDIS;
    proxy_timeout 60s;
  }
}
EOF
      "${PIN_PROXY[@]}" "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" 2>"$dir/stderr.log" &
      ;;
    *) die "unknown peer $name (drover, haproxy, nginx)" ;;
  esac
  PID[$name]=$!
  PIDS+=($!)
  PORT[$name]=$port
  wait_port "$port" "${PID[$name]}" 10 || { cat "$dir"/*.log >&2; die "$name did not start"; }
}
for peer in "${PEERS[@]}"; do start_peer "$peer"; done
log "redis on $REDIS; peers: $(for p in "${PEERS[@]}"; do printf '%s=%s ' "$p" "${PORT[$p]}"; done)"

# ------------------------------------------------------------------ measuring
RAW="$TMP/raw.tsv" # peer scenario per_second cpu_seconds count

measure() { # peer scenario
  local peer=$1 scen=$2 before after out cpu rate n args
  case "$scen" in
    kept) n=$KEPT args=() ;;
    new) n=$NEW args=(-k 0) ;;
  esac
  before="$(cpu_total "${PID[$peer]}")"
  out="$("${PIN_LOAD[@]}" redis-benchmark -h 127.0.0.1 -p "${PORT[$peer]}" --tls --cacert "$TMP/cert.pem" \
    -t get -c 20 -n "$n" "${args[@]}" --csv 2>&1)" || die "$peer $scen: redis-benchmark failed: $out"
  after="$(cpu_total "${PID[$peer]}")"
  rate="$(awk -F'"' '$2=="GET" {print $4}' <<<"$out")"
  [[ -n "$rate" ]] || die "$peer $scen: no GET line in: $out"
  cpu="$(awk -v t=$((after - before)) -v hz="$CLK_TCK" 'BEGIN{printf "%.3f", t / hz}')"
  printf '%s\t%s\t%s\t%s\t%s\n' "$peer" "$scen" "$rate" "$cpu" "$n" >>"$RAW"
  log "$peer $scen: $rate GET/s, proxy CPU ${cpu} s"
}

for ((round = 1; round <= ROUNDS; round++)); do
  read -r -a order <<<"$(order_for_round "$round")"
  log "round $round/$ROUNDS: ${order[*]}"
  for scen in kept new; do
    for peer in "${order[@]}"; do
      measure "$peer" "$scen"
      # Let TIME_WAIT and redis settle between peers.
      sleep 1
    done
  done
done

# ------------------------------------------------------------------ report
median() { sort -g | awk '{v[NR]=$1} END{if(!NR){print "nan"; exit} print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
col() { # peer scenario awk-expression over the raw columns ($3 per second, $4 cpu, $5 count)
  awk -F'\t' -v p="$1" -v s="$2" '$1==p && $2==s {print '"$3"'}' "$RAW" | median
}
echo
echo "TLS ended by a TCP balancer in front of redis, $ROUNDS round(s), medians; proxies on core ${PROXY_CPU}, redis and redis-benchmark on core ${LOADGEN_CPU}"
printf '%-8s %14s %20s %16s %22s\n' peer "kept GET/s" "CPU ms / 100k GETs" "handshakes/s" "CPU ms / 1k handshakes"
for peer in "${PEERS[@]}"; do
  kept="$(col "$peer" kept '$3')"
  kept_cpu="$(col "$peer" kept '$4 * 1e8 / $5')"
  new="$(col "$peer" new '$3')"
  new_cpu="$(col "$peer" new '$4 * 1e6 / $5')"
  printf '%-8s %14.0f %20.1f %16.0f %22.1f\n' "$peer" "$kept" "$kept_cpu" "$new" "$new_cpu"
  eval "KEPT_$peer=$kept KEPTCPU_$peer=$kept_cpu NEW_$peer=$new NEWCPU_$peer=$new_cpu"
done
if [[ " ${PEERS[*]} " == *" drover "* ]]; then
  for peer in "${PEERS[@]}"; do
    [[ "$peer" == drover ]] && continue
    awk -v a="$KEPT_drover" -v b="$(eval echo "\$KEPT_$peer")" \
      -v ac="$KEPTCPU_drover" -v bc="$(eval echo "\$KEPTCPU_$peer")" \
      -v s="$NEW_drover" -v t="$(eval echo "\$NEW_$peer")" \
      -v sc="$NEWCPU_drover" -v tc="$(eval echo "\$NEWCPU_$peer")" -v p="$peer" \
      'BEGIN{printf "drover / %-8s kept %.2f x (CPU per GET %.2f x), new %.2f x (CPU per handshake %.2f x)\n", p, a/b, ac/bc, s/t, sc/tc}'
  done
fi
mkdir -p "$BENCH_DIR/results"
cp "$RAW" "$BENCH_DIR/results/tcp-tls-$(date +%Y%m%d-%H%M%S).tsv"
