# node_lib.sh: helpers for the multi-process `starling node` tests (sourced
# after lib.sh, not run). Every node runs in the background with its log in
# $SCRATCH/nodeK.log and its data directory $SCRATCH/nodeK; its PID goes into
# PIDS (killed by lib.sh on exit) and NODE_PID[K]. Every wait is bounded by a
# deadline (scaled by $SLOW: 3 under sanitizers) and fails with the tail of
# every node log.

SLOW=1
[ "${ST_SANITIZE:-OFF}" = ON ] && SLOW=3
declare -A NODE_PID=()
KEY=$SCRATCH/cluster.key
"$STARLING" keygen --cluster --out "$KEY" >/dev/null || fail "keygen --cluster"

# The recipe that reaches ~0.88 test accuracy with 4 nodes in ~15 s.
RECIPE=(--model mlp:784-256-128-10 --data fashion-mnist --batch 64 --lr 0.05
        --momentum 0.9 --schedule cosine --device cpu --threads 1)

t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# scaled SECONDS: a deadline in seconds, longer under sanitizers.
scaled() { echo $(($1 * SLOW)); }

node_dir() { echo "$SCRATCH/node$1"; }
node_log() { echo "$SCRATCH/node$1.log"; }

# Prints the tail of every node log (for failure messages).
node_logs_tail() {
  local f
  for f in "$SCRATCH"/node*.log; do
    [ -e "$f" ] || continue
    echo "--- $(basename "$f") (last 15 lines)"
    tail -n 15 "$f"
  done
}

# node_fail MESSAGE: fails with the message and the tail of every node log.
node_fail() {
  echo "FAIL: $* (at $(elapsed) s)" >&2
  node_logs_tail >&2
  exit 1
}

# node_start K FLAGS...: starts node K in the background (its own data
# directory, log and --listen 127.0.0.1:0) with the given extra flags.
node_start() {
  local k=$1
  shift
  "$STARLING" node --listen 127.0.0.1:0 --cluster-key "$KEY" \
    --data-dir "$(node_dir "$k")" --log-every 1 "$@" >>"$(node_log "$k")" 2>&1 &
  NODE_PID[$k]=$!
  PIDS+=("$!")
}

# node_alive K: the process of node K still runs.
node_alive() { kill -0 "${NODE_PID[$1]}" 2>/dev/null; }

# node_status K: `starling status --json` of node K on stdout (status 1 and
# nothing when it does not answer).
node_status() {
  "$STARLING" status --json --data-dir "$(node_dir "$1")" 2>/dev/null
}

# node_peers K: `starling peers --json` of node K.
node_peers() {
  "$STARLING" peers --json --data-dir "$(node_dir "$1")" 2>/dev/null
}

# node_field K KEY: one field of node K's status (KEY may be a.b for a
# nested one; `starling status --field`); status 1 when the node does not
# answer or has no such field.
node_field() {
  "$STARLING" status --data-dir "$(node_dir "$1")" --field "$2" 2>/dev/null
}

# node_up K: waits (deadline) until node K answers on its control socket
# and sets NODE_ADDR to its address.
node_up() {
  local k=$1 deadline=$((SECONDS + $(scaled 20))) a
  NODE_ADDR=
  while [ $SECONDS -lt $deadline ]; do
    node_alive "$k" || node_fail "node $k exited during start-up"
    a=$(node_field "$k" address 2>/dev/null) && [ -n "$a" ] && {
      NODE_ADDR=$a
      return 0
    }
    sleep 0.2
  done
  node_fail "node $k did not answer on its control socket within $(scaled 20) s"
}

# poll_until SECONDS CMD...: runs CMD until it succeeds, every 0.2 s for
# the first 2 s, then every second (a poll costs a process or two, and the
# clusters these tests wait on need every core); status 1 when SECONDS
# (scaled) pass first.
poll_until() {
  local limit=$(scaled "$1")
  shift
  local deadline=$((SECONDS + limit)) polls=0
  while [ $SECONDS -lt $deadline ]; do
    "$@" && return 0
    polls=$((polls + 1))
    if [ $polls -le 10 ]; then sleep 0.2; else sleep 1; fi
  done
  return 1
}

