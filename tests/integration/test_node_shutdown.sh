#!/usr/bin/env bash
# test_node_shutdown.sh: nodes stopped in the middle of their traffic stop
# cleanly. Two nodes with a 3.7M-parameter model average back to back (an
# exchange every 0.1 s, each moving 15 MB each way through the thread
# pool's sealing and opening) and run rings; both get SIGTERM at the same
# moment, at a different point of the traffic each time. Each must exit 0
# with every handle closed (the loop asserts it) and a checkpoint written;
# under the sanitizers, also with no leak or invalid access. (A double close
# of a connection whose exchange failed on the way down was found this way.)
# Then SIGTERM while a node is still starting: it leaves cleanly too.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

awk 'BEGIN { srand(3); for (r = 0; r < 64; r++) { for (c = 0; c < 784; c++) printf "%.3f,", rand(); print r % 10 } }' \
  >"$SCRATCH/data.csv"
ARGS=(--model mlp:784-2048-1024-10 --data "csv:$SCRATCH/data.csv" --epochs 1
      --batch 2 --device cpu --threads 1 --eval-every 0 --checkpoint-every 0
      --gossip-every 0.1 --ring-every 1)

for round in 1 2 3; do
  a=$((2 * round)) b=$((2 * round + 1))
  node_start $a --shard 0/2 "${ARGS[@]}"
  node_up $a
  node_start $b --join "$NODE_ADDR" --shard 1/2 "${ARGS[@]}"
  node_up $b
  exchanging() { local ok; ok=$(node_field $a exchanges_ok 2>/dev/null) && [ "$ok" -ge 2 ]; }
  wait_for 60 "nodes $a and $b averaging" exchanging
  # A different moment of the traffic each round.
  sleep "0.$((round * 3))"
  kill -TERM "${NODE_PID[$a]}" "${NODE_PID[$b]}"
  for k in $a $b; do
    node_wait_exit $k 30
    [ "$NODE_STATUS" -eq 0 ] || node_fail "round $round: node $k exited $NODE_STATUS after SIGTERM"
    grep -q "stopped: every handle closed" "$(node_log $k)" ||
      node_fail "round $round: node $k did not close every handle"
    [ -s "$(node_dir $k)/checkpoint.safetensors" ] ||
      node_fail "round $round: node $k wrote no checkpoint"
    ! grep -q "ERROR: AddressSanitizer\|runtime error\|LeakSanitizer" "$(node_log $k)" ||
      node_fail "round $round: node $k: sanitizer report"
  done
  pass "round $round: both nodes stopped cleanly in the middle of their traffic"
done
# SIGTERM while a node starts: an orderly leave as soon as its loop runs,
# not the signal's default action (exit 143, no leave). First the moment
# its identity file appears (it then loads its data: the loop's handlers do
# not exist yet), then 0.2 s after the start.
for when in identity 0.2; do
  k=$((k + 1))
  node_start $k "${RECIPE[@]}"
  if [ "$when" = identity ]; then
    for _ in $(seq 5000); do
      [ -e "$(node_dir $k)/identity.key" ] && break
      sleep 0.001
    done
    [ -e "$(node_dir $k)/identity.key" ] || node_fail "node $k wrote no identity"
  else
    sleep "$when"
  fi
  kill -TERM "${NODE_PID[$k]}"
  node_wait_exit $k 30
  [ "$NODE_STATUS" -eq 0 ] || node_fail "SIGTERM at start ($when): exit status $NODE_STATUS, want 0"
  grep -q "stopped: every handle closed" "$(node_log $k)" ||
    node_fail "SIGTERM at start ($when): no orderly stop"
  pass "SIGTERM at start ($when): node $k left cleanly"
done
echo "all shutdown tests passed in $(elapsed) s"
