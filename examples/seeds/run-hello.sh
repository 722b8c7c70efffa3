#!/usr/bin/env bash
# The second post: one hello-world Node server spread over 2 processes four ways, each
# measured with wrk, ROUNDS times (default 3) in alternating order:
#
#   node        one `node hello.js`, nothing in front (the baseline)
#   cluster-2   Node's cluster module: node cluster.js hello.js 2
#   nginx-2     nginx round-robin over two `node hello.js`
#   iptables-2  the kernel: an iptables DNAT rule (statistic match, every 2nd new
#               connection) over two `node hello.js`; root only, inside a network
#               namespace this script creates (skipped, and said so, when it cannot)
#   drover-2    drover run -w 2 -- node hello.js
#
#   bash examples/seeds/run-hello.sh     # needs node, curl, wrk, nginx (apt-get install
#                                        # wrk nginx-light), iproute2 + iptables for iptables-2
# Environment: DURATION (wrk seconds, default 10), CONNS (default 50), ROUNDS (3).
# Figures: requests/s, p50 and p99 latency (wrk --latency), errors (non-2xx + socket errors).
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
need_drover
need node nodejs
need curl
need wrk
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
[[ -x "$NGINX" ]] || die "nginx is not installed (apt-get install nginx-light)"

HELLO="$SEEDS/hello.js"
DURATION="${DURATION:-10}"
CONNS="${CONNS:-50}"
SYSTEMS=(node cluster-2 nginx-2 iptables-2 drover-2)

# iptables-2 runs in a namespace of our own, so no rule touches the host's tables.
NS="drover-seeds-$$"
HAVE_NS=0
if [[ $EUID -eq 0 ]] && command -v ip >/dev/null && command -v iptables >/dev/null \
  && ip netns add "$NS" 2>/dev/null; then
  CLEANUPS+=("ip netns del $NS")
  ip netns exec "$NS" ip link set lo up
  if ip netns exec "$NS" iptables -t nat -A OUTPUT -p tcp -d 127.0.0.1 --dport 1 \
    -m statistic --mode nth --every 2 --packet 0 -j DNAT --to-destination 127.0.0.1:2 2>"$TMP/iptables.err"; then
    ip netns exec "$NS" iptables -t nat -F OUTPUT
    HAVE_NS=1
  else
    log "iptables' statistic match is not available: $(cat "$TMP/iptables.err"); skipping iptables-2"
  fi
else
  log "skipping iptables-2: it needs root, iproute2, iptables and network namespaces"
fi
((HAVE_NS)) || SYSTEMS=(node cluster-2 nginx-2 drover-2)

nginx_conf() { # port backend-port...
  local port=$1 b
  shift
  mkdir -p "$TMP/nginx"
  {
    echo "daemon off; worker_processes auto; pid $TMP/nginx/nginx.pid; error_log $TMP/nginx/error.log;"
    echo "events { worker_connections 4096; }"
    echo "http {"
    echo "  access_log off;"
    echo "  client_body_temp_path $TMP/nginx; proxy_temp_path $TMP/nginx; fastcgi_temp_path $TMP/nginx;"
    echo "  uwsgi_temp_path $TMP/nginx; scgi_temp_path $TMP/nginx;"
    echo "  upstream hello {"
    for b in "$@"; do echo "    server 127.0.0.1:$b;"; done
    echo "    keepalive 64;"
    echo "  }"
    echo "  server {"
    echo "    listen 127.0.0.1:$port;"
    echo "    location / { proxy_pass http://hello; proxy_http_version 1.1; proxy_set_header Connection \"\"; }"
    echo "  }"
    echo "}"
  } >"$TMP/nginx/nginx.conf"
}

two_hellos() { # sets P1 P2, started in the namespace when NS_EXEC says so
  P1="$(free_port)" P2="$(free_port)"
  for p in "$P1" "$P2"; do
    start "hello-$p" "${NS_EXEC[@]}" env PORT="$p" node "$HELLO"
    wait_http "http://127.0.0.1:$p/" "$STARTED" "hello-$p" 15
  done
}

run_one() { # system round
  local sys=$1 round=$2 port pid out
  port="$(free_port)"
  NS_EXEC=()
  case "$sys" in
    node)
      start node env PORT="$port" node "$HELLO"
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/" "$pid" node 15 ;;
    cluster-2)
      start cluster env PORT="$port" node "$SEEDS/cluster.js" "$HELLO" 2
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/" "$pid" cluster 15
      wait_workers "http://127.0.0.1:$port/" 2 ;;
    nginx-2)
      two_hellos
      nginx_conf "$port" "$P1" "$P2"
      start nginx "$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf"
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/" "$pid" nginx 15
      wait_workers "http://127.0.0.1:$port/" 2 ;;
    iptables-2)
      NS_EXEC=(ip netns exec "$NS")
      two_hellos
      ip netns exec "$NS" iptables -t nat -A OUTPUT -p tcp -d 127.0.0.1 --dport "$port" \
        -m statistic --mode nth --every 2 --packet 0 -j DNAT --to-destination "127.0.0.1:$P1"
      ip netns exec "$NS" iptables -t nat -A OUTPUT -p tcp -d 127.0.0.1 --dport "$port" \
        -j DNAT --to-destination "127.0.0.1:$P2"
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/" "$pid" "hello-$P2" 15
      wait_workers "http://127.0.0.1:$port/" 2 ;;
    drover-2)
      start drover "$DROVER" run -w 2 -l "127.0.0.1:$port" --admin off -- node "$HELLO"
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/" "$pid" drover 30
      wait_workers "http://127.0.0.1:$port/" 2 ;;
  esac
  "${NS_EXEC[@]}" timeout $((DURATION + 30)) wrk -t 2 -c "$CONNS" -d "${DURATION}s" --latency \
    "http://127.0.0.1:$port/" >"$TMP/wrk-$sys-$round.txt" 2>&1 || true
  out="$(node "$SEEDS/parse.js" wrk <"$TMP/wrk-$sys-$round.txt")"
  log "round $round $sys: $out"
  record "$sys" "$round" "$out"
  stop_all
  if [[ "$sys" == iptables-2 ]]; then ip netns exec "$NS" iptables -t nat -F OUTPUT; fi
  NS_EXEC=()
}

for ((r = 1; r <= ROUNDS; r++)); do
  for sys in $(order_for_round "$r" "${SYSTEMS[@]}"); do run_one "$sys" "$r"; done
done
report rps p50_ms p99_ms errors
