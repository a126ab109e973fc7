#!/usr/bin/env bash
# test_node_min_nodes.sh: `starling node --min-nodes N` takes no step before
# N nodes are alive (this one included), then trains on.
#   (a) alone, a node with --min-nodes 2 stays at step 0 in state "waiting",
#       says so in its log, and shows "-" (table) and null (JSON) for the
#       loss and accuracy it has not measured;
#   (b) a second node joins with --min-nodes 2: it synchronizes from the
#       waiting one, and both start training, the first only once the
#       second holds its state (a member counts once its STATUS says
#       synced); the waiting one held the same seeded initialization as
#       the joiner, so nothing was sent (state_transfers_held, its log
#       line; about 1 MB fewer bytes in);
#   (d) a third node joins once they train: it fetches their state in
#       full (not held);
#   (c) bad values are refused naming the flag.
# And, with node 0 at hand: a node on the CPU maps no CUDA library.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

# (c) first: no node needed.
expect_fail "--min-nodes 0" 2 "--min-nodes: '0' is not a whole number between 1 and 100000" -- \
  "$STARLING" node --min-nodes 0 --listen 127.0.0.1:0 --cluster-key "$KEY" \
  --data-dir "$SCRATCH/refused" "${RECIPE[@]}"
expect_fail "--min-nodes x" 2 "--min-nodes: 'x' is not a whole number" -- \
  "$STARLING" node --min-nodes x --listen 127.0.0.1:0 --cluster-key "$KEY" \
  --data-dir "$SCRATCH/refused" "${RECIPE[@]}"
pass "(c) bad --min-nodes values exit 2 naming the flag"

# (a) a lone node waits.
node_start 0 "${RECIPE[@]}" --epochs 1 --shard 0/10 --min-nodes 2
node_up 0
seed=$NODE_ADDR
wait_for 20 "the waiting line in node 0's log" \
  grep -q "waiting for 2 nodes before the first step (--min-nodes): 1 alive" "$(node_log 0)"
sleep "$(scaled 2)"
doc=$(node_status 0) || node_fail "(a) status of node 0"
"$NUMPY_PY" - "$doc" <<'EOF' || node_fail "(a) status of the waiting node: $doc"
import json, sys
s = json.loads(sys.argv[1])
assert s["state"] == "waiting", s["state"]
assert s["step"] == 0, s["step"]
assert s["samples"] == 0, s["samples"]
assert s["loss"] is None and s["test_accuracy"] is None, (s["loss"], s["test_accuracy"])
EOF
table=$("$STARLING" status --data-dir "$(node_dir 0)") || node_fail "(a) status table"
grep -qx "loss       -" <<<"$table" || node_fail "(a) the table shows no '-' for the loss: $table"
grep -qx "state      waiting" <<<"$table" || node_fail "(a) the table's state: $table"
pass "(a) alone with --min-nodes 2: state waiting, step 0, loss '-' / null ($(elapsed) s)"
# A node on the CPU maps no CUDA library (the backend is a module loaded
# only for a GPU: ~95 MB of memory saved per CPU node).
! grep -q "libcublas\|libcudart\|libstarling_cuda" "/proc/${NODE_PID[0]}/maps" ||
  node_fail "a --device cpu node maps CUDA libraries"
pass "a CPU node maps no CUDA library"

# (b) the second node: both train.
node_start 1 "${RECIPE[@]}" --epochs 1 --shard 1/10 --min-nodes 2 --join "$seed"
node_up 1
for k in 0 1; do
  wait_for 30 "node $k stepping" step_over "$k" 0
done
grep -q "2 nodes alive and synced (--min-nodes 2): training starts" "$(node_log 0)" ||
  node_fail "(b) node 0 does not log the start"
grep -q "synchronized from" "$(node_log 1)" ||
  node_fail "(b) node 1 did not synchronize from the waiting node"
# Node 1 counts once it holds the state: node 0's start comes after node
# 1's "synchronized from" (the logs' times, in Unix time by their "log
# clock" lines).
"$NUMPY_PY" - "$(node_log 0)" "$(node_log 1)" <<'EOF' || node_fail "(b) node 0 started before node 1 had synced"
import re, sys
def at(path, what):
    text = open(path).read()
    zero = float(re.search(r"log clock: second 0 of this log is Unix time ([0-9.]+)", text).group(1))
    t = float(re.search(r"^\[\s*([0-9.]+) \w+\] .*" + what, text, re.M).group(1))
    return zero + t
start, synced = at(sys.argv[1], "training starts"), at(sys.argv[2], "synchronized from")
print(f"node 1 synced at {synced:.3f}, node 0 started at {start:.3f}")
sys.exit(0 if start >= synced - 0.01 else 1)
EOF
pass "(b) a second node joins: node 0 starts once it has synced; both train ($(elapsed) s)"
grep -q "synchronized from [0-9a-f]* at step 0: it holds this node's own seeded initialization, nothing was sent" \
  "$(node_log 1)" || node_fail "(b) node 1 does not say its state transfer sent nothing"
[ "$(node_field 1 state_transfers)" = 1 ] && [ "$(node_field 1 state_transfers_held)" = 1 ] ||
  node_fail "(b) node 1: state_transfers $(node_field 1 state_transfers), held $(node_field 1 state_transfers_held)"
pass "(b) the joiner held the waiting node's state (its own seeded initialization): nothing sent"

# (d) a later joiner, once the two have trained: a real transfer.
wait_for 30 "node 0 past step 50" step_over 0 50
node_start 2 "${RECIPE[@]}" --epochs 1 --shard 2/10 --join "$seed"
node_up 2
wait_for 30 "node 2 synchronizing" grep -q "synchronized from" "$(node_log 2)"
! grep -q "nothing was sent" "$(node_log 2)" ||
  node_fail "(d) node 2 kept its initialization though the others had trained"
[ "$(node_field 2 state_transfers_held)" = 0 ] || node_fail "(d) node 2 counts a held transfer"
node_leave 2
pass "(d) a node joining a trained cluster fetches the state in full"

node_leave 1
node_leave 0
pass "both left cleanly"
