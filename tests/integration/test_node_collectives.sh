#!/usr/bin/env bash
# test_node_collectives.sh: user collectives across real processes
# (docs/collectives.md). Three nodes; a program on each (comm_probe, built
# on the client library) talks to its own node:
#   (a) barrier, all-reduce (float64 sum on the small path; float32 mean,
#       min and max of 1.2 MB on the ring), reduce to rank 1, broadcast
#       (small and chain): every member checks its results against float64
#       values it computes itself;
#   (b) one member calls with another count: every member fails, and the
#       errors name both calls;
#   (c) a member that never arrives: a barrier with a 1 s timeout fails on
#       the others, naming the member not heard from;
#   (d) a member's program killed while it waits in a barrier: the others
#       fail at once, naming it ("went away");
#   (g) publish and fetch: a program on node 0 publishes a tensor and exits;
#       programs on nodes 1 and 2 fetch it (large and small) exactly; a
#       name nobody published is refused naming it; a cluster-key holder
#       that is not a member gets no answer to its asks, for a published
#       name or not (counted as dropped), and a malformed ask closes its
#       connection;
#   (f) a call only one member makes times out, is withdrawn, and leaves
#       the members in step: the next barrier of all passes;
#   (e) a member's node killed -9 during a barrier: the others fail within
#       the failure detector's bound, naming it; no survivor hangs.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

PROBE=${ST_BUILD_DIR:-$(dirname "$STARLING")}/comm_probe
[ -x "$PROBE" ] || fail "comm_probe not built at $PROBE"
N=3
ARGS=(--model mlp:784-16-10 --data fashion-mnist --batch 64 --device cpu
      --threads 1 --epochs 1000 --eval-every 1000000 --ring-every 0)
sock() { echo "$(node_dir "$1")/control.sock"; }

node_start 0 --shard "0/$N" "${ARGS[@]}"
node_up 0
seed=$NODE_ADDR
for ((k = 1; k < N; k++)); do node_start "$k" --join "$seed" --shard "$k/$N" "${ARGS[@]}"; done
for ((k = 1; k < N; k++)); do node_up "$k"; done

# probe_all OUT CMD...: comm_probe on every node at once; waits for all.
probe_all() {
  local out=$1 k pids=()
  shift
  for ((k = 0; k < N; k++)); do
    timeout "$(scaled 60)" "$PROBE" "$(sock $k)" "$@" >"$SCRATCH/$out.$k" 2>&1 &
    pids+=("$!")
    PIDS+=("$!")
  done
  for k in "${!pids[@]}"; do wait "${pids[$k]}" || true; done
}

# (a) every pattern, checked against float64 on every member.
probe_all a check $N
for ((k = 0; k < N; k++)); do
  grep -q "^ok rank" "$SCRATCH/a.$k" || node_fail "(a) member $k: $(cat "$SCRATCH/a.$k")"
done
# Eight operations each; status counts them (and nothing failed).
coll_ok() {
  "$NUMPY_PY" -c '
import json, sys
c = json.loads(sys.argv[1])["collectives"]
sys.exit(0 if c["ok"] == 8 and c["failed"] == 0 and c["running"] == 0 else 1)' "$(node_status "$1")"
}
for ((k = 0; k < N; k++)); do
  coll_ok $k || node_fail "(a) node $k's status: $(node_status $k | grep -o '"collectives":{[^}]*}')"
done
pass "(a) barrier, all-reduce (small and ring), reduce, broadcast correct on all $N members"

# (b) a mismatch fails everywhere and names both calls.
for ((k = 0; k < N; k++)); do
  c=$((k == 2 ? 99 : 100))
  timeout "$(scaled 60)" "$PROBE" "$(sock $k)" count $c >"$SCRATCH/b.$k" 2>&1 &
  PIDS+=("$!")
  bp[$k]=$!
done
for ((k = 0; k < N; k++)); do wait "${bp[$k]}" || true; done
for ((k = 0; k < N; k++)); do
  grep -q "^error:" "$SCRATCH/b.$k" || node_fail "(b) member $k did not fail: $(cat "$SCRATCH/b.$k")"
done
grep -qh "of 99 float32.*of 100 float32\|of 100 float32.*of 99 float32" "$SCRATCH"/b.* ||
  node_fail "(b) no error names both calls: $(cat "$SCRATCH"/b.*)"
pass "(b) a count mismatch fails all $N members: $(head -c 160 "$SCRATCH/b.0")"

# (g) publish and fetch, and hostile asks.
STORE_PROBE=${ST_BUILD_DIR:-$(dirname "$STARLING")}/store_probe
[ -x "$STORE_PROBE" ] || fail "store_probe not built at $STORE_PROBE"
id0=$(node_field 0 id)
"$PROBE" "$(sock 0)" publish w 300000 >"$SCRATCH/g.pub" 2>&1 || node_fail "(g) publish: $(cat "$SCRATCH/g.pub")"
"$PROBE" "$(sock 0)" publish s 3 >>"$SCRATCH/g.pub" 2>&1 || node_fail "(g) publish: $(cat "$SCRATCH/g.pub")"
for k in 1 2; do
  for spec in "w 300000" "s 3"; do
    read -r name count <<<"$spec"
    timeout "$(scaled 60)" "$PROBE" "$(sock $k)" fetch "$id0" "$name" "$count" >"$SCRATCH/g.$k" 2>&1 ||
      node_fail "(g) member $k fetching $name: $(cat "$SCRATCH/g.$k")"
  done
