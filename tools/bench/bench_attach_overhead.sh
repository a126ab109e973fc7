#!/usr/bin/env bash
# bench_attach_overhead.sh: what attaching costs a PyTorch training loop
# (docs/benchmarks.md), in two parts:
#
# 1. Per step: examples/pytorch_fmnist.py attached to one `starling node
#    --attach` with no peers, against the same loop with --no-starling, in
#    REPEATS interleaved pairs (the order alternates: A B, B A, ...), each
#    run STEPS steps of the whole training set (--shard 0/1, --batch
#    $BATCH, --threads $THREADS, OPENBLAS_NUM_THREADS=1), a fresh node for
#    every attached run. A run's time per step is its loop's time without
#    the evaluations ((wall_s - eval_s) / steps_here of its --json-out);
#    the overhead is (attached - alone) / alone for each pair, and the
#    median of the pairs. Goal: under 2%.
#
# 2. Per step boundary: tools/bench/attach_step_cost.py on one node of two
#    that average every $GOSSIP s (a partner program steps on the other),
#    for each size in SIZES (cnn: the example's CNN; a number: one tensor
#    of that many floats): node.step() when it did nothing, and when it
#    served a snapshot and/or an averaging correction, against one copy of
#    the parameters measured in the same process. Goal: an exchange costs
#    at most one parameter copy beyond the no-op.
#
#   tools/bench/bench_attach_overhead.sh
#   REPEATS=9 STEPS=600 THREADS=2 tools/bench/bench_attach_overhead.sh
#   PARTS=2 SIZES="cnn 1048576 16777216" tools/bench/bench_attach_overhead.sh
#   SETUP=0 REPEATS=2 STEPS=100 SECONDS_EACH=3 tools/bench/bench_attach_overhead.sh  (a quick check)
#
# Installs what is missing and builds through tools/scripts/setup.sh (SETUP=0
# skips it). Every process is killed by PID on exit.
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

REPEATS=${REPEATS:-5}
STEPS=${STEPS:-400}
BATCH=${BATCH:-64}
THREADS=${THREADS:-1}
SIZES=${SIZES:-"cnn 4194304"}
SECONDS_EACH=${SECONDS_EACH:-15}
WORK_US=${WORK_US:-2000}
GOSSIP=${GOSSIP:-0.05}
PARTS=${PARTS:-"1 2"}
SETUP=${SETUP:-1}
PY=${PY:-/usr/bin/python3}
build=${ST_BUILD_DIR:-build}
S=$build/starling
LIB=$build/libstarling.so

