#!/usr/bin/env bash
# test.sh: every test. Installs what is missing, checks the layering
# (tools/scripts/check_layers.py) and that no function runs over 80 lines
# without a reason (check_function_length.py), then builds and runs the
# whole suite twice: a plain build with warnings as errors (CUDA backend
# included when nvcc exists; its parity tests run when a GPU is present and
# say they were skipped otherwise), and an AddressSanitizer +
# UndefinedBehaviorSanitizer build. Also checks formatting (.clang-format)
# and runs every libFuzzer target for a bounded time (tools/scripts/fuzz.sh,
# ST_FUZZ_SECONDS each, default 8).
#
#   tools/scripts/test.sh              everything
#   ST_TEST_QUICK=1 tools/scripts/test.sh   plain build only (no sanitizers, no fuzzing)
set -euo pipefail
cd "$(dirname "$0")/../.."
export ST_EXTRA_PACKAGES="python3-numpy python3-torch python3-pytest clang-format iptables prometheus groff-base systemd ${ST_EXTRA_PACKAGES:-}"

werror=${STARLING_WERROR:-ON}
ST_BUILD_DIR=build ST_CMAKE_ARGS="-DSTARLING_WERROR=$werror" tools/scripts/setup.sh

echo "== layering check (docs/architecture.md) and function lengths"
/usr/bin/python3 tools/scripts/check_layers.py .
/usr/bin/python3 tools/scripts/check_function_length.py

echo "== format check (clang-format)"
files=$(git ls-files '*.c' '*.h' '*.cu' 2>/dev/null || find kernels optimizer node tools tests -name '*.[ch]' -o -name '*.cu')
if ! clang-format --dry-run -Werror $files; then
  echo "test: formatting differs from .clang-format; run: clang-format -i \$(git ls-files '*.c' '*.h' '*.cu')" >&2
  exit 1
fi

jobs=$(nproc)
echo "== plain build: ctest"
(cd build && ctest --output-on-failure -j"$jobs")

if [ -z "${ST_TEST_QUICK:-}" ]; then
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer build: ctest"
  ST_BUILD_DIR=build-asan \
  ST_CMAKE_ARGS="-DSTARLING_WERROR=$werror -DSTARLING_SANITIZE=ON -DSTARLING_CUDA=OFF" \
    tools/scripts/setup.sh
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ctest --output-on-failure -j"$jobs")

  echo "== libFuzzer targets (clang, ASan + UBSan), ${ST_FUZZ_SECONDS:-8} s each"
  ST_FUZZ_SECONDS=${ST_FUZZ_SECONDS:-8} tools/scripts/fuzz.sh
fi
echo "== all tests passed"
