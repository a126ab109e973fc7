#!/usr/bin/env bash
# test_train_cli.sh: `starling train` end to end on real Fashion-MNIST (a
# shard of it, to stay quick): progress and --json output, checkpoints that
# NumPy reads, an interrupted and resumed run that lands on exactly the
# parameters of an uninterrupted one, and clear errors for bad input.
source "$(dirname "$0")/lib.sh"
# `starling train` keeps its model in out/train/ under the current
# directory by default: run in a directory of our own.
mkdir "$SCRATCH/run" && cd "$SCRATCH/run"

common=(--model mlp:784-64-10 --data fashion-mnist --shard 0/10 --batch 32
        --lr 0.05 --momentum 0.9 --schedule cosine --threads 1 --device cpu)

# --- --help and usage errors -------------------------------------------------
grep -q -- "--model SPEC" <<<"$("$STARLING" train --help)" || fail "train --help"
grep -q "train" <<<"$("$STARLING" --help)" || fail "starling --help"
pass "help"
expect_fail "no arguments" 2 "--model and --data are required" -- "$STARLING" train
expect_fail "unknown option" 2 "unknown option '--bogus'" -- "$STARLING" train --bogus
expect_fail "bad model" 2 "model 'mlp:784-x-10'" -- \
  "$STARLING" train --model mlp:784-x-10 --data fashion-mnist
expect_fail "bad number" 2 "--epochs: 'ten' is not a whole number" -- \
  "$STARLING" train --model softmax:784-10 --data fashion-mnist --epochs ten
expect_fail "bad shard" 2 "--shard: '4/4'" -- \
  "$STARLING" train --model softmax:784-10 --data fashion-mnist --shard 4/4
expect_fail "bad device" 1 '--device: unknown device "gpu"' -- \
  "$STARLING" train --model softmax:784-10 --data fashion-mnist --device gpu
expect_fail "model does not fit data" 1 "expects 100 inputs but .* has 784 features" -- \
  "$STARLING" train --model mlp:100-10-10 --data fashion-mnist --device cpu
expect_fail "too few outputs" 1 "has 5 outputs but .* has 10 classes" -- \
  "$STARLING" train --model mlp:784-10-5 --data fashion-mnist --device cpu
expect_fail "missing file" 1 "$SCRATCH/nope.gz" -- \
  "$STARLING" train --model softmax:784-10 --data "idx:$SCRATCH/nope.gz,$SCRATCH/nope2.gz"
STARLING_FASHION_MNIST_DIR="$SCRATCH/empty" expect_fail "dataset missing" 1 \
  "apt-get install dataset-fashion-mnist" -- \
  "$STARLING" train --model softmax:784-10 --data fashion-mnist

