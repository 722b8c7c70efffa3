# Shared by the run-*.sh scripts of examples/seeds: the drover binary, free loopback
# ports, starting and stopping process groups, rounds in alternating order, medians.
# shellcheck shell=bash
set -euo pipefail

SEEDS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$SEEDS/../.." && pwd)"
ROUNDS="${ROUNDS:-3}"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/drover-seeds.XXXXXX")"

log() { printf '[seeds %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The drover binary: $DROVER, else the release build of this checkout.
DROVER="${DROVER:-${CARGO_TARGET_DIR:-$ROOT/target}/release/drover}"
need_drover() {
  [[ -x "$DROVER" ]] || die "no drover at $DROVER: run \`cargo build --release\` first (or set DROVER)"
}
need() { command -v "$1" >/dev/null || die "$1 is not installed (apt-get install ${2:-$1})"; }

# A free loopback port, never one handed out earlier in this run.
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

# Process groups started by `start`, stopped by `stop_all` and on exit. Job control
# gives each background command a process group of its own, all in this script's
# session: with setsid instead, each would get a session and so, where the kernel
# groups CPU time by session (sched_autogroup, on by default in Debian), a CPU share of
# its own beside other sessions' work, and a system of three separately started
# processes would get three shares where one supervisor and its workers get one.
set -m
GROUPS_STARTED=()
start() { # logname cmd...: runs cmd in a process group of its own; sets STARTED (its pid)
  local name=$1
  shift
  "$@" >"$TMP/$name.log" 2>&1 < /dev/null &
  STARTED=$!
  disown "$STARTED" # no "Terminated" notices from job control when stop_all ends it
  GROUPS_STARTED+=("$STARTED")
}
stop_group() { # pid: SIGTERM to its group, SIGKILL after 10 s
  local pid=$1 i
  kill -TERM -- "-$pid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    kill -0 -- "-$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
}
stop_all() {
  local pid
  for pid in "${GROUPS_STARTED[@]}"; do stop_group "$pid"; done
  GROUPS_STARTED=()
}
CLEANUPS=()
cleanup() {
  local c
  stop_all
  for c in "${CLEANUPS[@]}"; do eval "$c" || true; done
  if [[ "${KEEP_TMP:-0}" == 1 ]]; then log "logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Commands that reach the servers run with this prefix: `ip netns exec NAME` while a
# script measures inside a network namespace of its own.
NS_EXEC=()

# Waits until `curl URL` answers 2xx, up to `seconds`; false (with the log) if the
# started process dies first or time runs out.
wait_http() { # url pid logname seconds
  local i
  for ((i = 0; i < $4 * 10; i++)); do
    "${NS_EXEC[@]}" curl -fsS -o /dev/null --max-time 2 "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { log "$3 exited:"; tail -20 "$TMP/$3.log" >&2; return 1; }
    sleep 0.1
  done
  log "$3 did not answer $1 within $4 s:"
  tail -20 "$TMP/$3.log" >&2
  return 1
}

# Until a URL has been answered by `want` distinct x-worker values (or 10 s pass), so a
# measurement starts once every worker serves.
wait_workers() { # url want
  local i seen
  for ((i = 0; i < 100; i++)); do
    seen="$(for _ in 1 2 3 4 5 6 7 8; do "${NS_EXEC[@]}" curl -s -o /dev/null -D - --max-time 5 "$1" | tr -d '\r' | awk 'tolower($1)=="x-worker:"{print $2}'; done | sort -u | wc -l)"
    ((seen >= $2)) && return 0
    sleep 0.1
  done
  log "warning: only $seen of $2 workers answered $1"
}

# The systems of a run, in round r's order: as listed on odd rounds, reversed on even.
order_for_round() { # round system...
  local r=$1
  shift
  if ((r % 2 == 1)); then echo "$@"; else
    local out=() i
    for ((i = $#; i >= 1; i--)); do out+=("${!i}"); done
    echo "${out[@]}"
  fi
}

# Each round appends one JSON line to $TMP/results.jsonl: {"system", "round", ...figures}.
record() { # system round json-object-of-figures
  node -e 'const [s, r, f] = process.argv.slice(1); console.log(JSON.stringify({ system: s, round: +r, ...JSON.parse(f) }))' "$1" "$2" "$3" >>"$TMP/results.jsonl"
}

# Prints every round and the median of each figure per system, in a Markdown table.
report() { # figure... (keys of the recorded objects, in column order)
  node "$SEEDS/median.js" "$TMP/results.jsonl" "$@"
  if [[ -n "${SEEDS_RESULTS:-}" ]]; then cp "$TMP/results.jsonl" "$SEEDS_RESULTS"; fi
}