# wait_for SECONDS WHAT CMD...: poll_until, failing naming WHAT.
wait_for() {
  local limit=$1 what=$2
  shift 2
  poll_until "$limit" "$@" || node_fail "$what: not within $(scaled "$limit") s"
}

# agreed_alike K...: nodes K hold the same agreed state (status agreed.id),
# that of the last ring round each took part in. After `settled`, that
# round started when all had ended their epochs: they hold its mean.
agreed_alike() {
  local k id first=
  for k in "$@"; do
    id=$(node_field "$k" agreed.id) || return 1
    [ -n "$first" ] || first=$id
    [ "$id" = "$first" ] || return 1
  done
}

# accurate MIN K...: every node K has a test accuracy of at least MIN.
accurate() {
  local min=$1 k
  shift
  for k in "$@"; do
    ge "$(node_field "$k" test_accuracy)" "$min" || return 1
  done
}

# settled K...: every node K has had a ring round that started after its
# epochs (status ring_final_round): the last steps of all are averaged.
settled() {
  local k
  for k in "$@"; do
    [ "$(node_field "$k" ring_final_round)" = true ] || return 1
  done
}

# node_wait_exit K SECONDS: waits for node K's process to exit; sets
# NODE_STATUS to its exit status. Fails when it does not exit in time.
node_wait_exit() {
  local k=$1 limit=$(scaled "$2")
  local deadline=$((SECONDS + limit))
  while node_alive "$k"; do
    [ $SECONDS -lt $deadline ] || node_fail "node $k did not exit within $limit s"
    sleep 0.2
  done
  NODE_STATUS=0
  wait "${NODE_PID[$k]}" 2>/dev/null || NODE_STATUS=$?
}

# node_leave K: `starling leave` node K and checks that it exits 0 and logs
# an orderly stop.
node_leave() {
  local k=$1
  "$STARLING" leave --data-dir "$(node_dir "$k")" >/dev/null ||
    node_fail "starling leave node $k"
  node_wait_exit "$k" 20
  [ "$NODE_STATUS" -eq 0 ] || node_fail "node $k exited $NODE_STATUS after leave"
  grep -q "stopped: every handle closed" "$(node_log "$k")" ||
    node_fail "node $k: no 'stopped: every handle closed' in its log"
}

# step_over K STEP: node K is past STEP.
step_over() { local s; s=$(node_field "$1" step 2>/dev/null) && [ "$s" -gt "$2" ]; }

# node_state_is K STATE: node K reports STATE.
node_state_is() { [ "$(node_field "$1" state 2>/dev/null)" = "$2" ]; }

# member_state K ID: the state of member ID in node K's peers list ("" when
# it is not there).
member_state() {
  local doc
  doc=$(node_peers "$1") || return 1
  "$NUMPY_PY" -c '
import json, sys
for m in json.loads(sys.argv[1]):
    if m["id"] == sys.argv[2]:
        print(m["state"])' "$doc" "$2"
}

# join_refused WHAT MESSAGE FLAGS...: node 0 runs the recipe (1 epoch,
# shard 0/4) with FLAGS; a node without them that joins it must stop
# within 30 s (scaled) with MESSAGE (grep) in its log. Node 0 is stopped
# after. WHAT names the joiner in the failure.
join_refused() {
  local what=$1 message=$2 joiner deadline
  shift 2
  node_start 0 "${RECIPE[@]}" --epochs 1 --shard 0/4 "$@"
  node_up 0
  "$STARLING" node --listen 127.0.0.1:0 --join "$NODE_ADDR" --cluster-key "$KEY" \
    --data-dir "$SCRATCH/mixed" "${RECIPE[@]}" --epochs 1 --shard 1/4 \
    >"$SCRATCH/mixed.log" 2>&1 &
  joiner=$!
  PIDS+=("$joiner")
  deadline=$((SECONDS + $(scaled 30)))
  while kill -0 "$joiner" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  kill -0 "$joiner" 2>/dev/null && fail "$what still runs in the cluster"
  grep -q -- "$message" "$SCRATCH/mixed.log" ||
    fail "$what: $(tail -3 "$SCRATCH/mixed.log")"
  kill "${NODE_PID[0]}" 2>/dev/null || true
  node_wait_exit 0 30
}

# ge A B: A >= B as numbers (floats allowed).
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 >= b + 0) }'; }
