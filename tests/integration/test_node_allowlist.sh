#!/usr/bin/env bash
# test_node_allowlist.sh: --allow over TCP and UDP, across real processes.
# A and B take only the keys of A, B and D; D takes anyone. C holds the
# cluster key but is on no list: it joins through D, learns A's address and
# id from D, and speaks to A. A must refuse C's handshakes
# (handshake_not_allowed) and drop C's UDP packets, which are signed by C's
# key (packet_not_allowed), while A, B and D stay members of one another;
# and C must never enter A's view, though D speaks of it (membership admits
# only listed keys).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

for n in a b c d; do
  "$STARLING" keygen --out "$SCRATCH/$n.key" --json >"$SCRATCH/$n.json" ||
    fail "keygen $n"
done
for n in a b d; do json_field "$SCRATCH/$n.json" public_key; done >"$SCRATCH/allow"
id_of() { json_field "$SCRATCH/$1.json" node_id; }

ARGS=("${RECIPE[@]}" --epochs 50 --ring-every 1)
node_start 0 --identity "$SCRATCH/a.key" --allow "$SCRATCH/allow" --shard 0/4 "${ARGS[@]}"
node_up 0
addr_a=$NODE_ADDR
node_start 1 --identity "$SCRATCH/b.key" --allow "$SCRATCH/allow" --join "$addr_a" --shard 1/4 "${ARGS[@]}"
node_start 3 --identity "$SCRATCH/d.key" --join "$addr_a" --shard 3/4 "${ARGS[@]}"
node_up 1
node_up 3
addr_d=$NODE_ADDR
alive_at() { [ "$(member_state "$1" "$2")" = alive ]; }
wait_for 30 "A holds B and D alive" eval 'alive_at 0 "$(id_of b)" && alive_at 0 "$(id_of d)"'
pass "A, B and D are members ($(elapsed) s)"

# C joins through D, which allows anyone.
node_start 2 --identity "$SCRATCH/c.key" --join "$addr_d" --shard 2/4 "${ARGS[@]}"
node_up 2
wait_for 30 "C learning A from D" eval '[ -n "$(member_state 2 "$(id_of a)")" ]'
counter() { node_field 0 "rejected.$1"; }
dropped() { [ "$(counter packet_not_allowed)" -gt 0 ]; }
wait_for 30 "A dropping C's packets as packet_not_allowed" dropped
pass "A drops C's UDP packets: packet_not_allowed $(counter packet_not_allowed) ($(elapsed) s)"

# A refuses C's handshakes too (C dials A to average), and keeps B and D.
refused() { [ "$(counter handshake_not_allowed)" -gt 0 ]; }
wait_for 30 "A refusing C's handshakes" refused
alive_at 0 "$(id_of b)" && alive_at 0 "$(id_of d)" ||
  node_fail "A lost B or D while refusing C"
state=$(member_state 0 "$(id_of c)")
[ -z "$state" ] || node_fail "C is in A's view ($state), from D's rumours"
[ "$(member_state 3 "$(id_of c)")" = alive ] || node_fail "D does not hold C alive: the test rumoured nothing"
pass "A refuses C's handshakes (handshake_not_allowed $(counter handshake_not_allowed)); C is not in A's view though D holds it alive; B and D still alive"

for k in 2 3 1 0; do node_leave "$k"; done
pass "every node leaves cleanly ($(elapsed) s)"
