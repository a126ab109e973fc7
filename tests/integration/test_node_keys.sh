#!/usr/bin/env bash
# test_node_keys.sh: `starling keys`, the cluster key rotated live (issue
# #18; docs/security.md, "Rotating the cluster key").
#
# (a) Refusals: no node running; a bad key id; removing the key in use;
#     a file that is not a key; a missing file; an unknown verb.
# (b) Two nodes on key A; a node holding only key B cannot join them.
# (c) On both: install B (listed, accepted), use B on one node while the
#     other still sends with A (they stay alive to each other), use B on
#     the other, remove A: no member is ever suspected or dead, and the
#     JSON form lists the keys.
# (d) After the rotation a node holding only A cannot join, one holding B
#     joins.
# (e) `--cluster` from one node, three nodes on B: the listing shows B
#     accepted and sent by all three; a non-member (keys_probe, a
#     cluster-key holder with a fresh identity) asking to install a key is
#     closed unanswered and counted; an outsider whose key has the
#     cluster key's id is refused at HS1 (handshake_mac); using a key not every member accepts
#     is refused naming the member; install C, use C, remove B from single
#     nodes reach all three (answers listed per member; a repeat is
#     "already"); no member is ever suspected or dead; every member's
#     signed status then says it sends with C and accepts nothing else.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

KEY_B=$SCRATCH/b.key
"$STARLING" keygen --cluster --out "$KEY_B" >/dev/null || fail "keygen --cluster"
id_of() { "$STARLING" keygen --show "$1" --json | "$NUMPY_PY" -c 'import json,sys; print(json.load(sys.stdin)["key_id"])'; }
A=$(id_of "$KEY")
B=$(id_of "$KEY_B")
while [ "$A" = "$B" ]; do # one chance in 256: draw again
  rm -f "$KEY_B"
  "$STARLING" keygen --cluster --out "$KEY_B" >/dev/null
  B=$(id_of "$KEY_B")
done
keys() { "$STARLING" keys --data-dir "$(node_dir "$1")" "${@:2}"; }

# --- (a) refusals ------------------------------------------------------------------
expect_fail "keys with no node" 1 "no node is running" -- \
  "$STARLING" keys --data-dir "$SCRATCH/none"
expect_fail "an unknown verb" 2 "expected list, install FILE, use ID or remove ID" -- \
  "$STARLING" keys --data-dir "$SCRATCH/none" rotate 3
expect_fail "a missing key file" 2 "cannot read the key file '$SCRATCH/nokey'" -- \
  "$STARLING" keys --data-dir "$SCRATCH/none" install "$SCRATCH/nokey"

RUN=(--model softmax:784-10 --data fashion-mnist --epochs 50 --batch 64 --lr 0.05
     --device cpu --threads 1 --eval-every 0 --ring-every 0)
node_start 0 "${RUN[@]}" --shard 0/2
node_up 0
seed=$NODE_ADDR
node_start 1 "${RUN[@]}" --shard 1/2 --join "$seed"
node_up 1
both_alive() { [ "$(node_field 0 peers_alive)" = 1 ] && [ "$(node_field 1 peers_alive)" = 1 ]; }
wait_for 30 "nodes 0 and 1 seeing each other" both_alive

expect_fail "a bad key id" 1 "'300' is not a key id" -- keys 0 use 300
expect_fail "removing the key in use" 1 "key $A is the one this node sends with" -- keys 0 remove "$A"
expect_fail "using a key not installed" 1 "holds no key of id $B; install it first" -- keys 0 use "$B"
head -c 100 /dev/urandom >"$SCRATCH/garbage.key"
chmod 600 "$SCRATCH/garbage.key"
expect_fail "a file that is not a key" 1 "$SCRATCH/garbage.key" -- keys 0 install "$SCRATCH/garbage.key"
keys 0 | grep -q "^key $A  *sends and accepts" || fail "keys lists: $(keys 0)"
pass "(a) refusals name the cause; the key in use is listed"

# --- (b) a node with only key B is refused ------------------------------------------------
"$STARLING" node --listen 127.0.0.1:0 --join "$seed" --cluster-key "$KEY_B" \
  --data-dir "$SCRATCH/bonly" "${RUN[@]}" --shard 0/2 >"$SCRATCH/bonly.log" 2>&1 &
BONLY=$!
PIDS+=("$BONLY")
# Refused by key id: a seed's first contact is a TCP push-pull (handshake),
# later ones may be packets.
key_refusals() {
  echo $(( $(node_field 0 rejected.handshake_key_id) + $(node_field 0 rejected.packet_key_id) ))
}
refused_b() { [ "$(key_refusals)" -gt 0 ]; }
wait_for 20 "node 0 refusing the handshakes sealed with key B" refused_b
sleep 2
[ "$(node_field 0 peers_alive)" = 1 ] || node_fail "node 0 let the B-only node in"
kill "$BONLY"
wait "$BONLY" 2>/dev/null || true
pass "(b) a node holding only key B cannot join ($(key_refusals) refused by key id)"

