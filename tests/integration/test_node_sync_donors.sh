#!/usr/bin/env bash
# test_node_sync_donors.sh: multi-donor state sync (issue #16;
# docs/protocol.md, "Multi-donor state sync") on real `starling node`
# processes, each in its own network namespace, the joiners' link shaped
# to 8 Mbit/s so that a transfer takes seconds (a range of one 1 MiB chunk
# about 4 s while four donors share the link):
#   (a) four donors train a 1.7M-parameter model (7 chunks of the agreed
#       state) with a ring round every 20 of the proposer's steps and one
#       when it is done; once all four are done they hold one agreed state
#       (the same id). Donor 3 runs with STARLING_FAULT_SYNC_CORRUPT: it
#       flips a bit in every chunk it serves;
#   (b) a joiner with --sync-donors 4 gets a range from each: it drops
#       donor 3 at its first chunk (chunks_bad 1, donors_bad 1), fetches
#       its chunks from the others, and ends holding exactly the agreed
#       state (its id, a hash of every float, equal to the donors') at the
#       donors' step;
#   (c) the same while an honest donor serving it is killed (kill -9)
#       mid-transfer: donors_lost 1, the same exact state;
#   (d) --sync-donors 1: the whole state from one donor (FETCH), as before;
#   and bad values of --sync-donors are refused, naming the range.
# About 30 s. Skipped (exit 0) only when not root or without `ip netns`.
# Named test_node_* so that CMake runs it alone among the cluster tests.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"
source "$SRC/tools/bench/bench_lib.sh"

# Bad values (nothing starts).
for v in 0 17 x; do
  expect_fail "--sync-donors $v" 2 "--sync-donors: '$v' is not a whole number between 1 and 16" -- \
    "$STARLING" node --sync-donors "$v" --listen 127.0.0.1:0 --cluster-key "$KEY" \
    --data-dir "$SCRATCH/refused"
done
[ ! -e "$SCRATCH/refused" ] || fail "a refused --sync-donors made its data directory"
pass "--sync-donors 0, 17 and x refused, naming the flag and the range"

if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: network namespaces need root (run as root to test multi-donor sync)"
  exit 0
fi
if ! ip netns list >/dev/null 2>&1; then
  echo "skipped: 'ip netns' does not work here (iproute2 and network namespaces needed)"
  exit 0
fi

# Namespaces PREFIX-sync-0 .. 4 on one bridge; 4 is the joiners'.
PREFIX=stsync$$
up_ns=()
# On exit: the nodes first (they hold the namespaces), then the
# namespaces, then lib.sh's cleanup.
ns_cleanup() {
  local u pid
  for pid in "${PIDS[@]:-}"; do
    if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
  done
  for u in "${up_ns[@]:-}"; do
    # shellcheck disable=SC2086 # "TAG N": two arguments
    if [ -n "$u" ]; then bench_ns_down "$PREFIX" $u; fi
  done
  cleanup
}
trap ns_cleanup EXIT
RATE='' bench_ns_up "$PREFIX" sync 5
# The joiners' ingress: the bridge's end of their link.
# At 16 Mbit/s a loaded CI machine once let 1.9 s pass between the
# joiner's agreement and the kill in (c), and donor 1 had sent its range
# by then (donors_lost 0; 2026-11-27): at 8 each first range takes ~4 s.
tc -n "$PREFIX-sync-br" qdisc add dev p4 root tbf rate 8mbit burst 64kb latency 400ms

"$NUMPY_PY" - "$SCRATCH/data.csv" <<'EOF'
import sys
import numpy as np
rng = np.random.default_rng(3)
x = rng.normal(size=(400, 20))
y = (x[:, :10].sum(axis=1) > 0).astype(int)
np.savetxt(sys.argv[1], np.column_stack([x, y]), delimiter=",", fmt="%.5f")
EOF
MODEL=(--model mlp:20-4096-400-2 --data "csv:$SCRATCH/data.csv" --batch 8
       --lr 0.01 --epochs 40 --threads 1 --device cpu --gossip-every 0
       --eval-every 0 --checkpoint-every 0)
DONOR=(--local-steps 20 --ring-every 0 --min-nodes 4)
CHUNKS=7 # ceil(1,725,618 / 262,144)

# ns_start K NS FLAGS...: node K in namespace NS, listening on its address.
ns_start() {
  local k=$1 r=$2
  shift 2
  ip netns exec "$PREFIX-sync-$r" "$STARLING" node \
    --listen "10.77.0.$((r + 1)):7946" --cluster-key "$KEY" \
    --data-dir "$(node_dir "$k")" --log-every 1 "${MODEL[@]}" "$@" \
    >>"$(node_log "$k")" 2>&1 &
  NODE_PID[$k]=$!
  PIDS+=("$!")
}
SEED=10.77.0.1:7946

# (a) four donors, one of them corrupting what it serves.
ns_start 0 0 --shard 0/4 "${DONOR[@]}"
node_up 0
ns_start 1 1 --shard 1/4 "${DONOR[@]}" --join "$SEED"
ns_start 2 2 --shard 2/4 "${DONOR[@]}" --join "$SEED"
STARLING_FAULT_SYNC_CORRUPT=1 ns_start 3 3 --shard 3/4 "${DONOR[@]}" --join "$SEED"
for k in 1 2 3; do node_up "$k"; done
grep -q "STARLING_FAULT_SYNC_CORRUPT is set" "$(node_log 3)" ||
  node_fail "(a) donor 3 does not say it corrupts what it serves"
