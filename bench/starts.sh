#!/usr/bin/env bash
# How an app's start goes under drover run and PM2 (`pm2 start -i 3`), as the apps write
# it: when the first answer comes, and how many times the start's own work ran.
#   slow   an app that waits SLOW_MS (40 s: migrations, a database slow to answer)
#          before it listens on PORT, past drover's default ready timeout (30 s)
#   steps  `npm start` of a package whose prestart script checks the environment and
#          whose start is `node migrate.js && node server.js`, as apps' scripts run
#          their migrations (300 ms here)
# Per system and scenario: seconds to the first 200 (none within LIMIT s: null), how many
# times the start's work ran by then plus 3 s (a restarted worker runs its migration
# again), and the workers' restarts as drover counts them.
#
#   bash bench/starts.sh                                  # drover and PM2, 1 round (~4 min)
#   DROVER_B_BIN=/path/to/old/drover bash bench/starts.sh # a second drover beside
#   SCENARIOS=steps bash bench/starts.sh
#
# BENCH_SKIP_BUILD=1 uses the built binary; DROVER_BIN another one.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROUNDS="${ROUNDS:-1}" SLOW_MS="${SLOW_MS:-40000}" LIMIT="${LIMIT:-90}"
SCENARIOS="${SCENARIOS:-slow steps}"
for v in ROUNDS SLOW_MS LIMIT; do
  [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -ge 1 ]] || { echo "starts.sh: $v must be a positive whole number" >&2; exit 2; }
done
for s in $SCENARIOS; do
  [[ "$s" == slow || "$s" == steps ]] || { echo "starts.sh: SCENARIOS: unknown scenario $s (slow, steps)" >&2; exit 2; }
done
LOG_TAG=starts
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch starts
drover_pm2_and_cluster
# Node's cluster module has no npm start and no ready timeout: drover and PM2 only.
SYSTEMS=(drover)
[[ -n "${DROVER_B_BIN:-}" ]] && SYSTEMS+=(drover-b)
SYSTEMS+=(pm2)

# The apps, written as their authors write them; each start's work appends a line to
# runs.log.
APP="$TMP/app"
mkdir -p "$APP"
cat >"$APP/slow.js" <<JS
require('fs').appendFileSync('runs.log', 'start\n');
setTimeout(() => {
  require('http').createServer((q, s) => s.end('ok ' + process.pid)).listen(process.env.PORT);
}, $SLOW_MS);
JS
cat >"$APP/package.json" <<'JSON'
{ "name": "steps", "private": true, "scripts": {
  "prestart": "node check-env.js",
  "start": "node migrate.js && node server.js" } }
JSON
echo "console.log('env ok');" >"$APP/check-env.js"
echo "setTimeout(() => require('fs').appendFileSync('runs.log', 'migration\n'), 300);" >"$APP/migrate.js"
echo "require('http').createServer((q, s) => s.end('ok ' + process.pid)).listen(process.env.PORT);" >"$APP/server.js"

run_one() { # "system scenario" round -> one JSON line
  local sys=${1% *} scenario=${1#* } port admin start first="null" runs restarts="null"
  local command=(node slow.js)
  [[ "$scenario" == steps ]] && command=(npm start)
  port="$(quick_port)"
  admin="$(quick_port)"
  rm -f "$APP/runs.log"
  start=$(date +%s%N)
  cd "$APP"
  case "$sys" in
    drover) start_system "$TMP/$sys.log" "$DROVER" run -w 3 -l "127.0.0.1:$port" --admin "127.0.0.1:$admin" -- "${command[@]}" ;;
    drover-b) start_system "$TMP/$sys.log" "$TMP/drover-b" run -w 3 -l "127.0.0.1:$port" --admin "127.0.0.1:$admin" -- "${command[@]}" ;;
    pm2) if [[ "$scenario" == steps ]]; then
      PORT="$port" "$PM2" start npm -i 3 --name app -- start >"$TMP/pm2.log" 2>&1
    else
      PORT="$port" "$PM2" start slow.js -i 3 --name app >"$TMP/pm2.log" 2>&1
    fi ;;
  esac
  cd - >/dev/null
  # Each try waits 1 s at most (drover holds a request while no worker is ready).
  while (($(date +%s%N) - start < LIMIT * 1000000000)); do
    if curl -s -m 1 "http://127.0.0.1:$port/" 2>/dev/null | grep -q '^ok'; then
      first=$((($(date +%s%N) - start) / 100000000))
      break
    fi
    sleep 0.25
  done
  sleep 3
  runs=0
  [[ -f "$APP/runs.log" ]] && runs=$(wc -l <"$APP/runs.log")
  if [[ "$sys" == drover* ]]; then
    restarts=$("$LOADGEN" ctl --admin "127.0.0.1:$admin" status --json 2>/dev/null |
      node -e 'try { const s = JSON.parse(require("fs").readFileSync(0, "utf8"));
        console.log(s.apps[0].workers.reduce((n, w) => n + w.restarts, 0)) } catch { console.log("null") }')
  fi
  if [[ "$sys" == pm2 ]]; then "$PM2" kill >/dev/null 2>&1 || true; else stop_system; fi
  printf '{"system":"%s","scenario":"%s","round":%s,"first_answer_s":%s,"start_work_runs":%s,"restarts":%s}\n' \
    "$sys" "$scenario" "$2" "$([[ "$first" == null ]] && echo null || echo "$((first / 10)).$((first % 10))")" "$runs" "$restarts"
}

PAIRS=()
for s in $SCENARIOS; do for sys in "${SYSTEMS[@]}"; do PAIRS+=("$sys $s"); done; done
alternate_rounds "$TMP/rows.jsonl" "${PAIRS[@]}"
log "3 workers each; slow: ${SLOW_MS} ms before listen(); steps: a prestart script and a 300 ms migration"
node -e 'const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => JSON.parse(l));
  console.log("| scenario | system | first answer (s) | start work runs | restarts |");
  console.log("|---|---|---:|---:|---:|");
  for (const r of rows) console.log(`| ${r.scenario} | ${r.system} | ${r.first_answer_s ?? "none"} | ${r.start_work_runs} | ${r.restarts ?? "-"} |`);' "$TMP/rows.jsonl"
