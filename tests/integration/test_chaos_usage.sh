#!/usr/bin/env bash
# test_chaos_usage.sh: tools/scripts/chaos.sh (a run takes minutes, so it is not run
# here; docs/operations.md, "Chaos runs") answers --help and refuses bad
# flags with exit status 2 and a message naming the flag, before it starts
# any node.
source "$(dirname "$0")/lib.sh"

CHAOS=$SRC/tools/scripts/chaos.sh
"$CHAOS" --help >"$SCRATCH/help" || fail "chaos.sh --help: exit status $?"
grep -q "kill -9" "$SCRATCH/help" || fail "chaos.sh --help does not describe the run"
pass "chaos.sh --help"
expect_fail "too few nodes" 2 "--nodes wants a number >= 3" -- "$CHAOS" --nodes 2 --starling "$STARLING"
expect_fail "minutes not a number" 2 "--minutes wants a whole number" -- "$CHAOS" --minutes x --starling "$STARLING"
expect_fail "epochs zero" 2 "--epochs wants a number >= 1" -- "$CHAOS" --epochs 0 --starling "$STARLING"
expect_fail "unknown flag" 2 "unknown option '--frobnicate'" -- "$CHAOS" --frobnicate
expect_fail "no starling" 2 "no starling at /nonexistent" -- "$CHAOS" --starling /nonexistent
[ ! -e "$SRC/out/chaos/node0.log" ] || [ "$SRC/out/chaos/node0.log" -ot "$SCRATCH/help" ] ||
  fail "a refused run started a node"
pass "every refusal before any node started"
