#!/usr/bin/env bash
# test_node_sync_liar.sh: a joiner that can ask only two donors, one of
# which describes the agreed state falsely (STARLING_FAULT_SYNC_MANIFEST:
# the first chunk's hash flipped in every manifest it sends), takes neither
# donor's word (docs/security.md, "A joiner takes no state on one donor's
# word"): round after round of asking ends with no two manifests alike, so
# it counts them (sync.disagreed), warns, asks again, and never falls back
# to one donor (sync.single_donor 0) nor trains (it stays "syncing").
# When the liar is gone, it still waits: the one member left could be the
# liar. Loopback, about 30 s. (The corrupting donor and the agreeing ones:
# test_node_sync_donors.sh.)
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"
source "$(dirname "$0")/sync_lib.sh" 5

# Two donors: node 0 honest, node 1 lying about its manifest.
node_start 0 "${MODEL[@]}" "${DONOR[@]}"
node_up 0
SEED=$NODE_ADDR
STARLING_FAULT_SYNC_MANIFEST=1 node_start 1 "${MODEL[@]}" "${DONOR[@]}" --join "$SEED"
node_up 1
grep -q "STARLING_FAULT_SYNC_MANIFEST is set" "$(node_log 1)" ||
  node_fail "donor 1 does not say it lies about its manifest"
sync_donors_agree
pass "two donors done, holding agreed state $(node_field 0 agreed.id)"

# The joiner: its candidates are the two; their manifests never agree.
node_start 2 "${MODEL[@]}" --ring-every 0 --join "$SEED"
node_up 2
disagreed() { [ "$(node_field 2 sync.disagreed)" -ge 2 ] && [ "$(node_field 2 sync.backoffs)" -ge 2 ]; }
wait_for 40 "the joiner counting two rounds of disagreeing donors" disagreed
[ "$(node_field 2 sync.single_donor)" = 0 ] ||
  node_fail "the joiner fell back to one donor: $(node_field 2 sync.single_donor)"
[ "$(node_field 2 state)" = syncing ] ||
  node_fail "the joiner is $(node_field 2 state), not syncing"
[ "$(node_field 2 step)" = 0 ] || node_fail "the joiner trained: step $(node_field 2 step)"
a=$(node_field 2 agreed.id || true); [ -z "$a" ] || [ "$a" = null ] ||
  node_fail "the joiner holds a state: $(node_field 2 agreed.id)"
grep -q "not taking any one donor's word" "$(node_log 2)" ||
  node_fail "the joiner's log does not say why it waits"
pass "with one honest and one lying donor the joiner waits: sync.disagreed $(node_field 2 sync.disagreed), single_donor 0, still syncing at step 0"

# The liar goes away: one member is left, but after donors disagreed the
# joiner cannot tell the honest one from the liar, so it keeps waiting
# rather than take that one's word.
kill -9 "${NODE_PID[1]}"
wait_for 30 "the joiner seeing the liar gone" alive_seen_by 2 2
wait_for 40 "the joiner saying it waits for a second member" \
  grep -q "waiting for a second one rather than take its word" "$(node_log 2)"
[ "$(node_field 2 sync.single_donor)" = 0 ] && [ "$(node_field 2 state)" = syncing ] ||
  node_fail "with one member left after a disagreement the joiner took its word: single_donor $(node_field 2 sync.single_donor), state $(node_field 2 state)"
pass "the liar gone, the joiner still waits (single_donor 0, syncing)"
