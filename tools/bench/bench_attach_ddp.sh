#!/usr/bin/env bash
# bench_attach_ddp.sh: time to a test accuracy of 0.90 for the example CNN
# (examples/pytorch_fmnist.py) on 4 attached starling nodes against PyTorch
# DistributedDataParallel (gloo, 4 processes, tools/bench/ddp_fmnist_cnn.py)
# in the same run, as a ratio (docs/benchmarks.md), on two kinds of links:
#
#   loopback  127.0.0.1
#   netns     (NETNS=1; root) each node (starling) or rank (DDP) in its own
#             network namespace on a bridge, every veth end shaped by
#             `tbf rate $RATE burst 64kb latency 50ms` (100mbit, MTU 1500
#             by default); the programs talk to their node through its
#             Unix socket, which no namespace separates
#
# Both sides: the example's CNN, data and loop (ddp_fmnist_cnn.py imports
# them from the example): strided shards K/4 of Fashion-MNIST, per-process
# batch $BATCH, SGD momentum 0.9, lr $LR, cosine over $EPOCHS epochs of the
# shard, one thread per process (torch.set_num_threads(1),
# OPENBLAS_NUM_THREADS=1), the test set evaluated at every epoch end (each
# starling program evaluates its own model; DDP's rank 0 its one model while
# the others wait). A starling program stops at the first epoch end at or
# above the target; DDP stops every rank at rank 0's.
#
# The clock starts when the first process is launched and stops when the
# last one has exited: start-up (importing torch, reading the data,
# attaching, the rendezvous) counts on both sides. starling's time needs
# every program at the target; a run where one ends below it (or runs past
# TIMEOUT) is reported as such, not timed.
#
#   tools/bench/bench_attach_ddp.sh                       loopback, and netns when root
#   REPEATS=3 tools/bench/bench_attach_ddp.sh
#   NETNS=0 tools/bench/bench_attach_ddp.sh               loopback only
#   LOOPBACK=0 RATE=100mbit tools/bench/bench_attach_ddp.sh   shaped links only
#   SETUP=0 EPOCHS=1 TARGET=0.8 tools/bench/bench_attach_ddp.sh   a quick check
#   DEVICE=cuda PY=python3 tools/bench/bench_attach_ddp.sh   every process on the GPU
#   HIDDEN=256 LOOPBACK=0 tools/bench/bench_attach_ddp.sh      the CNN with a wider head
#
# HIDDEN (default 0) is the example's --hidden on both sides: a hidden
# fully connected layer of that width before the output (256: 0.42M
# parameters instead of 21k), a model whose traffic loads 100 Mbit/s links.
#
# NODE_ARGS (default "--gossip-every 0.2 --ring-every 1") go to every
# `starling node --attach`. Installs what is missing (python3-torch,
# iproute2) and builds through tools/scripts/setup.sh (SETUP=0 skips it).
# Every process is killed by PID, every namespace removed by name, on exit.
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

WORLD=4
TARGET=${TARGET:-0.90}
EPOCHS=${EPOCHS:-8}
BATCH=${BATCH:-64}
LR=${LR:-0.02}
HIDDEN=${HIDDEN:-0}
REPEATS=${REPEATS:-1}
TIMEOUT=${TIMEOUT:-400}
RATE=${RATE:-100mbit}
MTU=${MTU:-1500}
LOOPBACK=${LOOPBACK:-1}
SETUP=${SETUP:-1}
NODE_ARGS=${NODE_ARGS:-"--gossip-every 0.2 --ring-every 1"}
DEVICE=${DEVICE:-cpu}
PY=${PY:-/usr/bin/python3}
build=${ST_BUILD_DIR:-build}
S=$build/starling
LIB=$build/libstarling.so
if [ -z "${NETNS:-}" ]; then
  NETNS=0
  if [ "$(id -u)" -eq 0 ] && ip netns list >/dev/null 2>&1; then NETNS=1; fi
