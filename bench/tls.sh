#!/usr/bin/env bash
# HTTPS side by side: drover proxy --tls-cert, nginx `listen ... ssl` and HAProxy `bind ...
# ssl crt`, each one process with one thread pinned to one core, serving the same
# certificate in front of the same tiny backend, measured one at a time in one run
# (issue 24's TLS targets).
#
#   bash bench/tls.sh                                    # 3 rounds, 10 s per measurement
#   BENCH_ROUNDS=1 BENCH_DURATION=3 BENCH_CONNS=500 bash bench/tls.sh   # smoke (~1 min)
#   BENCH_PROXY_QUOTA=10 BENCH_SCENARIOS="full resumed-h2load resumed" bash bench/tls.sh
#                                                        # handshakes under one CPU budget
#
# Scenarios (TLS 1.3, X25519 from the client's first key share, the client's first
# cipher suite, TLS_AES_256_GCM_SHA384, on every peer; the table's head says what was
# negotiated):
#   keepalive  wrk -t1 -c50 over HTTPS keep-alive connections, `GET /` answered "ok":
#              requests/s, and the proxy's CPU time per 1,000 requests.
#   full       new connections with a full handshake each: BENCH_HANDSHAKE_CLIENTS (8)
#              `openssl s_time -new -www /` processes at once, each one connection at a
#              time (handshake, GET / as HTTP/1.0, the answer, close): connections/s,
#              and the proxy's CPU time per 1,000 handshakes.
#   resumed    the same with `openssl s_time -reuse`: every connection after each
#              process's first resumes the session of its first from a TLS 1.3 ticket
#              (PSK with (EC)DHE). The count of resumed ones ('r' in s_time's output) is
#              recorded; a measurement where fewer than 90 % resumed is marked.
#   resumed-h2load  resumed handshakes from a client fast enough to keep the proxy's core
#              busy: `h2load --h1 -H 'Connection: close' -c BENCH_H2LOAD_CLIENTS (32) -n
#              BENCH_H2LOAD_REQUESTS (30000)`. h2load opens a new connection for each
#              request once the server has closed the last one (drover's
#              drover_tls_handshakes_total grew by 3,000 for 3,000 such requests), and it
#              resumes the session of its first ones from their tickets (nginx logged
#              $ssl_session_reused "r" for 196 of 200; it has no option to turn that off),
#              so this is the resumed row with a faster client: connections/s and CPU ms
#              per 1,000.
#   idle       memory per idle TLS connection: a fresh peer, BENCH_CONNS (2,000) HTTPS
#              connections that each complete a handshake and one keep-alive GET / and
#              then stay open and idle (bench/idle/client.js --tls); (RSS after - RSS
#              before) / BENCH_CONNS. nginx runs as a master and one worker here and both
#              are counted; elsewhere it runs as one process (master_process off).
# Each round measures every peer in an order rotated (and reversed on even rounds) from
# the last; the table gives each figure's median over the rounds and drover's ratio to
# each other peer.
#
# Environment (all optional): BENCH_ROUNDS (3), BENCH_DURATION (10), BENCH_CONNS (2000),
# BENCH_HANDSHAKE_CLIENTS (8), BENCH_H2LOAD_CLIENTS (32), BENCH_H2LOAD_REQUESTS (30000),
# BENCH_KEEPALIVE_CONNS (50), BENCH_KEY (ec: ECDSA P-256; rsa: RSA-2048), BENCH_TLS_VERSION
# (1.3; 1.2 applies to the full, resumed and idle rows: wrk and h2load negotiate 1.3),
# BENCH_PEERS ("drover haproxy nginx"), BENCH_SCENARIOS ("keepalive full resumed-h2load
# resumed idle"), BENCH_SKIP_BUILD=1,
# BENCH_NO_INSTALL=1, PROXY_CPU (last core), LOADGEN_CPU (0; the backend and the clients
# share it), BENCH_PROXY_QUOTA (unset; a percentage of one core, e.g. 25).
#
# BENCH_PROXY_QUOTA: every proxy runs in a cgroup of its own (v1 `cpu` or v2 `cpu.max`; root
# needed) whose CFS quota is that share of one core per 10 ms period, as a container's CPU
# limit is. On 2 cores the clients cannot keep a whole core's proxy busy with handshakes
# (the client's half of a handshake costs more than the server's), so the rates measure
# the clients; under a quota they saturate every peer, and each rate is what the same CPU
# budget serves. The table's "busy" column then reads about the quota.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH_DIR/.." && pwd)"
ROUNDS="${BENCH_ROUNDS:-3}"
D="${BENCH_DURATION:-10}"
N="${BENCH_CONNS:-2000}"
HS_CLIENTS="${BENCH_HANDSHAKE_CLIENTS:-8}"
H2LOAD_CLIENTS="${BENCH_H2LOAD_CLIENTS:-32}"
H2LOAD_REQUESTS="${BENCH_H2LOAD_REQUESTS:-30000}"
KA_CONNS="${BENCH_KEEPALIVE_CONNS:-50}"
KEY_KIND="${BENCH_KEY:-ec}"
TLS_VERSION="${BENCH_TLS_VERSION:-1.3}"
read -r -a PEERS <<<"${BENCH_PEERS:-drover haproxy nginx}"
IDLE_S=600 # every peer's idle timeouts: far beyond one measurement

