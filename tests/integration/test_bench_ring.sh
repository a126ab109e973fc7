#!/usr/bin/env bash
# test_bench_ring.sh: `starling-bench ring` (the ring all-reduce benchmark of
# docs/benchmarks.md) as a test of what its figures rest on: member
# processes running gossip/ring.c over encrypted loopback streams agree on a
# mean that matches the float64 reference, at the default segment size and
# at small segments with several in flight (the --segment-kib and
# --in-flight knobs), and over several lanes (--lanes: segments dealt
# round-robin over several encrypted connections and taken back in order);
# a member that alters its data makes the run fail (the check can fail),
# with lanes too; bad flags are refused with exit 2.
source "$(dirname "$0")/lib.sh"

BENCH=${ST_BUILD_DIR:-$SRC/build}/starling-bench
[ -x "$BENCH" ] || fail "no starling-bench at $BENCH (set ST_BUILD_DIR)"

check() { # FILE EXPR MESSAGE
  "$NUMPY_PY" - "$1" "$2" <<'PY' || fail "$3: $(cat "$1")"
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if eval(sys.argv[2], {"d": d}) else 1)
PY
}

"$BENCH" ring --members 3 --mib 1 --repeats 1 --json >"$SCRATCH/default.json" ||
  fail "3 members, 1 MiB: exit status $?"
check "$SCRATCH/default.json" \
  'd["verified"] is True and d["encrypted"] is True and d["segment_kib"] == 256 and d["in_flight"] == 4 and d["lanes"] == 1 and d["busbw_gbps"] > 0' \
  "default run"
pass "3 members, 1 MiB, default segments: mean verified"

"$BENCH" ring --members 4 --mib 1 --repeats 2 --segment-kib 4 --in-flight 5 --json \
  >"$SCRATCH/small.json" || fail "4 members, 4 KiB segments: exit status $?"
check "$SCRATCH/small.json" \
  'd["verified"] is True and d["segment_kib"] == 4 and d["in_flight"] == 5' \
  "4 KiB segments, 5 in flight"
pass "4 members, 1 MiB in 4 KiB segments, 5 in flight: mean verified"

"$BENCH" ring --members 3 --mib 1 --repeats 2 --segment-kib 4 --lanes 3 --json \
  >"$SCRATCH/lanes.json" || fail "3 members over 3 lanes: exit status $?"
check "$SCRATCH/lanes.json" \
  'd["verified"] is True and d["lanes"] == 3 and d["in_flight"] == 6' \
  "3 lanes"
pass "3 members, 1 MiB in 4 KiB segments over 3 lanes, 2 rounds: mean verified"

status=0
"$BENCH" ring --members 3 --mib 1 --repeats 1 --lanes 2 --corrupt >"$SCRATCH/corrupt2.out" \
  2>"$SCRATCH/corrupt2.err" || status=$?
[ "$status" -eq 1 ] || fail "--corrupt over 2 lanes: exit status $status, want 1"

status=0
"$BENCH" ring --members 3 --mib 1 --repeats 1 --corrupt >"$SCRATCH/corrupt.out" \
  2>"$SCRATCH/corrupt.err" || status=$?
[ "$status" -eq 1 ] || fail "--corrupt: exit status $status, want 1 (the check must catch it)"
pass "--corrupt: a member's altered float fails the run"

expect_fail "segment too large" 2 "--segment-kib: '2048' is not a whole number between 4 and 1024" -- \
  "$BENCH" ring --members 2 --mib 1 --segment-kib 2048
expect_fail "in-flight zero" 2 "--in-flight: '0' is not a whole number between 1 and 16" -- \
  "$BENCH" ring --members 2 --mib 1 --in-flight 0
expect_fail "lanes too many" 2 "--lanes: '9' is not a whole number between 1 and 8" -- \
  "$BENCH" ring --members 2 --mib 1 --lanes 9
