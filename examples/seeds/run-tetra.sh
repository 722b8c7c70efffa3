#!/usr/bin/env bash
# The fifth post: five tetration apps (Sinatra, Flask, Express, Go, Scotty) behind one
# balancer, `siege -b -c 100 -r 100` against it, ROUNDS times (default 3) in alternating
# order:
#
#   haproxy     haproxy -f haproxy-tetra.cfg (roundrobin, the post's balancer)
#   drover      drover proxy -b APP1 ... -b APP5 (defaults: p2c)
#   drover-rr   the same with --strategy round-robin
#
# The apps, one process each: by default the script starts the five of examples/tetra/
# (or TETRA_DIR) from a copy in its temporary directory (Go and Scotty built there,
# Express's node_modules installed there). Or TETRA_BACKENDS="HOST:PORT x5", in the
# order Sinatra Flask Express Go Scotty, of apps you started. Without either (or with
# STAND_INS=1) it starts five stand-ins from today's standard-library examples
# (tetra-server.js, tetra-server.py, go/tetra-server), which answer /tetra/3?n=2 with
# 3^3 = 27; the stand-ins' figures are not the post's apps'.
#
#   bash examples/seeds/run-tetra.sh      # needs node, curl, siege, haproxy (apt-get install
#                                         # siege haproxy) and the apps' frameworks: ruby-sinatra,
#                                         # python3-flask, golang-go, ghc libghc-scotty-dev
# Environment: TETRA_PATH (default /tetra/3, or /tetra/3?n=2 for the stand-ins),
# CONC (100), REPS (100), ROUNDS (3).
# Figures: transactions, failed, transactions/s, mean response time, availability.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
need_drover
need node nodejs
need curl
need siege
HAPROXY="$(command -v haproxy || echo /usr/sbin/haproxy)"
[[ -x "$HAPROXY" ]] || die "haproxy is not installed (apt-get install haproxy)"

CONC="${CONC:-100}"
REPS="${REPS:-100}"
NAMES=(SINATRA FLASK EXPRESS GO SCOTTY)

# Starts the five apps of examples/tetra/ (or TETRA_DIR) from a copy in $TMP, so the
# builds (Go, GHC) and Express's node_modules land there, not in the source tree.
start_tetra_apps() {
  local src=$1 dir="$TMP/tetra" i p
  mkdir -p "$dir"
  (cd "$src" && tar --exclude=node_modules -cf - .) | tar -xf - -C "$dir"
  need ruby ruby-sinatra
  need ghc "ghc libghc-scotty-dev"
  need go golang-go
  need python3 python3-flask
  log "building the Go and Scotty apps, npm ci for Express (in $dir)"
  (cd "$dir/go" && go build -o "$dir/tetra-go" .) >&2
  ghc -O -threaded -outputdir "$dir/scotty-build" -o "$dir/tetra-scotty" "$dir/scotty/Main.hs" >"$TMP/ghc.log" 2>&1 \
    || die "ghc failed: $(tail -5 "$TMP/ghc.log")"
  npm ci --prefix "$dir/express" --no-audit --no-fund --loglevel=error >&2
  local cmds=("ruby $dir/sinatra/app.rb" "python3 $dir/flask/app.py" "node $dir/express/app.js" "$dir/tetra-go" "$dir/tetra-scotty")
  BACKENDS=()
  for i in 0 1 2 3 4; do
    p="$(free_port)"
    # shellcheck disable=SC2086 # each command is a program and its script path
    start "app-$i" env PORT="$p" ${cmds[$i]}
    wait_http "http://127.0.0.1:$p/health" "$STARTED" "app-$i" 60
    BACKENDS+=("127.0.0.1:$p")
  done
  log "the five apps (Sinatra Flask Express Go Scotty) on ${BACKENDS[*]}"
}