LOG_TAG=tls
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
check_run_length "$D" "$ROUNDS"
[[ "$N" =~ ^[0-9]+$ && "$N" -ge 1 ]] || die "BENCH_CONNS must be a positive integer"
[[ "$HS_CLIENTS" =~ ^[0-9]+$ && "$HS_CLIENTS" -ge 1 ]] || die "BENCH_HANDSHAKE_CLIENTS must be a positive integer"
[[ "$H2LOAD_CLIENTS" =~ ^[0-9]+$ && "$H2LOAD_CLIENTS" -ge 1 ]] || die "BENCH_H2LOAD_CLIENTS must be a positive integer"
[[ "$H2LOAD_REQUESTS" =~ ^[0-9]+$ && "$H2LOAD_REQUESTS" -ge "$H2LOAD_CLIENTS" ]] || die "BENCH_H2LOAD_REQUESTS must be a whole number >= BENCH_H2LOAD_CLIENTS"
[[ "$KEY_KIND" == ec || "$KEY_KIND" == rsa ]] || die "BENCH_KEY is ec or rsa"
case "$TLS_VERSION" in
  1.3) S_TIME_VERSION=-tls1_3 ;;
  1.2) S_TIME_VERSION=-tls1_2 ;;
  *) die "BENCH_TLS_VERSION is 1.3 or 1.2" ;;
esac
scratch_and_cleanup tls-bench 1
setup_proxy_bench
QUOTA="${BENCH_PROXY_QUOTA:-}"
CGROUPS=()
if [[ -n "$QUOTA" ]]; then
  [[ "$QUOTA" =~ ^[0-9]+$ && "$QUOTA" -ge 1 && "$QUOTA" -le 100 ]] || die "BENCH_PROXY_QUOTA must be a whole percentage of one core, 1-100"
  if [[ -w /sys/fs/cgroup/cpu/cgroup.procs ]]; then
    CG_KIND=v1 CG_ROOT=/sys/fs/cgroup/cpu
  elif [[ -w /sys/fs/cgroup/cgroup.procs ]] && grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    # v2: a child has cpu.max only where the parent hands the controller down.
    CG_KIND=v2 CG_ROOT=/sys/fs/cgroup
  else
    die "BENCH_PROXY_QUOTA needs a writable cgroup cpu controller: /sys/fs/cgroup/cpu (v1), or v2 with cpu in /sys/fs/cgroup/cgroup.subtree_control (echo +cpu > it)"
  fi
