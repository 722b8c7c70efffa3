#!/usr/bin/env bash
# TCP mode side by side: drover proxy --tcp, HAProxy `mode tcp` and nginx `stream`, each
# one process with one thread pinned to one core, over the same two backends, measured
# one at a time in one run (issue 25, item 1's targets).
#
#   bash bench/tcp.sh                                 # 3 rounds, 1 GiB bulk, 10 s short
#   BENCH_ROUNDS=1 BENCH_DURATION=3 BENCH_BULK_BYTES=268435456 bash bench/tcp.sh  # smoke
#
# Scenarios (testkit-tcp, crates/drover-testkit/src/bin/testkit-tcp.rs, is both the
# backends and the load):
#   bulk   BENCH_BULK_BYTES (1 GiB) from the backends through 8 connections: bytes/s, and
#          the proxy's CPU time per GiB (utime + stime of its process, /proc).
#   short  connect, 100 bytes each way, close, from BENCH_SHORT_CONCURRENCY (50) clients
#          for BENCH_DURATION seconds: connections/s, errors, and the proxy's CPU time per
#          1,000 connections.
# Each round measures every peer in an order rotated (and reversed on even rounds) from
# the last; the table gives each figure's median over the rounds and drover's ratio to
# each other peer.
#
# Environment (all optional): BENCH_ROUNDS (3), BENCH_DURATION (10), BENCH_BULK_BYTES
# (1073741824), BENCH_SHORT_CONCURRENCY (50), BENCH_PEERS ("drover haproxy nginx"),
# BENCH_SKIP_BUILD=1, BENCH_NO_INSTALL=1, PROXY_CPU (last core), LOADGEN_CPU (0; the
# backends and the load share it).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${BENCH_ROUNDS:-3}"
D="${BENCH_DURATION:-10}"
BULK_BYTES="${BENCH_BULK_BYTES:-1073741824}"
SHORT_CONCURRENCY="${BENCH_SHORT_CONCURRENCY:-50}"
read -r -a PEERS <<<"${BENCH_PEERS:-drover haproxy nginx}"

LOG_TAG=tcp
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
scratch_and_cleanup tcp-bench 1
setup_proxy_bench
STREAM_MODULE=/usr/lib/nginx/modules/ngx_stream_module.so
if [[ ! -f "$STREAM_MODULE" ]]; then
  [[ "${BENCH_NO_INSTALL:-0}" == 1 ]] && die "missing nginx's stream module (libnginx-mod-stream)"
  log "installing libnginx-mod-stream with apt-get"
  apt-get install -y -qq libnginx-mod-stream >&2 || die "cannot install libnginx-mod-stream"
fi

build_binaries
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
if [[ "${BENCH_SKIP_BUILD:-0}" != 1 ]]; then
  log "cargo build --release -p drover-testkit --bin testkit-tcp"
  (cd "$ROOT" && cargo build --release -p drover-testkit --bin testkit-tcp >&2)
fi
# Copies: the shared target directory may be rebuilt from another branch mid-run.
cp "$DROVER" "$TMP/drover"
cp "$TARGET/release/testkit-tcp" "$TMP/testkit-tcp"
TK="$TMP/testkit-tcp"

# ------------------------------------------------------------------ backends and peers
B1="$(quick_port)" B2="$(quick_port)"
for port in "$B1" "$B2"; do
  "${PIN_LOAD[@]}" "$TK" serve "127.0.0.1:$port" >"$TMP/backend-$port.log" 2>&1 &
  PIDS+=($!)
  wait_port "$port" $! 10 || die "backend on $port did not start"
done

declare -A PORT PID
start_peer() { # name
  local name=$1 port dir="$TMP/peer-$1"
  port="$(quick_port)"
  mkdir -p "$dir/tmp"
  case "$name" in
    drover)
      "${PIN_PROXY[@]}" "$TMP/drover" proxy --tcp --listen "127.0.0.1:$port" --threads 1 \
        --strategy least-conn -b "127.0.0.1:$B1" -b "127.0.0.1:$B2" 2>"$dir/stderr.log" &
      ;;
    haproxy)
      cat >"$dir/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 8000
defaults
  mode tcp
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind 127.0.0.1:$port
  default_backend be
backend be
  balance leastconn
  server b1 127.0.0.1:$B1
  server b2 127.0.0.1:$B2
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
  upstream be {
    least_conn;
    server 127.0.0.1:$B1;
    server 127.0.0.1:$B2;
  }
  server {
    listen 127.0.0.1:$port backlog=4096;
    proxy_pass be;
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
log "backends on $B1 and $B2; peers: $(for p in "${PEERS[@]}"; do printf '%s=%s ' "$p" "${PORT[$p]}"; done)"

# ------------------------------------------------------------------ measuring
RAW="$TMP/raw.tsv" # peer scenario value cpu_seconds
json_field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }

