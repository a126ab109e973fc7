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
#       the attacker: most of its averagings clipped, few of anyone else's.
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
  "$CLIENT" --socket "$(node_dir $base)/control.sock" --steps 1 >/dev/null ||
    node_fail "($tag) the first program"
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
