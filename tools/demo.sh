#!/usr/bin/env bash
# demo.sh: the main job. Installs what is missing, builds, and trains the
# 784-256-128-10 MLP on Fashion-MNIST for 10 epochs on this machine (GPU when
# there is one), showing progress and the test accuracy after every epoch.
# Extra arguments are passed to `starling train` (e.g. --device cpu --json).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
mkdir -p out
exec build/starling train --model mlp:784-256-128-10 --data fashion-mnist \
  --epochs 10 --batch 64 --lr 0.05 --momentum 0.9 --schedule cosine \
  --checkpoint out/fashion-mnist-mlp.safetensors "$@"
