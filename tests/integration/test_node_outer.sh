#!/usr/bin/env bash
# test_node_outer.sh: the outer optimizer of averaging (--outer nesterov,
# --local-steps; issue #16) across real processes.
#
# (a) Bad settings are refused, naming the text: an unknown optimizer, a
#     momentum of 1, --outer-lr without --outer, --outer with no ring
#     rounds; --help documents the flags.
# (b) Mixed settings: a node without --outer cannot join a cluster that
#     runs it; it stops with a message naming both settings.
# (c) Four nodes with --outer nesterov --local-steps 100 train Fashion-MNIST
#     quarters (the README's recipe, 6 epochs, --min-nodes 4): while they
#     train, ring rounds come by the proposer's steps only (--ring-every 2
#     applies once the epochs are done): the nodes' outer steps are at
#     most the 1,410 steps / 100 + 2 (the last: the proposer's round at
#     its end, an outer step for a node still training), and the most of
#     them at least 1 (a node that ran far ahead of the proposer on the
#     shared cores may have seen only a round or two while it trained);
#     every node started the state once, sat out only rounds robust
#     averaging clipped, each reaches test accuracy 0.85. At rest, rounds are plain averaging, so
#     the four checkpoints agree within 1e-5 of the norm.
# (d) The gossip variant (--outer noloco, no ring rounds): two nodes take
#     outer steps on their exchanges' pairwise means and reach 0.82; at
#     rest their checkpoints agree. Six epochs of halves (three under the
#     sanitizers): with three, the joiner of a plain build trained 2 s,
#     its first exchanges clipped while robust averaging's history was
#     short, and once it took no outer step.
# (e) The gossip variant on compressed gossip (--compress int8): the step
#     on the pair's decoded mean (anchor + D(c_own) + delta); two nodes
#     take outer steps on compressed exchanges and reach 0.82.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

# --- (a) flag errors ------------------------------------------------------------
expect_fail "an unknown outer optimizer" 2 "--outer: outer optimizer 'adam' is unknown; use none \(plain averaging\), nesterov or noloco" -- \
  "$STARLING" node --outer adam
expect_fail "an outer momentum of 1" 2 "--outer-momentum: outer momentum '1' is not a decimal in \[0, 1\)" -- \
  "$STARLING" node --outer nesterov --outer-momentum 1
expect_fail "--outer-lr without --outer" 2 "--outer-lr and --outer-momentum set the outer optimizer; add --outer nesterov" -- \
  "$STARLING" node --listen 127.0.0.1:0 --cluster-key "$KEY" --data-dir "$SCRATCH/x" \
  "${RECIPE[@]}" --outer-lr 0.5
expect_fail "--outer noloco without gossip" 2 "--outer noloco steps on the means of gossip exchanges.*set --gossip-every" -- \
  "$STARLING" node --listen 127.0.0.1:0 --cluster-key "$KEY" --data-dir "$SCRATCH/x" \
  "${RECIPE[@]}" --outer noloco --gossip-every 0
expect_fail "--outer with no ring rounds" 2 "--outer steps on the mean of ring rounds.*set --ring-every or --local-steps" -- \
  "$STARLING" node --listen 127.0.0.1:0 --cluster-key "$KEY" --data-dir "$SCRATCH/x" \
  "${RECIPE[@]}" --outer nesterov --ring-every 0
"$STARLING" node --help >"$SCRATCH/help" || fail "node --help exits non-zero"
for flag in "--outer O" "--outer-lr X" "--outer-momentum M" "--local-steps H"; do
  grep -q -- "$flag" "$SCRATCH/help" || fail "node --help does not mention $flag"
done
pass "(a) bad --outer settings refused, the flags documented in --help"

# --- (b) mixed settings -----------------------------------------------------------
join_refused "the node without --outer" \
  "the cluster runs mlp:784-256-128-10 f32 outer=nesterov:0.7:0.9 but this node was started with mlp:784-256-128-10 f32: the cluster's nodes run --outer nesterov:0.7:0.9, this node --outer none" \
  --outer nesterov
pass "(b) a node without --outer is refused by a cluster with it, naming both"

# --- (c) four nodes -----------------------------------------------------------------
EPOCHS=6
# The same under the sanitizers: 2 epochs took 1 s there, too short for rounds.
OUTER=(--outer nesterov --local-steps 100 --ring-every 2 --min-nodes 4 --checkpoint-every 0)
node_start 10 "${RECIPE[@]}" --epochs "$EPOCHS" --shard 0/4 "${OUTER[@]}"
node_up 10
seed=$NODE_ADDR
for k in 1 2 3; do
  node_start $((10 + k)) "${RECIPE[@]}" --epochs "$EPOCHS" --shard "$k/4" \
    --join "$seed" "${OUTER[@]}"