done
timeout "$(scaled 60)" "$PROBE" "$(sock 1)" fetch "$id0" nobody 3 >"$SCRATCH/g.none" 2>&1 && node_fail "(g) a fetch of nothing passed"
grep -q '^error: .*nothing is published under "nobody"' "$SCRATCH/g.none" ||
  node_fail "(g) a fetch of nothing: $(cat "$SCRATCH/g.none")"
dropped_before=$(node_field 0 collectives.dropped)
field_before=$(node_field 0 rejected.wire_field)
# A name published there and one that is not: neither is answered.
for name in w nobody; do
  out=$(timeout "$(scaled 30)" "$STORE_PROBE" --cluster-key "$KEY" --connect "$(node_field 0 address)" --name "$name") ||
    node_fail "(g) store_probe failed: $out"
  [ "$out" = '{"answered":false,"closed":true}' ] || node_fail "(g) store_probe --name $name: $out"
done
dropped=$(node_field 0 collectives.dropped)
[ "$dropped" -ge $((dropped_before + 6)) ] ||
  node_fail "(g) 4 asks and 2 forged refusals from a non-member: collectives.dropped $dropped_before -> $dropped"
field=$(node_field 0 rejected.wire_field)
[ "$field" -ge $((field_before + 2)) ] ||
  node_fail "(g) 2 malformed asks: rejected.wire_field $field_before -> $field"
served=$(node_field 0 collectives.fetches_served)
[ "$served" -eq 4 ] || node_fail "(g) node 0 served $served fetches, not 4"
timeout "$(scaled 60)" "$PROBE" "$(sock 2)" fetch "$id0" s 3 >"$SCRATCH/g.after" 2>&1 ||
  node_fail "(g) a member's fetch after the hostile asks: $(cat "$SCRATCH/g.after")"
pass "(g) published on node 0, fetched exactly by 1 and 2; nothing published refused by name; a non-member's asks (a published name and not) dropped ($dropped_before -> $dropped), malformed ones closed"

# (c) member 2 never arrives: the others time out, naming it.
id2=$(node_field 2 id)
for k in 0 1; do
  "$PROBE" "$(sock $k)" barrier 1 >"$SCRATCH/c.$k" 2>&1 &
  PIDS+=("$!")
  cp_[$k]=$!
done
for k in 0 1; do wait "${cp_[$k]}" || true; done
for k in 0 1; do
  grep -q "^error: .*timed out after .*${id2:0:12}" "$SCRATCH/c.$k" ||
    node_fail "(c) member $k: $(cat "$SCRATCH/c.$k")"
done
# Member 2 now calls its barrier: the others have moved on; it times out too.
"$PROBE" "$(sock 2)" barrier 1 >"$SCRATCH/c.2" 2>&1 || true
grep -q "^error:" "$SCRATCH/c.2" || node_fail "(c) member 2 alone passed a barrier"
pass "(c) a barrier's timeout names the member that never came"

# (d) member 0's program is killed while it waits in a barrier that member
# 2 never joins: member 1 fails at once, naming member 0.
id0=$(node_field 0 id)
for k in 0 1; do
  "$PROBE" "$(sock $k)" barrier 0 >"$SCRATCH/d.$k" 2>&1 &
  PIDS+=("$!")
  dp[$k]=$!
done
sleep 1
kill -9 "${dp[0]}" 2>/dev/null || true
t_kill=$SECONDS
wait_for 10 "member 1's barrier to fail" test -s "$SCRATCH/d.1"
grep -q "^error: .*member ${id0}.*went away" "$SCRATCH/d.1" ||
  node_fail "(d) member 1: $(cat "$SCRATCH/d.1")"
pass "(d) a program killed in a barrier fails it on the others in $((SECONDS - t_kill)) s: $(head -c 160 "$SCRATCH/d.1")"

# (f) a call nobody else makes: it times out and is withdrawn, and the
# members stay in step. Member 2 first takes the failure (d) left for it
# (the ABORT kept for the barrier it never called), then member 0 calls a
# barrier alone, then all three call one: it must pass.
"$PROBE" "$(sock 2)" barrier 5 >"$SCRATCH/f.pre" 2>&1 || true
grep -q "^error: .*went away" "$SCRATCH/f.pre" || node_fail "(f) member 2's kept failure: $(cat "$SCRATCH/f.pre")"
"$PROBE" "$(sock 0)" barrier 1 >"$SCRATCH/f.alone" 2>&1 || true
grep -q "^error: .*withdrawn" "$SCRATCH/f.alone" || node_fail "(f) a lone barrier: $(cat "$SCRATCH/f.alone")"
probe_all f barrier 20
for ((k = 0; k < N; k++)); do
  grep -q "^ok" "$SCRATCH/f.$k" || node_fail "(f) member $k after a withdrawn call: $(cat "$SCRATCH/f.$k")"
done
pass "(f) a call nobody else made is withdrawn; the next barrier of all $N passes"

# (e) node 2 killed -9 during a barrier: the others fail within the
# detector's bound, naming it.
id2=$(node_field 2 id)
for k in 0 1; do
  "$PROBE" "$(sock $k)" barrier 0 >"$SCRATCH/e.$k" 2>&1 &
  PIDS+=("$!")
  ep[$k]=$!
done
sleep 0.5
kill -9 "${NODE_PID[2]}"
t_kill=$SECONDS
for k in 0 1; do
  wait_for 30 "member $k's barrier to fail" test -s "$SCRATCH/e.$k"
done
for k in 0 1; do
  grep -q "^error: .*member ${id2}: .*\(dead\|closed\|left\)" "$SCRATCH/e.$k" ||
    node_fail "(e) member $k: $(cat "$SCRATCH/e.$k")"
done
pass "(e) node 2 killed: the barrier failed on both survivors in $((SECONDS - t_kill)) s, naming it"
