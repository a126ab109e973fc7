#!/usr/bin/env bash
# bench_cluster_vs_ddp.sh: wall time and samples to a test accuracy of 0.87
# for starling clusters of 1, 2 and 4 nodes on this machine, against
# PyTorch DistributedDataParallel (gloo, 4 processes) in the same run, as a
# ratio (docs/benchmarks.md).
#
# Both sides: mlp:784-256-128-10 on Fashion-MNIST, strided shards K/N,
# per-process batch 64, SGD momentum 0.9, lr 0.05, cosine over 10 epochs,
# one BLAS thread per process (OPENBLAS_NUM_THREADS=1 for torch), the test
# set evaluated every 0.5 s of wall time. The clock starts when the first
# process is launched (start-up counts on both sides); starling's time is
# when EVERY node's accuracy has reached the target (polled through
# `starling status --json` every 0.25 s), DDP's when rank 0's has (there is
# one model).
#
#   tools/bench/bench_cluster_vs_ddp.sh                   nodes 1 2 4, one repeat
#   NODES="4" REPEATS=3 TARGET=0.87 tools/bench/bench_cluster_vs_ddp.sh
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

NODES=${NODES:-"1 2 4"}
REPEATS=${REPEATS:-1}
TARGET=${TARGET:-0.87}
TIMEOUT=${TIMEOUT:-240}
GOSSIP=${GOSSIP:-0.5}
PY=${PY:-/usr/bin/python3}
build=${ST_BUILD_DIR:-build}
S=$build/starling

bench_setup "$build" python3-torch python3-numpy libopenblas0-pthread

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
"$S" keygen --cluster --out "$work/ck" >/dev/null

recipe=(--model mlp:784-256-128-10 --data fashion-mnist --epochs 10 --batch 64
        --lr 0.05 --momentum 0.9 --schedule cosine --device cpu --threads 1
        --eval-every 0.5 --log-every 0 --checkpoint-every 0 --quiet
        --gossip-every "$GOSSIP")

jfield() { "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d[sys.argv[1]])' "$1" 2>/dev/null; }

# run_starling N: prints "seconds samples" to reach TARGET on every node.
run_starling() {
  local n=$1 dir=$work/s$1
  rm -rf "$dir"; mkdir -p "$dir"
  pids=()
  local t0
  t0=$(date +%s.%N)
  "$S" node --listen 127.0.0.1:0 --cluster-key "$work/ck" --data-dir "$dir/n0" \
    --shard "0/$n" "${recipe[@]}" 2>"$dir/n0.log" &
  pids+=($!)
  local seed=
  for _ in $(seq 200); do
    seed=$("$S" status --json --data-dir "$dir/n0" 2>/dev/null | jfield address || true)
    [ -n "$seed" ] && break
    sleep 0.05
  done
  for ((k = 1; k < n; k++)); do
    "$S" node --listen 127.0.0.1:0 --join "$seed" --cluster-key "$work/ck" \
      --data-dir "$dir/n$k" --shard "$k/$n" "${recipe[@]}" 2>"$dir/n$k.log" &
    pids+=($!)
  done
  local result=""
  while [ -z "$result" ]; do
    local now ok=0 samples=0
    now=$(date +%s.%N)
    if awk -v a="$now" -v b="$t0" -v t="$TIMEOUT" 'BEGIN { exit !(a - b > t) }'; then
      result="timeout"
      break
    fi
    for ((k = 0; k < n; k++)); do
      local js
      js=$("$S" status --json --data-dir "$dir/n$k" 2>/dev/null) || continue
      local acc s
      acc=$(echo "$js" | jfield test_accuracy)
      s=$(echo "$js" | jfield samples)
      samples=$((samples + s))
      awk -v a="$acc" -v t="$TARGET" 'BEGIN { exit !(a != "None" && a >= t) }' && ok=$((ok + 1))
    done
    if [ $ok -eq "$n" ]; then
      result=$(awk -v a="$(date +%s.%N)" -v b="$t0" -v s="$samples" 'BEGIN { printf "%.2f %d", a - b, s }')
    else
      sleep 0.25
    fi
  done
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  echo "$result"
}

run_ddp() {
  local t0
  t0=$(date +%s.%N)
  OPENBLAS_NUM_THREADS=1 timeout "$TIMEOUT" "$PY" tests/bench/torch_ddp.py \
    --world 4 --target "$TARGET" --t0 "$t0" --eval-every 0.5 2>"$work/ddp.log" |
    "$PY" -c 'import json,sys; d=json.load(sys.stdin); t=d["time_to_target_s"]; print("timeout" if t is None else "%.2f %d" % (t, d["samples_to_target"]))'
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F)"
echo "target test accuracy $TARGET; gossip every $GOSSIP s"
printf '%-22s %8s %12s\n' run seconds samples
for r in $(seq "$REPEATS"); do
  ddp=$(run_ddp)
  printf '%-22s %8s %12s\n' "ddp gloo x4 (#$r)" $ddp
  for n in $NODES; do
    res=$(run_starling "$n")
    printf '%-22s %8s %12s\n' "starling x$n (#$r)" $res
    if [ "$n" = 4 ] && [ "$res" != timeout ] && [ "$ddp" != timeout ]; then
      awk -v s="${res%% *}" -v d="${ddp%% *}" 'BEGIN { printf "  starling x4 / ddp x4 wall time: %.2f (goal <= 0.5)\n", s / d }'
    fi
  done
done
