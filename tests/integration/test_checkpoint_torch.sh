#!/usr/bin/env bash
# test_checkpoint_torch.sh: a checkpoint is a model PyTorch can use on its
# own. Runs the lines of docs/training.md ("In PyTorch", between the
# torch-rebuild markers), exactly as written there, on the checkpoint of a
# short `starling train` run, and checks that they reproduce the accuracy
# `starling eval` and `starling train` report, within 1e-3. On a small
# Fashion-MNIST (tests/integration/mini_fashion_mnist.py), which the doc's
# lines read through STARLING_FASHION_MNIST_DIR as starling does. Skipped
# (exit 0, saying so) only when PyTorch cannot be imported.
source "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "skipped: $PY cannot import torch (apt-get install python3-torch)"
  exit 0
fi

MINI=$SCRATCH/fmnist
"$PY" "$SRC/tests/integration/mini_fashion_mnist.py" "$MINI" 3000 1000 ||
  fail "cannot make the small Fashion-MNIST"
export STARLING_FASHION_MNIST_DIR=$MINI
mkdir "$SCRATCH/run" && cd "$SCRATCH/run"

# The doc's lines, as written (the fenced block between the markers).
awk '/<!-- torch-rebuild: begin -->/ { on = 1; next }
     /<!-- torch-rebuild: end -->/ { on = 0 }
     on && !/^```/' "$SRC/docs/training.md" >rebuild.py
grep -q 'starling.load_checkpoint("out/train/model.safetensors")' rebuild.py ||
  fail "docs/training.md has no torch-rebuild block reading out/train/model.safetensors"

# Two hidden layers, so that the ReLUs between layers are exercised.
"$STARLING" train --model mlp:784-64-32-10 --data fashion-mnist --epochs 2 \
  --batch 32 --momentum 0.9 --device cpu --threads 1 --json >train.json 2>train.log ||
  fail "training: $(cat train.log)"
"$STARLING" eval --checkpoint out/train/model.safetensors --data fashion-mnist \
  --device cpu --json >eval.json || fail "eval"
PYTHONPATH=$SRC/client/python PYTHONDONTWRITEBYTECODE=1 "$PY" rebuild.py >torch.out 2>torch.err ||
  fail "the doc's PyTorch lines fail: $(cat torch.err)"
torch_acc=$(sed -n 's/^test_accuracy //p' torch.out)
eval_acc=$(json_field eval.json accuracy)
train_acc=$(json_field train.json test_accuracy)
[ "$eval_acc" = "$train_acc" ] || fail "eval $eval_acc, train reported $train_acc"
"$PY" -c "import sys; sys.exit(0 if abs($torch_acc - $eval_acc) <= 1e-3 else 1)" ||
  fail "PyTorch's accuracy $torch_acc is not starling's $eval_acc"
pass "PyTorch rebuilt the model from the checkpoint alone: accuracy $torch_acc, starling $eval_acc"
