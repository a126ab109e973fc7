#!/usr/bin/env bash
# bench_sync_sgd.sh: samples/s of synchronous data-parallel SGD on N
# members (default 4) on this machine: starling.SyncDataParallel, each
# member a process next to its own starling node on 127.0.0.1, against
# PyTorch DistributedDataParallel over gloo (N processes), in the same run
# (docs/benchmarks.md, "Synchronous SGD against DDP (issue 15)").
#
# Both sides run tests/bench/sync_sgd_member.py: an MLP ($MODEL, default
# 784-512-512-10: 0.67 M parameters, 2.7 MB of float32 gradients a step)
# on synthetic data, per-member batch $BATCH, plain SGD, buckets of
# $BUCKET bytes, one intra-op thread per process (OPENBLAS_NUM_THREADS=1);
# $WARMUP steps, a barrier, then $STEPS timed steps. One process alone
# (no communication) is the reference. Each figure is the median of
# $REPEATS runs.
#
# Also the built-in trainer's `starling train --sync` (docs/collectives.md,
# "Synchronous SGD (starling train --sync)"): N members of the same MLP
# (mlp:$MODEL), batch $BATCH, plain SGD, one OpenBLAS thread each, one
# epoch over shards of $BATCH x ($WARMUP + $STEPS) random 28x28 images
# (IDX); the group's samples/s is N x member 0's "samples_per_sec" (its
# stepping time: warm-up steps included, loading and the evaluation at
# the end not).
#
#   tools/bench/bench_sync_sgd.sh
#   N=2 BATCH=256 REPEATS=5 tools/bench/bench_sync_sgd.sh
#
# The nodes train nothing (a one-example built-in model, gossip and rings
# off) and only carry the collectives. Installs what is missing
# (python3-torch) and builds through tools/scripts/setup.sh (SETUP=0
# skips it). Every process is killed by PID on exit.
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

N=${N:-4}
MODEL=${MODEL:-784-512-512-10}
BATCH=${BATCH:-64}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-5}
BUCKET=${BUCKET:-1048576}
REPEATS=${REPEATS:-3}
TIMEOUT=${TIMEOUT:-300}
SETUP=${SETUP:-1}
PY=${PY:-/usr/bin/python3}
build=${ST_BUILD_DIR:-build}
S=$build/starling
MEMBER=tests/bench/sync_sgd_member.py

case "$N" in '' | *[!0-9]* | 0 | 1) echo "bench_sync_sgd: N=$N: a member count of 2 or more" >&2; exit 2 ;; esac
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$SETUP" = 1 ]; then bench_setup "$build" python3-torch; fi
[ -x "$S" ] && [ -e "$build/libstarling.so" ] ||
  { echo "bench_sync_sgd: $S or $build/libstarling.so is missing: build first (or SETUP=1)" >&2; exit 1; }
echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 STARLING_LIB=$build/libstarling.so
echo "torch:   $($PY -c 'import torch; print(torch.__version__)'), gloo backend"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min; other work on these cores skews every figure)"
echo "runs:    N=$N members, model $MODEL, batch $BATCH each, $WARMUP + $STEPS steps, buckets of $BUCKET bytes, median of $REPEATS"
echo

# The nodes: one built-in node per member with a tiny model, so that each
# is on the network at once; gossip and rings off.
bench_idle_nodes "$S" "$work" "$N"

run_group() { # MODE: N members at once; prints member 0's JSON
  local mode=$1 k ps=() ok=0 port=0
  [ "$mode" = ddp ] && port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  for ((k = 0; k < N; k++)); do
    timeout "$TIMEOUT" "$PY" "$MEMBER" --mode "$mode" --socket "$work/n$k/control.sock" \
      --rank "$k" --world "$N" --port "$port" --model "$MODEL" --batch "$BATCH" \
      --steps "$STEPS" --warmup "$WARMUP" --bucket-bytes "$BUCKET" >"$work/$mode.$k" 2>&1 &
    ps+=($!)
    pids+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || ok=1; done
  [ $ok -eq 0 ] || { tail -n 5 "$work/$mode".* >&2; echo "bench_sync_sgd: $mode failed" >&2; exit 1; }
  grep '^{' "$work/$mode.0"
}
# The built-in trainer's data: N shards of BATCH x (WARMUP + STEPS) images.
"$PY" - "$work" $((N * BATCH * (WARMUP + STEPS))) <<'PY'
import struct, sys
import numpy as np
work, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(1)
with open(f"{work}/x.idx", "wb") as f:
    f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, n, 28, 28))
    f.write(rng.integers(0, 256, size=(n, 784), dtype=np.uint8).tobytes())
