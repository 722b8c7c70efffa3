#!/usr/bin/env bash
# What an idle app costs its supervisor: `drover run` beside Node cluster's primary and
# PM2's daemon, each with the same workers and no traffic.
#
#   bash bench/idle-cpu.sh                  # 3 rounds, alternating order (~4 min here)
#   WORKERS=8 IDLE=30 bash bench/idle-cpu.sh
#   DROVER_B_BIN=/path/to/drover bash bench/idle-cpu.sh   # and another build, as drover-b
#
# Most services idle most of the day, and a supervisor that wakes while nothing happens
# spends CPU (a burstable cloud instance's credits, a laptop's battery) and wake-ups on
# nothing. Per system and round, started fresh with WORKERS (2) workers of
# bench/deploy-app.js: 200 requests first (so whatever a system does after traffic is
# measured too), SETTLE (5) s, then IDLE (20) s in which the process that supervises
# (drover; the cluster primary, bench/node-cluster.js; PM2's God daemon) is watched:
# its CPU time from every thread's `schedstat` (ns), and its context switches
# (voluntary + not, every thread), which count its wake-ups. The workers are the same
# program under all three, so only the supervisor is counted.
# BENCH_SKIP_BUILD=1 skips cargo build; DROVER_BIN measures another binary.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${ROUNDS:-3}" WORKERS="${WORKERS:-2}" SETTLE="${SETTLE:-5}" IDLE="${IDLE:-20}"
for v in ROUNDS WORKERS SETTLE IDLE; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "idle-cpu.sh: $v must be a positive whole number, not \"${!v}\"" >&2; exit 2; }
done
APP="$BENCH_DIR/deploy-app.js"
LOG_TAG=idle-cpu
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch idle-cpu
SYSTEMS=(drover node-cluster pm2)
if [[ -n "${DROVER_B_BIN:-}" ]]; then
  cp "$DROVER_B_BIN" "$TMP/drover-b"
  SYSTEMS=(drover drover-b node-cluster pm2)
fi
# The app starts at once: start-up is not what is measured here.
export STARTUP_MS=0 PM2_HOME="$TMP/pm2"
PM2=""
find_pm2 || die "no pm2, and it could not be installed with npm"
log "pm2 $PM2_VERSION; $WORKERS workers; ${IDLE} s idle after ${SETTLE} s"

busy_ns() { # pid: CPU time of all its threads so far, in ns
  cat "/proc/$1"/task/*/schedstat 2>/dev/null | awk '{ns += $1} END {print ns + 0}'
}
switches() { # pid: context switches of all its threads so far
  cat "/proc/$1"/task/*/status 2>/dev/null |
    awk '/^(non)?voluntary_ctxt_switches:/ {n += $2} END {print n + 0}'
}

run_one() { # system round -> one JSON line on stdout
  local sys=$1 round=$2 port admin pid i b0 s0 b1 s1 served
  port="$(quick_port)" admin="$(quick_port)"
  case "$sys" in
    drover) start_system "$TMP/$sys.log" "$DROVER" run -w "$WORKERS" -l "127.0.0.1:$port" --admin "127.0.0.1:$admin" -- node "$APP" ;;
    drover-b) start_system "$TMP/$sys.log" "$TMP/drover-b" run -w "$WORKERS" -l "127.0.0.1:$port" --admin "127.0.0.1:$admin" -- node "$APP" ;;
    node-cluster) PORT="$port" WORKERS="$WORKERS" start_system "$TMP/$sys.log" node "$BENCH_DIR/node-cluster.js" "$APP" ;;
    pm2) PORT="$port" "$PM2" start "$APP" -i "$WORKERS" --name idle >"$TMP/pm2.log" 2>&1 ;;
  esac
  for ((i = 0; i < 300; i++)); do
    served="$("$LOADGEN" bench -n 200 -c 4 --json "http://127.0.0.1:$port/work?ms=1" 2>/dev/null || true)"
    [[ "$served" == *'"ok":200,'* ]] && break
    sleep 0.1
  done
  if [[ "$sys" == pm2 ]]; then pid="$(cat "$PM2_HOME/pm2.pid" 2>/dev/null || true)"; else pid="$SYS_PID"; fi
  if [[ "$served" != *'"ok":200,'* || -z "$pid" ]]; then
    echo "{\"system\":\"$sys\",\"round\":$round,\"error\":\"did not serve\"}"
  else
    sleep "$SETTLE"
    b0="$(busy_ns "$pid")" s0="$(switches "$pid")"
    sleep "$IDLE"
    b1="$(busy_ns "$pid")" s1="$(switches "$pid")"
    echo "{\"system\":\"$sys\",\"round\":$round,\"cpu_ms_per_min\":$(((b1 - b0) * 60 / IDLE / 1000000)),\"wakeups_per_s\":$(((s1 - s0) / IDLE)),\"threads\":$(ls "/proc/$pid/task" | wc -l)}"
  fi
  if [[ "$sys" == pm2 ]]; then "$PM2" kill >/dev/null 2>&1 || true; else stop_system; fi
}

alternate_rounds "$TMP/results.jsonl" "${SYSTEMS[@]}"
node - "$TMP/results.jsonl" "$BENCH_DIR/median.js" "${SYSTEMS[@]}" <<'EOF'
const [file, median, ...systems] = process.argv.slice(2);
const rows = require('fs').readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const med = require(median);
console.log('\n| system (the process that supervises) | CPU ms per idle minute (median) | wake-ups per s (median) | threads | rounds: CPU ms/min |');
console.log('|---|---:|---:|---:|---|');
for (const sys of systems) {
  const r = rows.filter((x) => x.system === sys && !x.error);
  if (!r.length) { console.log(`| ${sys} | did not serve | | | |`); continue; }
  console.log(`| ${sys} | ${med(r.map((x) => x.cpu_ms_per_min))} | ${med(r.map((x) => x.wakeups_per_s))} | ${med(r.map((x) => x.threads))} | ${r.map((x) => x.cpu_ms_per_min).join(', ')} |`);
}
EOF
