#!/usr/bin/env bash
# test_sim.sh: the membership simulator `starling-sim` ($2) as a test of the
# membership machine at small scale, with fixed seeds: crash detection
# within the targets of docs/membership.md, no false deaths at 5% loss, a
# timed join reaching everyone in O(log N) rounds, graceful leave, a mass
# restart that leaves nobody dead, a short and a 60 s partition that heal,
# constant load from 16 to 64 nodes, pauses with and without Lifeguard,
# byte-identical reports from the same seed, and usage errors (exit 2).
# Under sanitizers (ST_SANITIZE=ON) the runs are shorter and fewer.
source "$(dirname "$0")/lib.sh"

SIM=${2:-}
[ -n "$SIM" ] && [ -x "$SIM" ] || fail "usage: $0 STARLING STARLING_SIM (no starling-sim given)"
PY=/usr/bin/python3

SMALL=0
[ "${ST_SANITIZE:-OFF}" = ON ] && SMALL=1

# check FILE EXPR MESSAGE: EXPR is a Python expression over d (the JSON).
check() {
  "$PY" - "$1" "$2" <<'EOF' || fail "$3: $(cat "$1")"
import json, sys
d = json.load(open(sys.argv[1]))
ok = eval(sys.argv[2], {"d": d})
sys.exit(0 if ok else 1)
EOF
}

run() { # run NAME ARGS...: the JSON report in $SCRATCH/NAME.json
  local name=$1
  shift
  "$SIM" "$@" --json >"$SCRATCH/$name.json" 2>"$SCRATCH/$name.err" ||
    fail "$name: starling-sim $*: $(cat "$SCRATCH/$name.err")"
}

# --- Usage --------------------------------------------------------------------
"$SIM" --help >"$SCRATCH/help" || fail "--help exit status"
for flag in --nodes --seed --duration --loss --scenario --no-lifeguard --json; do
  grep -q -- "$flag" "$SCRATCH/help" || fail "--help lacks $flag"
done
pass "help"
expect_fail "unknown option" 2 "unknown option '--bogus'" -- "$SIM" --bogus
expect_fail "missing value" 2 "--nodes needs a value" -- "$SIM" --nodes
expect_fail "bad number" 2 "--nodes: 'ten' is not a whole number" -- "$SIM" --nodes ten
expect_fail "too few nodes" 2 "--nodes: '1' is not a whole number between 2" -- "$SIM" --nodes 1
expect_fail "bad loss" 2 "--loss: '1.5' is not a number between 0 and 0.9" -- "$SIM" --loss 1.5
expect_fail "bad scenario" 2 "--scenario: 'explode' is not one of crash, join" -- \
  "$SIM" --scenario explode
expect_fail "stray argument" 2 "unexpected argument 'extra'" -- "$SIM" extra
expect_fail "warm join" 2 "the join scenario grows its own" -- "$SIM" --warm --scenario join
expect_fail "warm too large" 2 "--warm needs --nodes <= 6900" -- "$SIM" --warm --nodes 6901

# --- Determinism: same seed, same bytes (host measurements aside) -------------
strip() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); [d.pop(k) for k in ("wall_seconds","max_rss_bytes")]; print(json.dumps(d))' "$1"; }
args=(--nodes 24 --seed 42 --duration 60 --loss 0.05 --dup 0.02 --scenario crash --events 2)
run det1 "${args[@]}"
run det2 "${args[@]}"
[ "$(strip "$SCRATCH/det1.json")" = "$(strip "$SCRATCH/det2.json")" ] ||
  fail "two runs with seed 42 differ: $(diff <(strip "$SCRATCH/det1.json") <(strip "$SCRATCH/det2.json"))"
run det3 "${args[@]/42/43}"
[ "$(strip "$SCRATCH/det1.json")" != "$(strip "$SCRATCH/det3.json")" ] ||
  fail "seeds 42 and 43 gave the same report"
pass "determinism (seed 42 twice: identical; seed 43: different)"

# --- Crash: detection within the targets ----------------------------------------
# Mean first suspicion <= 2 probe intervals (over the seeds), dead
# everywhere within suspicion-max + 3 s at p99, nothing false. SWIM's
# expected first suspicion is close to 2 intervals (the first probe of the
# dead node comes after ~1 interval, the suspicion at that probe's end), so
# the mean over 96 crashes is allowed 2.25 for sampling noise;
# docs/membership.md measures it on more.
# All 16 seeds under sanitizers too: over 3 runs (18 crashes) the mean's
# sampling error alone is about 0.25 intervals.
seeds=$(seq 1 16)
sum=0
for seed in $seeds; do
  run crash$seed --nodes 32 --seed "$seed" --duration 150 --scenario crash --events 6
  check "$SCRATCH/crash$seed.json" 'd["crashes"] == 6 and d["crashes_dead_everywhere"] == 6' \
    "crash seed $seed: not every crash was held dead everywhere"
  check "$SCRATCH/crash$seed.json" 'd["dead_everywhere_p99_s"] <= d["suspicion_max_s"] + 3' \
    "crash seed $seed: dead everywhere p99 beyond suspicion-max + 3 s"
  check "$SCRATCH/crash$seed.json" 'd["false_deaths"] == 0 and d["false_suspicions"] == 0' \
    "crash seed $seed: false alarms without loss"
  check "$SCRATCH/crash$seed.json" 'd["rejected"] == 0 and d["timer_stalls"] == 0' \
    "crash seed $seed: rejected packets or a stalled timer"
