#!/usr/bin/env bash
# test_node_attach.sh: `starling node --attach` with the C client library,
# as a user gets it: the library installed (cmake --install) and the
# example program (examples/client.c) built against it with pkg-config.
#   (a) no node at the socket, and a built-in node, refuse the example
#       with a sentence naming the socket;
#   (b) two attached nodes, the example on each with its own shard: both
#       reach the accuracy target and the nodes' models agree (their
#       checkpoints, after a leave, within 1% of the norm);
#   (c) a second program on a node with one attached is refused (busy);
#   (d) kill -9 of a program mid-run: the node keeps its parameters, a new
#       program resumes from them (the step goes on) and trains on;
#   (e) kill -9 of the node under a program: the program stops with an
#       error naming the socket;
#   (f) a checkpoint the node cannot take (a built-in model's, or a tensor
#       of another size than its list says) is refused at start, named,
#       and left as it was.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"
source "$(dirname "$0")/install_lib.sh"

BUILD=${ST_BUILD_DIR:?ST_BUILD_DIR: the build directory}
PREFIX=$SCRATCH/prefix
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null || fail "cmake --install"
CLIENT=$SCRATCH/client
client_build_against "$PREFIX" "$CLIENT"
pass "examples/client.c builds against the installed library (pkg-config)"
# The Python package went in beside it and finds the installed library.
python_finds_library "$PREFIX" "$PREFIX"
pass "the installed Python package finds the installed library"

ATTACH=(--attach --gossip-every 0.2 --ring-every 1)

# (a) nobody there; a node without --attach.
expect_fail "(a) no node" 1 "no starling node at $SCRATCH/nowhere.sock" -- \
  "$CLIENT" --socket "$SCRATCH/nowhere.sock" --steps 10
node_start 9 "${RECIPE[@]}" --epochs 1 --shard 0/50
node_up 9
expect_fail "(a) built-in node" 1 "started without --attach" -- \
  "$CLIENT" --socket "$(node_dir 9)/control.sock" --steps 10
kill -9 "${NODE_PID[9]}"

# (b) two nodes, one program each. Node 1 can only join once node 0 is on
# the network, which it is once its first program brought the model.
node_start 0 "${ATTACH[@]}"
wait_for 20 "node 0's control socket" test -S "$(node_dir 0)/control.sock"
"$CLIENT" --socket "$(node_dir 0)/control.sock" --steps 1 >"$SCRATCH/first.out" ||
  node_fail "(b) the first program on node 0"
node_up 0
seed=$NODE_ADDR
node_start 1 "${ATTACH[@]}" --join "$seed"
wait_for 20 "node 1's control socket" test -S "$(node_dir 1)/control.sock"
steps=3000
"$CLIENT" --socket "$(node_dir 0)/control.sock" --shard 0/2 --steps $steps \
  --step-us 500 >"$SCRATCH/p0.out" 2>&1 &
p0=$!
PIDS+=("$p0")
"$CLIENT" --socket "$(node_dir 1)/control.sock" --shard 1/2 --steps $steps \
  --step-us 500 >"$SCRATCH/p1.out" 2>&1 &
p1=$!
PIDS+=("$p1")

# (c) while they run: a second program on node 0 is refused.
# The log already holds the first program's "attached:" line: wait for p0's.
attached_twice() { [ "$(grep -c ") attached:" "$(node_log 0)")" -ge 2 ]; }
wait_for 20 "program 0 attached" attached_twice
expect_fail "(c) second program" 1 "another program is attached" -- \
  "$CLIENT" --socket "$(node_dir 0)/control.sock" --steps 10

wait "$p0" || node_fail "(b) program 0 failed: $(cat "$SCRATCH/p0.out")"
wait "$p1" || node_fail "(b) program 1 failed: $(cat "$SCRATCH/p1.out")"
for k in 0 1; do
  acc=$(sed -n 's/^final loss [0-9.]* accuracy \([0-9.]*\)$/\1/p' "$SCRATCH/p$k.out")
  [ -n "$acc" ] || node_fail "(b) program $k printed no final accuracy: $(tail -3 "$SCRATCH/p$k.out")"
  ge "$acc" 0.70 || node_fail "(b) program $k reached accuracy $acc < 0.70 (the problem's ceiling is ~0.75)"
done
ex=$(node_field 0 exchanges_ok)
pass "(b) two attached programs reach the target; node 0 averaged ($ex exchanges)"

# (d) kill -9 a program mid-run: the node keeps serving, a new one resumes.
"$CLIENT" --socket "$(node_dir 0)/control.sock" --shard 0/2 --steps 100000 \
  --step-us 2000 >"$SCRATCH/p2.out" 2>&1 &
