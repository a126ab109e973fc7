#!/usr/bin/env bash
# test_node_flood.sh: an outsider without the cluster key floods a node with
# idle TCP connections (tcp_flood.py, a separate process that holds each
# connection open and silent until the node closes it, and then opens
# another), which once filled the node's 256-slot table within a second and
# locked members out. The members run on 127.0.0.1, the flood comes from
# 127.0.0.2 and up.
#   (a) One address, 50 new connections a second: the node holds at most
#       16 of them (connections_per_address counts the rest) for the
#       normal 5 s handshake deadline (connections_handshake_timeout).
#   (b) 24 addresses, 1000 a second: connections that have not finished
#       a handshake take at most half the table, the oldest evicted for a
#       newcomer (connections_evicted); meanwhile a new member joins
#       through the flooded node within 15 s, and averaging exchanges with
#       it go on (without these limits, one exchange in 12 s got through,
#       and no new member).
#   (c) 24 addresses, 80 a second (more than a quarter of the table in
#       handshakes, too few to evict): a new connection gets 1 s instead
#       of 5 for its handshake.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

FLOOD=$SRC/tests/integration/tcp_flood.py

node_start 0 "${RECIPE[@]}" --epochs 50 --shard 0/4 --ring-every 0
node_up 0
seed=$NODE_ADDR
node_start 1 "${RECIPE[@]}" --epochs 50 --shard 1/4 --ring-every 0 --join "$seed"
node_up 1
wait_for 30 "node 1 synchronizing from the seed" grep -q "synchronized from" "$(node_log 1)"
ok_at_least() { local n; n=$(node_field "$1" exchanges_ok 2>/dev/null) && [ "$n" -ge "$2" ]; }
wait_for 30 "a first exchange between nodes 0 and 1" ok_at_least 0 1
pass "2 nodes up and averaging ($(node_field 0 exchanges_ok) exchanges) at $(elapsed) s"

# flood_start TAG ARGS...: starts tcp_flood.py against node 0 in the
# background (FLOOD_PID; its JSON goes to $SCRATCH/TAG.json).
flood_start() {
  local tag=$1
  shift
  "$NUMPY_PY" "$FLOOD" --connect "$seed" "$@" >"$SCRATCH/$tag.json" 2>"$SCRATCH/$tag.err" &
  FLOOD_PID=$!
  FLOOD_TAG=$tag
  PIDS+=("$FLOOD_PID")
}
flood_on() {
  kill -0 "$FLOOD_PID" 2>/dev/null ||
    node_fail "flood $FLOOD_TAG ended early: $(cat "$SCRATCH/$FLOOD_TAG.err")"
}
flood_stop() {
  kill -TERM "$FLOOD_PID" 2>/dev/null || true
  wait "$FLOOD_PID" 2>/dev/null || true
  [ -s "$SCRATCH/$FLOOD_TAG.json" ] || node_fail "flood $FLOOD_TAG printed nothing: $(cat "$SCRATCH/$FLOOD_TAG.err")"
}
# rejected KEY: one of node 0's rejected counters (0 when it has no such key).
rejected() {
  local doc
  doc=$(node_status 0) || node_fail "node 0 does not answer"
  "$NUMPY_PY" -c 'import json, sys; print(json.loads(sys.argv[1])["rejected"].get(sys.argv[2], 0))' "$doc" "$1"
}
counter_over() { flood_on; [ "$(rejected "$1")" -gt "$2" ]; }
# flood_field FIELD: a field of the last flood's JSON.
flood_field() { json_field "$SCRATCH/$FLOOD_TAG.json" "$1"; }

# --- (a) one address --------------------------------------------------------
flood_start one --sources 1 --rate 50 --seconds "$(scaled 60)"
wait_for 10 "(a) node 0 refusing the 17th connection from one address" counter_over connections_per_address 0
wait_for 15 "(a) node 0 closing connections at the handshake deadline" counter_over connections_handshake_timeout 0
preauth=$(node_field 0 connections_preauth)
[ "$preauth" -le 16 ] || node_fail "(a) $preauth connections in handshake from one address, want <= 16"
flood_stop
held=$(flood_field held_median_s)
ge "$held" 4 && ge 7 "$held" || node_fail "(a) the node held a connection $held s (median), want about 5: $(cat "$SCRATCH/one.json")"
pass "(a) one address: $preauth in handshake, held $held s (median), $(rejected connections_per_address) refused, $(rejected connections_handshake_timeout) timed out"

# --- (b) many addresses, fast: evictions; members get in --------------------
flood_start many --sources 24 --rate 1000 --max-open 3000 --seconds "$(scaled 90)"
wait_for 15 "(b) node 0 evicting connections" counter_over connections_evicted 0
flood_at=$SECONDS
ok0=$(node_field 0 exchanges_ok)
# A new member joins through the flooded seed: its push-pull must get in.
node_start 2 "${RECIPE[@]}" --epochs 50 --shard 2/4 --ring-every 0 --join "$seed"
node_up 2
wait_for 15 "(b) node 2 joining and synchronizing during the flood" grep -q "synchronized from" "$(node_log 2)"
member_alive() { [ "$(member_state 0 "$(node_field 2 id)")" = alive ]; }
wait_for 15 "(b) node 0 seeing node 2 alive" member_alive
flood_on
pass "(b) node 2 joined through node 0 during the flood, $((SECONDS - flood_at)) s in"
wait_for 15 "(b) node 0 completing exchanges during the flood" ok_at_least 0 $((ok0 + 5))
wait_for 15 "(b) node 2 completing an exchange during the flood" ok_at_least 2 1
preauth=$(node_field 0 connections_preauth)
held=$(node_field 0 connections)
[ "$preauth" -le 128 ] && [ "$held" -le 256 ] ||
  node_fail "(b) node 0 holds $held connections, $preauth in handshake: want <= 256 and <= 128"
flood_on
flood_stop
[ "$(flood_field opened)" -ge 2000 ] || node_fail "(b) the flood opened too few connections: $(cat "$SCRATCH/many.json")"
pass "(b) $(($(node_field 0 exchanges_ok) - ok0)) exchanges on node 0 during the flood, $(node_field 2 exchanges_ok) on node 2; $(rejected connections_evicted) evicted; $held held, $preauth in handshake; flood: $(cat "$SCRATCH/many.json")"

# --- (c) many addresses, slower: the short deadline ---------------------------
timeouts=$(rejected connections_handshake_timeout)
flood_start pressure --sources 24 --rate 80 --seconds "$(scaled 8)"
wait "$FLOOD_PID" || true
held=$(flood_field held_median_s)
ge 2 "$held" || node_fail "(c) under pressure the node held a connection $held s (median), want about 1: $(cat "$SCRATCH/pressure.json")"
[ "$(rejected connections_handshake_timeout)" -gt "$timeouts" ] || node_fail "(c) no handshake timed out under pressure"
pass "(c) under pressure: held $held s (median); flood: $(cat "$SCRATCH/pressure.json")"

for k in 2 1 0; do node_leave "$k"; done
echo "all node flood tests passed in $(elapsed) s"