all_done() {
  local k
  for k in 0 1 2 3; do node_state_is "$k" "done" || return 1; done
}
wait_for 120 "(a) the four donors finishing their epochs" all_done
# agreed_ids: the donors' agreed ids, one a line.
agreed_ids() {
  local k
  for k in 0 1 2 3; do node_field "$k" agreed.id 2>/dev/null || echo none; done
}
# One agreed state, after the proposer's final round: the proposer (the
# donor of the smallest id) proposes rounds until its final one
# (ring_final_round), and nobody after it. Taking the agreed state before
# that round once gave the test a state the joiner never got (2026-11-28).
proposer=0
for k in 1 2 3; do
  [[ "$(node_field "$k" id)" < "$(node_field "$proposer" id)" ]] && proposer=$k
done
one_agreed() {
  [ "$(node_field "$proposer" ring_final_round 2>/dev/null)" = true ] &&
    [ "$(agreed_ids | sort -u | wc -l)" = 1 ] && ! agreed_ids | grep -q none
}
wait_for 30 "(a) the four donors holding one agreed state, of their final round" one_agreed
AGREED=$(node_field 0 agreed.id)
ROUND=$(node_field 0 agreed.round)
STEP=$(for k in 0 1 2 3; do node_field "$k" step; done | sort -n | head -1)
pass "(a) four donors done at step >= $STEP, holding agreed state $AGREED (round $ROUND)"

# joiner K FLAGS...: starts joiner K in the joiners' namespace (no ring of
# its own, so the donors' agreed state stays as it is).
joiner() {
  local k=$1
  shift
  ns_start "$k" 4 --shard 0/4 --ring-every 0 --join "$SEED" "$@"
  node_up "$k"
}
synced() { ! node_state_is "$1" syncing; }
# check_exact K WHAT: joiner K took the agreed state, exactly, at STEP.
check_exact() {
  local k=$1 what=$2 id step
  id=$(node_field "$k" agreed.id)
  [ "$id" = "$AGREED" ] || node_fail "$what: joiner $k holds state $id, the donors $AGREED"
  step=$(node_field "$k" step)
  [ "$step" -ge "$STEP" ] || node_fail "$what: joiner $k is at step $step, the donors at $STEP or more"
  [ "$(node_field "$k" sync.ok)" = 1 ] || node_fail "$what: sync.ok is not 1"
  grep -q "synchronized from [0-9]* donors at step [0-9]*: the agreed state of ring round $ROUND" \
    "$(node_log "$k")" || node_fail "$what: no multi-donor sync line for round $ROUND"
}

# (b) four donors, one corrupting.
joiner 10 --sync-donors 4
wait_for 60 "(b) joiner 10 synchronizing" synced 10
check_exact 10 "(b)"
bad=$(node_field 10 sync.chunks_bad)
bad_donors=$(node_field 10 sync.donors_bad)
[ "$bad:$bad_donors" = 1:1 ] ||
  node_fail "(b) chunks_bad $bad, donors_bad $bad_donors: want 1 and 1"
[ "$(node_field 10 sync.chunks_ok)" = "$CHUNKS" ] ||
  node_fail "(b) $(node_field 10 sync.chunks_ok) chunks verified, want $CHUNKS"
grep -q "sent a chunk that does not match the agreed manifest" "$(node_log 10)" ||
  node_fail "(b) the joiner does not name the bad donor"
[ "$(node_field 3 sync.served_chunks)" -ge 1 ] || node_fail "(b) donor 3 served no chunk"
pass "(b) 4 donors, 1 corrupting: $CHUNKS chunks verified, the bad donor dropped, state $AGREED exactly"
kill -9 "${NODE_PID[10]}"

# (c) a donor killed mid-transfer (and donor 3 still corrupting). Donor
# 1's link at 1 Mbit/s: its range (a chunk or two of 1 MiB) takes 8 s or
# more, so that the kill lands mid-range however late it comes (at 8 the
# range was sometimes sent before the kill: donors_lost 0, 2026-11-28).
tc -n "$PREFIX-sync-1" qdisc add dev eth0 root tbf rate 1mbit burst 16kb latency 400ms
joiner 11 --sync-donors 4
wait_for 30 "(c) joiner 11 agreeing on a manifest" grep -q "donors agree on the state" "$(node_log 11)"
kill -9 "${NODE_PID[1]}"
wait_for 60 "(c) joiner 11 synchronizing" synced 11
check_exact 11 "(c)"
lost=$(node_field 11 sync.donors_lost)
[ "$lost" = 1 ] || node_fail "(c) donors_lost $lost, want 1 (donor 1 killed mid-range)"
grep -q "went away mid-range" "$(node_log 11)" || node_fail "(c) the joiner does not say a donor went away"
pass "(c) donor 1 killed mid-transfer: its chunks came from the others, state $AGREED exactly"
kill -9 "${NODE_PID[11]}"

# (d) one donor, as before.
joiner 12 --sync-donors 1
wait_for 60 "(d) joiner 12 synchronizing" synced 12
grep -q "synchronized from [0-9a-f]\{12\} at step" "$(node_log 12)" ||
  node_fail "(d) --sync-donors 1 did not take the state from one donor"
[ "$(node_field 12 sync.ok)" = 0 ] || node_fail "(d) --sync-donors 1 went multi-donor"
pass "(d) --sync-donors 1: the whole state from one donor"
