#!/usr/bin/env bash
# test_node_join.sh: `starling join` on running nodes, --advertise, host
# names where addresses go, and "-" for figures a node does not have.
#   (a) two nodes started alone (host names in --listen): `starling join`
#       on the second, with the first's address as a host name, makes them
#       one cluster; each lists the other alive;
#   (b) the address peers see is the advertised one: a node bound to
#       0.0.0.0 with --advertise 127.0.0.1:0 shows 127.0.0.1 and its bound
#       port in status and in the others' peers, and joins them;
#   (c) bad input: an address that does not resolve, no address, no node
#       at the socket, a duration with an unknown unit: clear errors,
#       non-zero exits, nothing joined (and --log-every 500ms is taken);
#   (d) a node with no test set logs "test acc -", never "nan";
#   (e) `starling force-leave`: node 2 killed (kill -9) and held dead by
#       node 0 is forgotten there at once (given by a 12-digit prefix),
#       while node 1, not asked, still lists it dead; an alive member,
#       a member not known, a malformed id and no node are refused; then
#       `--cluster` from node 0 (which forgot it already: "already")
#       makes node 1 forget it too ("done"), and `--cluster` on an alive
#       member is refused before anything is sent.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

host=$(hostname)
getent hosts "$host" | grep -q "^127\." || host=localhost
# Two features, then the label: no test set, a quick model.
"$NUMPY_PY" - "$SCRATCH/data.csv" <<'EOF'
import sys
import numpy as np
rng = np.random.default_rng(1)
x = rng.normal(size=(400, 2))
y = (x[:, 0] + x[:, 1] > 0).astype(int)
np.savetxt(sys.argv[1], np.column_stack([x, y]), delimiter=",", fmt=["%.5f", "%.5f", "%d"])
EOF
ARGS=(--model mlp:2-4-2 --data "csv:$SCRATCH/data.csv" --epochs 100000
      --threads 1 --ring-every 0)
start_alone() { # K LISTEN: node K on its own
  local k=$1 listen=$2
  shift 2
  "$STARLING" node --listen "$listen" --cluster-key "$KEY" \
    --data-dir "$(node_dir "$k")" --log-every 1 "${ARGS[@]}" "$@" >>"$(node_log "$k")" 2>&1 &
  NODE_PID[$k]=$!
  PIDS+=("$!")
}
peer_alive() { [ "$(member_state "$1" "$2")" = alive ]; }

# (a) two lone nodes; join by host name.
start_alone 0 "$host:0"
start_alone 1 "$host:0"
node_up 0
addr0=$NODE_ADDR
node_up 1
id0=$(node_field 0 id)
id1=$(node_field 1 id)
[ "$(node_field 0 peers_alive)" = 0 ] || node_fail "(a) node 0 has peers before any join"
out=$("$STARLING" join --data-dir "$(node_dir 1)" "$host:${addr0##*:}") ||
  node_fail "(a) starling join failed: $out"
grep -q "^joining: asked 1 address" <<<"$out" || node_fail "(a) join said: $out"
wait_for 20 "node 1 to list node 0 alive" peer_alive 1 "$id0"
wait_for 20 "node 0 to list node 1 alive" peer_alive 0 "$id1"
pass "(a) starling join $host:${addr0##*:} made two lone nodes one cluster"