# --- (c) the rotation, live ---------------------------------------------------------------
dead_before=$(( $(node_field 0 peers_dead) + $(node_field 1 peers_dead) ))
no_loss() {
  [ "$(node_field 0 peers_alive)" = 1 ] && [ "$(node_field 1 peers_alive)" = 1 ] &&
    [ "$(node_field 0 peers_suspect)" = 0 ] && [ "$(node_field 1 peers_suspect)" = 0 ] &&
    [ $(( $(node_field 0 peers_dead) + $(node_field 1 peers_dead) )) = "$dead_before" ]
}
# The cluster view of `keys --json` on node $1: "ID:ACCEPTED/SENDS ..." in
# key id order.
census() {
  keys "$1" --json | "$NUMPY_PY" -c '
import json, sys
c = json.load(sys.stdin)["cluster"]
print(" ".join("%d:%d/%d" % (k["id"], k["accepted_by"], k["sends_on"]) for k in c["keys"]))'
}
for k in 0 1; do
  keys "$k" install "$KEY_B" >"$SCRATCH/install$k" || node_fail "keys install on node $k"
  grep -q "^key $B  *accepts only" "$SCRATCH/install$k" || node_fail "after install: $(cat "$SCRATCH/install$k")"
done
keys 0 install "$KEY_B" >/dev/null || node_fail "installing the same key twice is not a no-op"
keys 0 use "$B" >/dev/null || node_fail "keys use $B on node 0"
sleep 4 # node 0 sends with B, node 1 with A: each accepts both
no_loss || node_fail "nodes lost each other with node 0 on B and node 1 on A"
keys 1 use "$B" >/dev/null || node_fail "keys use $B on node 1"
for k in 0 1; do
  keys "$k" remove "$A" >/dev/null || node_fail "keys remove $A on node $k"
done
sleep 4
no_loss || node_fail "nodes lost each other after the rotation"
keys 1 --json >"$SCRATCH/keys.json" || node_fail "keys --json"
"$NUMPY_PY" - "$SCRATCH/keys.json" "$B" <<'PY' || node_fail "keys --json: $(cat "$SCRATCH/keys.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["keys"] == [{"id": int(sys.argv[2]), "sends": True}], d
assert d["cluster"]["members"] == 2 and d["cluster"]["not_said"] == 0, d
PY
grep -q "cluster key $B now sends, asked by \`starling keys\`" "$(node_log 0)" ||
  node_fail "node 0 did not log the change"
pass "(c) install, use, remove on both nodes: they never lost each other"

# --- (d) after the rotation ------------------------------------------------------------------
"$STARLING" node --listen 127.0.0.1:0 --join "$seed" --cluster-key "$KEY" \
  --data-dir "$SCRATCH/aonly" "${RUN[@]}" --shard 0/2 >"$SCRATCH/aonly.log" 2>&1 &
AONLY=$!
PIDS+=("$AONLY")
before=$(key_refusals)
refused_a() { [ "$(key_refusals)" -gt "$before" ]; }
wait_for 20 "node 0 refusing the old key's handshakes" refused_a
[ "$(node_field 0 peers_alive)" = 1 ] || node_fail "node 0 let a node with the removed key in"
kill "$AONLY"
wait "$AONLY" 2>/dev/null || true
node_start 2 "${RUN[@]}" --shard 0/2 --cluster-key "$KEY_B" --join "$seed"
node_up 2
three() { [ "$(node_field 0 peers_alive)" = 2 ]; }
wait_for 30 "a node with the new key joining" three
pass "(d) the removed key is refused, the new one joins"

# --- (e) --cluster, from one node ---------------------------------------------------------
KEY_C=$SCRATCH/c.key
C=$B
while [ "$C" = "$B" ]; do # a third key, its id not B's
  rm -f "$KEY_C"
  "$STARLING" keygen --cluster --out "$KEY_C" >/dev/null || fail "keygen --cluster"
  C=$(id_of "$KEY_C")
done
# all_on K ID:ACCEPTED/SENDS...: node K's cluster view is exactly these.
all_on() {
  local k=$1 want
  shift
  want=$(printf '%s\n' "$@" | sort -t: -k1,1n | tr '\n' ' ')
  [ "$(census "$k")" = "${want% }" ]
}
wait_for 20 "node 0 seeing key $B accepted and sent by all three" all_on 0 "$B:3/3"
dead3() { echo $(( $(node_field 0 peers_dead) + $(node_field 1 peers_dead) + $(node_field 2 peers_dead) )); }
dead_before=$(dead3)
no_loss3() {
  for k in 0 1 2; do
    [ "$(node_field "$k" peers_alive)" = 2 ] && [ "$(node_field "$k" peers_suspect)" = 0 ] || return 1
  done
  [ "$(dead3)" = "$dead_before" ]
}

expect_fail "--cluster use before anyone holds it" 1 "holds no key of id $C" -- keys 1 --cluster use "$C"
PROBE=${ST_BUILD_DIR:-$(dirname "$STARLING")}/keys_probe
[ -x "$PROBE" ] || fail "no keys_probe next to $STARLING (build it: cmake --build build)"
"$PROBE" --cluster-key "$KEY_B" --connect "$seed" --op "install:$KEY_C" \
  >"$SCRATCH/probe.json" 2>"$SCRATCH/probe.err" || node_fail "keys_probe: $(cat "$SCRATCH/probe.err")"
