#!/usr/bin/env bash
# test_python_attach.sh: the Python package (client/python/starling) and the
# PyTorch example, under ctest: runs tests/python with pytest against this
# build's starling binary and client library (libstarling.so in
# $ST_BUILD_DIR). Each pytest test starts real `starling node --attach`
# processes on 127.0.0.1 and kills them by PID when it ends. Skipped (exit
# 0, saying so) only when PyTorch or pytest cannot be imported.
source "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
BUILD=${ST_BUILD_DIR:-$(dirname "$STARLING")}
LIB=$BUILD/libstarling.so
[ -e "$LIB" ] || fail "no client library at $LIB (set ST_BUILD_DIR to the build directory)"

for mod in torch pytest; do
  if ! "$PY" -c "import $mod" 2>/dev/null; then
    echo "skipped: $PY cannot import $mod (apt-get install python3-torch python3-pytest)"
    exit 0
  fi
done

# Under AddressSanitizer the library needs the ASan runtime preloaded
# (sanitizer_preload in lib.sh). Python and PyTorch keep memory until exit
# by design: leak checks are off for the Python processes (the nodes, built
# with ASan, keep ctest's options).
if [ "${ST_SANITIZE:-OFF}" = ON ]; then
  export ST_NODE_ASAN_OPTIONS=${ASAN_OPTIONS:-}
  LD_PRELOAD=$(sanitizer_preload)
  export LD_PRELOAD
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
fi

cd "$SRC"
STARLING_BIN=$STARLING STARLING_LIB=$LIB PYTHONPATH=$SRC/client/python \
  PYTHONDONTWRITEBYTECODE=1 \
  "$PY" -m pytest -x -q --durations=15 -p no:cacheprovider --basetemp="$SCRATCH/pytest" tests/python ||
  fail "pytest tests/python (STARLING_BIN=$STARLING STARLING_LIB=$LIB)"
pass "python package and example against real nodes"
