#!/usr/bin/env bash
# gpu_checks.sh: the checks and benchmarks that need an NVIDIA GPU, as one
# bounded run on a GPU machine that has PyTorch but none of starling's
# build dependencies (a cloud GPU box, a CI runner with a card).
#
#   tools/scripts/gpu_checks.sh kit BUILD KIT   on the build machine: copies
#       what the run needs into KIT (BUILD's starling, libstarling.so, the
#       CUDA module, test_kernels and test_trainer_thread; the shared
#       libraries they need that a PyTorch image lacks, in lib/ and, for
#       those the GPU machine may have itself, lib-extra/; all three in
#       KIT/kit.tar.xz) and Fashion-MNIST (KIT/data)
#   tools/scripts/gpu_checks.sh run KIT [LOG]   on the GPU machine, from a
#       checkout of the same commit: every step below under its own time
#       limit, the output also in LOG; a summary table at the end
#   tools/scripts/gpu_checks.sh outer KIT [LOG]   the same way, only the
#       attach-vs-DDP benchmark on the GPU and on the CPU cores, each with
#       the default node flags and with OUTER_ARGS added (default
#       "--outer nesterov"): the outer optimizer's A/B, one machine, one run
#   tools/scripts/gpu_checks.sh quiet KIT [LOG]   the same way: the Python
#       package on CUDA again, then the CPU figures that a busy 2-core
#       machine cannot give: what attaching costs a loop
#       (bench_attach_overhead.sh) and one 10M/50M-parameter exchange
#       against its floor (bench_exchange.sh), on a quiet many-core machine
#
# The steps: the CUDA backend's parity tests (every op against the CPU and
# a float64 reference; the trainer thread on `cuda`); the Python package
# with models and tensors on the GPU (attach, SyncDataParallel, all-reduce
# of a CUDA tensor); then the benchmarks, which skip when time is short:
# tools/bench/bench_attach_ddp.sh on the GPU and on the CPU cores, and
# tools/bench/bench_sync_sgd.sh. BUDGET (seconds, default 540) bounds the
# whole run; PY names the Python that has torch (default python3). On an
# H200 with 16 cores (2026-11-27) the steps took 49, 13, 22, 61, 139 and
# 110 s.
set -uo pipefail

die() { echo "gpu_checks: $*" >&2; exit 2; }