done
for k in 1 2 3; do node_up $((10 + k)); done
done_all() {
  for k in 0 1 2 3; do
    node_alive $((10 + k)) || node_fail "node $k exited while training"
    node_state_is $((10 + k)) "done" || return 1
  done
}
wait_for 150 "the nodes finishing their epochs" done_all
# The final rounds (plain averaging, --ring-every 2): waited for, since
# the four must leave alike (a CI rehearsal of 2026-11-28 went on after
# 5 s without them and the checkpoints differed by 9e-5 of the norm);
# then the accuracy at the end of the epochs or a fresh evaluation (every
# 5 s) after them.
alike() { settled 10 11 12 13 && agreed_alike 10 11 12 13; }
wait_for 60 "a ring round after every node's epochs, the four holding one agreed state" alike
at_rest() {
  alike || return 1
  [ "${ST_SANITIZE:-OFF}" = ON ] || accurate 0.85 10 11 12 13
}
poll_until 10 at_rest || true
for k in 0 1 2 3; do
  node_status $((10 + k)) >"$SCRATCH/outer-$k.json" || node_fail "status of node $k"
done
"$NUMPY_PY" - "$SCRATCH" "${ST_SANITIZE:-OFF}" <<'PY' || node_fail "(c) outer steps: see above"
import json, sys
scratch, sanitize = sys.argv[1], sys.argv[2] == "ON"
most = 0
for k in range(4):
    s = json.load(open("%s/outer-%d.json" % (scratch, k)))
    o = s["outer"]
    print("  node %d: step %d, test accuracy %.4f, ring rounds ok %d, outer %s"
          % (k, s["step"], s["test_accuracy"], s["ring_rounds_ok"], o))
    assert o["optimizer"] == "nesterov" and o["lr"] == 0.7 and o["momentum"] == 0.9, o
    assert o["local_steps"] == 100, o
    assert o["starts"] == 1, "the outer state started %d times" % o["starts"]
    # A round sat out is one robust averaging clipped (a long local period
    # can move a node past the bound of recent moves): never more.
    assert o["skipped"] <= s["ring_rounds_clipped"], (o, s["ring_rounds_clipped"])
    # By steps, not by ticks: at most one round per 100 of the proposer's
    # steps (every node takes as many as it, 1,410).
    assert o["steps"] + o["starts"] <= s["step"] // 100 + 2, \
        "%d rounds with outer steps in %d steps" % (o["steps"] + o["starts"], s["step"])
    most = max(most, o["steps"])
    if not sanitize:
        assert s["test_accuracy"] >= 0.85, "test accuracy %.4f" % s["test_accuracy"]
# Outer steps were taken, not only the start. Rounds come while the
# nodes train only as fast as the shared cores let the proposer's rounds
# form: 8 to 10 on a quiet machine, 2 at most in one CI rehearsal
# (2026-11-27: 4 ring rounds while training, beside other tests).
assert most >= 1, "no outer step on any node (%d)" % most
PY
pass "(c) 4 nodes took outer steps by their steps and reached their accuracy"
# At rest, rounds go on (--ring-every 2) without outer steps.
rounds0=$(json_field "$SCRATCH/outer-0.json" ring_rounds_ok)
outer0=$(node_field 10 outer.steps)
rounds_past() { [ "$(node_field 10 ring_rounds_ok)" -gt "$rounds0" ]; }
wait_for 20 "node 0 in a ring round at rest" rounds_past
[ "$(node_field 10 outer.steps)" -eq "$outer0" ] ||
  node_fail "(c) node 0 took an outer step at rest ($outer0, then $(node_field 10 outer.steps))"
