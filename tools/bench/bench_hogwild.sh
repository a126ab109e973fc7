#!/usr/bin/env bash
# bench_hogwild.sh: HogWild (`starling train --hogwild`, docs/training.md)
# on a synthetic sparse set, in one run (issue #15; docs/benchmarks.md,
# "HogWild"):
#
#   1 thread      --hogwild --threads 1: serial per-example SGD
#   N lock-free   --hogwild --threads N (N = THREADS, default every core)
#   N locked      --hogwild-locked --threads N: the same threads, one lock
#                 around each example's update
#   sklearn       scikit-learn's SGDClassifier(loss="log_loss") on the same
#                 files (one-vs-rest binary logistic regressions, its own
#                 learning-rate rule; n_jobs N spreads the classes over
#                 threads): what a Python user would run on this data
#
# The data: tools/scripts/gen_libsvm.py (TRAIN examples, TEST held out, DIM
# features with a bag-of-words-like popularity, NNZ of them per example,
# CLASSES from a planted linear model with noise). Every starling run is
# softmax:DIM-CLASSES, EPOCHS epochs, batch BATCH, lr LR per example,
# cosine schedule, seed 1. Figures: examples per second while training
# (starling's "samples_per_sec", loading and evaluation not counted;
# sklearn: TRAIN x EPOCHS / the time of fit()), the test accuracy and loss
# at the end, each the median of REPEATS runs.
#
#   tools/bench/bench_hogwild.sh
#   SETUP=0 TRAIN=50000 REPEATS=1 tools/bench/bench_hogwild.sh   a quick look
#
# Settings (environment): TRAIN (200000), TEST (20000), DIM (100000), NNZ
# (50), CLASSES (10), EPOCHS (5), BATCH (2000), LR (0.5), THREADS (nproc),
# REPEATS (3), SETUP (1), ST_BUILD_DIR (build). Installs what is missing
# (python3-sklearn, python3-numpy) and builds through tools/scripts/setup.sh.
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

TRAIN=${TRAIN:-200000}
TEST=${TEST:-20000}
DIM=${DIM:-100000}
NNZ=${NNZ:-50}
CLASSES=${CLASSES:-10}
EPOCHS=${EPOCHS:-5}
BATCH=${BATCH:-2000}
LR=${LR:-0.5}
THREADS=${THREADS:-$(nproc)}
REPEATS=${REPEATS:-3}
SETUP=${SETUP:-1}
PY=${PY:-/usr/bin/python3}
build=${ST_BUILD_DIR:-build}
for v in TRAIN TEST DIM NNZ CLASSES EPOCHS BATCH THREADS REPEATS; do
  case "${!v}" in '' | *[!0-9]* | 0) echo "bench_hogwild: $v=${!v}: a positive integer" >&2; exit 2 ;; esac
done

work=$(mktemp -d)
# shellcheck disable=SC2317 # run by the trap
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$SETUP" = 1 ]; then bench_setup "$build" python3-sklearn python3-numpy; fi
S=$build/starling
[ -x "$S" ] || { echo "bench_hogwild: $S is missing: build first (or SETUP=1)" >&2; exit 1; }
root=$(cd "$(dirname "$0")/../.." && pwd)

echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "sklearn: $($PY -c 'import sklearn; print(sklearn.__version__)') (python3-sklearn)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min; other work on these cores skews every figure)"
echo "data:    $TRAIN training and $TEST test examples, $DIM features, $NNZ per example, $CLASSES classes"
echo "runs:    softmax:$DIM-$CLASSES, $EPOCHS epochs, batch $BATCH, lr $LR cosine, median of $REPEATS"
echo

"$PY" "$root/tools/scripts/gen_libsvm.py" "$work/s" --train "$TRAIN" --test "$TEST" \
  --dim "$DIM" --nnz "$NNZ" --classes "$CLASSES" --seed 1 >/dev/null
data="libsvm:$work/s.train,$work/s.test"

star_run() { # NAME THREADS FLAG: one run; appends "name samples/s acc loss" to results
  "$S" train --model "softmax:$DIM-$CLASSES" --data "$data" --epochs "$EPOCHS" \
    --batch "$BATCH" --lr "$LR" --schedule cosine --seed 1 --device cpu \
    --threads "$2" "$3" --no-checkpoint --json >"$work/run.json" 2>"$work/run.log" ||
    { echo "bench_hogwild: $1 failed:" >&2; cat "$work/run.log" >&2; exit 1; }
  "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1]))
print(sys.argv[2], d["samples_per_sec"], d["test_accuracy"], d["test_loss"])' \
    "$work/run.json" "$1" >>"$work/results"
}

sk_run() { # NAME JOBS
  "$PY" - "$work/s.train" "$work/s.test" "$DIM" "$EPOCHS" "$2" "$1" >>"$work/results" <<'PY'
import sys, time
import numpy as np
from sklearn.datasets import load_svmlight_file
from sklearn.linear_model import SGDClassifier
from sklearn.metrics import log_loss
tr, te, dim, epochs, jobs, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
x, y = load_svmlight_file(tr, n_features=dim, dtype=np.float64)
xt, yt = load_svmlight_file(te, n_features=dim, dtype=np.float64)
m = SGDClassifier(loss="log_loss", max_iter=epochs, tol=None, random_state=1, n_jobs=jobs)
t = time.perf_counter()
m.fit(x, y)
dt = time.perf_counter() - t
p = m.predict_proba(xt)
print(name, x.shape[0] * epochs / dt, (m.predict(xt) == yt).mean(), log_loss(yt, p, labels=m.classes_))
PY
}

for ((r = 0; r < REPEATS; r++)); do
  star_run "starling_1_thread" 1 --hogwild
  star_run "starling_${THREADS}_lock-free" "$THREADS" --hogwild
  star_run "starling_${THREADS}_locked" "$THREADS" --hogwild-locked
  sk_run "sklearn_1_job" 1
  [ "$THREADS" -eq 1 ] || sk_run "sklearn_${THREADS}_jobs" "$THREADS"
done

"$PY" - "$work/results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, rate, acc, loss = line.split()
    rows.setdefault(name, []).append((float(rate), float(acc), float(loss)))
base = statistics.median(r[0] for r in rows["starling_1_thread"])
print("%-26s %14s %9s %10s %9s" % ("run", "examples/s", "vs 1", "test acc", "test loss"))
for name, rs in rows.items():
    rate = statistics.median(r[0] for r in rs)
    print("%-26s %14.0f %8.2fx %10.4f %9.4f" % (
        name.replace("_", " "), rate, rate / base,
        statistics.median(r[1] for r in rs), statistics.median(r[2] for r in rs)))
PY