done
"$PY" - $seeds <<EOF || fail "crash: mean first suspicion over seeds above 2 probe intervals"
import json, sys
v = [json.load(open("$SCRATCH/crash%s.json" % s))["first_suspect_mean_probes"] for s in sys.argv[1:]]
m = sum(v) / len(v)
print("ok: crash detection: first suspicion %.2f probe intervals on average over %d runs (target 2)" % (m, len(v)))
sys.exit(0 if m <= 2.25 else 1)
EOF

# --- No false deaths at 5% loss ---------------------------------------------------
dur=900
[ $SMALL = 1 ] && dur=300
run lossy --nodes 32 --seed 5 --duration $dur --loss 0.05 --scenario steady
check "$SCRATCH/lossy.json" 'd["false_deaths"] == 0 and d["dead_pairs_at_end"] == 0' \
  "5% loss: false deaths"
pass "5% loss, 32 nodes, $dur s: no false deaths"

# --- Join: every older node learns a newcomer in O(log N) rounds ------------------
run join --nodes 32 --seed 3 --duration 150 --scenario join
check "$SCRATCH/join.json" 'd["probe_joins"] >= 1 and d["probe_joins_converged"] == d["probe_joins"]' \
  "join: a timed join never reached everyone"
# log2(32) = 5; allow 3x the epidemic's rounds.
check "$SCRATCH/join.json" 'd["join_rounds"] <= 15' "join: more than 15 gossip rounds"
check "$SCRATCH/join.json" 'd["missing_pairs_at_end"] == 0 and d["dead_pairs_at_end"] == 0' \
  "join: the cluster did not converge"
pass "join: $(json_field "$SCRATCH/join.json" join_rounds) gossip rounds to reach 31 nodes"

# --- Leave: held left everywhere, never taken for a failure --------------------
run leave --nodes 32 --seed 4 --duration 120 --scenario leave --events 3
check "$SCRATCH/leave.json" 'd["leaves"] == 3 and d["leaves_everywhere"] == 3' \
  "leave: a leave did not reach everyone"
check "$SCRATCH/leave.json" 'd["left_seen_dead"] == 0 and d["false_deaths"] == 0' \
  "leave: a leave was taken for a failure"
pass "leave"

# --- Restart-all: nobody left dead ---------------------------------------------------
run restart --nodes 32 --seed 6 --duration 120 --scenario restart-all
check "$SCRATCH/restart.json" 'd["restarts"] == 32 and d["reconverged_s"] is not None' \
  "restart-all: never reconverged"
check "$SCRATCH/restart.json" 'd["dead_pairs_at_end"] == 0 and d["missing_pairs_at_end"] == 0 and d["suspect_pairs_at_end"] == 0' \
  "restart-all: a node was left dead, suspect or unknown"
pass "restart-all: reconverged $(json_field "$SCRATCH/restart.json" reconverged_s) s after the last restart"

# --- Partition: a short split heals --------------------------------------------------
run part --nodes 32 --seed 7 --duration 120 --scenario partition --partition-seconds 5
check "$SCRATCH/part.json" 'd["reconverged_s"] is not None and d["missing_pairs_at_end"] == 0 and d["dead_pairs_at_end"] == 0' \
  "partition (5 s): did not reconverge"
pass "partition (5 s) heals"
# A long split: both halves declare each other dead and forget each other;
# the reconnect push-pulls with buried members must bring them back.
run part60 --nodes 32 --seed 7 --duration 200 --scenario partition --partition-seconds 60
check "$SCRATCH/part60.json" 'd["reconverged_s"] is not None and d["missing_pairs_at_end"] == 0 and d["dead_pairs_at_end"] == 0' \
  "partition (60 s): did not reconverge"
pass "partition (60 s) heals: $(json_field "$SCRATCH/part60.json" reconverged_s) s after the heal"
run part1w --nodes 32 --seed 7 --duration 120 --scenario partition --partition-seconds 5 --one-way
check "$SCRATCH/part1w.json" 'd["packets_cut"] > 0' "one-way partition cut nothing"
pass "one-way partition runs"

# --- Constant load: packets per member per second, 16 vs 64 nodes -------------
if [ $SMALL = 0 ]; then
  run load16 --nodes 16 --seed 8 --duration 300 --scenario steady
  run load64 --nodes 64 --seed 8 --duration 300 --scenario steady
  "$PY" - "$SCRATCH/load16.json" "$SCRATCH/load64.json" <<'EOF' || fail "load differs by more than 20% from 16 to 64 nodes"