fi

tag=a$$      # namespaces st-att-a$$-R and the bridge st-att-a$$-br
work=$(mktemp -d)
pids=()      # what a run waits for: its programs, or its DDP ranks
node_pids=() # the run's starling nodes
up_ns=()

# ---- Namespaces: bench_lib.sh's, named st-att-* ------------------
ns_up() { bench_ns_up st-att "$@"; }     # TAG N
ns_down() { bench_ns_down st-att "$@"; } # TAG N

kill_all() { # every process of the run, by PID
  local p
  for p in "${pids[@]:-}" "${node_pids[@]:-}"; do
    [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
  done
  for p in "${pids[@]:-}" "${node_pids[@]:-}"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null || true
  done
  pids=()
  node_pids=()
}
# shellcheck disable=SC2317 # run by the trap
cleanup() {
  kill_all
  for x in "${up_ns[@]:-}"; do [ -n "$x" ] && ns_down "${x% *}" "${x#* }"; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- Setup ----------------------------------------------------------------------
if [ "$SETUP" = 1 ]; then
  bench_setup "$build" python3-torch python3-numpy libopenblas0-pthread iproute2
fi
for f in "$S" "$LIB"; do
  [ -e "$f" ] || { echo "bench_attach_ddp: $f is missing (build first)" >&2; exit 1; }
done
"$PY" -c 'import torch' || { echo "bench_attach_ddp: $PY cannot import torch" >&2; exit 1; }
"$S" keygen --cluster --out "$work/ck" >/dev/null

TRAIN=(--epochs "$EPOCHS" --batch "$BATCH" --lr "$LR" --momentum 0.9 --hidden "$HIDDEN"
       --schedule cosine --threads 1 --seed 1 --device "$DEVICE")
now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.2f", a - b }'; }
# ns_prefix LINK R: sets NSP to the words that run a command in rank R's
# namespace on netns links (none on loopback). A prefix, not a function: a
# command started with & must be the process itself, so that its PID is
# the one killed on exit (ip netns exec execs the command).
ns_prefix() {
  NSP=()
  if [ "$1" = netns ]; then NSP=(ip netns exec "st-att-$tag-$2"); fi
}
host_of() { # host_of LINK R: rank R's address
  if [ "$1" = netns ]; then echo "10.77.0.$(($2 + 1))"; else echo 127.0.0.1; fi
}

# wait_procs SECONDS: waits for every PID in pids to exit; sets END[i]
# (seconds since T0, polled every 0.1 s) and RC[i]. Past SECONDS: kills
# everything and returns 1.
wait_procs() {
  local limit=$1 i left
  END=()
  RC=()
  while :; do
    left=0
    for i in "${!pids[@]}"; do
      [ -n "${RC[$i]:-}" ] && continue
      if kill -0 "${pids[$i]}" 2>/dev/null; then
        left=$((left + 1))
        continue
      fi
      END[$i]=$(since "$T0")
      RC[$i]=0
      wait "${pids[$i]}" 2>/dev/null || RC[$i]=$?
    done
    [ $left -eq 0 ] && break
    if awk -v s="$(since "$T0")" -v t="$limit" 'BEGIN { exit !(s > t) }'; then
      kill_all
      return 1
    fi
    sleep 0.1
  done
  pids=()
}

# ---- DDP ------------------------------------------------------------------------

# run_ddp LINK: sets RESULT to "SECONDS STEPS ACCURACY", or what went wrong.
# (Not printed: the runs stay in this shell, not a $(...) subshell, so that
# its trap knows every PID.)
run_ddp() {
  local link=$1 r port=$((29500 + RANDOM % 1000)) ifname=lo
  [ "$link" = netns ] && ifname=eth0
  rm -f "$work/ddp.json"
  T0=$(now)
  for ((r = 0; r < WORLD; r++)); do
    ns_prefix "$link" "$r"
    "${NSP[@]}" env GLOO_SOCKET_IFNAME=$ifname OPENBLAS_NUM_THREADS=1 \
      PYTHONPATH=client/python "$PY" tools/bench/ddp_fmnist_cnn.py --rank "$r" \
      --world "$WORLD" --master "$(host_of "$link" 0):$port" --target "$TARGET" \
      --t0 "$T0" --json-out "$work/ddp.json" "${TRAIN[@]}" >"$work/ddp$r.log" 2>&1 &
    pids+=($!)
  done
  wait_procs "$TIMEOUT" || { RESULT="TIMEOUT after $TIMEOUT s"; return; }
  for r in "${!RC[@]}"; do
    [ "${RC[$r]}" = 0 ] || { RESULT="FAILED (rank $r: $(tail -1 "$work/ddp$r.log"))"; return; }
  done
  RESULT=$("$PY" - "$work/ddp.json" "${END[@]}" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
if d["time_to_target_s"] is None:
    print("BELOW the target: %.4f after %d steps" % (d["test_accuracy"], d["steps"]))
else:
    print("%.2f %d %.4f" % (max(map(float, sys.argv[2:])), d["steps"], d["test_accuracy"]))
EOF
)
}

# ---- starling -------------------------------------------------------------------

wait_socket() { # wait_socket K: node K answers on its control socket (20 s)
  local _
  for _ in $(seq 200); do
    "$S" status --data-dir "$work/s/n$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "bench_attach_ddp: node $1 did not start: $(tail -3 "$work/s/n$1.log")" >&2
  return 1
}

bound_address() { # node 0's HOST:PORT once it listens (its program attached; 60 s)
  local a _
  for _ in $(seq 600); do
    a=$("$S" status --json --data-dir "$work/s/n0" 2>/dev/null |
      "$PY" -c 'import json, sys; print(json.load(sys.stdin)["address"])' 2>/dev/null) || a=
    [ -n "$a" ] && [ "${a##*:}" != 0 ] && { echo "$a"; return 0; }
    sleep 0.1
  done
  return 1
}

# start_node LINK K [--join ADDR]: one attached node, in its namespace on
# netns links; start_prog K: its program (beside it: they talk through the
# node's Unix socket).
start_node() {
  local link=$1 k=$2
  shift 2
  ns_prefix "$link" "$k"
  # shellcheck disable=SC2086 # NODE_ARGS: words on purpose
  "${NSP[@]}" "$S" node --attach --listen "$(host_of "$link" "$k"):0" \
    --cluster-key "$work/ck" --data-dir "$work/s/n$k" --min-nodes "$WORLD" \
    --log-every 0 --checkpoint-every 0 $NODE_ARGS "$@" >"$work/s/n$k.log" 2>&1 &
  node_pids+=($!)
  wait_socket "$k"
}
start_prog() {
  local k=$1
  env STARLING_LIB="$LIB" PYTHONPATH=client/python OPENBLAS_NUM_THREADS=1 \
    "$PY" examples/pytorch_fmnist.py --socket "$work/s/n$k/control.sock" \
    --shard "$k/$WORLD" --target "$TARGET" --log-every 100000 \
    --json-out "$work/s/p$k.json" "${TRAIN[@]}" >"$work/s/p$k.log" 2>&1 &
  pids+=($!)
}

# run_starling LINK: sets RESULT to "SECONDS STEPS ACCURACY" (the last
# program's end, the most steps, the lowest accuracy), or what went wrong.
run_starling() {
  local link=$1 k seed
  rm -rf "$work/s"
  mkdir -p "$work/s"
  T0=$(now)
  start_node "$link" 0 || { kill_all; RESULT="FAILED (node 0)"; return; }
  start_prog 0
  seed=$(bound_address) || { kill_all; RESULT="FAILED (node 0 never listened)"; return; }
  for ((k = 1; k < WORLD; k++)); do
    start_node "$link" "$k" --join "$seed" || { kill_all; RESULT="FAILED (node $k)"; return; }
    start_prog "$k"
  done
  wait_procs "$TIMEOUT" || { RESULT="TIMEOUT after $TIMEOUT s"; return; }
  kill_all # the nodes
  for k in "${!RC[@]}"; do
    [ "${RC[$k]}" = 0 ] || { RESULT="FAILED (program $k: $(tail -1 "$work/s/p$k.log"))"; return; }
  done
  RESULT=$("$PY" - "$TARGET" "$work/s" "${END[@]}" <<'EOF'
import json, sys
target, d, ends = float(sys.argv[1]), sys.argv[2], [float(e) for e in sys.argv[3:]]
r = [json.load(open("%s/p%d.json" % (d, k))) for k in range(len(ends))]
low, steps = min(x["test_accuracy"] for x in r), max(x["steps"] for x in r)
if low < target:
    print("BELOW the target: lowest %.4f after %d steps" % (low, steps))
else:
    print("%.2f %d %.4f" % (max(ends), steps, low))
EOF
)
}

# ---- The table ------------------------------------------------------------------

# link_bytes LINK: bytes the members have sent on their shaped links so far
# (0 on loopback), to show that the run's traffic crossed them.
link_bytes() {
  local r sum=0 b
  if [ "$1" = netns ]; then
    for ((r = 0; r < WORLD; r++)); do
      b=$(ip -n "st-att-$tag-$r" -s link show dev eth0 | awk '/TX:/ { getline; print $1; exit }')
      sum=$((sum + b))
    done
  fi
  echo "$sum"
}

row() { printf '%-16s %-20s %9s %7s %9s %10s\n' "$@"; }
result_row() { # LINK SYSTEM RESULT BYTES
  local mb=-
  [ "$1" = loopback ] || mb=$(awk -v b="$4" 'BEGIN { printf "%.1f", b / 1e6 }')
  case "$3" in
    [0-9]*) row "$1" "$2" $3 "$mb" ;;
    *) printf '%-16s %-20s %s\n' "$1" "$2" "$3" ;;
  esac
}

