#!/usr/bin/env bash
# bench_train_vs_torch.sh: training throughput of starling against PyTorch
# eager on this machine, in one run, as a ratio (docs/benchmarks.md).
#
# Same model (mlp:784-256-128-10), data (Fashion-MNIST), batches, optimizer
# (SGD momentum 0.9, lr 0.05) and measurement (warm-up, median of repeats)
# on both sides: starling-bench train (tools/bench/bench.c) and its PyTorch twin
# tests/bench/torch_mlp.py, at the same thread counts. Made fair for torch:
# Debian's python3-torch is built against the generic libblas.so.3, which is
# the slow reference BLAS unless libopenblas0-pthread is installed, and
# OPENBLAS_NUM_THREADS=1 keeps OpenBLAS's threads from competing with
# torch's own intra-op threads (torch.set_num_threads(T)).
#
#   tools/bench/bench_train_vs_torch.sh                  threads 1 and 2, batch 64,256
#   THREADS="1 2 4" BATCHES=64,256,1024 STEPS=1000 REPEATS=7 \
#       tools/bench/bench_train_vs_torch.sh
#   DEVICE=cuda THREADS=1 PY=/path/to/venv/bin/python \
#       tools/bench/bench_train_vs_torch.sh              GPU (Debian's torch is CPU-only)
#
# Installs what is missing with apt-get and builds through tools/scripts/setup.sh
# (SETUP=0 skips both and uses the build directory as it is).
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

THREADS=${THREADS:-"1 2"}
BATCHES=${BATCHES:-64,256}
STEPS=${STEPS:-500}
WARMUP=${WARMUP:-50}
REPEATS=${REPEATS:-5}
DEVICE=${DEVICE:-cpu}
PY=${PY:-/usr/bin/python3} # Debian's, with python3-torch (a pyenv python has no torch)
build=${ST_BUILD_DIR:-build}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$build"
if [ "${SETUP:-1}" = 1 ]; then # SETUP=0: use the build directory as it is
  bench_setup "$build" python3-torch python3-numpy libopenblas0-pthread
fi

# ---- The machine ---------------------------------------------------------
echo "date:     $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu:      $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "os:       $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
echo "openblas: $(dpkg-query -W -f='${Package} ${Version}' libopenblas0-pthread 2>/dev/null || echo '(not from Debian)')"
echo "torch:    $($PY -c 'import torch; print(torch.__version__)') ($PY)"
echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
if [ "$DEVICE" != cpu ] && command -v nvidia-smi >/dev/null; then
  echo "gpu:      $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
fi
echo

# ---- The runs: for each thread count, starling then torch -----------------
common=(--batch "$BATCHES" --steps "$STEPS" --warmup-steps "$WARMUP" --repeats "$REPEATS")
for t in $THREADS; do
  echo "== $t thread(s)"
  cmd=("$build/starling-bench" train --device "$DEVICE" --threads "$t" "${common[@]}" --json)
  echo "\$ ${cmd[*]}"
  "${cmd[@]}" >"$out/starling-$t.json"
  cmd=(env OPENBLAS_NUM_THREADS=1 "$PY" tests/bench/torch_mlp.py --device "$DEVICE" --threads "$t" "${common[@]}" --json)
  echo "\$ ${cmd[*]}"
  "${cmd[@]}" >"$out/torch-$t.json"
done
echo

# ---- The table ----------------------------------------------------------------
"$PY" - "$out" $THREADS <<'EOF'
import json, sys
out, threads = sys.argv[1], sys.argv[2:]
print(f"{'threads':>7} {'batch':>6} {'starling samples/s':>19} "
      f"{'torch samples/s':>16} {'starling/torch':>15}")
for t in threads:
    st = json.load(open(f"{out}/starling-{t}.json"))["results"]
    pt = {r["batch"]: r for r in json.load(open(f"{out}/torch-{t}.json"))["results"]}
    for r in st:
        p = pt[r["batch"]]
        print(f"{t:>7} {r['batch']:>6} {r['samples_per_sec']:>19.0f} "
              f"{p['samples_per_sec']:>16.0f} "
              f"{r['samples_per_sec'] / p['samples_per_sec']:>14.2f}x")
EOF
