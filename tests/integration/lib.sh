# lib.sh: helpers for the integration tests (sourced, not run). Each test
# gets a scratch directory that is removed on exit (kept, and named on
# stderr, when ST_KEEP_SCRATCH is set: for reading a failed run's logs),
# and every process a test starts in the background is recorded and killed
# by PID on exit.
set -euo pipefail

STARLING=${1:?usage: $0 PATH_TO_STARLING}
SRC=${ST_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/starling-it-XXXXXX")
PIDS=()
NUMPY_PY=/usr/bin/python3

cleanup() {
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  done
  if [ -n "${ST_KEEP_SCRATCH:-}" ]; then
    echo "scratch kept: $SCRATCH" >&2
  else
    rm -rf "$SCRATCH"
  fi
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

pass() {
  echo "ok: $*"
}

# expect_fail NAME EXPECTED_STATUS PATTERN -- CMD...: runs CMD, which must
# exit with EXPECTED_STATUS and print PATTERN (grep -E) on stderr.
expect_fail() {
  local name=$1 want=$2 pattern=$3
  shift 4
  local status=0
  "$@" >"$SCRATCH/out" 2>"$SCRATCH/err" || status=$?
  [ "$status" -eq "$want" ] ||
    fail "$name: exit status $status, want $want; stderr: $(cat "$SCRATCH/err")"
  grep -Eq -- "$pattern" "$SCRATCH/err" ||
    fail "$name: stderr does not match '$pattern': $(cat "$SCRATCH/err")"
  pass "$name"
}

# json_field FILE KEY: prints a top-level number or string field of the JSON
# object in FILE (the test parses with Python's json module when present).
json_field() {
  "$NUMPY_PY" -c 'import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(v)' "$1" "$2"
}

# sanitizer_preload: prints what LD_PRELOAD needs for a Python program that
# loads this build's libstarling.so when the build has the sanitizers
# (ST_SANITIZE=ON), nothing otherwise. Python is not built with ASan, so
# the runtime is loaded first; libstdc++ is loaded with it because ASan
# binds its __cxa_throw interceptor at start-up, and PyTorch brings
# libstdc++ in later (dlopen): without it, the first C++ exception (an
# error raised in an autograd hook, say) aborts in ASan's CHECK.
sanitizer_preload() {
  [ "${ST_SANITIZE:-OFF}" = ON ] || return 0
  local asan stdcxx
  asan=$(${CC:-cc} -print-file-name=libasan.so)
  stdcxx=$(${CC:-cc} -print-file-name=libstdc++.so.6)
  [ -e "$asan" ] || fail "ST_SANITIZE=ON but no libasan.so ($asan) to preload"
  [ -e "$stdcxx" ] || fail "ST_SANITIZE=ON but no libstdc++.so.6 ($stdcxx) to preload"
  echo "$asan $stdcxx"
}
