#!/usr/bin/env bash
# test_node_handshake_rate.sh: a flood of valid handshake openings costs a
# node what --handshake-rate allows (issue #17), across real processes.
# Node A runs with --handshake-rate 20. hs1_probe, a separate process
# holding the cluster key, replays one valid HS1 over 300 TCP connections,
# one after another: A answers (public-key work) at most the bucket's 20
# plus 20 a second of the probe's run, closes the rest unanswered and counts
# each (rejected.handshake_busy); it stays up, and once the bucket has
# refilled a new node joins it. Without the bucket every replay is answered.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

PROBE=${ST_BUILD_DIR:-$(dirname "$STARLING")}/hs1_probe
[ -x "$PROBE" ] || fail "no hs1_probe next to $STARLING (build it: cmake --build build)"

node_start 0 "${RECIPE[@]}" --epochs 1 --shard 0/10 --handshake-rate 20
node_up 0
addr_a=$NODE_ADDR
[ "$(node_field 0 rejected.handshake_busy)" -eq 0 ] || node_fail "handshake_busy before any flood"
pass "A up with --handshake-rate 20 ($(elapsed) s)"

"$PROBE" --cluster-key "$KEY" --to "$addr_a" --count 300 >"$SCRATCH/probe.json" ||
  node_fail "hs1_probe failed: $(cat "$SCRATCH/probe.json")"
read -r answered closed seconds <<<"$("$NUMPY_PY" -c '
import json, sys
p = json.load(open(sys.argv[1]))
print(p["answered"], p["closed"], p["seconds"])' "$SCRATCH/probe.json")"
limit=$(awk -v s="$seconds" 'BEGIN { printf "%d", 20 + 20 * s + 2 }')
[ "$answered" -ge 20 ] || node_fail "A answered $answered replays, want the bucket's 20 at least"
[ "$answered" -le "$limit" ] || node_fail "A answered $answered replays in $seconds s, want <= $limit"
busy=$(node_field 0 rejected.handshake_busy)
[ "$busy" -eq "$closed" ] || node_fail "A counts $busy handshake_busy, the probe saw $closed closed"
node_alive 0 || node_fail "A died under the flood"
pass "A answered $answered of 300 replays in $seconds s, closed $closed unanswered (handshake_busy $busy)"

sleep "$(scaled 2)"
node_start 1 --join "$addr_a" "${RECIPE[@]}" --epochs 1 --shard 1/10
node_up 1
both_alive() { [ "$(node_field 0 peers_alive)" -ge 1 ] && [ "$(node_field 1 peers_alive)" -ge 1 ]; }
wait_for 30 "B joins A after the flood" both_alive
pass "B joined A after the flood ($(elapsed) s)"