pass "(c) rounds at rest are plain averaging ($(node_field 10 ring_rounds_ok) rounds, $outer0 outer steps)"
wait_for 30 "the four holding one agreed state before they leave" alike
for k in 0 1 2 3; do node_leave $((10 + k)); done
# agree PART K...: nodes K's checkpoints agree within 1e-5 of the norm;
# sets spread to node_param_spread's line.
agree() {
  local part=$1 k files=() ratio
  shift
  for k in "$@"; do files+=("$(node_dir "$k")/checkpoint.safetensors"); done
  spread=$("$NUMPY_PY" "$SRC/tests/integration/node_param_spread.py" "${files[@]}") ||
    fail "node_param_spread"
  ratio=${spread##*ratio=}
  ratio=${ratio%% *}
  ge 1e-5 "$ratio" || fail "($part) the nodes' models differ by $ratio of the norm: $spread"
}
agree c 10 11 12 13
pass "(c) the four models agree after the last rounds: $spread"
# The outer state went to disk beside each checkpoint at the leave (its
# resume is test_daemon_state's): anchor and momentum of 235,146 floats.
for k in 0 1 2 3; do
  f="$(node_dir $((10 + k)))/outer.safetensors"
  "$NUMPY_PY" - "$f" <<'PY' || fail "(c) node $k's outer.safetensors"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
assert h["__metadata__"]["outer"] == "nesterov:0.7:0.9", h["__metadata__"]
for t in ("outer.anchor", "outer.momentum"):
    assert h[t]["dtype"] == "F32" and h[t]["shape"] == [235146], h[t]
PY
done
pass "(c) each node wrote its outer state at the leave"

# --- (d) the gossip variant ---------------------------------------------------------
NOLOCO=(--outer noloco --ring-every 0 --gossip-every 0.2 --min-nodes 2 --checkpoint-every 0)
NOLOCO_EPOCHS=6
[ "${ST_SANITIZE:-OFF}" = ON ] && NOLOCO_EPOCHS=3 # slow enough for many exchanges
# noloco_pair K NAME ARGS...: nodes K (shard 0/2) and K + 1 (1/2, joining
# K) with --outer noloco and ARGS train their epochs; their status then
# goes to $SCRATCH/NAME-0.json and NAME-1.json.
noloco_pair() {
  local k=$1 name=$2 i
  shift 2
  node_start "$k" "${RECIPE[@]}" --epochs "$NOLOCO_EPOCHS" --shard 0/2 "${NOLOCO[@]}" "$@"
  node_up "$k"
  node_start $((k + 1)) "${RECIPE[@]}" --epochs "$NOLOCO_EPOCHS" --shard 1/2 \
    --join "$NODE_ADDR" "${NOLOCO[@]}" "$@"
  node_up $((k + 1))
  pair_done() { node_state_is "$k" "done" && node_state_is $((k + 1)) "done"; }
  wait_for 150 "the two $name nodes finishing their epochs" pair_done
  # Two exchanges at rest (the pair then holds one vector), and the
  # accuracy at the end of the epochs or a fresh evaluation after them.
  local ex
  ex=$(node_field "$k" exchanges_ok) || node_fail "status of node $k"
  pair_at_rest() {
    [ "$(node_field "$k" exchanges_ok)" -ge $((ex + 2)) ] || return 1
    [ "${ST_SANITIZE:-OFF}" = ON ] || accurate 0.82 "$k" $((k + 1))
  }
  poll_until 3 pair_at_rest || true
  for i in 0 1; do
    node_status $((k + i)) >"$SCRATCH/$name-$i.json" || node_fail "status of node $((k + i))"
  done
}
noloco_pair 20 noloco
"$NUMPY_PY" - "$SCRATCH" "${ST_SANITIZE:-OFF}" <<'PY' || node_fail "(d) noloco: see above"
import json, sys
scratch, sanitize = sys.argv[1], sys.argv[2] == "ON"
for k in range(2):
    s = json.load(open("%s/noloco-%d.json" % (scratch, k)))
    o = s["outer"]
    print("  node %d: step %d, test accuracy %.4f, exchanges ok %d, ring rounds %d, outer %s"
          % (k, s["step"], s["test_accuracy"], s["exchanges_ok"], s["ring_rounds_ok"], o))
    assert o["optimizer"] == "noloco" and o["lr"] == 0.7 and o["momentum"] == 0.9, o
    assert s["ring_rounds_ok"] == 0, "ring rounds with --ring-every 0"
    assert o["starts"] == 1, "the outer state started %d times" % o["starts"]
    assert o["steps"] >= 1, "no outer step in %d exchanges" % s["exchanges_ok"]
    assert o["steps"] + o["starts"] + o["skipped"] <= s["exchanges_ok"], o
    if not sanitize:
        assert s["test_accuracy"] >= 0.82, "test accuracy %.4f" % s["test_accuracy"]
PY
pass "(d) 2 nodes took noloco outer steps on their gossip exchanges and reached their accuracy"
node_leave 20
node_leave 21
agree d 20 21
pass "(d) at rest the two agree: $spread"

# --- (e) the gossip variant on compressed gossip --------------------------------------
noloco_pair 30 noloco-coded --compress int8
"$NUMPY_PY" - "$SCRATCH" "${ST_SANITIZE:-OFF}" <<'PY' || node_fail "(e) noloco on int8: see above"
import json, sys
scratch, sanitize = sys.argv[1], sys.argv[2] == "ON"
for k in range(2):
    s = json.load(open("%s/noloco-coded-%d.json" % (scratch, k)))
    o, c = s["outer"], s["compression"]
    print("  node %d: test accuracy %.4f, exchanges ok %d, compressed %d, outer %s"
          % (k, s["test_accuracy"], s["exchanges_ok"], c["exchanges_compressed"], o))
    assert c["exchanges_compressed"] >= 1, c
    assert o["starts"] == 1 and o["steps"] >= 1, o
    assert s["rejected"]["exchange_codec"] == 0, s["rejected"]
    if not sanitize:
        assert s["test_accuracy"] >= 0.82, "test accuracy %.4f" % s["test_accuracy"]
PY
pass "(e) 2 nodes took noloco outer steps on compressed (int8) exchanges and reached their accuracy"
echo "all outer optimizer tests passed in $(elapsed) s"
