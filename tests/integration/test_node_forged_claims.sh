#!/usr/bin/env bash
# test_node_forged_claims.sh: membership claims are bound to their subject,
# across real processes (issue #17). A 2-node cluster (A, B) runs; a
# cluster-key holder with an identity of its own (claims_probe, a separate
# process) sends A one UDP packet, three times, forging about B: an ALIVE at
# incarnation 2^64-1 and another address, a STATUS at sequence 2^64-1 with
# a false fingerprint, a SUSPECT at incarnation 2^64-1 and B's leave. A
# must refuse all four and count them (membership_bad_signature for the
# three that need B's signature, membership_beyond_signed for the
# suspicion), and keep B alive at its own incarnation, address and step.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

PROBE=${ST_BUILD_DIR:-$(dirname "$STARLING")}/claims_probe
[ -x "$PROBE" ] || fail "no claims_probe next to $STARLING (build it: cmake --build build)"

node_start 0 "${RECIPE[@]}" --epochs 1 --shard 0/10
node_up 0
addr_a=$NODE_ADDR
node_start 1 --join "$addr_a" "${RECIPE[@]}" --epochs 1 --shard 1/10
node_up 1
addr_b=$NODE_ADDR
id_a=$(node_field 0 id)
id_b=$(node_field 1 id)
# B's record in A's view, as "state incarnation address step".
b_at_a() {
  node_peers 0 | "$NUMPY_PY" -c '
import json, sys
for p in json.load(sys.stdin):
    if p["id"] == sys.argv[1]:
        print(p["state"], p["incarnation"], p["address"], p["step"])' "$id_b"
}
b_alive_at_a() { [ "$(b_at_a | cut -d" " -f1)" = alive ]; }
wait_for 30 "A sees B alive" b_alive_at_a
for k in 0 1; do
  for c in membership_bad_signature membership_beyond_signed; do
    [ "$(node_field $k rejected.$c)" -eq 0 ] ||
      node_fail "node $k counts $(node_field $k rejected.$c) $c with nobody forging"
  done
done
read -r _ inc_b _ _ <<<"$(b_at_a)"
pass "A and B up, B alive at A at incarnation $inc_b, no claim refused ($(elapsed) s)"

"$PROBE" --cluster-key "$KEY" --to "$addr_a" --to-id "$id_a" \
  --victim-identity "$(node_dir 1)/identity.key" --victim-inc "$inc_b" \
  >"$SCRATCH/probe.json" || node_fail "claims_probe failed: $(cat "$SCRATCH/probe.json")"
bad_enough() { [ "$(node_field 0 rejected.membership_bad_signature)" -ge 6 ]; }
wait_for 10 "A counts the forged ALIVE, STATUS and leave (3 packets)" bad_enough
beyond=$(node_field 0 rejected.membership_beyond_signed)
[ "$beyond" -ge 3 ] || node_fail "membership_beyond_signed $beyond, want >= 3"
pass "A refused them: membership_bad_signature $(node_field 0 rejected.membership_bad_signature), membership_beyond_signed $beyond"

# Two probe intervals later B is still alive at A, at an incarnation it
# signed (not 2^64-1), its own address, and a step it reported.
sleep "$(scaled 2)"
read -r state inc addr step <<<"$(b_at_a)"
[ "$state" = alive ] || node_fail "B is $state at A after the forgeries"
[ "$inc" != 18446744073709551615 ] || node_fail "B's incarnation at A is the forged 2^64-1"
[ "$addr" = "$addr_b" ] || node_fail "B's address at A is $addr, want $addr_b"
[ "$step" -lt 1099511627776 ] || node_fail "B's step at A is the forged $step"
[ "$(node_field 0 peers_alive)" -eq 1 ] || node_fail "A has $(node_field 0 peers_alive) peers alive, want 1"
pass "B alive at A at incarnation $inc, address $addr, step $step ($(elapsed) s)"
