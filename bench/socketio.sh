#!/usr/bin/env bash
# socket.io sessions over long-polling (socket.io's first transport, and its fallback
# where WebSockets are blocked) against 3 workers of a socket.io app run as written
# (crates/drover/tests/fixtures/workloads/socketio/server.js), under `drover run -w 3`
# with its defaults, PM2 (`pm2 start -i 3`) and Node's cluster module
# (bench/node-cluster.js). A session is a GET held open and POSTs beside it, each
# naming the session; one that reaches another worker gets `400 Session ID unknown`.
# The fixture's client runs SESSIONS sessions at once, MESSAGES acked messages each
# (pausing 1.6 s after every fifth, so polls cross a ping); a session completes when
# every message was acked by one worker with no error. Per run: sessions completed,
# sessions broken, and the first error seen.
#
#   bash bench/socketio.sh                       # 12 sessions x 20 messages, 2 rounds (~1 min)
#   SESSIONS=30 ROUNDS=3 bash bench/socketio.sh
#   DROVER_B_BIN=/path/to/other/drover bash bench/socketio.sh
#
# BENCH_SKIP_BUILD=1 uses the built binary; DROVER_BIN another one.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROUNDS="${ROUNDS:-2}"
SESSIONS="${SESSIONS:-12}"
MESSAGES="${MESSAGES:-20}"
LOG_TAG=socketio
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch socketio
FIXTURE="$BENCH_DIR/../crates/drover/tests/fixtures/workloads/socketio"
[[ -f "$FIXTURE/node_modules/socket.io/package.json" ]] ||
  npm ci --prefix "$FIXTURE" --no-audit --no-fund >&2 || die "npm ci of $FIXTURE failed"
drover_pm2_and_cluster
APP="$FIXTURE/server.js"

answers() { curl -s -m 1 "http://127.0.0.1:$1/health" 2>/dev/null | grep -q '^ok'; }

run_one() { # system round -> one JSON line
  local sys=$1 port i
  port="$(quick_port)"
  case "$sys" in
    drover) start_system "$TMP/$sys.log" "$DROVER" run -w 3 -l "127.0.0.1:$port" --admin off -- node "$APP" ;;
    drover-b) start_system "$TMP/$sys.log" "$TMP/drover-b" run -w 3 -l "127.0.0.1:$port" --admin off -- node "$APP" ;;
    pm2) PORT="$port" "$PM2" start "$APP" -i 3 --name sio >"$TMP/pm2.log" 2>&1 ;;
    cluster) start_system "$TMP/$sys.log" env WORKERS=3 PORT="$port" node "$BENCH_DIR/node-cluster.js" "$APP" ;;
  esac
  for ((i = 0; i < 300; i++)); do answers "$port" && break; sleep 0.1; done
  answers "$port" || die "$sys did not start"
  sleep 1 # every worker listening, not only the first
  timeout 120 node "$FIXTURE/client.js" "http://127.0.0.1:$port" "$SESSIONS" "$MESSAGES" >"$TMP/sessions.jsonl" ||
    die "the socket.io client did not finish against $sys"
  if [[ "$sys" == pm2 ]]; then "$PM2" kill >/dev/null 2>&1 || true; else stop_system; fi
  node - "$TMP/sessions.jsonl" "$sys" "$2" "$MESSAGES" <<'JS'
const [file, system, round, messages] = process.argv.slice(2);
const rows = require('fs').readFileSync(file, 'utf8').split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
const ok = rows.filter((s) => s.errors.length === 0 && s.acks === Number(messages) && s.workers.length === 1);
const first = rows.flatMap((s) => s.errors)[0] ?? '';
console.log(JSON.stringify({ system, round: Number(round), sessions: rows.length, completed: ok.length, broken: rows.length - ok.length, acks: rows.reduce((n, s) => n + s.acks, 0), first_error: String(first).slice(0, 80) }));
JS
}
alternate_rounds "$TMP/results.jsonl" "${SYSTEMS[@]}"

node - "$TMP/results.jsonl" <<'JS'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
console.log('\n| system | round | sessions | completed | broken | messages acked | first error |');
console.log('|---|---:|---:|---:|---:|---:|---|');
for (const x of rows) {
  console.log(`| ${x.system} | ${x.round} | ${x.sessions} | ${x.completed} | ${x.broken} | ${x.acks} | ${x.first_error} |`);
}
JS