fi
# new_quota_cgroup NAME: a cgroup limited to QUOTA % of one core; prints its directory.
new_quota_cgroup() {
  local dir="$CG_ROOT/drover-tls-bench-$$-$1" period=10000
  mkdir "$dir" || die "cannot make cgroup $dir"
  if [[ "$CG_KIND" == v1 ]]; then
    echo "$period" >"$dir/cpu.cfs_period_us"
    echo $((period * QUOTA / 100)) >"$dir/cpu.cfs_quota_us"
  else
    echo "$((period * QUOTA / 100)) $period" >"$dir/cpu.max"
  fi
  echo "$dir"
}
remove_quota_cgroups() {
  local dir i
  for dir in "${CGROUPS[@]}"; do
    for ((i = 0; i < 40; i++)); do rmdir "$dir" 2>/dev/null && break; sleep 0.05; done
  done
}
AFTER_CLEANUP=remove_quota_cgroups
command -v openssl >/dev/null || die "openssl (the CLI) is needed: certificates and s_time"
if ! command -v h2load >/dev/null && [[ -z "${BENCH_NO_INSTALL:-}" ]]; then
  log "installing nghttp2-client (h2load) with apt-get"
  (apt-get update -qq && apt-get install -y -qq nghttp2-client) >/dev/null 2>&1 || true
fi
command -v h2load >/dev/null || die "h2load (Debian: nghttp2-client) is needed for the resumed-h2load row"
NEED_FDS=$((N + 1024))
if (($(ulimit -n) < NEED_FDS)); then
  ulimit -Hn "$NEED_FDS" 2>/dev/null || true
  ulimit -n "$NEED_FDS" 2>/dev/null || true
fi
(($(ulimit -n) >= NEED_FDS)) || die "open-file limit $(ulimit -n) is below the $NEED_FDS that $N connections need"

build_binaries
# A copy: the shared target directory may be rebuilt from another branch mid-run.
cp "$DROVER" "$TMP/drover"

# ------------------------------------------------------------------ certificates
# One test CA and one server certificate it signs (localhost, 127.0.0.1), for every peer.
CERTS="$TMP/certs"
mkdir -p "$CERTS"
newkey() { # file
  if [[ "$KEY_KIND" == ec ]]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
  else
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1" 2>/dev/null
  fi
}
newkey "$CERTS/ca.key"
openssl req -x509 -new -key "$CERTS/ca.key" -subj "/CN=drover bench CA" -days 2 \
  -addext "basicConstraints=critical,CA:true" -addext "keyUsage=critical,keyCertSign" \
  -out "$CERTS/ca.pem" 2>/dev/null
newkey "$CERTS/server.key"
openssl req -new -key "$CERTS/server.key" -subj "/CN=localhost" -out "$CERTS/server.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:false\nextendedKeyUsage=serverAuth\n' >"$CERTS/ext.cnf"
openssl x509 -req -in "$CERTS/server.csr" -CA "$CERTS/ca.pem" -CAkey "$CERTS/ca.key" \
  -CAcreateserial -days 2 -extfile "$CERTS/ext.cnf" -out "$CERTS/server.pem" 2>/dev/null
# The chain every peer sends: the server certificate, then the CA's.
cat "$CERTS/server.pem" "$CERTS/ca.pem" >"$CERTS/chain.pem"
cat "$CERTS/chain.pem" "$CERTS/server.key" >"$CERTS/combined.pem" # HAProxy's crt
log "certificates: $KEY_KIND ($(openssl x509 -in "$CERTS/server.pem" -noout -text | sed -n 's/.*Public Key Algorithm: //p' | head -1)), chain of 2"

# ------------------------------------------------------------------ backend and peers
BE_PORT="$(quick_port)"
start_nginx_ok_backend "$TMP/backend" "${PIN_LOAD[*]}" "$BE_PORT"
PIDS+=("$NGINX_BACKEND_PID")
log "backend: one nginx worker answering \"ok\" on 127.0.0.1:$BE_PORT (core $LOADGEN_CPU)"

