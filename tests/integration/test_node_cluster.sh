#!/usr/bin/env bash
# test_node_cluster.sh: four `starling node` processes on loopback, each
# training a disjoint quarter of Fashion-MNIST and averaging by gossip and
# ring all-reduce (on by default), the nodes sending over 1, 2, 3 and 1
# ring lanes (--ring-lanes: each receiver learns its neighbour's count from
# the lanes' first message). All of them must finish their epochs with a good test accuracy, having
# averaged with each other, see each other alive, leave in order on
# `starling leave`, and write checkpoints whose parameters (read with NumPy)
# agree to within 1% of their norm. Also the control commands' and the
# node's errors when nothing runs or a flag is wrong.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

# --- Errors before any node runs ------------------------------------------------
expect_fail "status with no node" 1 "no node is running at '$SCRATCH/none/control.sock'" -- \
  "$STARLING" status --data-dir "$SCRATCH/none"
expect_fail "peers with no node" 1 "no node is running" -- \
  "$STARLING" peers --json --data-dir "$SCRATCH/none"
expect_fail "leave with no node" 1 "no node is running" -- \
  "$STARLING" leave --data-dir "$SCRATCH/none"
expect_fail "ring lanes out of range" 2 "--ring-lanes: '9' is not a whole number between 1 and 8" -- \
  "$STARLING" node --ring-lanes 9
"$STARLING" node --help >"$SCRATCH/help" || fail "node --help exits non-zero"
for flag in --listen --join --cluster-key --data-dir --gossip-every --checkpoint-every --model; do
  grep -q -- "$flag" "$SCRATCH/help" || fail "node --help does not mention $flag"
done
pass "node --help"
expect_fail "node without --cluster-key" 2 "--cluster-key FILE is required" -- \
  "$STARLING" node --listen 127.0.0.1:0 --data-dir "$SCRATCH/x" "${RECIPE[@]}"
expect_fail "node without --listen" 2 "--listen HOST:PORT is required" -- \
  "$STARLING" node --cluster-key "$KEY" --data-dir "$SCRATCH/x" "${RECIPE[@]}"
expect_fail "node without --data-dir" 2 "--data-dir DIR is required" -- \
  "$STARLING" node --listen 127.0.0.1:0 --cluster-key "$KEY" "${RECIPE[@]}"
expect_fail "node with an unknown option" 2 "unknown option '--bogus'" -- \
  "$STARLING" node --listen 127.0.0.1:0 --cluster-key "$KEY" --data-dir "$SCRATCH/x" --bogus
expect_fail "--listen without a port" 1 "--listen: 'localhost' is not HOST:PORT" -- \
  "$STARLING" node --listen localhost --cluster-key "$KEY" --data-dir "$SCRATCH/x" "${RECIPE[@]}"
expect_fail "--listen port out of range" 1 "--listen: '127.0.0.1:70000': the port is not a number" -- \
  "$STARLING" node --listen 127.0.0.1:70000 --cluster-key "$KEY" --data-dir "$SCRATCH/x" "${RECIPE[@]}"
expect_fail "--listen with a name that does not resolve" 1 "--listen: 'node.example:7946': 'node.example' is neither an IPv4 or IPv6 address nor a host name" -- \
  "$STARLING" node --listen node.example:7946 --cluster-key "$KEY" --data-dir "$SCRATCH/x" "${RECIPE[@]}"
expect_fail "--join with a bad address" 1 "--join: '127.0.0.1' is not HOST:PORT" -- \
  "$STARLING" node --listen 127.0.0.1:0 --join 127.0.0.1 --cluster-key "$KEY" \
  --data-dir "$SCRATCH/x" "${RECIPE[@]}"
expect_fail "missing cluster key file" 1 "$SCRATCH/nokey" -- \
  "$STARLING" node --listen 127.0.0.1:0 --cluster-key "$SCRATCH/nokey" --data-dir "$SCRATCH/x" "${RECIPE[@]}"

