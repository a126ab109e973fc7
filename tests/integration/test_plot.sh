#!/usr/bin/env bash
# test_plot.sh: `starling plot` (client/python/starling/plot.py, through
# tools/cli/cli_plot.c). Runs a short real cluster of two nodes (a tiny
# MLP on a small CSV, a progress line every 0.2 s) to get real logs, then
# tests/python/test_plot.py with pytest: recorded log lines and the real
# logs drawn as PNG (valid, read back by matplotlib) and SVG (XML, one line
# per node in each panel), --json, and the errors (no such file, a log
# without progress lines, matplotlib missing), directly and through
# `starling plot`. Skipped (exit 0, saying so) only when pytest or
# matplotlib cannot be imported.
source "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
for mod in pytest matplotlib; do
  if ! "$PY" -c "import $mod" 2>/dev/null; then
    echo "skipped: $PY cannot import $mod (apt-get install python3-pytest python3-matplotlib)"
    exit 0
  fi
done

source "$(dirname "$0")/node_lib.sh"

# Two nodes on halves of a small learnable CSV (3 classes from the sum of
# the first two of 8 features), a progress line every 0.2 s, until each
# has logged 4 training lines with a loss and a test accuracy.
gen() { # gen ROWS SEED
  awk -v n="$1" -v s="$2" 'BEGIN { srand(s); for (r = 0; r < n; r++) {
    a = rand(); b = rand(); printf "%.3f,%.3f", a, b
    for (c = 2; c < 8; c++) printf ",%.3f", rand()
    k = int((a + b) * 1.5); print "," (k > 2 ? 2 : k) } }'
}
gen 2000 1 >"$SCRATCH/train.csv"
gen 400 2 >"$SCRATCH/test.csv"
R=(--model mlp:8-16-3 --data "csv:$SCRATCH/train.csv,$SCRATCH/test.csv"
   --batch 16 --lr 0.1 --device cpu --threads 1 --epochs 100000
   --min-nodes 2 --eval-every 0.2 --log-every 0.2)
node_start 0 "${R[@]}" --shard 0/2
node_up 0
node_start 1 "${R[@]}" --shard 1/2 --join "$NODE_ADDR"
node_up 1
logged() { # logged K: node K's log has 4 training lines with loss and accuracy
  [ "$(grep -cE "training step [0-9]+ epoch [0-9]+ loss [0-9.]+ test acc [0-9.]+ " \
    "$(node_log "$1")")" -ge 4 ]
}
for k in 0 1; do
  wait_for 30 "4 progress lines in node $k's log" logged "$k"
done
for k in 0 1; do # their logs are all we need
  kill -9 "${NODE_PID[$k]}"
  wait "${NODE_PID[$k]}" 2>/dev/null || true
done
pass "2 nodes trained ($(elapsed) s)"
mkdir -p "$SCRATCH/real"
cp "$(node_log 0)" "$(node_log 1)" "$SCRATCH/real/"

# Every test must run here (-rs lists the skipped ones: none may be).
cd "$SRC"
ST_PLOT_REAL_LOGS=$SCRATCH/real STARLING_BIN=$STARLING PYTHONDONTWRITEBYTECODE=1 \
  "$PY" -m pytest --noconftest -x -q -rs -p no:cacheprovider \
  --basetemp="$SCRATCH/pytest" tests/python/test_plot.py >"$SCRATCH/pytest.out" 2>&1 ||
  { cat "$SCRATCH/pytest.out" >&2
    fail "pytest tests/python/test_plot.py (STARLING_BIN=$STARLING; ST_KEEP_SCRATCH=1 keeps the logs)"; }
cat "$SCRATCH/pytest.out"
! grep -q SKIPPED "$SCRATCH/pytest.out" || fail "tests/python/test_plot.py skipped a test"
pass "starling plot: PNG and SVG from recorded and real logs, --json, errors ($(elapsed) s)"
