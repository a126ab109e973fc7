#!/usr/bin/env bash
# bench_robust.sh: what robust averaging costs without an attack and what it
# saves under one, on real processes. Each run is 4 `starling node --attach`
# on 127.0.0.1 (gossip every 0.1 s, a ring round every second), each with a
# program of examples/client.c on its own shard of the synthetic problem
# (ceiling ~0.75 test accuracy); under attack the fourth runs
# tests/integration/hostile_client.c (--attack poison:8) instead. A run's
# figure is the mean, over the honest programs, of each one's mean test
# accuracy over its last 10 reports (its last 2000 steps). Prints one line
# per configuration: mean and standard deviation over REPEATS runs, and the
# difference robust - plain in percentage points.
#
#   tools/bench/bench_robust.sh [BUILD_DIR]     (default build-bench)
#   REPEATS=5 STEPS=12000 tools/bench/bench_robust.sh
#
# BUILD_DIR is built (tools/scripts/setup.sh) when it has no starling.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/bench_lib.sh
BUILD=${1:-build-bench}
[ -x "$BUILD/starling" ] || bench_setup "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
REPEATS=${REPEATS:-5}
STEPS=${STEPS:-12000}
export ST_BUILD_DIR=$BUILD
set -- "$BUILD/starling"
source tests/integration/lib.sh
source tests/integration/node_lib.sh

for prog in examples/client tests/integration/hostile_client; do
  cc -std=c11 -O2 "$SRC/$prog.c" -I"$SRC/client" -L"$BUILD" -lstarling -lm \
    -Wl,-rpath,"$BUILD" -o "$SCRATCH/$(basename "$prog")" || fail "building $prog.c"
done
next=0

# run CLIP ATTACK BASE: one cluster, nodes BASE..BASE+3 (fresh data
# directories); prints the honest programs' mean accuracy.
run() {
  local clip=$1 attack=$2 base=$3 k
  local flags=(--attach --gossip-every 0.1 --ring-every 1 --clip "$clip" --quiet)
  node_start $base "${flags[@]}"
  wait_for 20 "node $base's socket" test -S "$(node_dir $base)/control.sock"
  "$SCRATCH/client" --socket "$(node_dir $base)/control.sock" --steps 1 >/dev/null
  node_up $base
  local seed=$NODE_ADDR pids=() honest=4
  for k in 1 2 3; do
    node_start $((base + k)) "${flags[@]}" --join "$seed"
    wait_for 20 "node $((base + k))'s socket" \
      test -S "$(node_dir $((base + k)))/control.sock"
  done
  if [ "$attack" = poison ]; then
    honest=3
    "$SCRATCH/hostile_client" --socket "$(node_dir $((base + 3)))/control.sock" \
      --attack poison:8 --steps 1000000 --step-us 1000 >/dev/null 2>&1 &
    PIDS+=($!)
  fi
  for ((k = 0; k < honest; k++)); do
    "$SCRATCH/client" --socket "$(node_dir $((base + k)))/control.sock" \
      --shard $k/$honest --steps "$STEPS" --step-us 500 >"$SCRATCH/p$base-$k.out" 2>&1 &
    pids+=($!)
    PIDS+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for k in 0 1 2 3; do kill -9 "${NODE_PID[$((base + k))]}" 2>/dev/null || true; done
  for ((k = 0; k < honest; k++)); do
    grep '^step' "$SCRATCH/p$base-$k.out" | tail -n 10 |
      awk '{ s += $NF } END { printf "%.4f\n", s / NR }'
  done | awk '{ s += $1 } END { printf "%.4f", s / NR }'
}

echo "robust averaging: $REPEATS runs each, $STEPS steps, 4 nodes on $(nproc) cores, $(date -u +%Y-%m-%d)"
for attack in none poison; do
  declare -A mean=()
  for clip in 0 3; do
    vals=()
    for ((r = 0; r < REPEATS; r++)); do
      vals+=("$(run $clip $attack $next)")
      next=$((next + 4))
    done
    line=$(printf '%s\n' "${vals[@]}" |
      awk '{ s += $1; q += $1 * $1 } END { m = s / NR; v = q / NR - m * m;
             printf "%.4f %.4f", m, (v > 0 ? sqrt(v) : 0) }')
    mean[$clip]=${line%% *}
    printf 'attack %-6s --clip %s  honest accuracy %s +- %s  (runs: %s)\n' \
      "$attack" "$clip" "${line%% *}" "${line##* }" "${vals[*]}"
  done
  awk -v a="${mean[3]}" -v b="${mean[0]}" -v t="$attack" \
    'BEGIN { printf "attack %-6s robust - plain: %+.2f percentage points\n", t, (a - b) * 100 }'
done