# start_peer NAME MODE: MODE run (pinned to PROXY_CPU, nginx as one process) or idle
# (as deployed: nginx a master and one worker; also pinned). Sets PID[NAME] (nginx idle:
# its master), KIDS (nginx idle: the worker) and PORT[NAME].
declare -A PORT PID
KIDS=()
RUN_N=0
start_peer() { # name mode
  local name=$1 mode=$2 port dir i maxconn=$((N + 1024))
  RUN_N=$((RUN_N + 1))
  dir="$TMP/peer-$RUN_N-$1-$2"
  port="$(quick_port)"
  mkdir -p "$dir/tmp"
  # In its quota's cgroup from its first instruction: the shell joins it, then execs.
  local in_quota=()
  if [[ -n "$QUOTA" ]]; then
    local cg
    cg="$(new_quota_cgroup "$RUN_N-$name")"
    [[ -d "$cg" ]] || die "no cgroup for $name"
    CGROUPS+=("$cg")
    # shellcheck disable=SC2016 # $$ and $0 are the inner shell's
    in_quota=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg")
  fi
  case "$name" in
    drover)
      "${in_quota[@]}" "${PIN_PROXY[@]}" "$TMP/drover" proxy --listen "127.0.0.1:$port" --threads 1 \
        --backend "127.0.0.1:$BE_PORT" --tls-cert "$CERTS/chain.pem" --tls-key "$CERTS/server.key" \
        --idle-timeout "${IDLE_S}s" --header-timeout "${IDLE_S}s" \
        >"$dir/stdout.log" 2>"$dir/stderr.log" &
      ;;
    haproxy)
      cat >"$dir/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn $maxconn
  no strict-limits
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client ${IDLE_S}s
  timeout server ${IDLE_S}s
  timeout http-keep-alive ${IDLE_S}s
  timeout http-request ${IDLE_S}s
frontend fe
  bind 127.0.0.1:$port ssl crt $CERTS/combined.pem alpn http/1.1 backlog 4096
  default_backend be
backend be
  server be1 127.0.0.1:$BE_PORT