kit() {
  local build=$1 kit=$2 f lib
  [ -x "$build/starling" ] || die "$build/starling is missing: build first"
  [ -e "$build/libstarling_cuda.so" ] || die "$build has no CUDA module: build where nvcc is found"
  rm -rf "${kit:?}/build" "${kit:?}/lib" "${kit:?}/lib-extra"
  mkdir -p "$kit/build" "$kit/lib" "$kit/lib-extra" "$kit/data"
  for f in starling starling-bench libstarling.so libstarling_cuda.so test_kernels test_trainer_thread; do
    cp -L "$build/$f" "$kit/build/$f"
  done
  cp -L "$build/libstarling.so" "$kit/build/libstarling.so.0"
  # What a PyTorch image lacks goes first; what it may have (TLS, libffi)
  # is used only when the run finds it missing.
  ldd "$kit/build/"* | awk '$3 ~ /^\// { print $1, $3 }' | sort -u |
    while read -r lib f; do
      case "$lib" in
        libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | libstdc++* | libgcc_s* | libz.so*) ;;
        libcu*) ;; # the CUDA toolkit's: the GPU machine's own
        libgnutls* | libnettle* | libhogweed* | libidn2* | libunistring* | libtasn1* | libp11-kit* | libffi* | libgmp*)
          cp -L "$f" "$kit/lib-extra/$lib" ;;
        *) cp -L "$f" "$kit/lib/$lib" ;;
      esac
    done
  cp /usr/share/datasets/fashion-mnist/*.gz "$kit/data/" 2>/dev/null ||
    echo "gpu_checks: no Fashion-MNIST here (apt-get install dataset-fashion-mnist): the benchmarks will skip" >&2
  # OpenBLAS and LAPACK are most of it: xz takes 90 MB to about 12.
  tar -C "$kit" -cf - build lib lib-extra | xz -T0 -6 >"$kit/kit.tar.xz"
  rm -rf "${kit:?}/build" "${kit:?}/lib" "${kit:?}/lib-extra"
  du -sh "$kit"
}

declare -a SUMMARY=()
T_START=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T_START))); }

# step NAME LIMIT CMD...: runs CMD under min(LIMIT, what is left), records
# its result; skipped when under a third of LIMIT is left.
step() {
  local name=$1 limit=$2 rc t0 l
  shift 2
  l=$(left)
  if [ "$l" -lt $((limit / 3)) ]; then
    SUMMARY+=("$(printf '%-28s %-8s %5s' "$name" skipped -)")
    return
  fi
  [ "$l" -lt "$limit" ] && limit=$l
  echo
  echo "==== $name (limit ${limit}s)"
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@"
  rc=$?
  local verdict=ok
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && verdict=timeout
  [ $rc -ne 0 ] && [ $verdict = ok ] && verdict="rc=$rc"
  SUMMARY+=("$(printf '%-28s %-8s %5ss' "$name" "$verdict" $(($(date +%s) - t0)))")
}

# prepare KIT: unpacks the kit into a temporary folder (removed at exit),
# sets the environment the steps run in, and says what the machine is.
prepare() {
  local kit data
  data=$(cd "$1" && pwd)/data || die "$1: no such kit"
  # The unpacked programs and libraries: a folder of their own, removed at
  # exit.
  kit=$(mktemp -d "${TMPDIR:-/tmp}/starling-kit.XXXXXX") || die "cannot make a temporary folder"
  KIT_TMP=$kit
  trap 'rm -rf "$KIT_TMP"' EXIT
  xz -dc "$1/kit.tar.xz" | tar -C "$kit" -xf - || die "$1/kit.tar.xz: cannot unpack"
  BUDGET=${BUDGET:-540}
  export PY=${PY:-python3}
  export LD_LIBRARY_PATH="$kit/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ldd "$kit/build/starling" "$kit/build/libstarling_cuda.so" | grep -q "not found"; then
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$kit/lib-extra"
  fi
  export STARLING_BIN=$kit/build/starling STARLING_LIB=$kit/build/libstarling.so
  export STARLING_CUDA_MODULE=$kit/build/libstarling_cuda.so
  export STARLING_FASHION_MNIST_DIR=$data ST_BUILD_DIR=$kit/build SETUP=0
  echo "date:  $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "cpu:   $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
  "$PY" -c 'import torch; print("torch:", torch.__version__, "cuda", torch.cuda.is_available())'
  ldd "$kit/build/starling" "$kit/build/libstarling_cuda.so" | grep "not found" || true
  KIT_BUILD=$kit/build
}

summary() {
  echo
  echo "==== summary ($(($(date +%s) - T_START)) s of $BUDGET)"
  printf '%s\n' "${SUMMARY[@]}"
}

run() {
  prepare "$1"
  step "CUDA kernels parity" 60 "$KIT_BUILD/test_kernels"
  step "trainer thread cpu+cuda" 90 "$KIT_BUILD/test_trainer_thread"
  step "python on CUDA" 150 env PYTHONPATH=client/python "$PY" -m pytest -q -x -p no:cacheprovider \
    tests/python/test_attach_torch.py tests/python/test_sync_sgd.py tests/python/test_collectives.py \
    -k "cuda or test_all_reduce_torch_and_python"
  step "attach vs DDP, GPU" 120 env DEVICE=cuda NETNS=0 TIMEOUT=100 tools/bench/bench_attach_ddp.sh
  step "attach vs DDP, CPU cores" 200 env DEVICE=cpu NETNS=0 TIMEOUT=180 tools/bench/bench_attach_ddp.sh
  step "sync SGD vs DDP, CPU" 150 env TIMEOUT=140 tools/bench/bench_sync_sgd.sh
  summary
}

outer() {
  prepare "$1"
  local plain="--gossip-every 0.2 --ring-every 1" extra=${OUTER_ARGS:---outer nesterov}
  step "attach vs DDP, GPU" 120 env DEVICE=cuda NETNS=0 TIMEOUT=100 \
    NODE_ARGS="$plain" tools/bench/bench_attach_ddp.sh
  step "attach vs DDP, GPU, outer" 120 env DEVICE=cuda NETNS=0 TIMEOUT=100 \
    NODE_ARGS="$plain $extra" tools/bench/bench_attach_ddp.sh
  step "attach vs DDP, CPU" 200 env DEVICE=cpu NETNS=0 TIMEOUT=180 \
    NODE_ARGS="$plain" tools/bench/bench_attach_ddp.sh
  step "attach vs DDP, CPU, outer" 200 env DEVICE=cpu NETNS=0 TIMEOUT=180 \
    NODE_ARGS="$plain $extra" tools/bench/bench_attach_ddp.sh
  summary
}

quiet() {
  prepare "$1"
  step "python on CUDA" 120 env PYTHONPATH=client/python "$PY" -m pytest -q -x -p no:cacheprovider \
    tests/python/test_attach_torch.py tests/python/test_sync_sgd.py tests/python/test_collectives.py \
    -k "cuda or test_all_reduce_torch_and_python"
  step "attach overhead" 270 env REPEATS="${REPEATS:-5}" tools/bench/bench_attach_overhead.sh
  step "exchange 10M, 50M" 150 env MODELS="${EXCHANGE_MODELS:-mlp:784-4096-1664-10 mlp:784-8192-5376-10}" \
    SECONDS_EACH="${SECONDS_EACH:-15}" tools/bench/bench_exchange.sh
  summary
}

case "${1:-}" in
  kit) [ $# -eq 3 ] || die "usage: $0 kit BUILD KIT"; kit "$2" "$3" ;;
  run | outer | quiet)
    [ $# -ge 2 ] || die "usage: $0 $1 KIT [LOG]"
    if [ -n "${3:-}" ]; then "$1" "$2" 2>&1 | tee "$3"; else "$1" "$2"; fi ;;
  -h | --help | "") sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) die "unknown mode '$1' (kit, run, outer or quiet; --help)" ;;
esac
