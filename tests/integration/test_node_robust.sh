#!/usr/bin/env bash
# test_node_robust.sh: robust averaging against a malicious member, on real
# processes. Four `starling node --attach`: three run the example program
# (examples/client.c, each on its own shard), the fourth a hostile program
# (tests/integration/hostile_client.c) that serves the cluster a poisoned
# model through its own node, a member in good standing holding the
# cluster key. Gossip every 0.1 s, a ring round every second.
#   (a) with clipping off (--clip 0) the attack works: the honest programs
#       end far below the problem's ceiling (the test of the test);
#   (b) with the default clipping the honest programs reach the target, the
#       honest nodes count clipped pulls, and `starling peers` puts them on
#       the attacker: most of its averagings clipped, few of anyone else's;
#   (c) two of three members claim step 2^52 (a donor could hand a joiner
#       a step that leaves it nothing to train): four joiners in turn each
#       take the honest member's state and step;
#   (d) a program whose parameters turn NaN (refused by its node): its
#       node's exchanges and rings end instead of sending a snapshot buffer
#       that was never filled (it was sent, and averaged into the node's own
#       copy, as whatever the memory held), so the honest node drops
#       nothing and both nodes' parameters stay sane.
#   (e) a pair, one of them the poisoner: the honest node suspects its only
#       peer, cannot tell it from itself, and sets the suspicion aside
#       (logged), so ring rounds go on (an honest pair that drifted apart
#       used to suspect each other for good and never ring again).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

BUILD=${ST_BUILD_DIR:?ST_BUILD_DIR: the build directory}
san=()
[ "${ST_SANITIZE:-OFF}" = ON ] && san=(-fsanitize=address,undefined)
for prog in examples/client tests/integration/hostile_client; do
  cc -std=c11 -Wall -Wextra -Werror "${san[@]}" "$SRC/$prog.c" \
    -I"$SRC/client" -L"$BUILD" -lstarling -lm -Wl,-rpath,"$BUILD" \
    -o "$SCRATCH/$(basename "$prog")" || fail "building $prog.c"
done
CLIENT=$SCRATCH/client
HOSTILE=$SCRATCH/hostile_client
STEPS=12000

# run_cluster TAG CLIP BASE: the four nodes (BASE..BASE+3) and programs;
# each honest program's mean test accuracy over its last 10 reports (its
# last 2000 steps: one snapshot would be noise) in ACC[0..2]. Nodes keep
# running (for their counters).
declare -A ACC=()
run_cluster() {
  local tag=$1 clip=$2 base=$3
  local flags=(--attach --gossip-every 0.1 --ring-every 1 --clip "$clip")
  node_start $base "${flags[@]}"
  wait_for 20 "node $base's control socket" test -S "$(node_dir $base)/control.sock"
  "$CLIENT" --socket "$(node_dir $base)/control.sock" --steps 1 >"$SCRATCH/first$tag.out" 2>&1 ||
    node_fail "($tag) the first program: $(cat "$SCRATCH/first$tag.out")"
  node_up $base
  local seed=$NODE_ADDR k
  for k in 1 2 3; do
    node_start $((base + k)) "${flags[@]}" --join "$seed"
  done
  for k in 1 2 3; do
    wait_for 20 "node $((base + k))'s control socket" \
      test -S "$(node_dir $((base + k)))/control.sock"
  done
  "$HOSTILE" --socket "$(node_dir $((base + 3)))/control.sock" \
    --attack poison:8 --steps 100000 --step-us 1000 \
    >"$SCRATCH/hostile$tag.out" 2>&1 &
  local ph=$!
  PIDS+=("$ph")
  local pids=()
  for k in 0 1 2; do
    "$CLIENT" --socket "$(node_dir $((base + k)))/control.sock" --shard $k/3 \
      --steps $STEPS --step-us 500 >"$SCRATCH/p$tag$k.out" 2>&1 &
    pids+=($!)
    PIDS+=($!)
  done
  for k in 0 1 2; do
    wait "${pids[$k]}" || node_fail "($tag) program $k: $(tail -3 "$SCRATCH/p$tag$k.out")"
    ACC[$k]=$(grep '^step' "$SCRATCH/p$tag$k.out" | tail -n 10 |
      awk '{ s += $NF } END { if (NR == 10) printf "%.3f", s / NR }')
    [ -n "${ACC[$k]}" ] || node_fail "($tag) program $k printed no accuracy"
  done
  kill "$ph" 2>/dev/null || true
  grep -q "attacking" "$SCRATCH/hostile$tag.out" ||
    node_fail "($tag) the hostile program did not attach: $(cat "$SCRATCH/hostile$tag.out")"
}