# --- A cluster of four ------------------------------------------------------------
N=4
node_start 0 "${RECIPE[@]}" --epochs 10 --shard 0/$N --ring-lanes 1
node_up 0
seed=$NODE_ADDR
for k in 1 2 3; do
  node_start "$k" "${RECIPE[@]}" --epochs 10 --shard "$k/$N" --join "$seed" \
    --ring-lanes $((k % 3 + 1))
done
for k in 1 2 3; do node_up "$k"; done
pass "4 nodes up (seed $seed) at $(elapsed) s"

# The listen address is taken: a fifth node on it fails to bind, clearly.
expect_fail "--listen on a port in use" 1 "cannot listen on TCP $seed: address already in use; .*pick another with --listen" -- \
  "$STARLING" node --listen "$seed" --cluster-key "$KEY" --data-dir "$SCRATCH/x" "${RECIPE[@]}"

for k in 1 2 3; do
  grep -q "synchronized from [0-9a-f]* at step" "$(node_log "$k")" ||
    wait_for 30 "node $k synchronizing from a peer" grep -q "synchronized from [0-9a-f]* at step" "$(node_log "$k")"
done
pass "nodes 1..3 synchronized their initial state from a peer"

all_done() {
  local k
  for ((k = 0; k < N; k++)); do
    node_alive "$k" || node_fail "node $k exited while training"
    node_state_is "$k" done || return 1
  done
}
wait_for 150 "every node reaching state done" all_done
pass "every node ran its epochs at $(elapsed) s"

# The final ring rounds (each node is idle now, only averaging), and the
# accuracy at the end of the epochs or a fresh evaluation (every 5 s by
# default) after those rounds; the checks below say which fell short.
at_rest() { settled 0 1 2 3 && accurate 0.87 0 1 2 3; }
poll_until 6 at_rest || true

for ((k = 0; k < N; k++)); do
  node_status "$k" >"$SCRATCH/status$k.json" || node_fail "status of node $k"
  acc=$(json_field "$SCRATCH/status$k.json" test_accuracy)
  ok=$(json_field "$SCRATCH/status$k.json" exchanges_ok)
  st=$(json_field "$SCRATCH/status$k.json" state)
  step=$(json_field "$SCRATCH/status$k.json" step)
  alive=$(json_field "$SCRATCH/status$k.json" peers_alive)
  echo "  node $k: state $st step $step test_accuracy $acc exchanges_ok $ok peers_alive $alive"
  [ "$st" = done ] || node_fail "node $k: state $st after done"
  ge "$acc" 0.87 || node_fail "node $k: test accuracy $acc < 0.87"
  [ "$ok" -gt 0 ] || node_fail "node $k: no exchange succeeded"
  rings=$(json_field "$SCRATCH/status$k.json" ring_rounds_ok)
  [ "$rings" -gt 0 ] || node_fail "node $k: no ring round completed (rings are on by default)"
  [ "$alive" -eq 3 ] || node_fail "node $k: $alive peers alive, want 3"
  node_peers "$k" >"$SCRATCH/peers$k.json" || node_fail "peers of node $k"
  "$NUMPY_PY" - "$SCRATCH/peers$k.json" "$(json_field "$SCRATCH/status$k.json" id)" <<'PY' ||
import json, sys
ms = json.load(open(sys.argv[1]))
assert len(ms) == 4, "%d members: %s" % (len(ms), ms)
assert len({m["id"] for m in ms}) == 4, "duplicate ids: %s" % ms
assert all(m["state"] == "alive" for m in ms), [m["state"] for m in ms]
selves = [m for m in ms if m["self"]]
assert len(selves) == 1 and selves[0]["id"] == sys.argv[2], selves
assert all(m["address"].startswith("127.0.0.1:") for m in ms), ms
others = [m for m in ms if not m["self"]]
assert all(m["step"] > 0 for m in others), "no status records: %s" % others
assert all(m["last_heard_s"] is not None and m["last_heard_s"] < 10 for m in others), others
PY
    node_fail "node $k: peers --json: $(cat "$SCRATCH/peers$k.json")"
