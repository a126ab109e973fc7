#!/usr/bin/env bash
# chaos.sh: a local starling cluster trained under failures, checked at the
# end (docs/operations.md, "Chaos runs"). Not part of the test command: a
# run takes minutes.
#
#   tools/scripts/chaos.sh [--nodes N] [--minutes M] [--seed S] [--epochs E]
#                  [--dir DIR] [--starling PATH] [--calm S]
#                  [--min-accuracy A] [--max-spread R] [-- NODE_FLAGS...]
#
# Starts N nodes (default 5) on 127.0.0.1, node K training shard K/N of
# Fashion-MNIST for E epochs (default 100 a minute of chaos: about as long
# as the chaos on a 2-core machine; rings every second, gossip every 0.5 s;
# NODE_FLAGS are added to every node's), and for M minutes (default 5)
# does, every 2 to 6
# seconds, one of these to a node drawn at random (the seed S, default 1,
# fixes the sequence):
#   kill     kill -9, restarted 1-5 s later from its data directory (it
#            resumes from its last checkpoint and rejoins through a live
#            node);
#   freeze   SIGSTOP for 1-4 s, then SIGCONT (a paused machine);
#   leave    SIGTERM (an orderly leave), restarted 1-5 s later;
# never more than N - 2 nodes down or frozen at once, and never a node in
# its first second (a signal in the first milliseconds of a process, before
# any of its code runs, kills it like -9). Throughout, a node
# that exits without being told to fails the run. Then calm: every node
# must finish its epochs within S seconds (--calm, default 300) and average
# for 10 s more; then the checks:
#   - every node runs and holds every other node alive;
#   - every node's test accuracy is at least A (--min-accuracy, 0.85);
#   - ring rounds and averaging exchanges completed during the run (the
#     summary also counts the rounds aborted, from every log);
#   - every node leaves cleanly (SIGTERM: exit 0, every handle closed,
#     checkpoint written) and the checkpoints agree: the largest distance
#     between two nodes' parameters is at most R of their norm
#     (--max-spread, default 0.01, as the cluster test's);
#   - no AddressSanitizer or UBSan report in any log (run it with
#     --starling build-asan/starling to have them).
# Prints one line per action and a summary; exits 0 when every check
# passed, 1 naming the first that failed, 2 for bad usage. Logs: DIR/nodeK.log
# (DIR default out/chaos; kept).
set -euo pipefail
cd "$(dirname "$0")/../.."

nodes=5
minutes=5
seed=1
epochs=
dir=out/chaos
starling=build/starling
calm=300
min_acc=0.85
max_spread=0.01
usage() { sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --minutes) minutes=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --starling) starling=$2; shift 2 ;;
    --calm) calm=$2; shift 2 ;;
    --min-accuracy) min_acc=$2; shift 2 ;;
    --max-spread) max_spread=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "chaos.sh: unknown option '$1' (node flags go after --); see tools/scripts/chaos.sh --help" >&2; exit 2 ;;
  esac
done
isnum() { [[ "$1" =~ ^[0-9]+$ ]]; }
isnum "$nodes" && [ "$nodes" -ge 3 ] || { echo "chaos.sh: --nodes wants a number >= 3 (two stay up while one is down)" >&2; exit 2; }
isnum "$minutes" || { echo "chaos.sh: --minutes wants a whole number" >&2; exit 2; }
isnum "$seed" || { echo "chaos.sh: --seed wants a whole number" >&2; exit 2; }
isnum "$calm" || { echo "chaos.sh: --calm wants whole seconds" >&2; exit 2; }
[ -n "$epochs" ] || epochs=$(( minutes > 0 ? 100 * minutes : 100 ))
isnum "$epochs" && [ "$epochs" -ge 1 ] || { echo "chaos.sh: --epochs wants a number >= 1" >&2; exit 2; }
[ -x "$starling" ] || { echo "chaos.sh: no starling at $starling (build it: tools/scripts/setup.sh, or pass --starling PATH)" >&2; exit 2; }
PY=/usr/bin/python3

mkdir -p "$dir"
rm -rf "$dir"/node* "$dir/cluster.key"
"$starling" keygen --cluster --out "$dir/cluster.key" >/dev/null
RANDOM=$seed

declare -a pid state # state: up, down, frozen, gone (killed, to restart)
declare -a back_at   # when a down node comes back, or a frozen one goes on
declare -a started_at # when each node's process was started
kills=0 freezes=0 leaves=0 restarts=0
t0=$(date +%s)
now() { echo $(( $(date +%s) - t0 )); }
say() { printf '[%4d s] %s\n' "$(now)" "$*"; }

stop_all() {
  for ((k = 0; k < nodes; k++)); do
    [ -n "${pid[$k]:-}" ] || continue
    kill -CONT "${pid[$k]}" 2>/dev/null || true
    kill -9 "${pid[$k]}" 2>/dev/null || true
  done
}
failed() {
  echo "chaos.sh: FAILED: $*" >&2
  for ((k = 0; k < nodes; k++)); do
    echo "--- node $k (last 8 lines of $dir/node$k.log)" >&2
    tail -n 8 "$dir/node$k.log" >&2 || true
  done
  stop_all
  exit 1
}
trap 'stop_all; exit 130' INT TERM

