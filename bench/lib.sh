# Shared by bench/run.sh and bench/cluster.sh: logging, building the binaries, ports,
# per-process CPU and memory, the peer order of a round, and the measured capacity.
# Source it after setting BENCH_DIR and LOG_TAG (and ROOT, or it is BENCH_DIR/..).
# shellcheck shell=bash

# The repository root, for a script that did not set it (cargo builds there).
ROOT="${ROOT:-$(cd "$BENCH_DIR/.." && pwd)}"

log() { printf '[%s %s] %s\n' "${LOG_TAG:-bench}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

check_run_length() { # duration rounds
  [[ "$1" =~ ^[0-9]+$ && "$1" -ge 1 ]] || die "BENCH_DURATION must be a whole number of seconds"
  [[ "$2" =~ ^[0-9]+$ && "$2" -ge 1 ]] || die "BENCH_ROUNDS must be a positive integer"
}

# Builds drover (unless BENCH_SKIP_BUILD=1) and sets DROVER, HAVE_DROVER and LOADGEN:
# the load generator is `drover bench`, so LOADGEN is the drover binary and every
# measuring command is "$LOADGEN" bench ... . Without a drover that builds nothing can
# be measured.
build_binaries() {
  local target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
  DROVER="$target_dir/release/drover"
  LOADGEN="$DROVER"
  HAVE_DROVER=0
  if [[ "${BENCH_SKIP_BUILD:-0}" != 1 ]]; then
    log "cargo build --release -p drover"
    (cd "$ROOT" && cargo build --release -p drover >&2) || die "drover does not build; it is the load generator too (drover bench)"
  fi
  [[ -x "$DROVER" ]] && HAVE_DROVER=1
  [[ -x "$LOADGEN" ]] || die "no $LOADGEN (drover bench is the load generator)"
  return 0
}

# A loopback port no other peer of this run was given.
USED_PORTS=" "
free_port() {
  local p
  while :; do
    p="$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
    [[ "$USED_PORTS" == *" $p "* ]] || break
  done
  USED_PORTS+="$p "
  echo "$p"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A loopback port nobody listens on, below the ephemeral range (so no client socket holds
# it) and never given twice in this run. free_port above starts a node process, which
# takes up to half a second on a busy machine: too slow for a fresh peer per measurement.
quick_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 12000))
    [[ "$USED_PORTS" == *" $p "* ]] && continue
    port_open "$p" && continue
    break
  done
  USED_PORTS+="$p "
  echo "$p"
}

