#!/usr/bin/env bash
# The third post: an Express JSON API load-tested with npm loadtest at a fixed rate, one
# new connection per request (loadtest's default), three ways, ROUNDS times (default 3)
# in alternating order:
#
#   drover-2    drover run -w auto -- node express-api/server.js  (auto = 2 on 2 cores)
#   cluster-2   Node's cluster module: node cluster.js express-api/server.js 2
#   pm2-2       pm2 start express-api/server.js -i 2 (PM2's cluster mode)
#
# Two loads: "rated" (loadtest -n N --rps RPS, default 20000 at 2000/s; the post sent
# 200000: N=200000) and "overload" (-n OVER_N --rps OVER_RPS, default 15000 at 5000/s,
# past what two workers serve here).
#
#   npm ci --prefix examples/seeds/express-api && npm ci --prefix examples/seeds/tools
#   bash examples/seeds/run-express.sh
# loadtest's summary counts every answer >= 400 as an error and shows it as -1 (it keeps
# no status code without a status callback): an error there is a 503 or a broken
# connection alike. The drover logs are searched for its own refusals and ejections.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
need_drover
need node nodejs
need curl
LOADTEST="$SEEDS/tools/node_modules/.bin/loadtest"
PM2="$SEEDS/tools/node_modules/.bin/pm2"
[[ -x "$LOADTEST" && -x "$PM2" ]] || die "run \`npm ci --prefix examples/seeds/tools\` first"
[[ -d "$SEEDS/express-api/node_modules/express" ]] || die "run \`npm ci --prefix examples/seeds/express-api\` first"

APP="$SEEDS/express-api/server.js"
N="${N:-20000}"
RPS="${RPS:-2000}"
OVER_N="${OVER_N:-15000}"
OVER_RPS="${OVER_RPS:-5000}"
LOADS="${LOADS:-rated overload}"
export PM2_HOME="$TMP/pm2"
CLEANUPS+=("\"$PM2\" kill >/dev/null 2>&1")

run_one() { # system load round
  local sys=$1 load=$2 round=$3 port pid out n rps drover_log=""
  port="$(free_port)"
  case "$sys" in
    drover-2)
      start drover "$DROVER" run -w auto -l "127.0.0.1:$port" --admin off -- node "$APP"
      pid=$STARTED
      drover_log="$TMP/drover.log"
      wait_http "http://127.0.0.1:$port/" "$pid" drover 30 ;;
    cluster-2)
      start cluster env PORT="$port" node "$SEEDS/cluster.js" "$APP" 2
      pid=$STARTED
      wait_http "http://127.0.0.1:$port/" "$pid" cluster 15 ;;
    pm2-2)
      PORT="$port" "$PM2" start "$APP" -i 2 --name api >"$TMP/pm2.log" 2>&1 || die "pm2 start failed: $(tail -5 "$TMP/pm2.log")"
      pid="$(cat "$PM2_HOME/pm2.pid")"
      wait_http "http://127.0.0.1:$port/" "$pid" pm2 30 ;;
  esac
  if [[ "$load" == rated ]]; then n=$N rps=$RPS; else n=$OVER_N rps=$OVER_RPS; fi
  # Only what drover logs under the load counts: its probe by wait_http may have met
  # "no healthy endpoint" before the workers were ready.
  local skip=0
  [[ -n "$drover_log" ]] && skip="$(wc -l <"$drover_log")"
  timeout 600 "$LOADTEST" -n "$n" --rps "$rps" "http://127.0.0.1:$port/" >"$TMP/lt-$sys-$load-$round.txt" 2>&1 || true
  out="$(node "$SEEDS/parse.js" loadtest <"$TMP/lt-$sys-$load-$round.txt")"
  if [[ -n "$drover_log" ]]; then
    # drover's own view: refusals and ejections it logged during the run
    out="$(node -e 'const o = JSON.parse(process.argv[1]); o.drover_warnings = +process.argv[2]; o.ejections = +process.argv[3]; console.log(JSON.stringify(o))' \
      "$out" "$(tail -n +$((skip + 1)) "$drover_log" | grep -c -i 'warn' || true)" "$(tail -n +$((skip + 1)) "$drover_log" | grep -c 'endpoint ejected' || true)")"
    tail -n +$((skip + 1)) "$drover_log" >"$TMP/drover-$load-$round.log"
  fi
  log "round $round $sys $load: $out"
  record "$sys $load" "$round" "$out"
  if [[ "$sys" == pm2-2 ]]; then "$PM2" kill >/dev/null 2>&1 || true; fi
  stop_all
}

for ((r = 1; r <= ROUNDS; r++)); do
  for load in $LOADS; do
    for sys in $(order_for_round "$r" drover-2 cluster-2 pm2-2); do run_one "$sys" "$load" "$r"; done
  done
done
report completed errors rps mean_ms p50_ms p99_ms drover_warnings ejections