done
pass "every node: test accuracy >= 0.87, exchanges and ring rounds ok > 0, 4 alive members"

# The table forms answer too.
"$STARLING" status --data-dir "$(node_dir 0)" | grep -q "^state      done" ||
  node_fail "status (table) of node 0"
"$STARLING" peers --data-dir "$(node_dir 0)" | grep -c " alive " | grep -qx 4 ||
  node_fail "peers (table) of node 0"
pass "status and peers tables"

# One value for scripts: status --field KEY (a.b nested).
[ "$("$STARLING" status --data-dir "$(node_dir 0)" --field state)" = done ] ||
  node_fail "status --field state of node 0"
[ "$("$STARLING" status --data-dir "$(node_dir 0)" --field compression.codec)" = none ] ||
  node_fail "status --field compression.codec of node 0"
expect_fail "status --field of a missing key" 1 "no field 'nope.x' in the node's status" -- \
  "$STARLING" status --data-dir "$(node_dir 0)" --field nope.x
expect_fail "status --field of an object" 1 "'rejected' is an object; name one of its fields, or use --json" -- \
  "$STARLING" status --data-dir "$(node_dir 0)" --field rejected
expect_fail "status --field with --json" 2 "--field and --json exclude each other" -- \
  "$STARLING" status --data-dir "$(node_dir 0)" --field step --json
expect_fail "peers --field" 2 "unknown option '--field'" -- \
  "$STARLING" peers --data-dir "$(node_dir 0)" --field step

# --- Leave, all at once -----------------------------------------------------------------
for ((k = 0; k < N; k++)); do
  "$STARLING" leave --data-dir "$(node_dir "$k")" >"$SCRATCH/leave$k" ||
    node_fail "starling leave node $k"
  grep -q "^leaving" "$SCRATCH/leave$k" || node_fail "leave answer: $(cat "$SCRATCH/leave$k")"
done
for ((k = 0; k < N; k++)); do
  node_wait_exit "$k" 20
  [ "$NODE_STATUS" -eq 0 ] || node_fail "node $k exited $NODE_STATUS after leave"
  log=$(node_log "$k")
  grep -q "leaving (asked by \`starling leave\`)" "$log" || node_fail "node $k: no leave line"
  grep -q "checkpoint written to $(node_dir "$k")/checkpoint.safetensors" "$log" ||
    node_fail "node $k: no final checkpoint line"
  grep -q "stopped: every handle closed" "$log" || node_fail "node $k: no orderly stop"
  [ ! -e "$(node_dir "$k")/control.sock" ] || node_fail "node $k left its control socket behind"
  "$NUMPY_PY" "$SRC/tests/integration/check_safetensors_numpy.py" \
    "$(node_dir "$k")/checkpoint.safetensors" >/dev/null || node_fail "node $k: checkpoint unreadable"
done
pass "every node left, exited 0 and wrote its checkpoint at $(elapsed) s"
expect_fail "status after leave" 1 "no node is running" -- \
  "$STARLING" status --data-dir "$(node_dir 0)"

# --- The four models agree ---------------------------------------------------------------
spread=$("$NUMPY_PY" "$SRC/tests/integration/node_param_spread.py" \
  "$(node_dir 0)/checkpoint.safetensors" "$(node_dir 1)/checkpoint.safetensors" \
  "$(node_dir 2)/checkpoint.safetensors" "$(node_dir 3)/checkpoint.safetensors") ||
  fail "reading the checkpoints with NumPy"
echo "  $spread"
ratio=${spread##*ratio=}
ratio=${ratio%% *}
ge 0.01 "$ratio" || fail "the nodes' parameters differ by $ratio of their norm (> 1%)"
pass "largest pairwise distance between the nodes' parameters: $ratio of the mean norm"

echo "all node cluster tests passed in $(elapsed) s"
