#!/usr/bin/env bash
# socket.io apps as written, 3 workers each, under `drover run -w 3` with its defaults,
# PM2 (`pm2 start -i 3`) and Node's cluster module (bench/node-cluster.js). Two
# scenarios, from the test fixtures in crates/drover/tests/fixtures/workloads/socketio/:
#
# - sessions: server.js, with SESSIONS clients at once over long-polling (socket.io's
#   first transport, and its fallback where WebSockets are blocked), MESSAGES acked
#   messages each (pausing 1.6 s after every fifth, so polls cross a ping). A session is
#   a GET held open and POSTs beside it, each naming the session; one that reaches
#   another worker gets `400 Session ID unknown`. A session completes when every
#   message was acked by one worker with no error.
# - broadcast: adapter-server.js, which uses @socket.io/cluster-adapter and has no
#   primary code (Node cluster's guide adds `setupPrimary()` to the app's primary), and
#   6 clients over WebSockets; one shouts, and `io.emit` should reach all 6, whichever
#   worker holds them.
# - guide: guide-server.js, the app as socket.io's guide to Node's cluster module writes
#   it: its own primary listens and hands each connection to a worker by its session
#   (@socket.io/sticky's setupMaster), and its workers listen on no port. The sessions'
#   clients, then the broadcast's. "cluster" here is the app's own primary (`node
#   guide-server.js`, 3 workers), as the guide runs it; under PM2 and drover before it,
#   no worker ever listens.
# - sticky-session: sticky-session-server.js, the same with sticky-session, as older
#   socket.io tutorials scale out (its primary places connections by client address,
#   and forks a worker per CPU); the sessions' clients only.
#
# Per run: sessions (or clients) that completed, those that broke, and the first error.
#
#   bash bench/socketio.sh                       # 12 sessions x 20 messages, 2 rounds (~3 min)
#   SCENARIOS="guide sticky-session" bash bench/socketio.sh
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
answers() { # port scenario
  if [[ "$2" == guide || "$2" == sticky-session ]]; then # the handshake, as in any socket.io app
    curl -s -m 1 "http://127.0.0.1:$1/socket.io/?EIO=4&transport=polling" 2>/dev/null | grep -q '"sid"'
  else
    curl -s -m 1 "http://127.0.0.1:$1/health" 2>/dev/null | grep -q '^ok'
  fi
}

