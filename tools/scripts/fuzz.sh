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

total=0
for t in "${targets[@]}"; do
  corpus=tests/fuzz/corpus/$t
  mkdir -p "$scratch/$t"
  log=$scratch/$t.log
  if ! "build-fuzz/$t" -max_total_time="$seconds" -print_final_stats=1 \
       -artifact_prefix="$artifacts/$t-" -rss_limit_mb=2048 \
       "$scratch/$t" "$corpus" >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz: $t failed; reproducer in $artifacts (run: build-fuzz/$t FILE)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  echo "fuzz: $t: ${runs:-?} executions in ${seconds} s, clean"
  total=$((total + ${runs:-0}))
done
echo "fuzz: $total executions in all, clean"