# --- The CUDA backend module (a build with CUDA: libstarling_cuda.so) --------
# Programs do not link the CUDA runtime or cuBLAS; the module is loaded only
# when a device is asked for, and only where the NVIDIA driver is.
module=$(dirname "$STARLING")/libstarling_cuda.so
if [ -f "$module" ]; then
  ! ldd "$STARLING" | grep -q "libcublas\|libcudart" || fail "starling links the CUDA libraries"
  if ! ldconfig -p | grep -q "libcuda.so.1 "; then
    expect_fail "cuda without a driver" 1 "cannot open cuda: no NVIDIA driver on this machine .*; use --device cpu" -- \
      "$STARLING" train --model softmax:784-10 --data fashion-mnist --device cuda
  fi
  # With the CUDA toolkit's stub libcuda.so as the driver, the module is
  # found next to the program and loaded, and reports the stub.
  stub=$(ls /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/targets/*/lib/stubs/libcuda.so 2>/dev/null | head -1 || true)
  if [ -z "$stub" ]; then
    echo "skipped: module loading (no stub libcuda.so in /usr/local/cuda)"
  else
    mkdir -p "$SCRATCH/drv" && ln -s "$stub" "$SCRATCH/drv/libcuda.so.1"
    LD_LIBRARY_PATH=$SCRATCH/drv expect_fail "cuda with a stub driver" 1 "cudaErrorStubLibrary" -- \
      "$STARLING" train --model softmax:784-10 --data fashion-mnist --device cuda
    LD_LIBRARY_PATH=$SCRATCH/drv STARLING_CUDA_MODULE=$SCRATCH/none.so expect_fail "module missing" 1 \
      "the CUDA backend module libstarling_cuda.so could not be loaded \(set STARLING_CUDA_MODULE to its path; .*none.so" -- \
      "$STARLING" train --model softmax:784-10 --data fashion-mnist --device cuda
  fi
fi

# --- A short run with --json and a checkpoint --------------------------------
"$STARLING" train "${common[@]}" --epochs 2 --json --log-every 0 \
  --checkpoint "$SCRATCH/a.safetensors" >"$SCRATCH/a.json" 2>"$SCRATCH/a.log" ||
  fail "training run: $(cat "$SCRATCH/a.log")"
grep -q "^epoch 1/2  step 1/188  loss" "$SCRATCH/a.log" || fail "no progress lines"
grep -q "^epoch 2/2 done .*test_accuracy" "$SCRATCH/a.log" || fail "no epoch summary"
for key in test_accuracy epochs samples_per_sec wall_seconds; do
  json_field "$SCRATCH/a.json" $key >/dev/null || fail "json lacks $key"
done
acc=$(json_field "$SCRATCH/a.json" test_accuracy)
"$NUMPY_PY" -c "import sys; sys.exit(0 if $acc > 0.75 else 1)" ||
  fail "test accuracy $acc after 2 epochs on a tenth of the data"
[ "$(json_field "$SCRATCH/a.json" epochs)" = 2 ] || fail "epochs in json"
pass "train --json (test_accuracy $acc)"

"$NUMPY_PY" "$SRC/tests/integration/check_safetensors_numpy.py" \
  "$SCRATCH/a.safetensors" >"$SCRATCH/np.txt" || fail "numpy cannot read the checkpoint"
grep -q "layers.0.weight" "$SCRATCH/np.txt" || fail "numpy: no layers.0.weight"
grep -q "optimizer.momentum_buffer.layers.1.bias" "$SCRATCH/np.txt" ||
  fail "numpy: no momentum buffer"
pass "checkpoint readable by NumPy"

# --- Stop mid-epoch, resume, and land on the same parameters ---------------------
# The uninterrupted reference is a.safetensors (2 epochs of 188 steps). Stop
# a second run part-way through epoch 2, resume it, and compare bit for bit.
"$STARLING" train "${common[@]}" --epochs 2 --checkpoint "$SCRATCH/b.safetensors" \
  --stop-after-steps 250 >"$SCRATCH/b.log" 2>&1 || fail "stopped run: $(cat "$SCRATCH/b.log")"
grep -q "^epoch 1/2  step 47/188  loss [0-9.]*  lr [0-9.]*  [0-9]* samples/s" "$SCRATCH/b.log" ||
  fail "default progress: no line every quarter epoch: $(cat "$SCRATCH/b.log")"
grep -q "stopped (--stop-after-steps) at step 250; continue with --resume" "$SCRATCH/b.log" ||
  fail "no stop message: $(cat "$SCRATCH/b.log")"
"$STARLING" train "${common[@]}" --epochs 2 --checkpoint "$SCRATCH/b.safetensors" \
  --resume "$SCRATCH/b.safetensors" >"$SCRATCH/b2.log" 2>&1 ||
  fail "resume: $(cat "$SCRATCH/b2.log")"
grep -q "resumed from .* at epoch 2, step 250" "$SCRATCH/b2.log" || fail "no resume message"
"$NUMPY_PY" - "$SCRATCH/a.safetensors" "$SCRATCH/b.safetensors" <<'PY' || fail "resumed run differs from the uninterrupted one"
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return h.pop("__metadata__"), b[8 + n:]
ma, da = load(sys.argv[1])
mb, db = load(sys.argv[2])
for k in ("step", "epoch", "pos", "optimizer_step"):
    assert ma[k] == mb[k], (k, ma[k], mb[k])
assert da == db, "tensor bytes differ"
PY
pass "stopped at step 250 and resumed: parameters and optimizer state match the uninterrupted run bit for bit"

# --- SIGINT: an orderly stop with a checkpoint ----------------------------------------
"$STARLING" train --model mlp:784-256-10 --data fashion-mnist --device cpu --threads 1 \
  --epochs 50 --checkpoint "$SCRATCH/c.safetensors" >"$SCRATCH/c.log" 2>&1 &
pid=$!
PIDS+=("$pid")
for _ in $(seq 1 300); do
  grep -q "steps per epoch" "$SCRATCH/c.log" && break
  sleep 0.1
done
sleep 0.3
kill -INT "$pid"
status=0
wait "$pid" || status=$?
[ "$status" -eq 130 ] || fail "SIGINT: exit status $status, want 130: $(cat "$SCRATCH/c.log")"
grep -q "interrupted at step [0-9]*; continue with --resume" "$SCRATCH/c.log" ||
  fail "SIGINT: no message: $(cat "$SCRATCH/c.log")"
"$NUMPY_PY" "$SRC/tests/integration/check_safetensors_numpy.py" "$SCRATCH/c.safetensors" \
  >/dev/null || fail "SIGINT: checkpoint unreadable"
pass "SIGINT stops in order, with a checkpoint"

# --- CSV regression: a linear model recovers a linear target -----------------------
awk 'BEGIN { srand(7); print "x1,x2,y";
  for (i = 0; i < 500; i++) { a = rand() * 4 - 2; b = rand() * 4 - 2;
    printf "%.6f,%.6f,%.6f\n", a, b, 2 * a - b + 0.5 + (rand() - 0.5) * 0.01 } }' \
  >"$SCRATCH/reg.csv"
"$STARLING" train --model linear:2-1 --data "csv:$SCRATCH/reg.csv" --epochs 40 \
  --batch 16 --lr 0.05 --device cpu --json >"$SCRATCH/reg.json" 2>"$SCRATCH/reg.log" ||
  fail "csv regression: $(cat "$SCRATCH/reg.log")"
mse=$(json_field "$SCRATCH/reg.json" train_eval_loss)
"$NUMPY_PY" -c "import sys; sys.exit(0 if $mse < 1e-3 else 1)" ||
  fail "csv regression: loss $mse after 40 epochs"
[ "$(json_field "$SCRATCH/reg.json" test_accuracy)" = None ] || fail "regression has no accuracy"
pass "csv regression (0.5 * mse $mse)"

# --- Resume refusals ----------------------------------------------------------------
expect_fail "resume with another model" 1 "written with --model mlp:784-64-10 but this run has --model mlp:784-32-10" -- \
  "$STARLING" train --model mlp:784-32-10 --data fashion-mnist --shard 0/10 --batch 32 \
  --momentum 0.9 --device cpu --resume "$SCRATCH/a.safetensors"
head -c 100 "$SCRATCH/a.safetensors" >"$SCRATCH/trunc.safetensors"
expect_fail "resume from a truncated file" 1 "trunc.safetensors" -- \
  "$STARLING" train "${common[@]}" --resume "$SCRATCH/trunc.safetensors"
expect_fail "resume from a missing file" 1 "missing.safetensors" -- \
  "$STARLING" train "${common[@]}" --resume "$SCRATCH/missing.safetensors"
expect_fail "checkpoint into a missing directory" 1 "--checkpoint: directory '.*nodir' does not exist" -- \
  "$STARLING" train "${common[@]}" --epochs 1 --checkpoint "$SCRATCH/nodir/c.safetensors"

# --- A diverging run stops with a clear message ------------------------------------
expect_fail "divergence" 1 "training diverged at step" -- \
  "$STARLING" train --model mlp:784-64-10 --data fashion-mnist --shard 0/10 --device cpu \
  --lr 100000 --momentum 0.9 --epochs 1

echo "all train CLI tests passed"
