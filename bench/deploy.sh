#!/usr/bin/env bash
# A deploy under load: a rolling reload of 2 workers while clients keep sending, side by
# side with PM2's `pm2 reload`, the command PM2's users deploy with.
#
#   bash bench/deploy.sh                       # 3 rounds, alternating order (~3 min here)
#   ROUNDS=1 STARTUP_MS=1000 bash bench/deploy.sh   # an app that takes a second to start
#   STREAMS=8 DURATION=45 DRAIN=10s bash bench/deploy.sh   # clients that hold event streams
#
# The app is bench/deploy-app.js as apps are written: PORT, no signal handling, and
# STARTUP_MS (300) of CPU before it listens. Systems, 2 workers each: `drover run` (the
# default mode) reloaded with `drover ctl reload`, `drover run --mode proxy` the same,
# and PM2 in cluster mode (`pm2 start app.js -i 2`) reloaded with `pm2 reload`. First the
# capacity: a closed loop of 16 connections for 3 s against drover. Then per system and
# round, started fresh: an open loop at LOAD (0.5) of that capacity on /work?ms=WORK_MS
# (2), over CONNS (32) keep-alive connections at most, for DURATION (12) s; the reload
# starts RELOAD_AT (3) s in. Per run: failed requests (any non-2xx or transport error),
# the whole run's p99, the worst second's p99 and max, and how long the reload command
# took. The peers are given the same load, so the p99s compare. With STREAMS (0), that
# many clients also hold an event stream each (/events, an event a second; one that ends
# is opened again), and the run counts the streams cut; a stream ends only when its
# worker goes, so a reload waits for it up to drover's drain timeout (DRAIN, drover's
# default when empty), where PM2 ends the old worker after its kill_timeout (1.6 s).
# BENCH_SKIP_BUILD=1 skips cargo build; DROVER_BIN measures another binary.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${ROUNDS:-3}" DURATION="${DURATION:-12}" RELOAD_AT="${RELOAD_AT:-3}"
CONNS="${CONNS:-32}" STARTUP_MS="${STARTUP_MS:-300}" WORK_MS="${WORK_MS:-2}" LOAD="${LOAD:-0.5}"
STREAMS="${STREAMS:-0}" DRAIN="${DRAIN:-}"
for v in ROUNDS DURATION RELOAD_AT CONNS STARTUP_MS WORK_MS STREAMS; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "deploy.sh: $v must be a whole number" >&2; exit 2; }
done
[[ "$LOAD" =~ ^(0?\.[0-9]+|1(\.0*)?)$ ]] || { echo "deploy.sh: LOAD must be a share of capacity in (0, 1], not \"$LOAD\"" >&2; exit 2; }
[[ -z "$DRAIN" || "$DRAIN" =~ ^[0-9]+(ms|s|m)$ ]] || { echo "deploy.sh: DRAIN must be a duration such as 10s, not \"$DRAIN\"" >&2; exit 2; }
((RELOAD_AT < DURATION)) || { echo "deploy.sh: RELOAD_AT must come before DURATION ends" >&2; exit 2; }
APP="$BENCH_DIR/deploy-app.js"
LOG_TAG=deploy
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch deploy
export STARTUP_MS PM2_HOME="$TMP/pm2"
PM2=""
find_pm2 || die "no pm2, and it could not be installed with npm"
log "pm2 $PM2_VERSION"

ready() { # port: true once 8 requests in a row are answered
  local i
  for ((i = 0; i < 300; i++)); do
    [[ "$("$LOADGEN" bench -n 8 -c 2 --json "http://127.0.0.1:$1/" 2>/dev/null)" == *'"ok":8,'* ]] && return 0
    sleep 0.1
  done
  return 1
}

start() { # system port admin
  local sys=$1 port=$2 admin=$3 drain=()
  [[ -z "$DRAIN" ]] || drain=(--drain-timeout "$DRAIN")
  case "$sys" in
    drover) start_system "$TMP/$sys.log" "$DROVER" run -w 2 "${drain[@]}" -l "127.0.0.1:$port" --admin "127.0.0.1:$admin" -- node "$APP" ;;
    drover-proxy) start_system "$TMP/$sys.log" "$DROVER" run -w 2 --mode proxy "${drain[@]}" -l "127.0.0.1:$port" --admin "127.0.0.1:$admin" -- node "$APP" ;;
    pm2) PORT="$port" "$PM2" start "$APP" -i 2 --name deploy >"$TMP/pm2.log" 2>&1 ;;
  esac
}

reload() { # system admin
  case "$1" in
    drover | drover-proxy) "$DROVER" ctl --admin "127.0.0.1:$2" reload ;;
    pm2) "$PM2" reload deploy ;;
  esac
}

stop() { # system
  if [[ "$1" == pm2 ]]; then "$PM2" kill >/dev/null 2>&1 || true; else stop_system; fi
}

port="$(quick_port)" admin="$(quick_port)"
start drover "$port" "$admin"
ready "$port" || die "drover did not serve; its log: $(tail -n 20 "$TMP/drover.log")"
CAPACITY="$("$LOADGEN" bench -c 16 -d 3s --json "http://127.0.0.1:$port/work?ms=$WORK_MS" 2>/dev/null |
  node -e 'const t = require("fs").readFileSync(0, "utf8"); console.log(Math.round(JSON.parse(t.split("\n").filter((l) => l.startsWith("{")).pop()).rps))')"
