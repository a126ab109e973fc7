#!/usr/bin/env bash
# fuzz.sh: builds the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer, and runs each for a
# bounded time from its committed seed corpus (tests/fuzz/corpus/TARGET).
# New inputs go to a scratch directory, never into the repository. Prints
# the executions of each target; exits non-zero on the first crash, leak or
# sanitizer report (the reproducer is kept under $ST_FUZZ_ARTIFACTS).
#
#   tools/scripts/fuzz.sh                  every target, 20 s each
#   ST_FUZZ_SECONDS=600 tools/scripts/fuzz.sh fuzz_wire_decode
#
# Targets run ST_FUZZ_JOBS at a time (default: one per core).
set -euo pipefail
cd "$(dirname "$0")/../.."
export ST_EXTRA_PACKAGES="clang libclang-rt-14-dev ${ST_EXTRA_PACKAGES:-}"
seconds=${ST_FUZZ_SECONDS:-20}
artifacts=${ST_FUZZ_ARTIFACTS:-$PWD/build-fuzz/artifacts}

CC=clang ST_BUILD_DIR=build-fuzz \
  ST_CMAKE_ARGS="-DSTARLING_FUZZ=ON -DSTARLING_CUDA=OFF" tools/scripts/setup.sh >/dev/null

targets=("$@")
if ((${#targets[@]} == 0)); then
  for src in tests/fuzz/fuzz_*.c; do
    [ -e "$src" ] || continue
    targets+=("$(basename "$src" .c)")
  done
fi
mkdir -p "$artifacts"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/starling-fuzz-XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# fuzz_one TARGET: runs it; its log and the executions in $scratch.
fuzz_one() {
  local t=$1 corpus=tests/fuzz/corpus/$1 log=$scratch/$1.log
  mkdir -p "$scratch/$t"
  if ! "build-fuzz/$t" -max_total_time="$seconds" -print_final_stats=1 \
       -artifact_prefix="$artifacts/$t-" -rss_limit_mb=2048 \
       "$scratch/$t" "$corpus" >"$log" 2>&1; then
    return 1
  fi
  sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 >"$scratch/$t.runs"
}

# One target per core at a time (libFuzzer runs on one thread): the same
# executions per target as one after another, in a fraction of the time.
jobs=${ST_FUZZ_JOBS:-$(nproc)}
total=0
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  pids=() batch=("${targets[@]:i:jobs}")
  for t in "${batch[@]}"; do
    fuzz_one "$t" &
    pids+=($!)
  done
  for k in "${!batch[@]}"; do
    t=${batch[k]}
    if ! wait "${pids[k]}"; then
      wait # the rest of the batch
      tail -40 "$scratch/$t.log" >&2
      echo "fuzz: $t failed; reproducer in $artifacts (run: build-fuzz/$t FILE)" >&2
      exit 1
    fi
    runs=$(cat "$scratch/$t.runs" 2>/dev/null || true)
    echo "fuzz: $t: ${runs:-?} executions in ${seconds} s, clean"
    total=$((total + ${runs:-0}))
  done
done
echo "fuzz: $total executions in all, clean"