measure() { # peer scenario
  local peer=$1 scen=$2 before after out cpu
  before="$(cpu_total "${PID[$peer]}")"
  case "$scen" in
    bulk) out="$("${PIN_LOAD[@]}" "$TK" bulk "127.0.0.1:${PORT[$peer]}" 8 "$BULK_BYTES")" ;;
    short) out="$("${PIN_LOAD[@]}" "$TK" short "127.0.0.1:${PORT[$peer]}" "$SHORT_CONCURRENCY" "$D")" ;;
  esac
  after="$(cpu_total "${PID[$peer]}")"
  cpu="$(awk -v t=$((after - before)) -v hz="$CLK_TCK" 'BEGIN{printf "%.3f", t / hz}')"
  case "$scen" in
    bulk) printf '%s\tbulk\t%s\t%s\t%s\n' "$peer" "$(json_field bytes_per_s <<<"$out")" "$cpu" "$(json_field bytes <<<"$out")" ;;
    short) printf '%s\tshort\t%s\t%s\t%s\t%s\n' "$peer" "$(json_field connections_per_s <<<"$out")" "$cpu" \
      "$(json_field connections <<<"$out")" "$(json_field errors <<<"$out")" ;;
  esac >>"$RAW"
  log "$peer $scen: $out, proxy CPU ${cpu} s"
}

for ((round = 1; round <= ROUNDS; round++)); do
  read -r -a order <<<"$(order_for_round "$round")"
  log "round $round/$ROUNDS: ${order[*]}"
  for scen in bulk short; do
    for peer in "${order[@]}"; do
      measure "$peer" "$scen"
      # Let TIME_WAIT and the backends settle between peers.
      sleep 1
    done
  done
done

# ------------------------------------------------------------------ report
median() { sort -g | awk '{v[NR]=$1} END{if(!NR){print "nan"; exit} print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
col() { # peer scenario awk-expression over the raw columns ($3 value, $4 cpu, $5 count, $6 errors)
  awk -F'\t' -v p="$1" -v s="$2" '$1==p && $2==s {print '"$3"'}' "$RAW" | median
}
echo
echo "TCP mode, $ROUNDS round(s), medians; proxies on core ${PROXY_CPU}, load and backends on core ${LOADGEN_CPU}"
printf '%-8s %12s %14s %14s %16s %8s\n' peer "bulk MB/s" "CPU s / GiB" "short conn/s" "CPU ms / 1k conn" errors
for peer in "${PEERS[@]}"; do
  bulk="$(col "$peer" bulk '$3 / 1e6')"
  bulk_cpu="$(col "$peer" bulk '$4 / ($5 / 1073741824)')"
  short="$(col "$peer" short '$3')"
  short_cpu="$(col "$peer" short '$4 * 1e6 / $5')"
  errors="$(awk -F'\t' -v p="$peer" '$1==p && $2=="short" {e+=$6} END{print e+0}' "$RAW")"
  printf '%-8s %12.0f %14.3f %14.0f %16.1f %8s\n' "$peer" "$bulk" "$bulk_cpu" "$short" "$short_cpu" "$errors"
  eval "BULK_$peer=$bulk BULKCPU_$peer=$bulk_cpu SHORT_$peer=$short SHORTCPU_$peer=$short_cpu"
done
if [[ " ${PEERS[*]} " == *" drover "* ]]; then
  for peer in "${PEERS[@]}"; do
    [[ "$peer" == drover ]] && continue
    awk -v a="$BULK_drover" -v b="$(eval echo "\$BULK_$peer")" \
      -v ac="$BULKCPU_drover" -v bc="$(eval echo "\$BULKCPU_$peer")" \
      -v s="$SHORT_drover" -v t="$(eval echo "\$SHORT_$peer")" \
      -v sc="$SHORTCPU_drover" -v tc="$(eval echo "\$SHORTCPU_$peer")" -v p="$peer" \
      'BEGIN{printf "drover / %-8s bulk %.2f x (CPU per byte %.2f x), short %.2f x (CPU per connection %.2f x)\n", p, a/b, ac/bc, s/t, sc/tc}'
  done
fi
mkdir -p "$BENCH_DIR/results"
cp "$RAW" "$BENCH_DIR/results/tcp-$(date +%Y%m%d-%H%M%S).tsv"