run_link() { # LINK GOAL: REPEATS x (DDP, then starling), each pair's ratio
  local link=$1 goal=$2 label=$1 rep ddp st b0
  if [ "$link" = netns ]; then
    label="netns $RATE"
    ns_up "$tag" "$WORLD"
  fi
  for ((rep = 1; rep <= REPEATS; rep++)); do
    b0=$(link_bytes "$link")
    run_ddp "$link"
    ddp=$RESULT
    result_row "$label" "ddp gloo x$WORLD (#$rep)" "$ddp" $(($(link_bytes "$link") - b0))
    b0=$(link_bytes "$link")
    run_starling "$link"
    st=$RESULT
    result_row "$label" "starling x$WORLD (#$rep)" "$st" $(($(link_bytes "$link") - b0))
    case "$ddp/$st" in
      [0-9]*/[0-9]*)
        awk -v s="${st%% *}" -v d="${ddp%% *}" -v g="$goal" \
          'BEGIN { printf "  starling / ddp wall time: %.2f (goal <= %s)\n", s / d, g }' ;;
    esac
  done
  if [ "$link" = netns ]; then
    ns_down "$tag" "$WORLD"
    up_ns=()
  fi
}

echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "torch:   $("$PY" -c 'import torch; print(torch.__version__)'); load $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
echo "recipe:  ${TRAIN[*]}; $WORLD processes on shards K/$WORLD; target $TARGET"
echo "nodes:   starling node --attach --min-nodes $WORLD --checkpoint-every 0 $NODE_ARGS"
echo
row link system seconds steps accuracy "MB on links"
if [ "$LOOPBACK" = 1 ]; then run_link loopback 0.9; fi
if [ "$NETNS" = 1 ]; then
  echo "netns: tbf $RATE each way per link, MTU $MTU"
  run_link netns 0.5
fi
