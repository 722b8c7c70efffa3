#!/usr/bin/env bash
# The fourth post: a request that loops 1e7 times, `ab -n 1000 -c 100` against it three
# ways, ROUNDS times (default 3) in alternating order:
#
#   node        one `node loop-server.js`
#   cluster-2   Node's cluster module: node cluster.js loop-server.js 2
#   drover-2    drover run -w 2 -- node loop-server.js
#
#   bash examples/seeds/run-loop.sh     # needs node, curl, ab (apt-get install apache2-utils)
# Environment: N (default 1000), C (default 100), ROUNDS (3).
# Figures: requests/s, mean time per request, p50 and p99 (ab's percentiles), failures.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
need_drover
need node nodejs
need curl
need ab apache2-utils

APP="$SEEDS/loop-server.js"
N="${N:-1000}"
C="${C:-100}"

run_one() { # system round
  local sys=$1 round=$2 port pid out
  port="$(free_port)"
  case "$sys" in
    node)
      start node env PORT="$port" node "$APP"
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/" "$pid" node 15 ;;
    cluster-2)
      start cluster env PORT="$port" node "$SEEDS/cluster.js" "$APP" 2
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/" "$pid" cluster 15
      wait_workers "http://127.0.0.1:$port/" 2 ;;
    drover-2)
      start drover "$DROVER" run -w 2 -l "127.0.0.1:$port" --admin off -- node "$APP"
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/" "$pid" drover 30
      wait_workers "http://127.0.0.1:$port/" 2 ;;
  esac
  timeout 300 ab -n "$N" -c "$C" "http://127.0.0.1:$port/" >"$TMP/ab-$sys-$round.txt" 2>&1 || true
  out="$(node "$SEEDS/parse.js" ab <"$TMP/ab-$sys-$round.txt")"
  log "round $round $sys: $out"
  record "$sys" "$round" "$out"
  stop_all
}

for ((r = 1; r <= ROUNDS; r++)); do
  for sys in $(order_for_round "$r" node cluster-2 drover-2); do run_one "$sys" "$r"; done
done
report rps mean_ms p50_ms p99_ms failed non2xx
