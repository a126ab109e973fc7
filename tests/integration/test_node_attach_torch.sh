#!/usr/bin/env bash
# test_node_attach_torch.sh: the acceptance test of "bring your own model"
# (issue 14) with PyTorch: 4 `starling node --attach` on 127.0.0.1, each
# with examples/pytorch_fmnist.py (a CNN with BatchNorm) on its own shard
# K/4 of Fashion-MNIST, all in one run:
#   (a) the four programs attach and train together (--min-nodes 4);
#   (b) kill -9 of program 1 mid-run: node 1 stays, a new program attaches
#       and resumes from node 1's parameters (its step goes on, and the
#       parameters it gets already score >= 0.80, where a fresh model
#       scores ~0.10);
#   (c) kill -9 of node 3 mid-run: its program stops with NodeUnavailable
#       naming the socket; the other nodes go on;
#   (d) programs 0, 1 (restarted) and 2 reach test accuracy >= 0.90 (each
#       stops at the first epoch end at or above it);
#   (e) the three nodes' models agree within 1% of the norm (checkpoints
#       written at their leave, once ring rounds ran after the programs
#       ended: at rest, rounds are plain averaging).
# Took 183 s on the 2-core VM (2026-11-27, a loaded day). Skipped (exit 0,
# saying so) when PyTorch cannot be imported, and in the sanitizer build:
# there PyTorch runs with the ASan runtime preloaded, ~4x slower (every
# tensor over 128 KiB is an mmap and a munmap), and this test ran past 15
# minutes; the node's side of the same faults runs under the sanitizers in
# test_node_attach (the C client), the Python binding's in
# test_python_attach.
source "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
  echo "skipped: $PY cannot import torch (apt-get install python3-torch python3-numpy)"
  exit 0
fi
if [ "${ST_SANITIZE:-OFF}" = ON ]; then
  echo "skipped under the sanitizers: whole-run PyTorch training (the plain build runs it;"
  echo "test_node_attach and test_python_attach cover the same paths under ASan)"
  exit 0
fi
source "$(dirname "$0")/node_lib.sh"

BUILD=${ST_BUILD_DIR:-$(dirname "$STARLING")}
LIB=$BUILD/libstarling.so
[ -e "$LIB" ] || fail "no client library at $LIB (set ST_BUILD_DIR to the build directory)"

# The programs' environment.
PYENV=(env STARLING_LIB="$LIB" PYTHONPATH="$SRC/client/python" OPENBLAS_NUM_THREADS=1
       PYTHONDONTWRITEBYTECODE=1)

# The recipe: 4 programs on 2 cores, one thread each (~10 s an epoch of a
# shard on a quiet machine), reached 0.90 at the 5th to 7th epoch end of 8
# in this test's runs with plain averaging (0.908 at the 8th when all four
# run every epoch); lr 0.05, the example's default, stalls near 0.88. The
# nodes take the outer optimizer's step on their ring rounds (--outer
# nesterov, docs/compression.md): the programs then reached 0.90 at the
# 3rd to 5th epoch end (bench_attach_ddp.sh: 4 to 6 epochs against the
# mean's 6 to 8), which shortens the test, and the outer step runs here
# through program kills and a node's death.
TARGET=0.90
TRAIN=(--epochs 8 --batch 64 --lr 0.02 --momentum 0.9 --schedule cosine
       --threads 1 --target "$TARGET" --log-every 50)
ATTACH=(--attach --min-nodes 4 --gossip-every 0.2 --ring-every 1 --outer nesterov)
declare -A PROG=()

# prog_start K NAME [ARGS...]: the example on node K (shard K/4) in the
# background, its output in $SCRATCH/NAME.out, its results NAME.json and
# NAME.npy; its PID in PROG[NAME].
prog_start() {
  local k=$1 name=$2
  shift 2
  "${PYENV[@]}" "$PY" "$SRC/examples/pytorch_fmnist.py" \
    --socket "$(node_dir "$k")/control.sock" --shard "$k/4" "${TRAIN[@]}" \
    --json-out "$SCRATCH/$name.json" --save-params "$SCRATCH/$name.npy" "$@" \
    >"$SCRATCH/$name.out" 2>&1 &
  PROG[$name]=$!
  PIDS+=("$!")
}

# prog_fail NAME MESSAGE: fails with the program's output and the node logs.
prog_fail() {
  echo "--- $1.out (last 15 lines)" >&2
  tail -n 15 "$SCRATCH/$1.out" >&2
  node_fail "$2"
}

# prog_wait NAME SECONDS: waits for program NAME to exit; sets PROG_STATUS.
prog_wait() {
  local pid=${PROG[$1]} deadline=$((SECONDS + $(scaled "$2")))
  while kill -0 "$pid" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || prog_fail "$1" "program $1 still runs after $(scaled "$2") s"
    sleep 0.5
  done
  PROG_STATUS=0
  wait "$pid" || PROG_STATUS=$?
}

address_bound() { # address_bound K: node K listens (not "HOST:0")
  local a
  a=$(node_field "$1" address 2>/dev/null) && [ -n "$a" ] && [ "${a##*:}" != 0 ]
}

