#!/usr/bin/env bash
# Health checks of backends busy with someone else's load: 4 CPU-bound Node backends
# (bench/matrix/backend.js) are loaded directly (another balancer's traffic, as when
# several balancers share backends), while drover proxy (`--health-path /`, default
# timing: every 2 s, 1 s to answer, 3 to fall) and HAProxy (`option httpchk GET /`,
# `inter 2s fall 3 rise 2`, `timeout check 1s`) check them at the same time and carry
# no traffic of their own, so no completed request can say the backends are busy.
#
#   bash bench/busy-probes.sh                          # 3 rounds of 20 s (~1.5 min)
#   DROVER_B_BIN=/path/to/old/drover bash bench/busy-probes.sh   # a second drover beside
#   CONNS=150 SECS=30 ROUNDS=2 bash bench/busy-probes.sh
#
# Load per backend: CONNS keep-alive connections (94: the 375 of bench/sweep.sh seed 13
# sample 10 over 4), 85 % of requests burning 0.4 ms of CPU and 15 % 10 ms. After each
# round, per checker: checks answered in time, failures counted against a backend, and
# backends taken down (drover: its /metrics and log; HAProxy: its stats CSV).
# BENCH_SKIP_BUILD=1 skips cargo build; DROVER_BIN measures another binary.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
CONNS="${CONNS:-94}" SECS="${SECS:-20}" ROUNDS="${ROUNDS:-3}"
LOG_TAG=busy-probes
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$SECS" "$ROUNDS"
[[ "$CONNS" =~ ^[0-9]+$ && "$CONNS" -ge 1 ]] || die "CONNS must be a positive whole number"
scratch_and_cleanup busy-probes 1
build_binaries
DROVER="${DROVER_BIN:-$DROVER}"
HAPROXY="$(command -v haproxy || echo /usr/sbin/haproxy)"
[[ -x "$HAPROXY" ]] || die "haproxy is not installed (apt-get install haproxy)"

backends=()
for i in 1 2 3 4; do
  p="$(quick_port)"
  node "$BENCH_DIR/matrix/backend.js" "$p" >/dev/null 2>&1 &
  PIDS+=($!)
  wait_port "$p" $! 10 || die "backend $p did not start"
  backends+=("$p")
done

checkers=(drover)
[[ -n "${DROVER_B_BIN:-}" ]] && checkers+=(drover-b)
declare -A ADMIN
for c in "${checkers[@]}"; do
  bin="$DROVER"
  [[ "$c" == drover-b ]] && bin="$DROVER_B_BIN"
  ADMIN[$c]="$(quick_port)"
  args=(proxy --listen "127.0.0.1:$(quick_port)" --admin "127.0.0.1:${ADMIN[$c]}" --threads 1 --health-path /)
  for p in "${backends[@]}"; do args+=(--backend "127.0.0.1:$p"); done
  "$bin" "${args[@]}" >"$TMP/$c.log" 2>&1 &
  PIDS+=($!)
  wait_port "${ADMIN[$c]}" $! 10 || die "$c did not start: $(cat "$TMP/$c.log")"
done

HA_STATS="$(quick_port)"
{
  haproxy_preamble 1000 "$(quick_port)"
  echo "  option httpchk GET /"
  echo "  timeout check 1s"
  for p in "${backends[@]}"; do echo "  server s$p 127.0.0.1:$p check inter 2s fall 3 rise 2"; done
  echo "frontend stats"
  echo "  bind 127.0.0.1:$HA_STATS"
  echo "  stats enable"
  echo "  stats uri /stats"
} >"$TMP/haproxy.cfg"
"$HAPROXY" -f "$TMP/haproxy.cfg" >"$TMP/haproxy.log" 2>&1 &
PIDS+=($!)
wait_port "$HA_STATS" $! 10 || die "haproxy did not start: $(cat "$TMP/haproxy.log")"

drover_counts() { # checker -> "answered failed down"
  local m
  m="$(curl -s "127.0.0.1:${ADMIN[$1]}/metrics")"
  printf '%s %s %s\n' \
    "$(awk '/^drover_endpoint_health_checks_total/ && /result="pass"/ {s += $NF} END {print s + 0}' <<<"$m")" \
    "$(awk '/^drover_endpoint_health_checks_total/ && /result="fail"/ {s += $NF} END {print s + 0}' <<<"$m")" \
    "$(grep -c 'endpoint down' "$TMP/$1.log" || true)"
}
haproxy_counts() { # -> "answered failed down": answered is unknown to the CSV ("-")
  curl -s "127.0.0.1:$HA_STATS/stats;csv" | awk -F, '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $2 ~ /^s[0-9]+$/ { f += $col["chkfail"]; d += $col["chkdown"] }
    END { printf "- %d %d\n", f, d }'
}

log "backends ${backends[*]}; checkers ${checkers[*]} haproxy; $ROUNDS rounds of ${SECS}s, $CONNS connections per backend"
sleep 2
for ((r = 1; r <= ROUNDS; r++)); do
  loads=()
  for p in "${backends[@]}"; do
    "$LOADGEN" bench -c "$CONNS" -d "${SECS}s" --timeout 30s --json \
      --mix "85:/cpu?us=400,15:/cpu?ms=10" "http://127.0.0.1:$p/" >"$TMP/load-$r-$p.json" 2>&1 &
    loads+=($!)
  done
  wait "${loads[@]}" || true
  for c in "${checkers[@]}"; do
    read -r answered failed down <<<"$(drover_counts "$c")"
    printf 'round %d  %-9s checks answered %4s  failed %3s  backends down %s\n' "$r" "$c" "$answered" "$failed" "$down"
  done
  read -r answered failed down <<<"$(haproxy_counts)"
  printf 'round %d  %-9s checks answered %4s  failed %3s  backends down %s\n' "$r" haproxy "$answered" "$failed" "$down"
  sleep 4
done
echo "(counts are totals since the start; a drover check that timed out while every backend's did is not counted as failed)"