TETRA_DIR="${TETRA_DIR:-$ROOT/examples/tetra}"
if [[ -n "${TETRA_BACKENDS:-}" ]]; then
  read -r -a BACKENDS <<<"$TETRA_BACKENDS"
  ((${#BACKENDS[@]} == 5)) || die "TETRA_BACKENDS must name five HOST:PORT (Sinatra Flask Express Go Scotty)"
  TETRA_PATH="${TETRA_PATH:-/tetra/3}"
  for b in "${BACKENDS[@]}"; do
    curl -fsS -o /dev/null --max-time 5 "http://$b$TETRA_PATH" || die "$b does not answer $TETRA_PATH"
  done
elif [[ -f "$TETRA_DIR/sinatra/app.rb" && "${STAND_INS:-0}" != 1 ]]; then
  TETRA_PATH="${TETRA_PATH:-/tetra/3}"
  start_tetra_apps "$TETRA_DIR"
else
  log "no examples/tetra/ (or STAND_INS=1): starting five stand-ins from examples/ (not the post's apps)"
  TETRA_PATH="${TETRA_PATH:-/tetra/3?n=2}"
  STANDINS=(js py js py js)
  if command -v go >/dev/null; then
    (cd "$ROOT/examples/go/tetra-server" && go build -o "$TMP/tetra-server" .) && STANDINS[3]=go
  fi
  BACKENDS=()
  for i in 0 1 2 3 4; do
    p="$(free_port)"
    case "${STANDINS[$i]}" in
      js) start "app-$i" env PORT="$p" node "$ROOT/examples/tetra-server.js" ;;
      py) start "app-$i" env PORT="$p" python3 "$ROOT/examples/tetra-server.py" ;;
      go) start "app-$i" env PORT="$p" GOMAXPROCS=1 "$TMP/tetra-server" ;;
    esac
    wait_http "http://127.0.0.1:$p/health" "$STARTED" "app-$i" 30
    BACKENDS+=("127.0.0.1:$p")
  done
  log "stand-ins: ${STANDINS[*]} on ${BACKENDS[*]}"
fi
APP_GROUPS=("${GROUPS_STARTED[@]}")   # the apps stay up across rounds; balancers do not

printf 'json_output = true\nlogging = false\nparser = false\nprotocol = HTTP/1.1\nconnection = close\nlimit = 255\n' >"$TMP/siegerc"

run_one() { # system round
  local sys=$1 round=$2 port pid out b i
  port="$(free_port)"
  GROUPS_STARTED=()
  case "$sys" in
    haproxy)
      local env=(TETRA_LISTEN="127.0.0.1:$port")
      for i in 0 1 2 3 4; do env+=("${NAMES[$i]}=${BACKENDS[$i]}"); done
      start haproxy env "${env[@]}" "$HAPROXY" -db -f "$SEEDS/haproxy-tetra.cfg"
      pid=$STARTED ;;
    drover | drover-rr)
      local args=(proxy --listen "127.0.0.1:$port")
      for b in "${BACKENDS[@]}"; do args+=(-b "$b"); done
      [[ "$sys" == drover-rr ]] && args+=(--strategy round-robin)
      start "$sys" "$DROVER" "${args[@]}"
      pid=$STARTED ;;
  esac
  wait_http "http://127.0.0.1:$port$TETRA_PATH" "$pid" "$sys" 15
  timeout 300 siege -R "$TMP/siegerc" -q -b -c "$CONC" -r "$REPS" "http://127.0.0.1:$port$TETRA_PATH" \
    >"$TMP/siege-$sys-$round.txt" 2>&1 || true
  out="$(node "$SEEDS/parse.js" siege <"$TMP/siege-$sys-$round.txt")"
  log "round $round $sys: $out"
  record "$sys" "$round" "$out"
  stop_all
}

for ((r = 1; r <= ROUNDS; r++)); do
  for sys in $(order_for_round "$r" haproxy drover drover-rr); do run_one "$sys" "$r"; done
done
GROUPS_STARTED=("${APP_GROUPS[@]}")
report transactions failed rps mean_ms availability