work=$(mktemp -d)
pids=()
kill_all() {
  local p
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  pids=()
}
# shellcheck disable=SC2317 # run by the trap
cleanup() {
  kill_all
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$SETUP" = 1 ]; then
    bench_setup "$build" python3-torch python3-numpy libopenblas0-pthread
fi
for f in "$S" "$LIB"; do
  [ -e "$f" ] || { echo "bench_attach_overhead: $f is missing (build first)" >&2; exit 1; }
done
"$S" keygen --cluster --out "$work/ck" >/dev/null
export STARLING_LIB=$LIB PYTHONPATH=client/python OPENBLAS_NUM_THREADS=1

# node_start NAME [FLAGS...]: an attached node on 127.0.0.1 in the
# background, waited for on its control socket (20 s).
node_start() {
  local name=$1 _
  shift
  rm -rf "${work:?}/$name"
  "$S" node --attach --listen 127.0.0.1:0 --cluster-key "$work/ck" \
    --data-dir "$work/$name" --log-every 0 "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do
    "$S" status --data-dir "$work/$name" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "bench_attach_overhead: node $name did not start: $(tail -3 "$work/$name.log")" >&2
  exit 1
}

# ---- 1. per step ----------------------------------------------------------------

# one_run attached|alone: sets MS to the run's milliseconds per training
# step (a variable, not output: the run stays in this shell, whose trap
# knows its PIDs).
one_run() {
  local how=$1 args=()
  if [ "$how" = attached ]; then
    node_start solo
    args=(--socket "$work/solo/control.sock")
  else
    args=(--no-starling)
  fi
  "$PY" examples/pytorch_fmnist.py "${args[@]}" --shard 0/1 --epochs 100 \
    --max-steps "$STEPS" --batch "$BATCH" --threads "$THREADS" \
    --log-every 100000 --json-out "$work/run.json" >"$work/run.log" 2>&1 ||
    { echo "bench_attach_overhead: the $how run failed: $(tail -3 "$work/run.log")" >&2; exit 1; }
  kill_all
  MS=$("$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print("%.4f" % (1e3 * (d["wall_s"] - d["eval_s"]) / d["steps_here"]))' "$work/run.json")
}

per_step() {
  local r a b first
  echo "== 1. per training step: examples/pytorch_fmnist.py --shard 0/1 --batch $BATCH --threads $THREADS, $STEPS steps a run"
  printf '%-6s %16s %16s %10s\n' pair "alone ms/step" "attached ms/step" overhead
  : >"$work/pairs"
  for ((r = 1; r <= REPEATS; r++)); do
    if ((r % 2)); then
      one_run alone; a=$MS; one_run attached; b=$MS; first=alone
    else
      one_run attached; b=$MS; one_run alone; a=$MS; first=attached
    fi
    echo "$a $b" >>"$work/pairs"
    awk -v a="$a" -v b="$b" -v r="$r" -v f="$first" \
      'BEGIN { printf "%-6s %16.3f %16.3f %9.2f%%  (%s first)\n", r, a, b, 100 * (b - a) / a, f }'
  done
  "$PY" -c 'import statistics, sys
p = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
o = [100 * (b - a) / a for a, b in p]
print("median: alone %.3f ms, attached %.3f ms; overhead %.2f%% (pairs: min %.2f%%, max %.2f%%; goal < 2%%)"
      % (statistics.median(a for a, _ in p), statistics.median(b for _, b in p),
         statistics.median(o), min(o), max(o)))' "$work/pairs"
}

# ---- 2. per step boundary -------------------------------------------------------

# boundary SIZE: the step-cost program on node a, its partner on node b.
boundary() {
  local size=$1 floats=0 _ addr=
  [ "$size" = cnn ] || floats=$size
  node_start a --gossip-every "$GOSSIP" --ring-every 0
  # The measured program first: it brings the model, and node a opens its
  # port; then node b joins and its partner attaches.
  "$PY" tools/bench/attach_step_cost.py --socket "$work/a/control.sock" \
    --floats "$floats" --seconds "$SECONDS_EACH" --work-us "$WORK_US" \
    >"$work/cost.out" 2>&1 &
  local measured=$!
  pids+=("$measured")
  for _ in $(seq 600); do
    addr=$("$S" status --json --data-dir "$work/a" 2>/dev/null |
      "$PY" -c 'import json, sys; print(json.load(sys.stdin)["address"])' 2>/dev/null) || addr=
    [ -n "$addr" ] && [ "${addr##*:}" != 0 ] && break
    sleep 0.1
  done
  node_start b --gossip-every "$GOSSIP" --ring-every 0 --join "$addr"
  "$PY" tools/bench/attach_step_cost.py --socket "$work/b/control.sock" \
    --floats "$floats" --seconds "$((SECONDS_EACH + 5))" --work-us "$WORK_US" \
    --serve >"$work/partner.out" 2>&1 &
  pids+=($!)
  wait "$measured" || { echo "bench_attach_overhead: attach_step_cost.py failed: $(tail -3 "$work/cost.out")" >&2; exit 1; }
  sed 's/^/  /' "$work/cost.out"
  echo "  exchanges (node a): $("$S" status --data-dir "$work/a" 2>/dev/null | awk '/^exchanges/ { $1 = ""; print }')"
  kill_all
}

echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "torch:   $("$PY" -c 'import torch; print(torch.__version__)'); load $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
for part in $PARTS; do
  echo
  case "$part" in
    1) per_step ;;
    2)
      echo "== 2. per step boundary: node.step() by what it served; two nodes averaging every $GOSSIP s, $SECONDS_EACH s a size, ${WORK_US} us of sleep between steps"
      for size in $SIZES; do boundary "$size"; done
      ;;
  esac
done
