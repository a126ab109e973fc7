#!/usr/bin/env bash
# test_node_ring.sh: the ring all-reduce across real processes. Four nodes
# with rings every second complete rounds of all four; then a member is
# frozen in the middle of a round (SIGSTOP, so that the round cannot finish
# without it) and killed with -9: every survivor running that round must
# abort it (its log names it; none counts it done; one whose CONFIRM had not
# come yet is not in it), keep training, and form the next rounds without
# the dead member.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

N=4
# A 2.7M-parameter model, so that a round takes long enough to be caught
# in the middle; a short schedule nobody finishes during the test.
ARGS=(--model mlp:784-2048-512-10 --data fashion-mnist --batch 64 --lr 0.01
      --device cpu --threads 1 --epochs 50 --ring-every 1 --gossip-every 2
      --eval-every 30)

node_start 0 --shard "0/$N" "${ARGS[@]}"
node_up 0
seed=$NODE_ADDR
for ((k = 1; k < N; k++)); do
  node_start "$k" --join "$seed" --shard "$k/$N" "${ARGS[@]}"
done
for ((k = 1; k < N; k++)); do node_up "$k"; done
pass "4 nodes up (seed $seed) at $(elapsed) s"

# --- Rounds of all four -----------------------------------------------------
full_round() {
  local doc
  doc=$(node_status 0) || return 1
  "$NUMPY_PY" -c '
import json, sys
d = json.loads(sys.argv[1])
sys.exit(0 if d["ring_rounds_ok"] > 0 and len(d["ring_last_members"]) == 4 else 1)' "$doc"
}
wait_for 90 "a ring round of 4 members completed on node 0" full_round
pass "ring rounds of 4 members complete ($(node_field 0 ring_rounds_ok) on node 0) at $(elapsed) s"

# --- Freeze node 3 inside a round, then kill it ------------------------------
victim=3
round=
caught=0
deadline=$((SECONDS + $(scaled 120)))
while [ $caught -eq 0 ] && [ $SECONDS -lt $deadline ]; do
  doc=$(node_status $victim) || { sleep 0.05; continue; }
  # Early in a round: fewer than a third of its segments received.
  round=$("$NUMPY_PY" -c '
import json, sys
d = json.loads(sys.argv[1])
p = d["ring_progress"]
print(d["ring_round"] if d["ring_round"] and p is not None and p < 0.34 else "")' "$doc")
  [ -n "$round" ] || continue
  kill -STOP "${NODE_PID[$victim]}"
  # A survivor may still have finished that round (the status was read a
  # moment before the freeze): then let the victim go and try again. The
  # survivors running it now must abort it; one whose CONFIRM has not come
  # yet is not in it (and none may count it done).
  sleep 0.3
  caught=1
  in_round=()
  for ((k = 0; k < N - 1; k++)); do
    doc=$(node_status "$k")
    where=$("$NUMPY_PY" -c '
import json, sys
d = json.loads(sys.argv[1])
if d["ring_last_round"] == sys.argv[2] and d["ring_last_ok"]:
    print("done")
elif d["ring_round"] == sys.argv[2]:
    print("in")' "$doc" "$round")
    [ "$where" = done ] && caught=0
    [ "$where" = in ] && in_round+=("$k")
  done
  [ ${#in_round[@]} -ge 2 ] || caught=0
  if [ $caught -eq 0 ]; then
    echo "  (round $round finished on a survivor before the freeze took; again)"
    kill -CONT "${NODE_PID[$victim]}"
  fi
done
[ $caught -eq 1 ] || node_fail "node $victim was never frozen early in a ring round"
steps_before=()
for ((k = 0; k < N - 1; k++)); do steps_before[$k]=$(node_field "$k" step); done
kill -9 "${NODE_PID[$victim]}"
kill -CONT "${NODE_PID[$victim]}" 2>/dev/null || true
node_wait_exit $victim 10
pass "node $victim frozen inside round $round and killed -9 at $(elapsed) s"

aborted_everywhere() {
  local k
  for k in "${in_round[@]}"; do
    grep -q "ring round $round of [0-9]* members aborted" "$(node_log "$k")" || return 1
  done
}
wait_for 60 "every survivor in round $round (nodes ${in_round[*]}) aborting it" aborted_everywhere
for ((k = 0; k < N - 1; k++)); do
  doc=$(node_status "$k") || node_fail "status of node $k"
  "$NUMPY_PY" -c '
import json, sys
d = json.loads(sys.argv[1])
assert not (d["ring_last_round"] == sys.argv[2] and d["ring_last_ok"]), "round counted ok"
assert d["loss"] is not None and d["loss"] == d["loss"], "loss not finite"' "$doc" "$round" ||
    node_fail "node $k after the abort: $doc"
done
for k in "${in_round[@]}"; do
  [ "$(node_field "$k" ring_rounds_aborted)" -ge 1 ] || node_fail "node $k counts no aborted round"
done
pass "the survivors in round $round (nodes ${in_round[*]}) aborted it, none counted it done, at $(elapsed) s"

# --- Training goes on; the next rounds form without node 3 -------------------
for ((k = 0; k < N - 1; k++)); do
  wait_for 30 "node $k stepping after the abort" step_over "$k" "${steps_before[$k]}"
done
pass "the survivors keep training"

victim_id=$(sed -n 's/.*node \([0-9a-f]\{32\}\) listening.*/\1/p' "$(node_log $victim)" | head -1)
[ -n "$victim_id" ] || node_fail "node $victim's id not in its log"
three_member_round() {
  local doc
  doc=$(node_status 0) || return 1
  "$NUMPY_PY" -c '
import json, sys
d = json.loads(sys.argv[1])
m = d["ring_last_members"]
sys.exit(0 if d["ring_last_ok"] and len(m) == 3 and sys.argv[2] not in m else 1)' "$doc" "$victim_id"
}
wait_for 90 "a ring round of the 3 survivors completed" three_member_round
pass "rounds form again without node $victim at $(elapsed) s"

for ((k = 0; k < N - 1; k++)); do node_leave "$k"; done
pass "the survivors left in order"
echo "all ring tests passed in $(elapsed) s"