EOF
      "${in_quota[@]}" "${PIN_PROXY[@]}" "$HAPROXY" -db -f "$dir/haproxy.cfg" >"$dir/stderr.log" 2>&1 &
      ;;
    nginx)
      {
        if [[ "$mode" == idle ]]; then
          # worker_connections 2N: nginx closes idle keep-alive connections when fewer
          # than 1/16 of its slots are free (see bench/idle.sh).
          nginx_preamble "$dir" $((2 * N + 1024)) | sed -e 's/^master_process off;/master_process on;/' -e 's/^# one process serves everything.*/# a master and one worker/'
        else
          nginx_preamble "$dir" "$maxconn"
        fi
        cat <<EOF
  ssl_session_cache shared:SSL:10m;
  ssl_session_tickets on;
  ssl_protocols TLSv1.2 TLSv1.3;
  upstream backends {
    server 127.0.0.1:$BE_PORT max_fails=0;
    keepalive 64;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$port ssl backlog=4096;
    ssl_certificate $CERTS/chain.pem;
    ssl_certificate_key $CERTS/server.key;
    keepalive_timeout ${IDLE_S}s;
    client_header_timeout ${IDLE_S}s;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    location / { proxy_pass http://backends; }
  }
}
EOF
      } >"$dir/nginx.conf"
      "${in_quota[@]}" "${PIN_PROXY[@]}" "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" 2>"$dir/stderr.log" &
      ;;
    *) die "unknown peer $name (drover, haproxy, nginx)" ;;
  esac
  PID[$name]=$!
  PIDS+=($!)
  PORT[$name]=$port
  wait_port "$port" "${PID[$name]}" 10 || { cat "$dir"/*.log >&2; die "$name did not start"; }
  KIDS=()
  if [[ "$name" == nginx && "$mode" == idle ]]; then
    for ((i = 0; i < 100; i++)); do
      mapfile -t KIDS < <(pgrep -P "${PID[$name]}" || true)
      ((${#KIDS[@]})) && break
      sleep 0.05
    done
    ((${#KIDS[@]})) || die "nginx started no worker"
  fi
  # It must answer over HTTPS, with the test CA's certificate, before it is measured.
  local body
  body="$(curl -sS --max-time 5 --cacert "$CERTS/ca.pem" "https://localhost:$port/" --resolve "localhost:$port:127.0.0.1")" ||
    { cat "$dir"/*.log >&2; die "$name does not answer over HTTPS"; }
  [[ "$body" == ok ]] || die "$name answered '$body', not 'ok'"
  # And to the request s_time sends (HTTP/1.0, no Host): drover once forwarded it without
  # a Host, the backend answered 400 and closed, and the handshake rows compared drover's
  # 400s with the others' 200s.
  body="$(printf 'GET / HTTP/1.0\r\n\r\n' | timeout 5 openssl s_client -connect "127.0.0.1:$port" -quiet 2>/dev/null | head -1 | tr -d '\r')" || true
  [[ "$body" == "HTTP/1."?" 200 "* ]] || die "$name answered s_time's request with '$body', not 200"
}
stop_peer() { # name
  local pid=${PID[$1]} p i
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  for p in "$pid" "${KIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait "$pid" 2>/dev/null || true
  KIDS=()
}

peer_label() {
  case "$1" in
    drover) echo "drover $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" ;;
    nginx) echo "nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///')" ;;
    haproxy) echo "haproxy $("$HAPROXY" -v | awk 'NR==1{print $3}')" ;;
  esac
}

for peer in "${PEERS[@]}"; do start_peer "$peer" run; done
log "peers: $(for p in "${PEERS[@]}"; do printf '%s=%s ' "$p" "${PORT[$p]}"; done)"
NEGOTIATED=""
for peer in "${PEERS[@]}"; do
  # What each peer negotiates with the same client (s_client's "Protocol version",
  # "Ciphersuite", "Server Temp Key").
  neg="$(openssl s_client -brief -connect "127.0.0.1:${PORT[$peer]}" -servername localhost "$S_TIME_VERSION" </dev/null 2>&1 |
    awk -F': ' '/^Protocol version|^Ciphersuite|Temp Key/{printf "%s ", $2}')"
  log "$peer negotiates: $neg"
  NEGOTIATED+="$peer: ${neg% }; "
done

# ------------------------------------------------------------------ measuring
mkdir -p "$BENCH_DIR/results"
STAMP="$(date +%Y%m%d-%H%M%S)"
RAW="$BENCH_DIR/results/tls-raw-$STAMP.jsonl"
: >"$RAW"
now() { date +%s.%N; }
cpu_s() { awk -v t="$1" -v hz="$CLK_TCK" 'BEGIN{printf "%.3f", t / hz}'; }

record() { # round peer scenario rate count cpu_s errors extra-json
  node -e '
    const [round, peer, label, scen, rate, count, cpu, errors, extra] = process.argv.slice(1);
    console.log(JSON.stringify({ round: +round, peer, label, scenario: scen, rate: +rate, count: +count,
      cpu_s: +cpu, errors: +errors, ...JSON.parse(extra) }));
  ' "$1" "$2" "$(peer_label "$2")" "$3" "$4" "$5" "$6" "$7" "$8" >>"$RAW"
}

measure_keepalive() { # round peer
  local before after out
  before="$(cpu_total "${PID[$2]}")"
  out="$("${PIN_LOAD[@]}" wrk -t1 "-c$KA_CONNS" "-d${D}s" -s "$BENCH_DIR/wrk-json.lua" "https://127.0.0.1:${PORT[$2]}/" | grep '^{"tool"')"
  after="$(cpu_total "${PID[$2]}")"
  local rps reqs errs
  rps="$(node -e 'const r=JSON.parse(process.argv[1]);console.log(r.rps)' "$out")"
  reqs="$(node -e 'const r=JSON.parse(process.argv[1]);console.log(r.requests)' "$out")"
  errs="$(node -e 'const e=JSON.parse(process.argv[1]).errors;console.log(e.connect+e.read+e.write+e.status+e.timeout)' "$out")"
  record "$1" "$2" keepalive "$rps" "$reqs" "$(cpu_s $((after - before)))" "$errs" "{\"wrk\":$out}"
  log "round $1 $2 keepalive: $rps req/s, $errs errors, proxy CPU $(cpu_s $((after - before))) s"
}

measure_handshakes() { # round peer scenario(full|resumed)
  local flag=-new before after t0 t1 i conns=0 resumed=0 full=0 n r s
  [[ "$3" == resumed ]] && flag=-reuse
  before="$(cpu_total "${PID[$2]}")"
  local clients=()
  t0="$(now)"
  for ((i = 0; i < HS_CLIENTS; i++)); do
    "${PIN_LOAD[@]}" openssl s_time -connect "127.0.0.1:${PORT[$2]}" -www / "$flag" "$S_TIME_VERSION" \
      -time "$D" >"$TMP/stime-$i.out" 2>&1 &
    clients+=($!)
  done
  for i in "${clients[@]}"; do wait "$i" || true; done
  t1="$(now)"
  after="$(cpu_total "${PID[$2]}")"
  for ((i = 0; i < HS_CLIENTS; i++)); do
    n="$(sed -n 's/^\([0-9]*\) connections in [0-9.]*s;.*/\1/p' "$TMP/stime-$i.out" | tail -1)"
    r="$(grep -E '^[*r]+$' "$TMP/stime-$i.out" | tr -cd 'r' | wc -c)"
    s="$(grep -E '^[*r]+$' "$TMP/stime-$i.out" | tr -cd '*' | wc -c)"
    conns=$((conns + ${n:-0})) resumed=$((resumed + r)) full=$((full + s))
  done
  local rate wall
  wall="$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b - a}')"
  rate="$(awk -v c="$conns" -v w="$wall" 'BEGIN{printf "%.1f", c / w}')"
  # s_time marks each connection: '*' a full handshake, 'r' a resumed one. Errors: the
  # processes that counted nothing.
  local errs=0
  for ((i = 0; i < HS_CLIENTS; i++)); do grep -q ' connections in ' "$TMP/stime-$i.out" || errs=$((errs + 1)); done
  record "$1" "$2" "$3" "$rate" "$conns" "$(cpu_s $((after - before)))" "$errs" \
    "{\"wall_s\":$wall,\"clients\":$HS_CLIENTS,\"marked_full\":$full,\"marked_resumed\":$resumed}"
  log "round $1 $2 $3: $rate conn/s ($conns in ${wall}s; $full full, $resumed resumed), proxy CPU $(cpu_s $((after - before))) s"
  ((errs == 0)) || log "round $1 $2 $3: $errs s_time process(es) counted nothing: $(tail -3 "$TMP/stime-0.out")"
}
measure_h2load_resumed() { # round peer
  local before after out line rate count failed wall
  before="$(cpu_total "${PID[$2]}")"
  # -n, not -D: h2load 1.52 with -D and reconnecting HTTP/1.1 clients never returned
  # after its duration (it spun at full CPU until killed).
  out="$("${PIN_LOAD[@]}" timeout 120 h2load --h1 -t1 -c "$H2LOAD_CLIENTS" -n "$H2LOAD_REQUESTS" \
    -H 'Connection: close' "https://127.0.0.1:${PORT[$2]}/" 2>&1)" || true
  after="$(cpu_total "${PID[$2]}")"
  # "finished in 1.29s, 4634.91 req/s, ..." and "requests: T total, S started, D done,
  # OK succeeded, F failed, E errored, TO timeout"
  rate="$(sed -n 's/^finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' <<<"$out")"
  wall="$(sed -n 's/^finished in \([0-9.]*\)\(m\{0,1\}\)s,.*/\1 \2/p' <<<"$out" | awk '{printf "%.3f", $2 == "m" ? $1 / 1000 : $1}')"
  line="$(grep '^requests:' <<<"$out" || true)"
  count="$(sed -n 's/.* \([0-9]*\) succeeded.*/\1/p' <<<"$line")"
  failed="$(sed -n 's/.* \([0-9]*\) failed.*/\1/p' <<<"$line")"
  [[ -n "$rate" && -n "$count" && -n "$wall" ]] || { log "round $1 $2 resumed-h2load: no result: $(tail -3 <<<"$out")"; rate=0 count=0 failed=1 wall=0; }
  record "$1" "$2" resumed-h2load "$rate" "$count" "$(cpu_s $((after - before)))" "${failed:-0}" \
    "{\"clients\":$H2LOAD_CLIENTS,\"wall_s\":$wall}"
  log "round $1 $2 resumed-h2load: $rate conn/s ($count requests in ${wall}s), ${failed:-?} failed, proxy CPU $(cpu_s $((after - before))) s"
}

