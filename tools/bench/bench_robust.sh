#!/usr/bin/env bash
# bench_robust.sh: what robust averaging costs without an attack and what it
# saves under attacks, on real processes. Each run is NODES `starling node
# --attach` on 127.0.0.1 (gossip every 0.1 s, a ring round every second),
# each with a program of examples/client.c on its own shard of the
# synthetic problem (ceiling ~0.75 test accuracy), except that under an
# attack the last F nodes run tests/integration/hostile_client.c with that
# attack instead (poison:V, flip:K, noise:S, stale, nan:P: see its top
# comment). A run's figure is the mean, over the honest programs, of each
# one's mean test accuracy over its last 10 reports (its last 2000 steps).
# Prints one line per configuration: mean and standard deviation over
# REPEATS runs with --clip 0 and with --clip 3, and the difference in
# percentage points.
#
#   tools/bench/bench_robust.sh          (ST_BUILD_DIR, default build-bench)
#   REPEATS=5 STEPS=12000 tools/bench/bench_robust.sh
#   NODES=8 FS="1 2" ATTACKS="poison:8 flip:4 noise:0.5 stale nan:0.2" \
#     REPEATS=2 tools/bench/bench_robust.sh
#
# ST_BUILD_DIR is built (tools/scripts/setup.sh) when it has no starling.
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"
BUILD=${ST_BUILD_DIR:-build-bench}
[ -x "$BUILD/starling" ] || bench_setup "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
REPEATS=${REPEATS:-5}
STEPS=${STEPS:-12000}
NODES=${NODES:-4}
FS=${FS:-1}
ATTACKS=${ATTACKS:-poison:8}
export ST_BUILD_DIR=$BUILD
set -- "$BUILD/starling"
source tests/integration/lib.sh
source tests/integration/node_lib.sh

for prog in examples/client tests/integration/hostile_client; do
  cc -std=c11 -O2 "$SRC/$prog.c" -I"$SRC/client" -L"$BUILD" -lstarling -lm \
    -Wl,-rpath,"$BUILD" -o "$SCRATCH/$(basename "$prog")" || fail "building $prog.c"
done
next=0

# run CLIP ATTACK F BASE: one cluster, nodes BASE..BASE+NODES-1 (fresh data
# directories), the last F of them attackers (F 0: no attack); prints the
# honest programs' mean accuracy.
run() {
  local clip=$1 attack=$2 f=$3 base=$4 k
  local flags=(--attach --gossip-every 0.1 --ring-every 1 --clip "$clip" --quiet)
  node_start $base "${flags[@]}"
  wait_for 20 "node $base's socket" test -S "$(node_dir $base)/control.sock"
  "$SCRATCH/client" --socket "$(node_dir $base)/control.sock" --steps 1 >/dev/null
  node_up $base
  local seed=$NODE_ADDR pids=() honest=$((NODES - f))
  for ((k = 1; k < NODES; k++)); do
    node_start $((base + k)) "${flags[@]}" --join "$seed"
  done
  for ((k = 1; k < NODES; k++)); do
    wait_for 20 "node $((base + k))'s socket" \
      test -S "$(node_dir $((base + k)))/control.sock"
  done
  for ((k = honest; k < NODES; k++)); do
    "$SCRATCH/hostile_client" --socket "$(node_dir $((base + k)))/control.sock" \
      --attack "$attack" --steps 1000000 --step-us 1000 >/dev/null 2>&1 &
    PIDS+=($!)
  done
  for ((k = 0; k < honest; k++)); do
    "$SCRATCH/client" --socket "$(node_dir $((base + k)))/control.sock" \
      --shard $k/$honest --steps "$STEPS" --step-us 500 >"$SCRATCH/p$base-$k.out" 2>&1 &
    pids+=($!)
    PIDS+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for ((k = 0; k < NODES; k++)); do
    kill -9 "${NODE_PID[$((base + k))]}" 2>/dev/null || true
  done
  for ((k = 0; k < honest; k++)); do
    grep '^step' "$SCRATCH/p$base-$k.out" | tail -n 10 |
      awk '{ s += $NF } END { printf "%.4f\n", s / NR }'
  done | awk '{ s += $1 } END { printf "%.4f", s / NR }'
}

# config ATTACK F: REPEATS runs with each --clip; one line.
config() {
  local attack=$1 f=$2 clip r line out=""
  for clip in 0 3; do
    local vals=()
    for ((r = 0; r < REPEATS; r++)); do
      vals+=("$(run $clip "$attack" $f $next)")
      next=$((next + NODES))
    done
    line=$(printf '%s\n' "${vals[@]}" |
      awk '{ s += $1; q += $1 * $1 } END { m = s / NR; v = q / NR - m * m;
             printf "%.4f %.4f", m, (v > 0 ? sqrt(v) : 0) }')
    out="$out ${line%% *} ${line##* }"
  done
  set -- $out
  printf '%-12s f=%d  plain %s +- %s  robust %s +- %s  robust - plain %+.2f pp\n' \
    "$attack" "$f" "$1" "$2" "$3" "$4" "$(awk -v a="$3" -v b="$1" 'BEGIN { print (a - b) * 100 }')"
}

echo "robust averaging: $NODES nodes, $REPEATS runs each, $STEPS steps, $(nproc) cores, $(date -u +%Y-%m-%d)"
echo "honest programs' test accuracy (mean +- sd over runs), --clip 0 (plain) and --clip 3 (robust)"
config none 0
for attack in $ATTACKS; do
  for f in $FS; do config "$attack" "$f"; done
done