wait_port() { # port pid seconds: true once the port accepts, false if pid dies first
  local i
  for ((i = 0; i < $3 * 20; i++)); do
    port_open "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

cpu_ticks() { # "utime stime" of a process (all threads), in clock ticks
  [[ -r "/proc/$1/stat" ]] || { echo "0 0"; return; }
  sed 's/.*) //' "/proc/$1/stat" | awk '{print $12, $13}'
}
cpu_total() { # utime + stime of a process, in clock ticks
  local u s
  read -r u s < <(cpu_ticks "$1")
  echo $((u + s))
}
rss_kb() { awk '/^VmRSS:/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
hwm_kb() { awk '/^VmHWM:/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
CLK_TCK="$(getconf CLK_TCK)"

order_for_round() { # round -> PEERS, rotated by round-1 and reversed on even rounds
  local r=$1 n=${#PEERS[@]} i out=()
  for ((i = 0; i < n; i++)); do out+=("${PEERS[$(((i + r - 1) % n))]}"); done
  if ((r % 2 == 0)); then
    local rev=()
    for ((i = n - 1; i >= 0; i--)); do rev+=("${out[$i]}"); done
    out=("${rev[@]}")
  fi
  echo "${out[@]}"
}

# Capacity for the open-loop runs: the median of round 1's error-free closed-loop mixed
# throughputs (records with at least MIN_WORKERS workers, when the record says). The
# median, not the best: on a noisy 2-core machine the best of several is an outlier, and
# "75 % of capacity" offered from an outlier is really 85-95 %, where every peer's queue
# grows for the whole run and the p99s compare nothing but luck.
# Prints "RPS DESCRIPTION", or nothing when no such record exists.
measured_capacity() { # raw.jsonl min_workers
  # shellcheck disable=SC2016 # JavaScript, not shell
  node -e '
    const fs = require("fs"); const min = +process.argv[2]; const runs = [];
    for (const line of fs.readFileSync(process.argv[1], "utf8").split("\n")) {
      if (!line) continue; const r = JSON.parse(line);
      if (r.round === 1 && r.scenario === "mixed-closed" && r.peer !== "direct" &&
          (r.workers === undefined || r.workers >= min) &&
          r.result && r.result.errors_total === 0) runs.push(r);
    }
    if (!runs.length) process.exit(0);
    runs.sort((a, b) => a.result.rps - b.result.rps);
    const n = runs.length, mid = Math.floor(n / 2);
    const rps = n % 2 ? runs[mid].result.rps : (runs[mid - 1].result.rps + runs[mid].result.rps) / 2;
    const each = runs.map((r) => `${r.peer}=${Math.round(r.result.rps)}`).join(",");
    console.log(`${Math.round(rps)} median-of-${n}:${each}`);
  ' "$1" "$2"
}

# PM2 for bench/cluster.sh and bench/deploy.sh: a pm2 on PATH, else one npm-installed into
# bench/.cache (kept between runs). Sets PM2 and PM2_VERSION; false when there is none.
PM2_VERSION=""
# SYSTEMS=(drover [drover-b] pm2 cluster) for a script that runs an app under drover,
# PM2 and Node's cluster module: finds PM2 (its daemon under $TMP/pm2), and copies
# DROVER_B_BIN to $TMP/drover-b when it is set.
drover_pm2_and_cluster() {
  export PM2_HOME="$TMP/pm2"
  PM2=""
  find_pm2 || die "no pm2, and it could not be installed with npm"
  log "pm2 $PM2_VERSION"
  SYSTEMS=(drover)
  if [[ -n "${DROVER_B_BIN:-}" ]]; then
    cp "$DROVER_B_BIN" "$TMP/drover-b"
    SYSTEMS+=(drover-b)
  fi
  SYSTEMS+=(pm2 cluster)
}
find_pm2() {
  local cache="$BENCH_DIR/.cache"
  if command -v pm2 >/dev/null; then
    PM2="$(command -v pm2)"
  elif [[ -x "$cache/node_modules/.bin/pm2" ]]; then
    PM2="$cache/node_modules/.bin/pm2"
  elif [[ "${BENCH_NO_INSTALL:-0}" == 1 ]]; then
    return 1
  else
    command -v npm >/dev/null || return 1
    log "installing pm2 with npm into $cache"
    mkdir -p "$cache"
    # Nothing in the cache belongs in git.
    [[ -f "$cache/.gitignore" ]] || echo '*' >"$cache/.gitignore"
    npm install --prefix "$cache" --no-save --no-audit --no-fund --loglevel=error pm2@7 >&2 || return 1
    PM2="$cache/node_modules/.bin/pm2"
  fi
  # Read the version from the package: any pm2 command would start a daemon.
  PM2_VERSION="$(node -e 'const p=require("path"),fs=require("fs");
    console.log(require(path.join(path.dirname(fs.realpathSync(process.argv[1])), "..", "package.json")).version)' "$PM2" 2>/dev/null || echo unknown)"
}

# The tools bench/run.sh and bench/matrix.sh need: installs nginx, HAProxy, wrk, Node,
# curl and taskset with apt-get when missing (unless BENCH_NO_INSTALL=1), sets NGINX and
# HAPROXY, raises the open-file limit (HAProxy sizes its own from maxconn; io-c1000 of the
# matrix holds 1,000 client connections and as many to the backends), and sets PIN_PROXY
# and PIN_LOAD: taskset prefixes that put the proxy under test on PROXY_CPU (default: the
# last core) and the load generator on LOADGEN_CPU (default: 0). NCPU is the core count.
setup_proxy_bench() {
  local pkgs=()
  command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || pkgs+=(nginx-light)
  command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]] || pkgs+=(haproxy)
  command -v wrk >/dev/null || pkgs+=(wrk)
  command -v node >/dev/null || pkgs+=(nodejs)
  command -v curl >/dev/null || pkgs+=(curl)
  command -v taskset >/dev/null || pkgs+=(util-linux)
  if ((${#pkgs[@]})); then
    [[ "${BENCH_NO_INSTALL:-0}" == 1 ]] && die "missing: ${pkgs[*]} (BENCH_NO_INSTALL=1)"
    local sudo=""
    if [[ $(id -u) -ne 0 ]]; then
      command -v sudo >/dev/null || die "missing ${pkgs[*]}; run as root or install them"
      sudo="sudo"
    fi
    log "installing ${pkgs[*]} with apt-get"
    # Wait for another apt/dpkg run (up to 10 minutes) instead of failing on its lock.
    local lock=(-o DPkg::Lock::Timeout=600)
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y -qq \
      --no-install-recommends "${pkgs[@]}" >&2
  fi
  export PATH="$PATH:/usr/sbin:/sbin"
  NGINX="$(command -v nginx)"
  HAPROXY="$(command -v haproxy)"
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  NCPU="$(nproc)"
  PROXY_CPU="${PROXY_CPU:-$((NCPU - 1))}"
  LOADGEN_CPU="${LOADGEN_CPU:-0}"
  PIN_PROXY=() PIN_LOAD=()
  if ((NCPU > 1)) && command -v taskset >/dev/null; then
    PIN_PROXY=(taskset -c "$PROXY_CPU")
    PIN_LOAD=(taskset -c "$LOADGEN_CPU")
  else
    log "one core or no taskset: nothing is pinned"
  fi
}

# The head of an nginx.conf for one proxy process in DIR (pid, logs and temp files
# there) with CONNECTIONS worker connections, up to and including the open `http {`
# block's keep-alive settings; the caller writes the upstream and server blocks and
# closes `http`.
nginx_preamble() { # dir connections
  cat <<EOF
# one process serves everything (master_process off = a single worker, no master)
daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 65536;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections $2; multi_accept on; }
http {
  access_log off;
  client_body_temp_path $1/tmp/body;
  proxy_temp_path $1/tmp/proxy;
  fastcgi_temp_path $1/tmp/fastcgi;
  uwsgi_temp_path $1/tmp/uwsgi;
  scgi_temp_path $1/tmp/scgi;
  keepalive_requests 10000000;
  keepalive_timeout 120s;
EOF
}

# The head of a haproxy.cfg for one process and thread, with MAXCONN connections, HTTP
# keep-alive on both sides, and a frontend on 127.0.0.1:PORT, up to and including the
# `backend be` line; the caller writes the balance and server lines.
haproxy_preamble() { # maxconn port
  cat <<EOF
global
  nbthread 1
  maxconn $1
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout tunnel 60s
  timeout http-keep-alive 120s
  timeout http-request 10s
frontend fe
  bind 127.0.0.1:$2
  default_backend be
backend be
EOF
}

# Starts one nginx process in DIR answering "ok" on every PORT given (a backend that
# costs next to nothing, so the proxy in front of it is what is measured), pinned with
# the words of PIN (e.g. "taskset -c 0", or ""); sets NGINX_BACKEND_PID and dies if a
# port does not open. Needs NGINX.
start_nginx_ok_backend() { # dir pin port...
  local dir=$1 pin=$2 port
  shift 2
  mkdir -p "$dir/tmp"
  {
    nginx_preamble "$dir" 8192
    echo "  server {"
    for port in "$@"; do echo "    listen 127.0.0.1:$port backlog=4096;"; done
    echo '    location / { return 200 "ok"; }'
    echo "  }"
    echo "}"
  } >"$dir/nginx.conf"
  # shellcheck disable=SC2086 # PIN is words on purpose
  $pin "$NGINX" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" 2>"$dir/stderr.log" &
  NGINX_BACKEND_PID=$!
  for port in "$@"; do
    wait_port "$port" "$NGINX_BACKEND_PID" 10 ||
      { cat "$dir/stderr.log" "$dir/error.log" >&2 2>/dev/null; die "nginx backend did not start"; }
  done
}

# A scratch directory in TMP and the PIDS array, both cleaned up on exit: the processes
# get SIGTERM, GRACE seconds (for drover to drain and stop its workers), then SIGKILL.
# AFTER_CLEANUP, when a script sets it, is a command run once they are gone.
scratch_and_cleanup() { # name grace
  TMP="$(mktemp -d "/tmp/drover-$1.XXXXXX")"
  PIDS=()
  CLEANUP_GRACE=$2
  trap cleanup_scratch EXIT
  trap 'exit 130' INT TERM
}
cleanup_scratch() {
  local rc=$? pid
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  sleep "$CLEANUP_GRACE"
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  ${AFTER_CLEANUP:-}
  rm -rf "$TMP"
  exit "$rc"
}

# For bench/burst.sh and bench/fault.sh: the scratch directory, job control, the built
# drover copied into the scratch directory (the shared target directory may be rebuilt
# from another branch mid-run), and one system under test at a time (drover run, a
# cluster primary) as the leader of a process group of its own, stopped with its
# workers on exit and on Ctrl-C. Job control, not setsid: a session of its own would
# be a CPU share of its own under sched_autogroup (see examples/seeds/README.md).
# DROVER_BIN, when set, is the drover copied in instead of the one built (it is the
# load generator too).
# start_system and stop_system must run at the top level, not in a pipeline: in a
# subshell job control is off and no group is made.
system_scratch() { # name
  scratch_and_cleanup "$1" 2
  set -m
  build_binaries
  cp "${DROVER_BIN:-$DROVER}" "$TMP/drover"
  DROVER="$TMP/drover" LOADGEN="$TMP/drover"
  SYS_PID=""
  trap 'rc=$?; stop_system; (exit $rc); cleanup_scratch' EXIT
}
start_system() { # logfile cmd... -> SYS_PID
  local logf=$1
  shift
  "$@" >"$logf" 2>&1 </dev/null &
  SYS_PID=$!
  disown "$SYS_PID"
}
# Calls the script's `run_one SYSTEM ROUND` (one JSON line on stdout) for every system,
# ROUNDS times, in the order given and reversed on even rounds; each line goes to
# stderr as it comes and is appended to FILE (emptied first).
alternate_rounds() { # file system...
  local file=$1 r i
  shift
  local systems=("$@") order
  : >"$file"
  for ((r = 1; r <= ROUNDS; r++)); do
    order=("${systems[@]}")
    if ((r % 2 == 0)); then
      order=()
      for ((i = ${#systems[@]} - 1; i >= 0; i--)); do order+=("${systems[i]}"); done
    fi
    for i in "${order[@]}"; do
      run_one "$i" "$r" >"$TMP/row"
      cat "$TMP/row" >&2
      cat "$TMP/row" >>"$file"
    done
  done
}
# Waits (30 s at most) until SYS_PID has two node children and 8 GETs of / on SYS_PORT
# are answered; dies naming SYSTEM, with its log's tail, if not.
two_workers_serve() { # system
  local i
  for ((i = 0; i < 300; i++)); do
    (($(pgrep -c -P "$SYS_PID" node || true) >= 2)) &&
      [[ "$("$LOADGEN" bench -n 8 -c 2 --json "http://127.0.0.1:$SYS_PORT/" 2>/dev/null)" == *'"ok":8,'* ]] && return 0
    sleep 0.1
  done
  die "$1 did not start: $(tail -5 "$TMP/$1.log")"
}
stop_system() {
  [[ -n "$SYS_PID" ]] || return 0
  local i
  kill -TERM -- "-$SYS_PID" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do kill -0 -- "-$SYS_PID" 2>/dev/null || break; sleep 0.1; done
  kill -9 -- "-$SYS_PID" 2>/dev/null || true
  SYS_PID=""
}