peer_rss_kb() { # name: the peer's processes, summed
  local p sum=0
  for p in "${PID[$1]}" "${KIDS[@]}"; do sum=$((sum + $(rss_kb "$p"))); done
  echo "$sum"
}

measure_idle() { # round peer: a fresh peer of its own
  local round=$1 name=$2 rss0 rss1 out="$TMP/idle-$1-$2.out" client ready end_line i
  local keep_pid=${PID[$name]} keep_port=${PORT[$name]}
  start_peer "$name" idle
  node "$BENCH_DIR/idle/client.js" --tls --tls-version "$TLS_VERSION" --port "${PORT[$name]}" \
    --conns 50 --concurrency 10 --timeout-ms 10000 --close >"$TMP/warm.out" 2>&1 || true
  grep -q '"failed":0' "$TMP/warm.out" || log "round $round $name idle: warm-up failed: $(cat "$TMP/warm.out")"
  sleep 1
  rss0="$(peer_rss_kb "$name")"
  "${PIN_LOAD[@]}" node "$BENCH_DIR/idle/client.js" --tls --tls-version "$TLS_VERSION" --port "${PORT[$name]}" \
    --conns "$N" --concurrency 64 --timeout-ms 120000 --hold-ms $(((IDLE_S - 60) * 1000)) >"$out" 2>"$out.err" &
  client=$!
  for ((i = 0; i < 1300; i++)); do
    grep -q '"event":"ready"' "$out" 2>/dev/null && break
    kill -0 "$client" 2>/dev/null || break
    sleep 0.1
  done
  ready="$(grep '"event":"ready"' "$out" || echo '{}')"
  sleep 3
  rss1="$(peer_rss_kb "$name")"
  kill -TERM "$client" 2>/dev/null || true
  wait "$client" 2>/dev/null || true
  end_line="$(grep '"event":"end"' "$out" || echo '{}')"
  stop_peer "$name"
  PID[$name]=$keep_pid PORT[$name]=$keep_port
  local valid per
  valid="$(node -e 'const r=JSON.parse(process.argv[1]),e=JSON.parse(process.argv[2]),n=+process.argv[3];
    console.log(r.ok===n && r.failed===0 && e.open===n && e.closed_by_peer===0 ? "true" : "false")' "$ready" "$end_line" "$N")"
  per="$(awk -v a="$rss0" -v b="$rss1" -v n="$N" 'BEGIN{printf "%.1f", (b - a) * 1024 / n}')"
  record "$round" "$name" idle "$per" "$N" 0 "$([[ $valid == true ]] && echo 0 || echo 1)" \
    "{\"rss_before_kb\":$rss0,\"rss_after_kb\":$rss1,\"ready\":$ready,\"end\":$end_line,\"valid\":$valid}"
  log "round $round $name idle: RSS $rss0 -> $rss1 KiB, $per B per idle TLS connection (valid: $valid; connected in $(node -e 'console.log(JSON.parse(process.argv[1]).ms)' "$ready") ms)"
}