status_json() { timeout 5 "$starling" status --json --data-dir "$dir/node$1" 2>/dev/null; }
field() { # field K KEY
  local doc
  doc=$(status_json "$1") || return 1
  $PY -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$doc" "$2"
}

start_node() { # start_node K [--join ADDR]: appends to its log
  local k=$1
  shift
  "$starling" node --listen 127.0.0.1:0 --cluster-key "$dir/cluster.key" \
    --data-dir "$dir/node$k" --shard "$k/$nodes" \
    --model mlp:784-256-128-10 --data fashion-mnist --batch 64 --lr 0.05 \
    --momentum 0.9 --schedule cosine --device cpu --threads 1 --epochs "$epochs" \
    --ring-every 1 --gossip-every 0.5 --checkpoint-every 10 --log-every 10 \
    "$@" "${node_flags[@]}" >>"$dir/node$k.log" 2>&1 &
  pid[$k]=$!
  state[$k]=up
  started_at[$k]=$(date +%s.%N)
}
node_flags=("$@")

live_addr() { # the address of some node that is up
  local k a
  for ((k = 0; k < nodes; k++)); do
    [ "${state[$k]}" = up ] || continue
    a=$(field "$k" address 2>/dev/null) && [ -n "$a" ] && { echo "$a"; return 0; }
  done
  return 1
}

# ---- Start ---------------------------------------------------------------
start_node 0 --min-nodes "$nodes"
seed_addr=
for _ in $(seq 100); do
  seed_addr=$(field 0 address 2>/dev/null) && [ -n "$seed_addr" ] && break
  kill -0 "${pid[0]}" 2>/dev/null || failed "node 0 did not start"
  sleep 0.1
done
[ -n "$seed_addr" ] || failed "node 0 did not answer within 10 s"
for ((k = 1; k < nodes; k++)); do start_node "$k" --join "$seed_addr" --min-nodes "$nodes"; done
say "$nodes nodes started (seed $seed_addr, chaos seed $seed); logs in $dir/nodeK.log"

# Every node that should run still does (an exit nobody asked for fails).
check_running() {
  local k
  for ((k = 0; k < nodes; k++)); do
    case "${state[$k]}" in
      up|frozen)
        kill -0 "${pid[$k]}" 2>/dev/null || {
          wait "${pid[$k]}" 2>/dev/null && rc=0 || rc=$?
          failed "node $k exited on its own (status $rc)"
        } ;;
    esac
  done
}

# ---- Chaos ---------------------------------------------------------------
end=$(( $(date +%s) + minutes * 60 ))
next=$(( $(date +%s) + 2 + RANDOM % 5 ))
while [ "$(date +%s)" -lt "$end" ]; do
  check_running
  t=$(date +%s)
  for ((k = 0; k < nodes; k++)); do
    [ "${back_at[$k]:-0}" -le "$t" ] || continue
    case "${state[$k]}" in
      frozen)
        kill -CONT "${pid[$k]}"; state[$k]=up; say "node $k goes on (SIGCONT)" ;;
      down)
        addr=$(live_addr) || failed "no node up to rejoin through"
        start_node "$k" --join "$addr"; restarts=$((restarts + 1))
        say "node $k restarted, joining through $addr" ;;
    esac
  done
  if [ "$t" -ge "$next" ]; then
    out=0
    for ((k = 0; k < nodes; k++)); do [ "${state[$k]}" = up ] || out=$((out + 1)); done
    k=$((RANDOM % nodes))
    young=$(awk -v s="${started_at[$k]}" -v n="$(date +%s.%N)" 'BEGIN { print (n - s < 1) }')
    if [ "$out" -lt $((nodes - 2)) ] && [ "${state[$k]}" = up ] && [ "$young" = 0 ]; then
      case $((RANDOM % 3)) in
        0)
          kill -9 "${pid[$k]}"; wait "${pid[$k]}" 2>/dev/null || true
          state[$k]=down; back_at[$k]=$((t + 1 + RANDOM % 5)); kills=$((kills + 1))
          say "node $k killed (-9), back in $((back_at[$k] - t)) s" ;;
        1)
          kill -STOP "${pid[$k]}"
          state[$k]=frozen; back_at[$k]=$((t + 1 + RANDOM % 4)); freezes=$((freezes + 1))
          say "node $k frozen (SIGSTOP) for $((back_at[$k] - t)) s" ;;
        2)
          kill -TERM "${pid[$k]}"
          rc=0; wait "${pid[$k]}" 2>/dev/null || rc=$?
          [ "$rc" -eq 0 ] || failed "node $k exited $rc after SIGTERM"
          state[$k]=down; back_at[$k]=$((t + 1 + RANDOM % 5)); leaves=$((leaves + 1))
          say "node $k left (SIGTERM), back in $((back_at[$k] - t)) s" ;;
      esac
    fi
    next=$((t + 2 + RANDOM % 5))
  fi
  sleep 0.2
