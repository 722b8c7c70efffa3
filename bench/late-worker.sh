#!/usr/bin/env bash
# A fresh start where one worker is ready late: `drover run -w 2` of
# crates/drover/tests/fixtures/cold_start/server.js, whose worker 1 listens DELAYS ms
# after worker 0 ("0,1500"), then, as soon as both are ready, a closed loop of CONNS (4)
# connections on /work?ms=WORK_MS (10 ms of CPU each) for DURATION seconds (4), from
# drover bench. Per build and round: each worker's share of the requests (from drover's
# JSON access log) and the p99; then medians. It compares two drover builds on the same
# rounds, alternating: what a change to placement at a cold start does.
#
#   DROVER_B_BIN=<other build> bash bench/late-worker.sh        # 3 rounds each (~1 min)
#   DROVER_FLAGS="--max-conns 0" DROVER_B_BIN=... bash bench/late-worker.sh
#
# BENCH_SKIP_BUILD=1 skips cargo build; DROVER_BIN measures another binary as "drover".
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${ROUNDS:-3}" CONNS="${CONNS:-4}" WORK_MS="${WORK_MS:-10}" DURATION="${DURATION:-4}"
DELAYS="${DELAYS:-0,1500}"
for v in ROUNDS CONNS WORK_MS DURATION; do
  [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -ge 1 ]] || { echo "late-worker.sh: $v must be a positive whole number" >&2; exit 2; }
done
[[ "$DELAYS" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "late-worker.sh: DELAYS must be ms, comma-separated (0,1500)" >&2; exit 2; }
APP="$ROOT/crates/drover/tests/fixtures/cold_start/server.js"
LOG_TAG=late-worker
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
system_scratch late-worker
SYSTEMS=(drover)
if [[ -n "${DROVER_B_BIN:-}" ]]; then
  cp "$DROVER_B_BIN" "$TMP/drover-b"
  SYSTEMS+=(drover-b)
fi
read -r -a FLAGS <<<"${DROVER_FLAGS:-}"

run_one() { # system round -> one JSON line on stdout
  local sys=$1 round=$2 port admin i ready
  port="$(quick_port)"
  admin="$(quick_port)"
  rm -f "$TMP/access.log"
  start_system "$TMP/$sys.log" "$TMP/$sys" run -w 2 "${FLAGS[@]}" -l "127.0.0.1:$port" --admin "127.0.0.1:$admin" \
    --access-log json --access-log-path "$TMP/access.log" -- node "$APP" "$DELAYS"
  for ((i = 0; i < 400; i++)); do # both workers ready
    ready="$({ "$LOADGEN" ctl --admin "127.0.0.1:$admin" status --json 2>/dev/null || true; } |
      node -e 'try { const s = JSON.parse(require("fs").readFileSync(0, "utf8"));
        console.log(s.apps[0].workers.filter((w) => w.state === "ready").length) } catch { console.log(0) }')"
    [[ "$ready" == 2 ]] && break
    sleep 0.05
  done
  "$LOADGEN" bench -c "$CONNS" -d "${DURATION}s" --json "http://127.0.0.1:$port/work?ms=$WORK_MS" >"$TMP/out" 2>"$TMP/err" || true
  stop_system
  node -e 'const fs = require("fs"); const [sys, round, log] = process.argv.slice(1);
    const r = JSON.parse(fs.readFileSync(0, "utf8").split("\n").filter((l) => l.startsWith("{")).pop() || "null");
    const per = {};
    for (const l of (fs.existsSync(log) ? fs.readFileSync(log, "utf8") : "").split("\n")) {
      try { const e = JSON.parse(l); per[e.endpoint] = (per[e.endpoint] || 0) + 1 } catch {}
    }
    const counts = Object.values(per), all = counts.reduce((a, n) => a + n, 0) || 1;
    console.log(JSON.stringify({ system: sys, round: +round, rps: r && Math.round(r.rps),
      p99_ms: r && Math.round(r.latency_us.p99 / 100) / 10, errors: r && r.errors_total,
      busier_share: Math.round(100 * Math.max(0, ...counts) / all) / 100 }))' "$sys" "$round" "$TMP/access.log" <"$TMP/out"
}

log "worker delays $DELAYS ms; $CONNS connections on /work?ms=$WORK_MS, ${DURATION} s, $ROUNDS round(s); flags: ${DROVER_FLAGS:-none}"
alternate_rounds "$TMP/results.jsonl" "${SYSTEMS[@]}"
node - "$TMP/results.jsonl" "$BENCH_DIR/median.js" "${SYSTEMS[@]}" <<'EOF'
const [file, medPath, ...systems] = process.argv.slice(2);
const rows = require('fs').readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const med = require(medPath);
console.log('\n| build | p99 ms (median) | p99 per round | busier worker\'s share (median) | req/s (median) | errors |');
console.log('|---|---:|---|---:|---:|---:|');
const m = {};
for (const sys of systems) {
  const r = rows.filter((x) => x.system === sys);
  m[sys] = med(r.map((x) => x.p99_ms));
  console.log(`| ${sys} | ${m[sys]} | ${r.map((x) => x.p99_ms).join(', ')} | ${med(r.map((x) => x.busier_share))} | ${med(r.map((x) => x.rps))} | ${r.reduce((a, x) => a + (x.errors || 0), 0)} |`);
}
if (m['drover-b']) console.log(`drover / drover-b p99: ${(m.drover / m['drover-b']).toFixed(2)} x`);
EOF