with open(f"{work}/y.idx", "wb") as f:
    f.write(struct.pack(">BBBBI", 0, 0, 8, 1, n))
    f.write(rng.integers(0, 10, size=n, dtype=np.uint8).tobytes())
PY
run_builtin() { # N `starling train --sync` at once; prints the group's samples/s
  local k ps=() ok=0
  for ((k = 0; k < N; k++)); do
    timeout "$TIMEOUT" "$S" train --sync --data-dir "$work/n$k" --shard "$k/$N" \
      --model "mlp:$MODEL" --data "idx:$work/x.idx,$work/y.idx" --no-normalize \
      --batch "$BATCH" --epochs 1 --lr 0.01 --device cpu --threads 1 \
      --no-checkpoint --json >"$work/builtin.$k" 2>"$work/builtin.err.$k" &
    ps+=($!)
    pids+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || ok=1; done
  [ $ok -eq 0 ] || { tail -n 5 "$work"/builtin.err.* >&2; echo "bench_sync_sgd: starling train --sync failed" >&2; exit 1; }
  "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples_per_sec"] * int(sys.argv[2]))' \
    "$work/builtin.0" "$N"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p"; }

echo "\$ $PY $MEMBER --mode alone --model $MODEL --batch $BATCH --steps $STEPS"
echo "\$ $PY $MEMBER --mode starling --socket DATA_DIR/control.sock ...   (one per node, $N at once)"
echo "\$ $PY $MEMBER --mode ddp --rank K --world $N --port P ...          ($N at once)"
echo "\$ $S train --sync --data-dir DATA_DIR --shard K/$N --model mlp:$MODEL --batch $BATCH ...   ($N at once)"
echo
: >"$work/alone.all"; : >"$work/starling.all"; : >"$work/ddp.all"; : >"$work/builtin.all"
for ((r = 0; r < REPEATS; r++)); do
  timeout "$TIMEOUT" "$PY" "$MEMBER" --mode alone --model "$MODEL" --batch "$BATCH" \
    --steps "$STEPS" --warmup "$WARMUP" | field samples_per_s >>"$work/alone.all"
  run_group starling | field samples_per_s >>"$work/starling.all"
  run_group ddp | field samples_per_s >>"$work/ddp.all"
  run_builtin >>"$work/builtin.all"
done
node_pids=("${pids[@]:0:N}")
kill -TERM "${node_pids[@]}" 2>/dev/null || true
for p in "${node_pids[@]}"; do wait "$p" 2>/dev/null || true; done
alone=$(median <"$work/alone.all")
st=$(median <"$work/starling.all")
ddp=$(median <"$work/ddp.all")
bi=$(median <"$work/builtin.all")
printf '%-34s %12s   %s\n' "run" "samples/s" "all runs"
printf '%-34s %12s   %s\n' "one process, no communication" "$alone" "$(tr '\n' ' ' <"$work/alone.all")"
printf '%-34s %12s   %s\n' "starling SyncDataParallel, N=$N" "$st" "$(tr '\n' ' ' <"$work/starling.all")"
printf '%-34s %12s   %s\n' "PyTorch DDP (gloo), N=$N" "$ddp" "$(tr '\n' ' ' <"$work/ddp.all")"
printf '%-34s %12s   %s\n' "starling train --sync, N=$N" "$bi" "$(tr '\n' ' ' <"$work/builtin.all")"
awk -v s="$st" -v d="$ddp" 'BEGIN { printf "starling / DDP: %.2f\n", s / d }'
awk -v s="$bi" -v d="$ddp" 'BEGIN { printf "starling train --sync / DDP: %.2f\n", s / d }'