done

# ---- Calm ----------------------------------------------------------------
for ((k = 0; k < nodes; k++)); do
  case "${state[$k]}" in
    frozen) kill -CONT "${pid[$k]}"; state[$k]=up ;;
    down)
      addr=$(live_addr) || failed "no node up to rejoin through"
      start_node "$k" --join "$addr"; restarts=$((restarts + 1)) ;;
  esac
done
say "chaos over ($kills kills, $freezes freezes, $leaves leaves, $restarts restarts); calm until every node has run its $epochs epochs"
deadline=$(( $(date +%s) + calm ))
while :; do
  check_running
  busy=
  for ((k = 0; k < nodes; k++)); do
    [ "$(field "$k" state 2>/dev/null || echo '?')" = done ] || busy="$busy $k"
  done
  [ -z "$busy" ] && break
  [ "$(date +%s)" -lt "$deadline" ] ||
    failed "nodes$busy still not done after $calm s of calm (raise --calm or lower --epochs)"
  sleep 1
done
say "every node has run its epochs; 10 s more of averaging"
for ((i = 0; i < 10; i++)); do check_running; sleep 1; done

# ---- Checks --------------------------------------------------------------
ids=()
for ((k = 0; k < nodes; k++)); do
  ids[$k]=$(field "$k" id) || failed "node $k does not answer after the calm"
done
ring_ok=0 ring_aborted=0 xchg_ok=0 xchg_failed=0
for ((k = 0; k < nodes; k++)); do
  doc=$(status_json "$k") || failed "node $k does not answer"
  peers=$(timeout 5 "$starling" peers --json --data-dir "$dir/node$k") || failed "node $k: peers does not answer"
  read -r acc rok rab xok xf < <($PY -c '
import json, sys
d = json.loads(sys.argv[1])
print(d["test_accuracy"], d["ring_rounds_ok"], d["ring_rounds_aborted"],
      d["exchanges_ok"], d["exchanges_failed"])' "$doc")
  missing=$($PY -c '
import json, sys
alive = {m["id"] for m in json.loads(sys.argv[1]) if m["state"] == "alive"}
print(" ".join(i[:12] for i in sys.argv[3:] if i != sys.argv[2] and i not in alive))' \
    "$peers" "${ids[$k]}" "${ids[@]}")
  [ -z "$missing" ] || failed "node $k does not hold alive: $missing"
  $PY -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$acc" "$min_acc" ||
    failed "node $k test accuracy $acc < $min_acc"
  say "node $k  test accuracy $acc  rings ok $rok aborted $rab  exchanges ok $xok failed $xf"
  ring_ok=$((ring_ok + rok)); ring_aborted=$((ring_aborted + rab))
  xchg_ok=$((xchg_ok + xok)); xchg_failed=$((xchg_failed + xf))
done
[ "$ring_ok" -gt 0 ] || failed "no ring round completed"
[ "$xchg_ok" -gt 0 ] || failed "no averaging exchange completed"

# Everyone leaves at once; each writes its checkpoint.
for ((k = 0; k < nodes; k++)); do kill -TERM "${pid[$k]}"; done
for ((k = 0; k < nodes; k++)); do
  rc=0; wait "${pid[$k]}" 2>/dev/null || rc=$?
  state[$k]=gone
  [ "$rc" -eq 0 ] || failed "node $k exited $rc at the final leave"
  tail -n 3 "$dir/node$k.log" | grep -q "stopped: every handle closed" ||
    failed "node $k: no orderly stop at the final leave"
done
spread=$($PY tests/integration/node_param_spread.py "$dir"/node*/checkpoint.safetensors) ||
  failed "reading the checkpoints: $spread"
ratio=$(sed -n 's/.*ratio=\([0-9.e+-]*\).*/\1/p' <<<"$spread")
$PY -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$ratio" "$max_spread" ||
  failed "models differ: $spread (want ratio <= $max_spread)"
if grep -l -E "ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer" "$dir"/node*.log >/dev/null; then
  failed "sanitizer report in $(grep -l -E "ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer" "$dir"/node*.log | tr '\n' ' ')"
fi
# The counters start again with each restart; the logs keep every abort.
aborts=$(grep -h -o "aborted after [0-9]* ms: [a-z_]*" "$dir"/node*.log | awk '
  { n++; ms = $3 + 0; if (ms > max) max = ms; why[$5]++ }
  END { printf "%d", n; if (n) { printf " (longest %d ms;", max; for (w in why) printf " %s %d", w, why[w]; printf ")" } }')
say "passed: $kills kills, $freezes freezes, $leaves leaves, $restarts restarts in $minutes min; ring rounds aborted (every log) $aborts; since each node's last start: ring rounds $ring_ok ok, exchanges $xchg_ok ok, $xchg_failed failed; models agree ($spread)"