import json, sys
a, b = (json.load(open(f))["packets_per_member_per_s"] for f in sys.argv[1:])
print("ok: packets per member per second: %.3f at 16 nodes, %.3f at 64" % (a, b))
sys.exit(0 if abs(a - b) <= 0.2 * min(a, b) else 1)
EOF
fi

# --- Warm start: converged from t = 0, then the same targets --------------------
# Every node knows every other alive at its first incarnation (the boot by
# gossip is what the join scenario measures); the cluster must count as
# converged at the first check, detect crashes within the targets, and run
# at the steady load of 2 packets per member per second when nothing
# happens (a ping and an ack: no boot dissemination left to carry).
run warm --nodes 64 --seed 10 --duration 150 --scenario crash --events 4 --warm
check "$SCRATCH/warm.json" 'd["warm"] is True and d["converged_s"] == 0.25' \
  "warm: not converged at the first check"
check "$SCRATCH/warm.json" 'd["crashes_dead_everywhere"] == 4 and d["dead_everywhere_p99_s"] <= d["suspicion_max_s"] + 3' \
  "warm: a crash not held dead everywhere in time"
check "$SCRATCH/warm.json" 'd["false_deaths"] == 0 and d["false_suspicions"] == 0 and d["rejected"] == 0' \
  "warm: false alarms or rejected packets"
check "$SCRATCH/warm.json" 'd["missing_pairs_at_end"] == 0 and d["suspect_pairs_at_end"] == 0' \
  "warm: views incomplete at the end"
run warm_steady --nodes 64 --seed 10 --duration 120 --scenario steady --warm
check "$SCRATCH/warm_steady.json" '1.9 <= d["packets_per_member_per_s"] <= 2.1' \
  "warm: load far from a ping and an ack per member per second"
pass "warm start: converged at once, $(json_field "$SCRATCH/warm_steady.json" packets_per_member_per_s) packets per member per second"

# --- Pauses, Lifeguard on and off: runs and reports (see docs/membership.md) ------
run pause_on --nodes 32 --seed 9 --duration 300 --scenario pause
run pause_off --nodes 32 --seed 9 --duration 300 --scenario pause --no-lifeguard
check "$SCRATCH/pause_on.json" 'd["pauses"] > 0 and d["lifeguard"] is True' "pause: no pauses"
check "$SCRATCH/pause_off.json" 'd["pauses"] > 0 and d["lifeguard"] is False' "pause: no pauses"
# With Lifeguard a stalled node re-arms its timers instead of concluding
# (membership_probe.c, st__stall): no healthy node is suspected.
check "$SCRATCH/pause_on.json" 'd["false_suspicions"] == 0' \
  "pause: false suspicions with Lifeguard on"
echo "note: false suspicions under pauses: lifeguard on $(json_field "$SCRATCH/pause_on.json" false_suspicions)," \
  "off $(json_field "$SCRATCH/pause_off.json" false_suspicions) (the 10x ratio is measured at 64 nodes in docs/membership.md)"
pass "pause"

# --- Averaging: the exchange machines of gossip/exchange.c at 256 nodes ----------
# Issue 13: the mean squared distance to the average falls by at least a
# factor 1 - 1/(n - 1) per completed exchange, within 20% (theory is the
# rate of the expected distance for uniformly random pairs; one run's
# log-rate is at least that on average, see docs/membership.md). About
# 2350 exchanges (a fall of 1e4 in theory), a few ms of wall time.
avg=(--scenario average --nodes 256 --seed 11)
run avg1 "${avg[@]}"
run avg2 "${avg[@]}"
[ "$(strip "$SCRATCH/avg1.json")" = "$(strip "$SCRATCH/avg2.json")" ] ||
  fail "average: two runs with seed 11 differ: $(diff <(strip "$SCRATCH/avg1.json") <(strip "$SCRATCH/avg2.json"))"
check "$SCRATCH/avg1.json" 'd["exchanges_completed"] >= d["exchanges_target"] > 2000' \
  "average: too few exchanges completed"
check "$SCRATCH/avg1.json" 'd["exchanges_failed"] == 0' "average: an exchange failed"
check "$SCRATCH/avg1.json" 'd["msd_end"] <= d["msd_start"] * 1e-3' \
  "average: the squared distance fell by less than 1e3"
check "$SCRATCH/avg1.json" 'd["rate_ratio"] >= 0.8' \
  "average: contraction per exchange below 0.8 x theory"
check "$SCRATCH/avg1.json" 'd["mean_drift_max"] < 1e-4' \
  "average: the global average drifted"
check "$SCRATCH/avg1.json" 'd["exchanges_busy"] > 0 and d["max_active_nodes"] > 2' \
  "average: exchanges never overlapped"
pass "average: 256 nodes, $(json_field "$SCRATCH/avg1.json" exchanges_completed) exchanges, rate $(json_field "$SCRATCH/avg1.json" rate_ratio) x theory, drift $(json_field "$SCRATCH/avg1.json" mean_drift_max)"
expect_fail "bad dim" 2 "--dim: '0' is not a whole number between 1" -- "$SIM" --scenario average --dim 0
