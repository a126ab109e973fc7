#!/usr/bin/env bash
# test_node_sync_corrupt.sh: a joiner whose agreeing donors both send
# corrupted chunks (STARLING_FAULT_SYNC_CORRUPT: the last byte of every
# chunk's data flipped, under a true manifest) never takes one
# donor's word (docs/protocol.md, "Multi-donor state sync"): each sync
# drops both donors as bad and starts asking again, and after four such
# restarts in a row it backs off and asks again, rather than fall back to
# the whole state from one donor (sync.single_donor 0); it never trains
# (it stays "syncing" at step 0). Nor does it when one of the two goes
# away then: the member left is one of those that failed. Loopback, about
# 20 s. (One corrupting
# donor among honest ones: test_node_sync_donors.sh; a donor that lies
# about its manifest: test_node_sync_liar.sh.)
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"
source "$(dirname "$0")/sync_lib.sh" 6

# Two donors that agree on the state and corrupt every chunk they send.
STARLING_FAULT_SYNC_CORRUPT=1 node_start 0 "${MODEL[@]}" "${DONOR[@]}"
node_up 0
SEED=$NODE_ADDR
STARLING_FAULT_SYNC_CORRUPT=1 node_start 1 "${MODEL[@]}" "${DONOR[@]}" --join "$SEED"
node_up 1
sync_donors_agree
pass "two corrupting donors done, holding agreed state $(node_field 0 agreed.id)"

node_start 2 "${MODEL[@]}" --ring-every 0 --join "$SEED"
node_up 2
wait_for 60 "the joiner backing off after its agreeing donors failed again and again" \
  grep -q "the agreeing donors failed 4 times in a row: not taking any one donor's word" \
  "$(node_log 2)"
bad=$(node_field 2 sync.donors_bad)
[ "$bad" -ge 8 ] || node_fail "the joiner counted $bad bad donors, not at least 8 (2 in each of 4 syncs)"
[ "$(node_field 2 sync.single_donor)" = 0 ] ||
  node_fail "the joiner fell back to one donor: $(node_field 2 sync.single_donor)"
[ "$(node_field 2 sync.backoffs)" -ge 1 ] ||
  node_fail "the joiner counted no back-off: sync.backoffs $(node_field 2 sync.backoffs)"
[ "$(node_field 2 state)" = syncing ] ||
  node_fail "the joiner is $(node_field 2 state), not syncing"
[ "$(node_field 2 step)" = 0 ] || node_fail "the joiner trained: step $(node_field 2 step)"
a=$(node_field 2 agreed.id || true); [ -z "$a" ] || [ "$a" = null ] ||
  node_fail "the joiner holds a state: $(node_field 2 agreed.id)"
pass "both agreeing donors corrupt: the joiner backs off and asks again (donors_bad $bad, single_donor 0, syncing at step 0)"

# One of the two goes away: the one left cannot settle it alone.
kill -9 "${NODE_PID[1]}"
wait_for 30 "the joiner seeing donor 1 gone" alive_seen_by 2 2
wait_for 40 "the joiner saying it waits for a second member" \
  grep -q "waiting for a second one rather than take its word" "$(node_log 2)"
sleep 1
[ "$(node_field 2 sync.single_donor)" = 0 ] && [ "$(node_field 2 state)" = syncing ] ||
  node_fail "with one member left after its donors failed the joiner took its word: single_donor $(node_field 2 sync.single_donor), state $(node_field 2 state)"
pass "donor 1 gone, the joiner still waits (single_donor 0, syncing)"
