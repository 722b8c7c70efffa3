#!/usr/bin/env bash
# A database outage (issue 20: "a safety mechanism must never be the outage"): 2
# workers of bench/dep-app.js, an app that exits when its database (a file here) goes
# away and at start while it is gone, under `drover run -w 2`, PM2 (`pm2 start -i 2`)
# and Node's cluster module (bench/node-cluster.js, which forks a new worker whenever
# one exits). The database goes away for OUTAGE seconds, then comes back. Per run: how
# long after its return the app answered again, and how many times the app was started
# meanwhile (what the restarts cost). "never" when it did not answer within 60 s.
#
#   bash bench/dependency.sh                           # outages of 5, 20 and 45 s (~4 min)
#   OUTAGES="20" ROUNDS=2 bash bench/dependency.sh
#   DROVER_B_BIN=/path/to/other/drover bash bench/dependency.sh
#
# BENCH_SKIP_BUILD=1 uses the built binary; DROVER_BIN another one.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROUNDS="${ROUNDS:-1}"
OUTAGES="${OUTAGES:-5 20 45}"
LOG_TAG=dependency
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch dependency
export DEP_FILE="$TMP/db" STARTS_FILE="$TMP/starts"
drover_pm2_and_cluster
APP="$BENCH_DIR/dep-app.js"

answers() { curl -s -m 1 "http://127.0.0.1:$1/" 2>/dev/null | grep -q '^ok'; }

run_one() { # "system outage" round -> one JSON line
  local sys=${1% *} outage=${1#* } port i t0 t1 recovered=never starts
  port="$(quick_port)"
  touch "$DEP_FILE"
  case "$sys" in
    drover) start_system "$TMP/$sys.log" "$DROVER" run -w 2 -l "127.0.0.1:$port" --admin off -- node "$APP" ;;
    drover-b) start_system "$TMP/$sys.log" "$TMP/drover-b" run -w 2 -l "127.0.0.1:$port" --admin off -- node "$APP" ;;
    pm2) PORT="$port" "$PM2" start "$APP" -i 2 --name dep >"$TMP/pm2.log" 2>&1 ;;
    cluster) start_system "$TMP/$sys.log" env WORKERS=2 PORT="$port" node "$BENCH_DIR/node-cluster.js" "$APP" ;;
  esac
  for ((i = 0; i < 300; i++)); do answers "$port" && break; sleep 0.1; done
  answers "$port" || die "$sys did not start"
  : >"$STARTS_FILE"
  rm -f "$DEP_FILE"
  sleep "$outage"
  starts="$(wc -l <"$STARTS_FILE")"
  touch "$DEP_FILE"
  t0="$(date +%s%N)"
  for ((i = 0; i < 1200; i++)); do
    if answers "$port"; then
      t1="$(date +%s%N)"
      recovered="$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", (b - a) / 1e9}')"
      break
    fi
    sleep 0.05
  done
  if [[ "$sys" == pm2 ]]; then "$PM2" kill >/dev/null 2>&1 || true; else stop_system; fi
  printf '{"system":"%s","outage_s":%s,"round":%s,"recovered_after_s":"%s","starts_during_outage":%s}\n' \
    "$sys" "$outage" "$2" "$recovered" "$starts"
}
RUNS=()
for outage in $OUTAGES; do
  for sys in "${SYSTEMS[@]}"; do RUNS+=("$sys $outage"); done
done
alternate_rounds "$TMP/results.jsonl" "${RUNS[@]}"

node - "$TMP/results.jsonl" <<'JS'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
console.log('\n| system | outage s | round | answered again after s | starts during the outage |');
console.log('|---|---:|---:|---:|---:|');
for (const x of rows) {
  console.log(`| ${x.system} | ${x.outage_s} | ${x.round} | ${x.recovered_after_s} | ${x.starts_during_outage} |`);
}
JS