# (a) no clipping: the poison wins.
run_cluster a 0 0
mean=$(printf '%s\n' "${ACC[@]}" | awk '{ s += $1 } END { printf "%.3f", s / NR }')
ge 0.66 "$mean" || node_fail "(a) without clipping the honest programs still reached ${ACC[*]}: the attack does not bite"
[ "$(node_field 0 exchanges_clipped)" = 0 ] || node_fail "(a) --clip 0 clipped"
pass "(a) without clipping the poisoned member drags the honest ones down (accuracies ${ACC[*]})"
for k in 0 1 2 3; do kill -9 "${NODE_PID[$k]}"; done

# (b) the default clipping holds.
run_cluster b 3 10
for k in 0 1 2; do
  ge "${ACC[$k]}" 0.70 || node_fail "(b) honest program $k reached ${ACC[$k]} < 0.70 under attack (ceiling ~0.75)"
done
attacker=$(node_field 13 id)
for k in 10 11 12; do
  clipped=$(node_field $k exchanges_clipped)
  [ "$clipped" -gt 0 ] || node_fail "(b) node $k clipped nothing"
  node_peers $k >"$SCRATCH/peers$k.json"
  "$NUMPY_PY" - "$SCRATCH/peers$k.json" "$attacker" <<'EOF' || node_fail "(b) node $k's peers do not single out the attacker"
import json, sys
peers = json.load(open(sys.argv[1]))
bad = [p for p in peers if p["id"] == sys.argv[2]][0]
# Most of the attacker's pulls are clipped (not all: a node's first 8
# averagings set the bound, and its suspicion takes a few to rise).
assert bad["averaged"] >= 5 and bad["clipped"] >= 0.4 * bad["averaged"], bad
assert all(0 <= p["suspicion"] <= 1 for p in peers), peers
assert bad["suspicion"] > 0, bad  # it pulled beyond the bound to the end
for p in peers:
    if p["id"] != sys.argv[2] and not p["self"]:
        # Honest pulls are clipped far less often than the attacker's (an
        # honest node the attacker pulled early is clipped for a while,
        # rightly, until it is back with the others).
        frac = p["clipped"] / max(p["averaged"], 1)
        assert frac < 0.5 * bad["clipped"] / bad["averaged"], (p, bad)
EOF
done
pass "(b) with clipping the honest programs reach ${ACC[*]}; the attacker's pulls are clipped and named in peers"
for k in 10 11 12 13; do kill -9 "${NODE_PID[$k]}"; done

# (c) lying about the step. Node 20 is honest (its program trains a little
# and leaves), nodes 21 and 22 run programs that claim step 2^52.
flags=(--attach --gossip-every 0.5 --ring-every 0)
node_start 20 "${flags[@]}"
wait_for 20 "node 20's control socket" test -S "$(node_dir 20)/control.sock"
"$CLIENT" --socket "$(node_dir 20)/control.sock" --steps 300 >/dev/null ||
  node_fail "(c) the first program"
node_up 20
seed=$NODE_ADDR
for k in 21 22; do
  node_start $k "${flags[@]}" --join "$seed"
  wait_for 20 "node $k's control socket" test -S "$(node_dir $k)/control.sock"
  "$HOSTILE" --socket "$(node_dir $k)/control.sock" --attack step:4503599627370496 \
    --steps 100000 --step-us 2000 >"$SCRATCH/liar$k.out" 2>&1 &
  PIDS+=($!)
done
for k in 21 22; do wait_for 20 "node $k at the lying step" step_over $k 4503599627370000; done
wait_for 10 "the lies to reach node 20" "$NUMPY_PY" -c '
import json, subprocess, sys
peers = json.loads(subprocess.run(sys.argv[1:], capture_output=True, text=True).stdout)
sys.exit(sum(p["step"] > 1 << 50 for p in peers) < 2)' \
  "$STARLING" peers --json --data-dir "$(node_dir 20)"
refused=0
for j in 1 2 3 4; do
  k=$((30 + j))
  node_start $k "${flags[@]}" --join "$seed"
  wait_for 20 "node $k's control socket" test -S "$(node_dir $k)/control.sock"
  "$CLIENT" --socket "$(node_dir $k)/control.sock" --steps 1 >"$SCRATCH/j$k.out" 2>&1 ||
    node_fail "(c) joiner $k's program: $(cat "$SCRATCH/j$k.out")"
  from=$(sed -n 's/^training from step \([0-9]*\) .*/\1/p' "$SCRATCH/j$k.out")
  [ -n "$from" ] && [ "$from" -le 300 ] ||
    node_fail "(c) joiner $k started at step '$from', not the honest member's (at most 300)"
  refused=$((refused + $(node_field $k state_transfers_refused_step)))
  kill -9 "${NODE_PID[$k]}"
