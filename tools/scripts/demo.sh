#!/usr/bin/env bash
# demo.sh: the main job. Installs what is missing, builds, and runs a local
# cluster of 4 starling nodes on 127.0.0.1, each training the
# 784-256-128-10 MLP on its own quarter of Fashion-MNIST and averaging with
# its peers over encrypted TCP. Shows one line per node, refreshed, until
# every node has run its 10 epochs; then each node's test accuracy and the
# spread between nodes, and draws every node's loss and test accuracy into
# out/cluster/plot.png and .svg (`starling plot`, matplotlib). Ctrl-C stops
# every node cleanly.
#
# Extra arguments go to every `starling node` (e.g. --device cpu). NODES=N
# changes the cluster size. Logs and checkpoints: out/cluster/.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/scripts/setup.sh
exec tools/scripts/cluster.sh --nodes "${NODES:-4}" --dir out/cluster \
  --starling build/starling -- \
  --model mlp:784-256-128-10 --data fashion-mnist --epochs 10 --batch 64 \
  --lr 0.05 --momentum 0.9 --schedule cosine --threads 1 --eval-every 2 "$@"
