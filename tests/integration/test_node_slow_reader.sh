#!/usr/bin/env bash
# test_node_slow_reader.sh: an insider (a cluster-key holder, fetch_probe)
# asks a donor for state transfers of a 29.6 MB model and then reads them
# slowly or not at all. Before, a finished exchange whose writes were not
# drained never closed, and every such transfer held a copy of the
# parameters. Now, against node A:
#   (a) A serves at most 2 transfers at once: a third request is answered
#       busy (fetches_over_limit);
#   (b) the reader that stops reading is cut by the kernel
#       (TCP_USER_TIMEOUT, 10 s; Linux acts at its next window probe)
#       before the exchange's own 30 s timeout: exchange_closed;
#   (c) the reader that drips (about 128 KiB/s) reaches the exchange
#       timeout, and its connection is reset then: the reader sees the end
#       at once, the node's kernel does not go on sending it megabytes (a
#       graceful close left the kernel's send buffer to drain at its pace);
#   (d) then no transfer holds a slot, and a new member fetches from A.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

PROBE=${ST_BUILD_DIR:-$(dirname "$STARLING")}/fetch_probe
[ -x "$PROBE" ] || fail "no fetch_probe next to $STARLING (build it: cmake --build build)"

# A 7.4M-parameter model (29.6 MB), far more than the socket buffers hold
# and than the dripping reader takes in 30 s (about 6 MB);
# A waits for a second node (--min-nodes 2), so it serves without training.
ARGS=(--model mlp:784-4096-1024-10 --data fashion-mnist --batch 64 --lr 0.01
      --device cpu --threads 1 --epochs 50 --ring-every 0 --gossip-every 0
      --eval-every 60 --min-nodes 2)
node_start 0 --shard 0/2 "${ARGS[@]}"
node_up 0
addr_a=$NODE_ADDR
wait_for 20 "node A waiting for a second node" node_state_is 0 waiting

# rejected KEY: one of A's rejected counters.
rejected() { node_field 0 "rejected.$1"; }
at_least() { local n; n=$(rejected "$1" 2>/dev/null) && [ "$n" -ge "$2" ]; }

started=$SECONDS
"$PROBE" --cluster-key "$KEY" --connect "$addr_a" --readers drip,stall,drip \
  --hold "$(scaled 50)" >"$SCRATCH/probe.json" 2>"$SCRATCH/probe.err" &
PROBE_PID=$!
PIDS+=("$PROBE_PID")

# (a) the third request is busy, while two transfers are served.
wait_for 10 "(a) node A refusing a third transfer" at_least fetches_over_limit 1
[ "$(node_field 0 fetches_serving)" -eq 2 ] || node_fail "(a) A serves $(node_field 0 fetches_serving) transfers, want 2"
pass "(a) A serves 2 transfers and refused the third ($(rejected fetches_over_limit))"

# (b) the stalled reader is cut by the kernel before the 30 s timeout.
wait_for 25 "(b) node A ending the stalled transfer" at_least exchange_closed 1
[ "$(rejected exchange_timeout)" -eq 0 ] ||
  node_fail "(b) the exchange timeout came first: the stalled reader was not cut by TCP_USER_TIMEOUT"
pass "(b) the stalled transfer ended after $((SECONDS - started)) s (exchange_closed $(rejected exchange_closed))"

# (c) the dripping reader: the exchange times out at 30 s, with a reset.
counters() {
  echo "exchange_closed $(rejected exchange_closed), exchange_timeout $(rejected exchange_timeout)," \
    "serving $(node_field 0 fetches_serving)"
}
deadline=$((SECONDS + $(scaled 45)))
until at_least exchange_timeout 1; do
  [ $SECONDS -lt $deadline ] ||
    node_fail "(c) node A ending the dripping transfer: no exchange timeout within $(scaled 45) s ($(counters))"
  sleep 0.5
done
took=$((SECONDS - started))
ge "$took" 30 || node_fail "(c) the exchange timed out after $took s, before its 30 s"
pass "(c) the dripping transfer timed out $took s in"

# (d) nothing holds a slot now; a new member fetches from A.
[ "$(node_field 0 fetches_serving)" -eq 0 ] || node_fail "(d) A still serves $(node_field 0 fetches_serving) transfers"
node_start 1 --shard 1/2 --join "$addr_a" "${ARGS[@]}"
node_up 1
wait_for 30 "(d) node 1 synchronizing from A" grep -q "synchronized from" "$(node_log 1)"
pass "(d) a new member synchronized from A; A holds $(node_field 0 connections) connections"

kill -TERM "$PROBE_PID" 2>/dev/null || true
wait "$PROBE_PID" || node_fail "fetch_probe failed: $(cat "$SCRATCH/probe.err")"
grep -q '"replies":\["ok","ok","busy"\]' "$SCRATCH/probe.json" ||
  node_fail "fetch_probe's replies: $(cat "$SCRATCH/probe.json")"
# The end was a reset: the dripping reader saw its connection end at its
# next drip (every 2 s), not when the node's kernel had delivered the rest
# of its send buffer at the reader's pace (once 90 s in).
ended=$("$NUMPY_PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["ended_s"][0])' "$SCRATCH/probe.json")
[ "$ended" != None ] && ge $((took + 6)) "$ended" ||
  node_fail "(c) the dripping reader saw its end at ${ended} s, the node timed it out at ${took} s: not a reset"
pass "(c) the reset reached the dripping reader at ${ended} s; fetch_probe: $(cat "$SCRATCH/probe.json")"

for k in 1 0; do node_leave "$k"; done
echo "all slow reader tests passed in $(elapsed) s"
