#!/usr/bin/env bash
# The burst of issue 20: `drover run -w 2 --health-path /health -- node examples/pi-server.js`
# (the health settings of the README's drover.toml) side by side with Node's cluster
# module over the same app, 2 workers each: 100 concurrent requests of 10^7 Monte-Carlo
# points, twice (200 requests, 100 connections: the shape of the fourth post's
# `ab -n 1000 -c 100` on a CPU loop). Every worker holds seconds of queued work, so a
# health probe waits behind it: the burst tells whether drover restarts busy workers.
#
#   bash bench/burst.sh                 # 3 rounds, alternating order (~4 min here)
#   ROUNDS=1 bash bench/burst.sh
#   POINTS=20000000 bash bench/burst.sh  # a slower day: past 30 s of queued work
#   NEW_CONN=1 N=400 bash bench/burst.sh  # as ab sends it: a new connection per request
#   QUIET=3 bash bench/burst.sh         # the burst after 3 s of nothing (the first of a day)
#
# Per system and round: failed requests (any non-2xx or transport error), worker
# restarts (drover: `drover ctl restarts --json`; cluster: worker exits it logged), p50,
# p99 and max; then the medians and drover's p99 / cluster's p99 (target: 0 failed,
# 0 restarts, p99 <= 1.0 x cluster's). BENCH_SKIP_BUILD=1 skips cargo build; DROVER_BIN
# measures another binary.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${ROUNDS:-3}"
N="${N:-200}" C=100
# ab without -k opens a connection per request; past a quarter of the queue timeout
# drover leaves new connections in the listen backlog, which changes who goes first.
CONN_HEADER=()
[[ "${NEW_CONN:-0}" == 1 ]] && CONN_HEADER=(-H "Connection: close")
POINTS="${POINTS:-10000000}"
QUIET="${QUIET:-0}"
[[ "$QUIET" =~ ^[0-9]+$ ]] || { echo "burst.sh: QUIET must be a whole number of seconds, not \"$QUIET\"" >&2; exit 2; }
APP="$ROOT/examples/pi-server.js"
LOG_TAG=burst
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch burst

run_one() { # system round -> one JSON line on stdout
  local sys=$1 round=$2 port admin restarts i
  port="$(quick_port)" admin="$(quick_port)"
  if [[ "$sys" == drover ]]; then
    start_system "$TMP/$sys.log" "$DROVER" run -w 2 --health-path /health -l "127.0.0.1:$port" \
      --admin "127.0.0.1:$admin" -- node "$APP"
  else
    start_system "$TMP/$sys.log" env PORT="$port" WORKERS=2 node "$BENCH_DIR/node-cluster.js" "$APP"
  fi
  for ((i = 0; i < 300; i++)); do # ready: both workers answer
    [[ "$("$LOADGEN" bench -n 8 -c 2 --json "http://127.0.0.1:$port/health" 2>/dev/null)" == *'"ok":8,'* ]] && break
    sleep 0.1
  done
  sleep "$QUIET"
  "$LOADGEN" bench -n "$N" -c "$C" -d 600s --timeout 300s --json "${CONN_HEADER[@]}" \
    "http://127.0.0.1:$port/pi?iterations=$POINTS" >"$TMP/out" 2>"$TMP/err" || true
  if [[ "$sys" == drover ]]; then
    restarts="$("$DROVER" ctl --admin "127.0.0.1:$admin" restarts --json 2>/dev/null |
      node -e 'const t = require("fs").readFileSync(0, "utf8").trim(); const j = t ? JSON.parse(t) : [];
        const a = Array.isArray(j) ? j : j.restarts || [];
        console.log(a.filter((r) => !/^(scale|reload)$/.test(String(r.reason))).map((r) => r.reason).join(",") || "-")' || echo "?")"
  else
    restarts="$(grep 'exited' "$TMP/$sys.log" | sed 's/.*exited (\([^)]*\)).*/exit \1/' | paste -sd, || true)"
    [[ -n "$restarts" ]] || restarts="-"
  fi
  stop_system
  node -e 'const [sys, round, restarts, n] = process.argv.slice(1); const t = require("fs").readFileSync(0, "utf8");
    const r = JSON.parse(t.split("\n").filter((l) => l.startsWith("{")).pop() || "null");
    console.log(JSON.stringify({ system: sys, round: +round, restarts: restarts === "?" ? null : restarts === "-" ? 0 : restarts.split(",").length,
      restart_reasons: restarts,
      failed: r ? r.requests - r.ok + (n - r.requests) : null, errors: r && r.errors, status: r && r.status,
      p50_ms: r && Math.round(r.latency_us.p50 / 1000), p99_ms: r && Math.round(r.latency_us.p99 / 1000), max_ms: r && Math.round(r.latency_us.max / 1000) }))' \
    "$sys" "$round" "$restarts" "$N" <"$TMP/out"
}

: >"$TMP/results.jsonl"
log "$N requests of $POINTS points, $C at a time${NEW_CONN:+, a new connection each}, ${QUIET} s after ready, $ROUNDS round(s); drover: $DROVER"
for ((r = 1; r <= ROUNDS; r++)); do
  order="drover cluster"
  ((r % 2 == 0)) && order="cluster drover"
  for sys in $order; do
    run_one "$sys" "$r" >"$TMP/row"
    cat "$TMP/row" >&2
    cat "$TMP/row" >>"$TMP/results.jsonl"
  done
done
node - "$TMP/results.jsonl" <<'EOF'
const rows = require('fs').readFileSync(process.argv[2], 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const med = (xs) => { const s = xs.filter((x) => x !== null).sort((a, b) => a - b); const m = s.length >> 1; return !s.length ? null : s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const sum = (xs) => xs.reduce((a, x) => a + (x || 0), 0);
console.log('\n| system | rounds | failed (all rounds) | restarts (all rounds) | p50 ms | p99 ms | max ms |');
console.log('|---|---:|---:|---:|---:|---:|---:|');
const m = {};
for (const sys of ['drover', 'cluster']) {
  const r = rows.filter((x) => x.system === sys);
  m[sys] = { p99: med(r.map((x) => x.p99_ms)) };
  console.log(`| ${sys === 'drover' ? 'drover run -w 2 --health-path /health' : 'Node cluster, 2 workers'} | ${r.length} | ${sum(r.map((x) => x.failed))} | ${sum(r.map((x) => x.restarts))} | ${med(r.map((x) => x.p50_ms))} | ${m[sys].p99} | ${med(r.map((x) => x.max_ms))} |`);
}
const ratios = rows.filter((x) => x.system === 'drover').map((d) => {
  const c = rows.find((x) => x.system === 'cluster' && x.round === d.round);
  return c && c.p99_ms ? d.p99_ms / c.p99_ms : null;
});
const d = rows.filter((x) => x.system === 'drover');
// A failed request answers fast (a 502 or 503): while drover fails some, its p99 is not
// comparable with a system that answered all of them.
const note = sum(d.map((x) => x.failed)) ? ' (not comparable: drover failed requests, which answer fast)' : '';
console.log(`\ndrover p99 / cluster p99, median of per-round ratios: ${med(ratios)?.toFixed(2)}${note} (target <= 1.0)`);
console.log(`restart reasons per round: ${rows.map((x) => `${x.system} r${x.round}: ${x.restart_reasons}`).join('; ')}`);
console.log(`target 0 failed, 0 restarts: ${sum(d.map((x) => x.failed)) === 0 && sum(d.map((x) => x.restarts)) === 0 ? 'PASS' : 'MISS'}`);
EOF