grep -q '"answered":false' "$SCRATCH/probe.json" || node_fail "a non-member was answered: $(cat "$SCRATCH/probe.json")"
[ "$(node_field 0 rejected.cluster_request)" -ge 1 ] || node_fail "the non-member's request was not counted"
[ "$(census 0)" = "$B:3/3" ] || node_fail "a non-member changed the keys: $(census 0)"
# An outsider with a key of the cluster's key id (drawn until the ids
# match) is refused at its first handshake message, before any public-key
# work: mac1 does not verify (handshake_mac).
FORGED=$SCRATCH/forged.key
(umask 077 && "$NUMPY_PY" - "$FORGED" "$B" <<'PY') || fail "forging a key of id $B"
import base64, hashlib, os, sys
while True:  # the key id: the first byte of BLAKE2b-128(key), personalized
    key = os.urandom(32)
    if hashlib.blake2b(key, digest_size=16, person=b"starling-keyid").digest()[0] == int(sys.argv[2]):
        break
text = base64.urlsafe_b64encode(key).decode().rstrip("=")
open(sys.argv[1], "w").write("starling-cluster-key-v1 " + text + "\n")
PY
[ "$("$STARLING" keygen --show "$FORGED" | sed -n 's/^key id *//p')" = "$B" ] || fail "the forged key's id is not $B"
macs=$(node_field 0 rejected.handshake_mac)
! "$PROBE" --cluster-key "$FORGED" --connect "$seed" --op "use:$B" >/dev/null 2>&1 ||
  node_fail "a handshake under a forged key of the same id succeeded"
[ "$(node_field 0 rejected.handshake_mac)" -gt "$macs" ] || node_fail "the forged HS1 was not counted as handshake_mac"

# Node 2 (the last to join) decides the next request: it must have heard
# every member say which keys it holds (a loaded CI machine once ran it
# before: "member ... has not said which keys it holds yet", 2026-11-28).
wait_for 20 "node 2 seeing key $B accepted and sent by all three" all_on 2 "$B:3/3"
keys 2 install "$KEY_C" >/dev/null || node_fail "keys install on node 2 alone"
expect_fail "--cluster use of a key two members lack" 1 "does not accept key $C" -- keys 2 --cluster use "$C"
keys 1 --cluster --json install "$KEY_C" >"$SCRATCH/install.json" ||
  node_fail "keys --cluster install: $(cat "$SCRATCH/install.json")"
"$NUMPY_PY" - "$SCRATCH/install.json" <<'PY' || node_fail "keys --cluster install --json: $(cat "$SCRATCH/install.json")"
import json, sys
d = json.load(open(sys.argv[1]))
results = sorted(m["result"] for m in d["members"])
assert d["op"] == "install" and len(d["members"]) == 3, d
assert results == ["already", "done", "done"], results  # node 2 had it
PY
# Each step waits until every node's view shows the last one done: each
# node judges a request from its own view (a node that has not yet heard a
# member's new status refuses, and a repeat succeeds).
all_three_on() { all_on 0 "$@" && all_on 1 "$@" && all_on 2 "$@"; }
wait_for 20 "key $C accepted by all three" all_three_on "$B:3/3" "$C:3/0"
expect_fail "--cluster remove of the key all send with" 1 "still sends with key $B" -- keys 0 --cluster remove "$B"
keys 0 --cluster use "$C" >"$SCRATCH/use.txt" || node_fail "keys --cluster use: $(cat "$SCRATCH/use.txt")"
grep -q "0 refused or did not answer" "$SCRATCH/use.txt" || node_fail "use: $(cat "$SCRATCH/use.txt")"
keys 1 --cluster use "$C" >"$SCRATCH/use2.txt" || node_fail "a repeated use: $(cat "$SCRATCH/use2.txt")"
[ "$(grep -c "  already$" "$SCRATCH/use2.txt")" = 3 ] || node_fail "a repeat is not 'already' everywhere: $(cat "$SCRATCH/use2.txt")"
wait_for 20 "every member sending with key $C" all_three_on "$B:3/0" "$C:3/3"
keys 2 --cluster remove "$B" >"$SCRATCH/remove.txt" || node_fail "keys --cluster remove: $(cat "$SCRATCH/remove.txt")"
wait_for 20 "key $B gone from every member" all_on 1 "$C:3/3"
sleep 2
no_loss3 || node_fail "members lost each other during the cluster rotation"
node_peers 1 | "$NUMPY_PY" -c '
import json, sys
c = int(sys.argv[1])
for m in json.load(sys.stdin):
    assert m["keys"] == {"sends": c, "accepts": [c]}, m' "$C" || node_fail "peers --json keys"
[ "$(node_field 1 cluster_requests.granted)" -ge 2 ] || node_fail "node 1 counted no granted requests"
grep -q "cluster key $C now sends, asked by member" "$(node_log 1)" || node_fail "node 1 did not log who asked"
pass "(e) --cluster: install, use, remove reach all three from one node; refusals name the member; a non-member is not answered"
