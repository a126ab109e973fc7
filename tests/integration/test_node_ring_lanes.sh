#!/usr/bin/env bash
# test_node_ring_lanes.sh: who may open a ring lane to a node, across real
# processes. A client holding the cluster key but in no round
# (ring_lane_probe, a fresh identity) opens lanes to node A of a 2-node
# cluster with rings every second:
#   (a) a lane that names a round A never accepted is closed at once (the
#       sender of such a lane aborts its round at once, not at A's
#       connection deadline of 5 s), and counted in ring_lanes_refused;
#   (b) a lane that names the round A is running, while A waits for B (B
#       frozen with SIGSTOP for a moment), is closed too: only the round's
#       previous member may feed it. The round is not disturbed: once B
#       goes on, A completes that very round. (Were the lane taken, the
#       previous member's own lane 0 would come twice and abort it.)
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

PROBE=${ST_BUILD_DIR:-$(dirname "$STARLING")}/ring_lane_probe
[ -x "$PROBE" ] || fail "no ring_lane_probe next to $STARLING (build it: cmake --build build)"

# A 2.7M-parameter model, so that a round lasts long enough to be caught
# running; a schedule nobody finishes during the test.
ARGS=(--model mlp:784-2048-512-10 --data fashion-mnist --batch 64 --lr 0.01
      --device cpu --threads 1 --epochs 50 --ring-every 1 --gossip-every 0
      --eval-every 60)
node_start 0 --shard 0/2 "${ARGS[@]}"
node_up 0
addr_a=$NODE_ADDR
node_start 1 --join "$addr_a" --shard 1/2 "${ARGS[@]}"
node_up 1
rounds_ok() { local n; n=$(node_field 0 ring_rounds_ok 2>/dev/null) && [ "$n" -ge "$1" ]; }
wait_for 60 "three ring rounds completed on node A" rounds_ok 3
# The lanes of completed rounds are not refusals (their sender closes them).
for k in 0 1; do
  [ "$(node_field $k ring_lanes_refused)" -eq 0 ] ||
    node_fail "node $k counts $(node_field $k ring_lanes_refused) refused lanes with no stray lane sent"
done
pass "2 nodes up, rings completing ($(node_field 0 ring_rounds_ok) on A), no lane refused, at $(elapsed) s"

# --- (a) a round A never accepted ------------------------------------------
"$PROBE" --cluster-key "$KEY" --connect "$addr_a" --wait "$(scaled 10)" \
  >"$SCRATCH/probe_a.json" || node_fail "(a) the lane was not closed: $(cat "$SCRATCH/probe_a.json")"
ms=$(json_field "$SCRATCH/probe_a.json" after_ms)
ge "$((2500 * SLOW))" "$ms" || node_fail "(a) a stray lane was closed after $ms ms, want < $((2500 * SLOW)) (the connection deadline is 5000)"
refused=$(node_field 0 ring_lanes_refused)
[ "$refused" -ge 1 ] || node_fail "(a) ring_lanes_refused $refused, want >= 1"
pass "(a) a lane of a round A never accepted: closed after $ms ms, ring_lanes_refused $refused"

# --- (b) the running round, from a node that is not A's previous member ----
# Freeze B, catch A inside a round, probe, and check that A was still in
# that round when the probe's lane was answered (A may also finish while B
# is frozen, from what B had already sent: then let B go on and try again).
probe_running_round() { # sets round; status 1 when nothing was caught
  local r again
  # Freeze B first, then look: a round of A's that is running now cannot
  # end without B (a round takes ~0.1 s on a quiet machine, about what one
  # status read takes, so reading first and freezing after missed them).
  kill -STOP "${NODE_PID[1]}"
  r=$(node_field 0 ring_round 2>/dev/null) || r=
  [ -n "$r" ] || {
    kill -CONT "${NODE_PID[1]}"
    return 1
  }
  again=$(node_field 0 ring_round 2>/dev/null) || again=
  if [ "$again" = "$r" ]; then
    aborted0=$(node_field 0 ring_rounds_aborted)
    probe_status=0
    "$PROBE" --cluster-key "$KEY" --connect "$addr_a" --round "$r" \
      --wait "$(scaled 3)" >"$SCRATCH/probe_b.json" || probe_status=$?
    again=$(node_field 0 ring_round 2>/dev/null) || again=
    ok0=$(node_field 0 ring_rounds_ok) # B frozen: round r has not ended
    [ "$(node_field 0 ring_rounds_aborted)" = "$aborted0" ] || {
      kill -CONT "${NODE_PID[1]}"
      node_fail "(b) A aborted round $r when the probe's lane came ($(grep "aborted" "$(node_log 0)" | tail -1))"
    }
  fi
  kill -CONT "${NODE_PID[1]}"
  [ "$again" = "$r" ] || return 1
  round=$r
}
round=
tries=0
deadline=$((SECONDS + $(scaled 60)))
while [ -z "$round" ] && [ $SECONDS -lt $deadline ]; do
  tries=$((tries + 1))
  probe_running_round || sleep 0.05
done
[ -n "$round" ] || node_fail "(b) never caught node A inside a round ($tries tries)"
[ "$probe_status" -eq 0 ] || node_fail "(b) a lane naming the running round from outside it was not closed (probe status $probe_status)"
ms=$(json_field "$SCRATCH/probe_b.json" after_ms)
# A round ends OK or aborted, and A runs one at a time: the first round A
# completes after the probe is round r, unless an abort was counted. (Its
# id as ring_last_round may already be gone, a later round done, by the
# time a loaded machine reads it.)
wait_for 30 "(b) node A ending round $round" rounds_ok $((ok0 + 1))
[ "$(node_field 0 ring_rounds_aborted)" = "$aborted0" ] ||
  node_fail "(b) round $round failed on A after the probe's lane ($(grep "aborted" "$(node_log 0)" | tail -1))"
pass "(b) a lane naming the running round $round from outside it: closed after $ms ms; A completed the round once B went on ($tries tries)"

# --- And the cluster goes on ------------------------------------------------
ok_now=$(node_field 0 ring_rounds_ok)
wait_for 30 "a later ring round on A" rounds_ok $((ok_now + 1))
node_leave 1
node_leave 0
pass "later rounds complete; both nodes leave cleanly ($(elapsed) s)"
