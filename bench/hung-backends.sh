#!/usr/bin/env bash
# Most backends hung: what health checks do when 3 of 4 backends stop (SIGSTOP), beside
# HAProxy. drover's checks that get no answer take down at most half the backends, unless
# its own requests are stuck on one (crates/drover-registry/src/active.rs,
# `NoAnswerBudget`); this measures what that costs when the backends are truly hung.
#
#   bash bench/hung-backends.sh                                   # ~6 min
#   DROVER_B_BIN=/path/to/old/drover bash bench/hung-backends.sh  # a second drover beside
#   ROUNDS=1 SECS=10 bash bench/hung-backends.sh
#
# Per round, per peer (order alternating), on 4 fresh Node backends (bench/matrix/
# backend.js) and a fresh peer, in two scenarios:
#   idle    3 backends stop while the balancer carries nothing; 10 s later (its checks
#           have judged them) 8 closed-loop connections send /cpu?us=200 for SECS
#   loaded  the same load runs, and 3 backends stop 3 s into it
# Each peer checks `GET /` every 2 s, 1 s to answer, 3 to fall, 2 to rise (drover's
# defaults: `drover proxy --health-path /`; HAProxy `option httpchk`, `inter 2s fall 3
# rise 2`, `timeout check 1s`), and waits at most 30 s for a response (drover's default
# request timeout; HAProxy `timeout server 30s`). Printed per run: requests answered
# 200, requests failed (a status other than 200, or no answer within 40 s), p99 and the
# slowest request, and the backends its log or stats say went down.
# BENCH_SKIP_BUILD=1 skips cargo build; DROVER_BIN measures another binary.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
SECS="${SECS:-15}" ROUNDS="${ROUNDS:-2}"
LOG_TAG=hung-backends
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$SECS" "$ROUNDS"
scratch_and_cleanup hung-backends 1
build_binaries
DROVER="${DROVER_BIN:-$DROVER}"
HAPROXY="$(command -v haproxy || echo /usr/sbin/haproxy)"
[[ -x "$HAPROXY" ]] || die "haproxy is not installed (apt-get install haproxy)"

peers=(drover haproxy)
[[ -n "${DROVER_B_BIN:-}" ]] && peers=(drover drover-b haproxy)

# Starts 4 backends: BACKEND_PORTS and BACKEND_PIDS.
start_backends() {
  BACKEND_PORTS=() BACKEND_PIDS=()
  local i p
  for i in 1 2 3 4; do
    p="$(quick_port)"
    node "$BENCH_DIR/matrix/backend.js" "$p" >/dev/null 2>&1 &
    PIDS+=($!) BACKEND_PIDS+=($!)
    wait_port "$p" $! 10 || die "backend $p did not start"
    BACKEND_PORTS+=("$p")
  done
}

# Starts PEER in front of the backends: PEER_PORT, PEER_PID, PEER_LOG, HA_STATS.
start_peer() { # peer
  local bin p
  PEER_PORT="$(quick_port)" PEER_LOG="$TMP/$1.log"
  case "$1" in
    drover | drover-b)
      bin="$DROVER"
      [[ "$1" == drover-b ]] && bin="$DROVER_B_BIN"
      local args=(proxy --listen "127.0.0.1:$PEER_PORT" --threads 1 --health-path /)
      for p in "${BACKEND_PORTS[@]}"; do args+=(--backend "127.0.0.1:$p"); done
      "$bin" "${args[@]}" >"$PEER_LOG" 2>&1 &
      ;;
    haproxy)
      HA_STATS="$(quick_port)"
      {
        haproxy_preamble 1000 "$PEER_PORT"
        echo "  balance leastconn"
        echo "  option httpchk GET /"
        echo "  timeout check 1s"
        echo "  timeout server 30s"
        for p in "${BACKEND_PORTS[@]}"; do echo "  server s$p 127.0.0.1:$p check inter 2s fall 3 rise 2"; done
        echo "frontend stats"
        echo "  bind 127.0.0.1:$HA_STATS"
        echo "  stats enable"
        echo "  stats uri /stats"
      } >"$TMP/haproxy.cfg"
      "$HAPROXY" -f "$TMP/haproxy.cfg" >"$PEER_LOG" 2>&1 &
      ;;
  esac
  PEER_PID=$!
  PIDS+=("$PEER_PID")
  wait_port "$PEER_PORT" "$PEER_PID" 10 || die "$1 did not start: $(cat "$PEER_LOG")"
}

backends_down() { # peer
  if [[ "$1" == haproxy ]]; then
    curl -s "127.0.0.1:$HA_STATS/stats;csv" | awk -F, '
      NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
      $2 ~ /^s[0-9]+$/ { d += $col["chkdown"] } END { print d + 0 }'
  else
    grep -c 'endpoint down' "$PEER_LOG" || true
  fi
}

stop_three() { kill -STOP "${BACKEND_PIDS[@]:0:3}"; }

run_one() { # scenario peer round
  local out="$TMP/$1-$2-$3.json" load
  start_backends
  start_peer "$2"
  sleep 1
  local url="http://127.0.0.1:$PEER_PORT/cpu?us=200"
  if [[ "$1" == idle ]]; then
    stop_three
    sleep 10
    "$LOADGEN" bench -c 8 -d "${SECS}s" --timeout 40s --json "$url" >"$out" 2>/dev/null || true
  else
    "$LOADGEN" bench -c 8 -d "${SECS}s" --timeout 40s --json "$url" >"$out" 2>/dev/null &
    load=$!
    sleep 3
    stop_three
    wait "$load" || true
  fi
  local down
  down="$(backends_down "$2")"
  kill -CONT "${BACKEND_PIDS[@]}" 2>/dev/null || true
  kill "$PEER_PID" "${BACKEND_PIDS[@]}" 2>/dev/null || true
  wait "$PEER_PID" "${BACKEND_PIDS[@]}" 2>/dev/null || true
  node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const failed = r.requests - r.ok + r.errors_total;
    const ms = (us) => (us / 1000).toFixed(1);
    console.log([process.argv[2].padEnd(7), process.argv[3].padEnd(9), "round", process.argv[4],
      "ok", String(r.ok).padStart(8), "failed", String(failed).padStart(4),
      "p99", ms(r.latency_us.p99).padStart(7), "ms  max", ms(r.latency_us.max).padStart(8), "ms",
      " backends down", process.argv[5]].join(" "));
  ' "$out" "$1" "$2" "$3" "$down"
}

log "peers ${peers[*]}; $ROUNDS round(s); load 8 connections for ${SECS}s"
for ((r = 1; r <= ROUNDS; r++)); do
  order=("${peers[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#peers[@]} - 1; i >= 0; i--)); do order+=("${peers[$i]}"); done
  fi
  for scenario in idle loaded; do
    for peer in "${order[@]}"; do run_one "$scenario" "$peer" "$r"; done
  done
done
echo "(failed: a status other than 200, or no answer within 40 s; the 30 s request timeouts answer 504)"