run_one() { # "system scenario" round -> one JSON line
  local sys=${1% *} scenario=${1#* } port i app
  port="$(quick_port)"
  app="$FIXTURE/server.js"
  [[ "$scenario" == broadcast ]] && app="$FIXTURE/adapter-server.js"
  [[ "$scenario" == guide ]] && app="$FIXTURE/guide-server.js"
  [[ "$scenario" == sticky-session ]] && app="$FIXTURE/sticky-session-server.js"
  case "$sys" in
    drover) start_system "$TMP/$sys.log" "$DROVER" run -w 3 -l "127.0.0.1:$port" --admin off -- node "$app" ;;
    drover-b) start_system "$TMP/$sys.log" "$TMP/drover-b" run -w 3 -l "127.0.0.1:$port" --admin off -- node "$app" ;;
    pm2) PORT="$port" "$PM2" start "$app" -i 3 --name sio >"$TMP/pm2.log" 2>&1 ;;
    cluster) if [[ "$scenario" == guide || "$scenario" == sticky-session ]]; then
      start_system "$TMP/$sys.log" env WORKERS=3 node "$app" "$port"
    else
      start_system "$TMP/$sys.log" env WORKERS=3 PORT="$port" node "$BENCH_DIR/node-cluster.js" "$app"
    fi ;;
  esac
  for ((i = 0; i < 150; i++)); do answers "$port" "$scenario" && break; sleep 0.1; done
  if ! answers "$port" "$scenario"; then
    # No worker listens (the guide's app under PM2): nothing served in 15 s.
    [[ "$scenario" == guide || "$scenario" == sticky-session ]] || die "$sys did not start"
    if [[ "$sys" == pm2 ]]; then "$PM2" kill >/dev/null 2>&1 || true; else stop_system; fi
    echo "{\"system\":\"$sys\",\"scenario\":\"$scenario\",\"round\":$2,\"total\":$SESSIONS,\"completed\":0,\"broken\":$SESSIONS,\"first_error\":\"nothing answered in 15 s: no worker listens\"}"
    return
  fi
  sleep 1 # every worker listening, not only the first
  if [[ "$scenario" == guide || "$scenario" == sticky-session ]]; then
    timeout 120 node "$FIXTURE/client.js" "http://127.0.0.1:$port" "$SESSIONS" "$MESSAGES" >"$TMP/out.jsonl" ||
      die "the socket.io client did not finish against $sys"
    if [[ "$scenario" == guide ]]; then
      timeout 60 node "$FIXTURE/broadcast-client.js" "http://127.0.0.1:$port" 6 >>"$TMP/out.jsonl" ||
        die "the broadcast client did not finish against $sys"
    fi
  elif [[ "$scenario" == sessions ]]; then
    timeout 120 node "$FIXTURE/client.js" "http://127.0.0.1:$port" "$SESSIONS" "$MESSAGES" >"$TMP/out.jsonl" ||
      die "the socket.io client did not finish against $sys"
  else
    timeout 60 node "$FIXTURE/broadcast-client.js" "http://127.0.0.1:$port" 6 >"$TMP/out.jsonl" ||
      die "the broadcast client did not finish against $sys"
  fi
  if [[ "$sys" == pm2 ]]; then "$PM2" kill >/dev/null 2>&1 || true; else stop_system; fi
  node - "$TMP/out.jsonl" "$sys" "$scenario" "$2" "$MESSAGES" <<'JS'
const [file, system, scenario, round, messages] = process.argv.slice(2);
const rows = require('fs').readFileSync(file, 'utf8').split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
let out;
const sessions = (rows) => {
  const ok = rows.filter((s) => s.errors.length === 0 && s.acks === Number(messages) && s.workers.length === 1);
  const first = rows.flatMap((s) => s.errors)[0] ?? '';
  return { total: rows.length, completed: ok.length, first_error: String(first).slice(0, 80) };
};
const broadcast = ({ workers, heard }) => {
  const on = new Set(workers).size;
  return { total: heard.length, completed: heard.filter(Boolean).length, first_error: `clients on ${on} workers` };
};
if (scenario === 'sessions') out = sessions(rows);
else if (scenario === 'broadcast') out = broadcast(rows[0]);
else {
  const s = sessions(rows.filter((r) => 'session' in r));
  const shout = rows.find((r) => 'heard' in r);
  const b = shout ? broadcast(shout) : null;
  const on = new Set(rows.filter((r) => 'session' in r).flatMap((r) => r.workers)).size;
  const where = `sessions on ${on} workers${b ? `; broadcast: ${b.first_error}` : ''}`;
  out = { total: s.total, completed: s.completed, heard: b ? `${b.completed}/${b.total}` : '', first_error: `${s.first_error} (${where})` };
}
console.log(JSON.stringify({ system, scenario, round: Number(round), ...out, broken: out.total - out.completed }));
JS
}
RUNS=()
for scenario in ${SCENARIOS:-sessions broadcast guide sticky-session}; do
  for sys in "${SYSTEMS[@]}"; do RUNS+=("$sys $scenario"); done
done
alternate_rounds "$TMP/results.jsonl" "${RUNS[@]}"

node - "$TMP/results.jsonl" <<'JS'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
console.log('\n| system | scenario | round | sessions or clients | completed (broadcast: heard it) | broken | guide: heard the broadcast | first error (broadcast: where the clients were) |');
console.log('|---|---|---:|---:|---:|---:|---:|---|');
for (const x of rows) {
  console.log(`| ${x.system} | ${x.scenario} | ${x.round} | ${x.total} | ${x.completed} | ${x.broken} | ${x.heard ?? ''} | ${x.first_error} |`);
}
JS