p2=$!
PIDS+=("$p2")
wait_for 20 "program 2 at step 4000" step_over 0 4000
kill -9 "$p2"
wait_for 10 "node 0 noticing program 2's death" grep -q "went away" "$(node_log 0)"
node_alive 0 || node_fail "(d) node 0 died with its program"
before=$(node_field 0 step)
"$CLIENT" --socket "$(node_dir 0)/control.sock" --shard 0/2 \
  --steps $((before + 200)) >"$SCRATCH/p3.out" 2>&1 || node_fail "(d) program 3"
from=$(sed -n 's/^training from step \([0-9]*\) .*/\1/p' "$SCRATCH/p3.out")
[ "$from" = "$before" ] || node_fail "(d) program 3 started at step '$from', the node was at $before"
acc=$(sed -n 's/^training from step [0-9]* .* accuracy \([0-9.]*\)$/\1/p' "$SCRATCH/p3.out")
ge "$acc" 0.70 || node_fail "(d) program 3 started from accuracy $acc: not the node's parameters"
pass "(d) after kill -9 of a program, the next resumes from the node (step $from, accuracy $acc)"

# The two nodes agree (their checkpoints, written at the leave) once a ring
# has run since the last program left (rings every second).
rings=$(node_field 0 ring_rounds_ok)
rings_over() { [ "$(node_field 0 ring_rounds_ok 2>/dev/null)" -gt $((rings + 1)) ]; }
wait_for 20 "two ring rounds after the programs ended" rings_over
for k in 0 1; do node_leave "$k"; done
spread=$("$NUMPY_PY" "$SRC/tests/integration/node_param_spread.py" --all \
  "$(node_dir 0)/checkpoint.safetensors" "$(node_dir 1)/checkpoint.safetensors") ||
  fail "node_param_spread"
ratio=${spread##*ratio=}
ratio=${ratio%% *}
ge 0.01 "$ratio" || fail "(b) the nodes' models differ by $spread"
pass "(b) the nodes' checkpoints agree: $spread"

# (e) the node dies under a program.
node_start 0 "${ATTACH[@]}"
node_up 0
"$CLIENT" --socket "$(node_dir 0)/control.sock" --steps 1000000 --step-us 1000 \
  >"$SCRATCH/p4.out" 2>"$SCRATCH/p4.err" &
p4=$!
PIDS+=("$p4")
wait_for 20 "program 4 attached" grep -q "program (pid $p4) attached" "$(node_log 0)"
kill -9 "${NODE_PID[0]}"
status=0
deadline=$((SECONDS + $(scaled 10)))
while kill -0 "$p4" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
kill -0 "$p4" 2>/dev/null && fail "(e) the program still runs after its node died"
wait "$p4" || status=$?
[ "$status" -eq 1 ] || fail "(e) the program exited $status, want 1"
grep -q "$(node_dir 0)/control.sock" "$SCRATCH/p4.err" ||
  fail "(e) the error does not name the socket: $(cat "$SCRATCH/p4.err")"
pass "(e) the node's death stops the program with: $(cat "$SCRATCH/p4.err")"

# (f) a node started on a checkpoint it cannot take refuses to start,
# naming the file and what is wrong, and changes nothing: one written by a
# built-in model (no attach_model), and one whose tensor is of another size
# than its tensor list says.
"$NUMPY_PY" - "$SCRATCH" <<'PYEOF'
import json, struct, sys
import numpy as np

def write(path, tensors, meta):
    header, blobs, off = {"__metadata__": meta}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

d = sys.argv[1]
w = np.ones((2, 3), dtype=np.float32)
write(d + "/builtin.safetensors", {"w": w}, {"step": "5", "model": "linear:3-2"})
canon = "w\tF32\t2,3\n"  # attach/attach.h, st_attach_model_canonical
write(d + "/resized.safetensors", {"w": np.ones((2, 2), dtype=np.float32)},
      {"step": "5", "attach_model": canon})
PYEOF
for case in builtin resized; do
  dir=$SCRATCH/ck_$case
  mkdir -p "$dir"
  cp "$SCRATCH/$case.safetensors" "$dir/checkpoint.safetensors"
  want="it was not written by an attached node \(no attach_model\)"
  [ "$case" = resized ] && want="tensor 'w' is missing or of another size"
  expect_fail "(f) a checkpoint $case refused at start" 1 \
    "checkpoint $dir/checkpoint.safetensors: .*$want" -- \
    timeout "$(scaled 20)" "$STARLING" node "${ATTACH[@]}" --listen 127.0.0.1:0 \
    --cluster-key "$KEY" --data-dir "$dir"
  cmp -s "$SCRATCH/$case.safetensors" "$dir/checkpoint.safetensors" ||
    fail "(f) the refused checkpoint ($case) was changed"
done
