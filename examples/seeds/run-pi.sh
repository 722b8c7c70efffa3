#!/usr/bin/env bash
# The first post: a Node server answering every request with a Monte-Carlo estimate of
# pi from 10,000,000 points, 10 users x 5 requests each. Measured three ways, ROUNDS
# times (default 3) in alternating order:
#
#   node      one `node examples/pi-server.js`, no balancer (where the post starts)
#   rr-3      the post's own round-robin (pi-rr.js, node-http-proxy) over 3 pi servers
#   drover-3  drover run -w 3 -- node examples/pi-server.js
#
#   bash examples/seeds/run-pi.sh            # needs node, curl, a release build of drover,
#                                            # and `npm ci --prefix examples/seeds/tools`
# Figures: total wall time of the 50 requests, per-request mean/p50/max, errors.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
need_drover
need node nodejs
need curl
[[ -d "$SEEDS/tools/node_modules/http-proxy" ]] || die "run \`npm ci --prefix examples/seeds/tools\` first"

PI="$ROOT/examples/pi-server.js"
QUERY="/pi?iterations=10000000"
USERS="${USERS:-10}"
REQUESTS="${REQUESTS:-5}"

run_one() { # system round
  local sys=$1 round=$2 port p1 p2 p3 pid out
  port="$(free_port)"
  case "$sys" in
    node)
      start node env PORT="$port" node "$PI"
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/health" "$pid" node 15 ;;
    rr-3)
      p1="$(free_port)" p2="$(free_port)" p3="$(free_port)"
      for p in "$p1" "$p2" "$p3"; do
        start "pi-$p" env PORT="$p" node "$PI"
        wait_http "http://127.0.0.1:$p/health" "$STARTED" "pi-$p" 15
      done
      start rr env PORT="$port" node "$SEEDS/pi-rr.js" "127.0.0.1:$p1" "127.0.0.1:$p2" "127.0.0.1:$p3"
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/health" "$pid" rr 15
      wait_workers "http://127.0.0.1:$port/health" 3 ;;
    drover-3)
      start drover "$DROVER" run -w 3 -l "127.0.0.1:$port" --admin off -- node "$PI"
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/health" "$pid" drover 30
      wait_workers "http://127.0.0.1:$port/health" 3 ;;
  esac
  out="$(timeout 300 node "$SEEDS/users.js" "http://127.0.0.1:$port$QUERY" "$USERS" "$REQUESTS")"
  log "round $round $sys: $out"
  record "$sys" "$round" "$out"
  stop_all
}

for ((r = 1; r <= ROUNDS; r++)); do
  for sys in $(order_for_round "$r" node rr-3 drover-3); do run_one "$sys" "$r"; done
done
report total_ms mean_ms p50_ms max_ms errors