# ---- (a) start: node 0 opens its port once its program brought the model --------
node_start 0 "${ATTACH[@]}"
wait_for 20 "node 0's control socket" test -S "$(node_dir 0)/control.sock"
prog_start 0 p0
wait_for 120 "node 0 listening (program 0 attached)" address_bound 0
seed=$(node_field 0 address)
for k in 1 2 3; do
  node_start "$k" "${ATTACH[@]}" --join "$seed"
  wait_for 20 "node $k's control socket" test -S "$(node_dir "$k")/control.sock"
  prog_start "$k" "p$k"
done
for k in 0 1 2 3; do
  wait_for 120 "program $k attached" grep -qs '^attached: ' "$SCRATCH/p$k.out"
done
pass "(a) 4 programs attached to 4 nodes ($(elapsed) s)"

# ---- (b) kill -9 program 1 mid-run; a new one resumes from node 1 -----------------
wait_for 180 "node 1 past step 300" step_over 1 300
kill -9 "${PROG[p1]}"
wait "${PROG[p1]}" 2>/dev/null || true # reaped here: no "Killed" line
wait_for 10 "node 1 noticing program 1's death" grep -q "went away" "$(node_log 1)"
node_alive 1 || node_fail "(b) node 1 died with its program"
before=$(node_field 1 step)
prog_start 1 p1b --eval-at-attach
wait_for 120 "the restarted program's first evaluation" grep -qs '^at attach: ' "$SCRATCH/p1b.out"
line=$(grep '^at attach: ' "$SCRATCH/p1b.out")
from=$(sed -n 's/^at attach: step \([0-9]*\) test acc.*/\1/p' <<<"$line")
acc=$(sed -n 's/^at attach: step [0-9]* test acc \([0-9.]*\)$/\1/p' <<<"$line")
[ -n "$from" ] && [ "$from" -ge "$before" ] ||
  prog_fail p1b "(b) the restarted program started at step '$from'; node 1 was at $before"
ge "$acc" 0.80 ||
  prog_fail p1b "(b) the restarted program's first parameters score $acc: not node 1's"
pass "(b) kill -9 of program 1 at step $before; the new one resumed at step $from, test acc $acc ($(elapsed) s)"

# ---- (c) kill -9 node 3 mid-run: its program fails, the others go on -------------
wait_for 180 "node 3 past step 600" step_over 3 600
kill -9 "${NODE_PID[3]}"
wait "${NODE_PID[3]}" 2>/dev/null || true
# The program notices at its next step boundary (the client polls the socket
# every 0.1 s there). The kill may land during its epoch-end evaluation of
# the 10,000 test images, which took 15-30 s on the loaded 2-core CI machine
# (four programs, four nodes and other tests at once): hence 120 s.
prog_wait p3 120
[ "$PROG_STATUS" -ne 0 ] || prog_fail p3 "(c) program 3 exited 0 after its node was killed"
grep -q "NodeUnavailable" "$SCRATCH/p3.out" ||
  prog_fail p3 "(c) program 3 did not stop with starling.NodeUnavailable"
grep -q "$(node_dir 3)/control.sock" "$SCRATCH/p3.out" ||
  prog_fail p3 "(c) program 3's error does not name the socket"
for k in 0 1 2; do node_alive "$k" || node_fail "(c) node $k died with node 3"; done
pass "(c) kill -9 of node 3: $(grep -m1 NodeUnavailable "$SCRATCH/p3.out" | cut -c1-160)"

# ---- (d) the three others reach the target ----------------------------------------
for name in p0 p1b p2; do
  prog_wait "$name" 240
  [ "$PROG_STATUS" -eq 0 ] || prog_fail "$name" "(d) program $name exited $PROG_STATUS"
  acc=$(json_field "$SCRATCH/$name.json" test_accuracy)
  steps=$(json_field "$SCRATCH/$name.json" steps)
  ge "$acc" "$TARGET" ||
    prog_fail "$name" "(d) program $name ended at step $steps with test accuracy $acc < $TARGET"
  echo "  $name: test accuracy $acc at step $steps"
done
pass "(d) programs 0, 1 (restarted) and 2 reached $TARGET ($(elapsed) s)"
# For the record: how far apart the programs' own final parameters are
# (they stop at their own epoch ends, so they need not agree).
"$NUMPY_PY" -c '
import sys, numpy as np
v = [np.load(p).astype(np.float64) for p in sys.argv[1:]]
d = max(np.linalg.norm(a - b) for i, a in enumerate(v) for b in v[i + 1:])
print("  the programs final parameters: max pairwise l2 %.4g, norm %.4g" % (d, np.linalg.norm(v[0])))' \
  "$SCRATCH/p0.npy" "$SCRATCH/p1b.npy" "$SCRATCH/p2.npy"

# ---- (e) the nodes agree ----------------------------------------------------------
rings=$(node_field 0 ring_rounds_ok)
rings_over() { [ "$(node_field 0 ring_rounds_ok 2>/dev/null)" -gt $((rings + 1)) ]; }
wait_for 60 "two ring rounds after the programs ended" rings_over
for k in 0 1 2; do node_leave "$k"; done
spread=$("$NUMPY_PY" "$SRC/tests/integration/node_param_spread.py" --all \
  "$(node_dir 0)/checkpoint.safetensors" "$(node_dir 1)/checkpoint.safetensors" \
  "$(node_dir 2)/checkpoint.safetensors") || fail "node_param_spread"
ratio=${spread##*ratio=}
ratio=${ratio%% *}
ge 0.01 "$ratio" || fail "(e) the nodes' models differ by $spread"
pass "(e) the nodes' checkpoints agree: $spread ($(elapsed) s)"