stop drover
RATE="$(node -e 'console.log(Math.max(1, Math.round(process.argv[1] * process.argv[2])))' "$CAPACITY" "$LOAD")"
log "capacity $CAPACITY req/s (drover, 16 connections); offered $RATE req/s; reload at ${RELOAD_AT} s of ${DURATION} s"

hold_streams() { # port: STREAMS event streams for DURATION s -> {"opened":N,"cut":N}
  node -e 'const http = require("http"); const [port, n, secs] = process.argv.slice(1).map(Number);
    let opened = 0, cut = 0, done = false;
    const open = () => {
      if (done) return;
      let answered = false, ended = false;
      const req = http.get({ port, host: "127.0.0.1", path: "/events", headers: { accept: "text/event-stream" } }, (res) => {
        answered = true; opened++; res.resume();
        const end = () => { if (ended || done) return; ended = true; cut++; setTimeout(open, 200); };
        res.on("end", end); res.on("close", end); res.on("error", () => {});
      });
      req.on("error", () => { if (!answered && !done) setTimeout(open, 200); });
    };
    for (let i = 0; i < n; i++) open();
    setTimeout(() => { done = true; console.log(JSON.stringify({ opened, cut })); process.exit(0); }, secs * 1000);' \
    "$1" "$STREAMS" "$DURATION"
}

run_one() { # system round -> one JSON line on stdout
  local sys=$1 round=$2 port admin load_pid streams_pid t0 t1 reload_rc=0
  port="$(quick_port)" admin="$(quick_port)"
  start "$sys" "$port" "$admin"
  ready "$port" || { stop "$sys"; echo "{\"system\":\"$sys\",\"round\":$round,\"error\":\"did not serve\"}"; return; }
  echo '{"opened":0,"cut":0}' >"$TMP/streams"
  if ((STREAMS > 0)); then hold_streams "$port" >"$TMP/streams" & streams_pid=$!; fi
  "$LOADGEN" bench -r "$RATE" -c "$CONNS" -d "${DURATION}s" --json "http://127.0.0.1:$port/work?ms=$WORK_MS" \
    >"$TMP/out" 2>"$TMP/err" &
  load_pid=$!
  sleep "$RELOAD_AT"
  t0="$(date +%s%N)"
  reload "$sys" "$admin" >"$TMP/reload.log" 2>&1 || reload_rc=$?
  t1="$(date +%s%N)"
  wait "$load_pid" || true
  [[ -z "${streams_pid:-}" ]] || wait "$streams_pid" || true
  stop "$sys"
  node -e 'const [sys, round, ns, rc, streamsFile] = process.argv.slice(1); const t = require("fs").readFileSync(0, "utf8");
    const streams = JSON.parse(require("fs").readFileSync(streamsFile, "utf8"));
    const r = JSON.parse(t.split("\n").filter((l) => l.startsWith("{")).pop() || "null");
    // Answers that are not 2xx, and requests that got no answer at all.
    const failed = r && r.requests - r.ok + r.errors.connect + r.errors.timeout + r.errors.io;
    const secs = r ? r.intervals : [];
    console.log(JSON.stringify({ system: sys, round: +round, requests: r && r.requests, failed,
      p99_ms: r && +(r.latency_us.p99 / 1000).toFixed(1),
      worst_second_p99_ms: +(Math.max(...secs.map((i) => i.p99_us)) / 1000).toFixed(1),
      max_ms: +(Math.max(...secs.map((i) => i.max_us)) / 1000).toFixed(1),
      reload_s: +(ns / 1e9).toFixed(2), reload_ok: rc === "0", streams_cut: streams.cut,
      p99_per_second_ms: secs.map((i) => Math.round(i.p99_us / 1000)) }))' \
    "$sys" "$round" "$((t1 - t0))" "$reload_rc" "$TMP/streams" <"$TMP/out"
}

alternate_rounds "$TMP/results.jsonl" drover drover-proxy pm2
node - "$TMP/results.jsonl" "$BENCH_DIR/median.js" <<'EOF'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const med = require(process.argv[3]);
const m = {};
console.log('\n| system | failed (all rounds) | p99 ms (median) | worst second p99 ms (median) | max ms (median) | reload s (median) | streams cut (all rounds) |');
console.log('|---|---:|---:|---:|---:|---:|---:|');
for (const sys of ['drover', 'drover-proxy', 'pm2']) {
  const r = rows.filter((x) => x.system === sys && !x.error);
  if (!r.length) { console.log(`| ${sys} | did not serve | | | | | |`); continue; }
  m[sys] = { p99: med(r.map((x) => x.p99_ms)), worst: med(r.map((x) => x.worst_second_p99_ms)) };
  console.log(`| ${sys} | ${r.reduce((a, x) => a + (x.failed || 0), 0)} of ${r.reduce((a, x) => a + (x.requests || 0), 0)} | ${m[sys].p99} | ${m[sys].worst} | ${med(r.map((x) => x.max_ms))} | ${med(r.map((x) => x.reload_s))} | ${r.reduce((a, x) => a + (x.streams_cut || 0), 0)} |`);
}
for (const sys of ['drover', 'drover-proxy']) {
  if (m[sys] && m.pm2) console.log(`${sys} / pm2: p99 ${(m[sys].p99 / m.pm2.p99).toFixed(2)} x, worst second's p99 ${(m[sys].worst / m.pm2.worst).toFixed(2)} x`);
}
EOF
