#!/usr/bin/env bash
# 100 host and path routes beside one balancer (issue 25's target: >= 0.97 x the
# throughput of one balancer), the same drover build over the same two nginx "ok"
# backends, measured one after the other in one run:
#   one     a listener over the two backends;
#   routes  a listener with 100 routes to 10 balancers without listen, each over the
#           same two backends: 40 exact hosts, 10 wildcards, and 50 prefixes under
#           api.example.com. The request (Host api.example.com, GET /p7/x) is taken by
#           one of the shortest prefixes, which the pick tries after the 40 longer ones.
# drover runs with one serving thread pinned to one core; the load (drover bench,
# keep-alive, closed loop) and nginx share the other. Each round measures both in an
# order that alternates; the table gives each figure's median over the rounds, and the
# ratio of routes to one: req/s, and drover's CPU time per request (utime + stime).
#
#   bash bench/routes.sh                                  # 5 rounds of 10 s
#   BENCH_ROUNDS=1 BENCH_DURATION=2 bash bench/routes.sh  # smoke
#
# Environment (all optional): BENCH_ROUNDS (5), BENCH_DURATION (10), BENCH_CONNECTIONS
# (32), BENCH_SKIP_BUILD=1, PROXY_CPU (last core), LOADGEN_CPU (0).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${BENCH_ROUNDS:-5}"
D="${BENCH_DURATION:-10}"
CONNS="${BENCH_CONNECTIONS:-32}"
LOG_TAG=routes
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
[[ -x "$NGINX" ]] || die "nginx is needed for the backends (apt-get install nginx)"
scratch_and_cleanup routes-bench 1
build_binaries
# A copy: the shared target directory may be rebuilt from another branch mid-run.
cp "$DROVER" "$TMP/drover"
DROVER="$TMP/drover"
CORES="$(nproc)"
PROXY_CPU="${PROXY_CPU:-$((CORES - 1))}"
LOADGEN_CPU="${LOADGEN_CPU:-0}"

BE=("$(quick_port)" "$(quick_port)")
start_nginx_ok_backend "$TMP/backend" "taskset -c $LOADGEN_CPU" "${BE[@]}"
PIDS+=("$NGINX_BACKEND_PID")
BACKENDS="[\"127.0.0.1:${BE[0]}\", \"127.0.0.1:${BE[1]}\"]"

write_configs() { # one-port routes-port
  printf '[[balancer]]\nname = "one"\nlisten = "127.0.0.1:%s"\nthreads = 1\nbackends = %s\n' \
    "$1" "$BACKENDS" >"$TMP/one.toml"
  {
    printf '[[balancer]]\nname = "front"\nlisten = "127.0.0.1:%s"\nthreads = 1\nbackends = []\nroutes = [\n' "$2"
    local i
    for ((i = 0; i < 40; i++)); do
      printf '  { host = ["h%d.example.com"], balancer = "b%d" },\n' "$i" $((i % 10))
    done
    for ((i = 0; i < 10; i++)); do
      printf '  { host = ["*.w%d.example.com"], balancer = "b%d" },\n' "$i" $((i % 10))
    done
    for ((i = 0; i < 50; i++)); do
      printf '  { host = ["api.example.com"], path_prefix = "/p%d", balancer = "b%d" },\n' "$i" $((i % 10))
    done
    printf ']\n'
    for ((i = 0; i < 10; i++)); do
      printf '\n[[balancer]]\nname = "b%d"\nthreads = 1\nbackends = %s\n' "$i" "$BACKENDS"
    done
  } >"$TMP/routes.toml"
}

# Runs peer NAME for D seconds; appends "rps cpu_us_per_request" to $TMP/NAME.rows.
measure() { # name
  local name=$1 port pid before after rps requests
  port="$(quick_port)"
  if [[ "$name" == one ]]; then write_configs "$port" 1; else write_configs 1 "$port"; fi
  taskset -c "$PROXY_CPU" "$DROVER" proxy --config "$TMP/$name.toml" 2>"$TMP/$name.log" &
  pid=$!
  PIDS+=("$pid")
  wait_port "$port" "$pid" 20 || { cat "$TMP/$name.log" >&2; die "$name did not start"; }
  # A warm-up, then the measured run.
  taskset -c "$LOADGEN_CPU" "$DROVER" bench -c "$CONNS" -d 1s -H "Host: api.example.com" \
    "http://127.0.0.1:$port/p7/x" >/dev/null 2>&1
  before="$(cpu_total "$pid")"
  taskset -c "$LOADGEN_CPU" "$DROVER" bench -c "$CONNS" -d "${D}s" -H "Host: api.example.com" \
    --json "http://127.0.0.1:$port/p7/x" >"$TMP/$name.json" 2>"$TMP/$name.bench.log" ||
    { cat "$TMP/$name.bench.log" >&2; die "$name: the load failed"; }
  after="$(cpu_total "$pid")"
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  read -r rps requests < <(node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    if (r.errors_total || r.ok !== r.requests) { console.error(JSON.stringify(r.status), r.errors_total); process.exit(1); }
    console.log(r.rps, r.requests);' "$TMP/$name.json") || die "$name: requests failed"
  local hz
  hz="$(getconf CLK_TCK)"
  echo "$rps $(awk -v t=$((after - before)) -v hz="$hz" -v n="$requests" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }')" >>"$TMP/$name.rows"
  log "$name: $rps req/s"
}

PEERS=(one routes)
for ((r = 1; r <= ROUNDS; r++)); do
  for peer in $(order_for_round "$r"); do measure "$peer"; done
done

node -e '
  const fs = require("fs");
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
  const read = (n) => fs.readFileSync(process.argv[1] + "/" + n + ".rows", "utf8").trim().split("\n").map((l) => l.split(" ").map(Number));
  const one = read("one"), routes = read("routes");
  const row = (name, rows) => console.log(name.padEnd(8), String(Math.round(median(rows.map((x) => x[0])))).padStart(8), median(rows.map((x) => x[1])).toFixed(2).padStart(12), "   ", rows.map((x) => Math.round(x[0])).join(" "));
  console.log("peer       req/s   cpu us/req    req/s by round");
  row("one", one);
  row("routes", routes);
  const ratio = (i) => median(routes.map((x) => x[i])) / median(one.map((x) => x[i]));
  console.log(`routes / one: ${ratio(0).toFixed(3)} x the req/s, ${ratio(1).toFixed(3)} x the CPU per request`);
' "$TMP"