# (b) bound to every interface, advertising loopback.
start_alone 2 0.0.0.0:0 --advertise 127.0.0.1:0 --join "$addr0" --log-every 500ms
node_up 2
addr2=$NODE_ADDR
[ "${addr2%:*}" = 127.0.0.1 ] || node_fail "(b) node 2 shows address $addr2, want 127.0.0.1:PORT"
id2=$(node_field 2 id)
wait_for 20 "node 0 to list node 2 alive" peer_alive 0 "$id2"
seen=$(node_peers 0 | "$NUMPY_PY" -c '
import json, sys
print([m["address"] for m in json.load(sys.stdin) if m["id"] == sys.argv[1]][0])' "$id2")
[ "$seen" = "$addr2" ] || node_fail "(b) node 0 sees node 2 at $seen, it advertises $addr2"
pass "(b) a node bound to 0.0.0.0 with --advertise is reached at $addr2"

# (c) bad input.
expect_fail "(c) unresolvable" 1 "nor a host name this machine can resolve" -- \
  "$STARLING" join --data-dir "$(node_dir 1)" no-such-host.invalid:7946
expect_fail "(c) no address" 2 "give at least one HOST:PORT" -- \
  "$STARLING" join --data-dir "$(node_dir 1)"
expect_fail "(c) no node" 1 "$SCRATCH/nowhere" -- \
  "$STARLING" join --data-dir "$SCRATCH/nowhere" 127.0.0.1:1
expect_fail "(c) bad --advertise" 1 "--advertise" -- \
  "$STARLING" node --listen 127.0.0.1:0 --advertise 1.2.3:x --cluster-key "$KEY" \
  --data-dir "$SCRATCH/bad" "${ARGS[@]}"
expect_fail "(c) a duration without a known unit" 2 "'5x' is not a duration" -- \
  "$STARLING" node --listen 127.0.0.1:0 --log-every 5x --cluster-key "$KEY" \
  --data-dir "$SCRATCH/bad" "${ARGS[@]}"
grep -q "^usage: starling version" <<<"$("$STARLING" version --help)" ||
  fail "(c) starling version --help prints no usage"
pass "(c) bad addresses, durations and a missing node are refused with their reason"

# (d) no test set: "-" in the log, never "nan".
wait_for 20 "a training line in node 0's log" grep -q "training step" "$(node_log 0)"
grep -q "test acc - " "$(node_log 0)" || node_fail "(d) no 'test acc -' in node 0's log"
! grep -q "nan" "$(node_log 0)" || node_fail "(d) node 0 logged nan: $(grep -m1 nan "$(node_log 0)")"
pass "(d) a node without a test set logs 'test acc -'"

# (e) force-leave: node 2 fails for good.
{ kill -9 "${NODE_PID[2]}" && wait "${NODE_PID[2]}"; } 2>/dev/null || true
peer_dead() { [ "$(member_state "$1" "$2")" = dead ]; }
wait_for 30 "node 0 to hold node 2 dead" peer_dead 0 "$id2"
wait_for 30 "node 1 to hold node 2 dead" peer_dead 1 "$id2"
expect_fail "(e) an alive member" 1 "is alive here: only it can leave" -- \
  "$STARLING" force-leave --data-dir "$(node_dir 0)" "${id1:0:12}"
expect_fail "(e) a member not known" 1 "no member 0123abcd here" -- \
  "$STARLING" force-leave --data-dir "$(node_dir 0)" 0123abcd
expect_fail "(e) not an id" 1 "'xyz' is not a member id" -- \
  "$STARLING" force-leave --data-dir "$(node_dir 0)" xyz
expect_fail "(e) no id" 2 "give one member ID" -- \
  "$STARLING" force-leave --data-dir "$(node_dir 0)"
expect_fail "(e) no node" 1 "$SCRATCH/nowhere" -- \
  "$STARLING" force-leave --data-dir "$SCRATCH/nowhere" "${id2:0:12}"
out=$("$STARLING" force-leave --json --data-dir "$(node_dir 0)" "${id2:0:12}") ||
  node_fail "(e) force-leave of the dead node 2 failed: $out"
[ "$out" = "{\"forgotten\":\"$id2\"}" ] || node_fail "(e) force-leave said: $out"
[ "$(member_state 0 "$id2")" = "" ] || node_fail "(e) node 0 still lists node 2: $(member_state 0 "$id2")"
[ "$(member_state 1 "$id2")" = dead ] || node_fail "(e) node 1 no longer lists node 2 dead: $(member_state 1 "$id2")"
grep -q "member ${id2:0:12} forgotten, asked by \`starling force-leave\`" "$(node_log 0)" ||
  node_fail "(e) node 0 did not log the force-leave"
sleep 3 # node 1's rumours of node 2's death do not bring it back to node 0
[ "$(member_state 0 "$id2")" = "" ] || node_fail "(e) node 2 came back to node 0: $(member_state 0 "$id2")"
expect_fail "(e) --cluster on an alive member" 1 "is alive here: only it can leave" -- \
  "$STARLING" force-leave --cluster --data-dir "$(node_dir 0)" "${id1:0:12}"
[ "$(member_state 1 "$id2")" = dead ] || node_fail "(e) node 1 lost node 2 before --cluster"
"$STARLING" force-leave --cluster --json --data-dir "$(node_dir 0)" "$id2" >"$SCRATCH/fl.json" ||
  node_fail "(e) force-leave --cluster: $(cat "$SCRATCH/fl.json")"
"$NUMPY_PY" - "$SCRATCH/fl.json" "$id0" "$id1" <<'PY' || node_fail "(e) force-leave --cluster said: $(cat "$SCRATCH/fl.json")"
import json, sys
d = json.load(open(sys.argv[1]))
got = {m["id"]: m["result"] for m in d["members"]}
assert d["op"] == "force-leave" and got == {sys.argv[2]: "already", sys.argv[3]: "done"}, d
PY
[ "$(member_state 1 "$id2")" = "" ] || node_fail "(e) node 1 still lists node 2 after --cluster"
grep -q "member ${id2:0:12} forgotten, asked by member ${id0:0:12}" "$(node_log 1)" ||
  node_fail "(e) node 1 did not log who asked"
pass "(e) force-leave forgot the failed node 2 on node 0 alone, then with --cluster on node 1; refusals name the cause"