done
pass "(c) four joiners took the honest member's step (state transfers refused for their step: $refused)"
for k in 20 21 22; do kill -9 "${NODE_PID[$k]}"; done

# attached_pair TAG K FLAGS...: nodes K and K + 1 with --attach, gossip
# every 0.1 s and a ring round every second (and FLAGS); node K's first
# program runs one step, node K + 1 joins it; both control sockets up.
attached_pair() {
  local tag=$1 k=$2
  shift 2
  local flags=(--attach --gossip-every 0.1 --ring-every 1 "$@")
  node_start "$k" "${flags[@]}"
  wait_for 20 "node $k's control socket" test -S "$(node_dir "$k")/control.sock"
  "$CLIENT" --socket "$(node_dir "$k")/control.sock" --steps 1 >/dev/null ||
    node_fail "($tag) the first program"
  node_up "$k"
  node_start $((k + 1)) "${flags[@]}" --join "$NODE_ADDR"
  wait_for 20 "node $((k + 1))'s control socket" \
    test -S "$(node_dir $((k + 1)))/control.sock"
}

# (d) NaN from a program, rings and gossip on, no clipping.
attached_pair d 40 --clip 0
"$HOSTILE" --socket "$(node_dir 41)/control.sock" --attack nan:0.2 \
  --steps 100000 --step-us 1000 >"$SCRATCH/nan.out" 2>&1 &
PIDS+=($!)
"$CLIENT" --socket "$(node_dir 40)/control.sock" --steps 3000 --step-us 1000 \
  >"$SCRATCH/pd.out" 2>&1 || node_fail "(d) the honest program: $(tail -3 "$SCRATCH/pd.out")"
grep -q "non-finite" "$SCRATCH/nan.out" ||
  node_fail "(d) the hostile program never hit its NaN: $(cat "$SCRATCH/nan.out")"
dropped=$(node_field 40 exchanges_dropped)
[ "$dropped" = 0 ] ||
  node_fail "(d) node 40 dropped $dropped snapshots of node 41: it served garbage"
for k in 40 41; do node_leave $k; done
"$NUMPY_PY" - "$(node_dir 40)/checkpoint.safetensors" \
  "$(node_dir 41)/checkpoint.safetensors" <<'EOF' || node_fail "(d) a node's parameters are not sane"
import json, struct, sys
import numpy as np
for path in sys.argv[1:]:
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        v = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4")
        assert np.isfinite(v).all() and np.abs(v).max() < 1e3, (path, name, v.max(), v.min())
EOF
pass "(d) a program's NaN ends its node's exchanges and rings: nothing dropped, both models sane"

# (e) a pair: the only peer is suspected, and suspicion is set aside (it
# cannot be told from this node: robust averaging protects a majority).
# Before, an honest pair that drifted apart suspected each other for good
# and never took a ring round again; here the suspect is a poisoner, whose
# pulls go beyond the bound every time, so that the suspicion is certain.
attached_pair e 50
"$HOSTILE" --socket "$(node_dir 51)/control.sock" --attack poison:8 \
  --steps 100000 --step-us 1000 >"$SCRATCH/pair.out" 2>&1 &
PIDS+=($!)
"$CLIENT" --socket "$(node_dir 50)/control.sock" --steps 100000 --step-us 1000 \
  >"$SCRATCH/pe.out" 2>&1 &
PIDS+=($!)
wait_for "$(scaled 30)" "node 50 to set aside its suspicion of its only peer" \
  grep -q "suspicion is set aside" "$(node_log 50)"
rounds=$(node_field 50 ring_rounds_ok)
wait_for "$(scaled 20)" "ring rounds of node 50 after it suspected its only peer" \
  sh -c "[ \$($(printf %q "$STARLING") status --data-dir $(printf %q "$(node_dir 50)") \
    --field ring_rounds_ok) -ge $((rounds + 3)) ]"
[ "$(node_field 50 ring_proposals_distrusted)" = 0 ] ||
  node_fail "(e) node 50 refused a proposal for distrust of its only peer"
pass "(e) a pair: the only peer's suspicion is set aside, ring rounds go on ($rounds, then 3 more)"