# Warm up every peer's upstream connections and allocator.
for peer in "${PEERS[@]}"; do
  "${PIN_LOAD[@]}" wrk -t1 "-c$KA_CONNS" -d2s "https://127.0.0.1:${PORT[$peer]}/" >/dev/null 2>&1 || true
done

for ((round = 1; round <= ROUNDS; round++)); do
  read -r -a order <<<"$(order_for_round "$round")"
  log "round $round/$ROUNDS: ${order[*]}"
  for scen in ${BENCH_SCENARIOS:-keepalive full resumed-h2load resumed idle}; do
    for peer in "${order[@]}"; do
      case "$scen" in
        keepalive) measure_keepalive "$round" "$peer" ;;
        full | resumed) measure_handshakes "$round" "$peer" "$scen" ;;
        resumed-h2load) measure_h2load_resumed "$round" "$peer" ;;
        idle) measure_idle "$round" "$peer" ;;
        *) die "unknown scenario $scen (keepalive full resumed-h2load resumed idle)" ;;
      esac
      sleep 1 # let TIME_WAIT and the backend settle between peers
    done
  done
done

# ------------------------------------------------------------------ report
QUOTA_NOTE=""
[[ -n "$QUOTA" ]] && QUOTA_NOTE=" (each limited to $QUOTA % of it by a CFS quota)"
node "$BENCH_DIR/tls-report.js" "$RAW" "proxies on core $PROXY_CPU$QUOTA_NOTE, load and backend on core $LOADGEN_CPU; $KEY_KIND key; ${NEGOTIATED% }"
log "raw records: $RAW"
