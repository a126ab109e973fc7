#!/usr/bin/env bash
# bench_kmeans.sh: `starling kmeans` across N members against scikit-learn's
# KMeans (Lloyd) in one process, on the same points and the same cores, in
# one run (issue #15; docs/benchmarks.md, "k-means vs scikit-learn"):
#
#   starling  N idle `starling node`s on loopback (bench_lib.sh,
#             bench_idle_nodes) and `starling kmeans --shard K/N` next to
#             each: every iteration each member assigns its shard's points
#             and one float64 all-reduce (encrypted TCP) adds up the sums
#   sklearn   sklearn.cluster.KMeans(algorithm="lloyd", n_init=1) on all the
#             points in one process, its thread pools limited to the
#             machine's cores (threadpoolctl)
#
# The points: POINTS x DIM uniformly random bytes (seed 1), written as an
# IDX file (starling reads them divided by 255; scikit-learn gets the same
# float64 values). Points without clusters keep Lloyd's algorithm moving,
# so both run MAX_ITER iterations (with well-separated blobs scikit-learn's
# greedy k-means++ lands on the answer and stops after 2, and the figure
# would be its start's). Both start with k-means++ and run to MAX_ITER with
# tolerance 0; the figure is the time of the whole call (k-means++
# included, loading the data not) divided by its iterations, the median of
# REPEATS runs; the objectives are printed beside (they differ with the
# start).
#
#   tools/bench/bench_kmeans.sh
#   SETUP=0 POINTS=100000 REPEATS=1 tools/bench/bench_kmeans.sh
#
# Settings (environment): N members (4), POINTS (1000000), DIM (32), K (16),
# MAX_ITER (20), REPEATS (3), TIMEOUT seconds a run (600), SETUP (1),
# ST_BUILD_DIR (build). Installs what is missing (python3-sklearn,
# python3-numpy) and builds through tools/scripts/setup.sh; every process
# started here is killed by PID on exit.
set -euo pipefail
case "${1:-}" in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "bench_kmeans: no arguments (settings are variables: see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
source tools/bench/bench_lib.sh

N=${N:-4}
POINTS=${POINTS:-1000000}
DIM=${DIM:-32}
K=${K:-16}
MAX_ITER=${MAX_ITER:-20}
REPEATS=${REPEATS:-3}
TIMEOUT=${TIMEOUT:-600}
SETUP=${SETUP:-1}
PY=/usr/bin/python3
build=${ST_BUILD_DIR:-build}
for v in N POINTS DIM K MAX_ITER REPEATS TIMEOUT; do
  case "${!v}" in '' | *[!0-9]* | 0) echo "bench_kmeans: $v=${!v}: a positive integer" >&2; exit 2 ;; esac
done
[ "$N" -ge 2 ] || { echo "bench_kmeans: N=$N: a member count of 2 or more" >&2; exit 2; }

work=$(mktemp -d)
pids=()
# shellcheck disable=SC2317,SC2015 # run by the trap
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$SETUP" = 1 ]; then bench_setup "$build" python3-sklearn python3-numpy; fi
S=$build/starling
[ -x "$S" ] || { echo "bench_kmeans: $S is missing: build first (or SETUP=1)" >&2; exit 1; }

echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "sklearn: $($PY -c 'import sklearn; print(sklearn.__version__)') (python3-sklearn), threads limited to $(nproc)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min; other work on these cores skews every figure)"
echo "runs:    $POINTS points x $DIM, k $K, $N starling members, max $MAX_ITER iterations, tol 0, median of $REPEATS"
echo

# ---- The points ---------------------------------------------------------------
"$PY" - "$work" "$POINTS" "$DIM" "$K" <<'PY'
import struct, sys
import numpy as np
work, n, dim, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(1)
x = rng.integers(0, 256, size=(n, dim), dtype=np.uint8)
with open(f"{work}/points.idx", "wb") as f:
    f.write(struct.pack(">BBBBII", 0, 0, 8, 2, n, dim))
    f.write(x.tobytes())
with open(f"{work}/labels.idx", "wb") as f:
    f.write(struct.pack(">BBBBI", 0, 0, 8, 1, n))
    f.write(bytes(n))
PY

# ---- starling: N members -----------------------------------------------------------
bench_idle_nodes "$S" "$work" "$N"
star_run() { # REP: one run of N members; prints member 0's "seconds iterations objective"
  local rep=$1 k ps=() ok=0
  for ((k = 0; k < N; k++)); do
    timeout "$TIMEOUT" "$S" kmeans --data-dir "$work/n$k" --data "idx:$work/points.idx,$work/labels.idx" \
      --shard "$k/$N" --k "$K" --max-iter "$MAX_ITER" --tol 0 --json \
      >"$work/star.$rep.$k" 2>"$work/star.$rep.$k.err" &
    ps+=($!)
    pids+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || ok=1; done
  [ $ok -eq 0 ] || { tail -n 5 "$work"/star."$rep".*.err >&2; echo "bench_kmeans: a starling member failed" >&2; exit 1; }
  "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["time_s"], r["iterations"], r["objective"])' \
    "$work/star.$rep.0"
}
for ((r = 0; r < REPEATS; r++)); do star_run "$r" >>"$work/star.runs"; done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done

# ---- scikit-learn: one process -------------------------------------------------------
"$PY" - "$work" "$K" "$MAX_ITER" "$REPEATS" "$(nproc)" >"$work/sk.runs" <<'PY'
import sys, time
import numpy as np
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits
work, k, max_iter, repeats, cores = sys.argv[1], *map(int, sys.argv[2:])
raw = open(f"{work}/points.idx", "rb").read()
n, dim = int.from_bytes(raw[4:8], "big"), int.from_bytes(raw[8:12], "big")
x = np.frombuffer(raw[12:], dtype=np.uint8).reshape(n, dim).astype(np.float64) / 255.0
with threadpool_limits(limits=cores):
    for r in range(repeats):
        km = KMeans(n_clusters=k, algorithm="lloyd", n_init=1, max_iter=max_iter, tol=0.0,
                    init="k-means++", random_state=r + 1)
        t0 = time.perf_counter()
        km.fit(x)
        # sklearn's inertia is the sum of squared distances, as starling's objective
        print(time.perf_counter() - t0, km.n_iter_, km.inertia_)
PY

"$PY" - "$work/star.runs" "$work/sk.runs" "$N" <<'PY'
import statistics, sys
def load(p):
    rows = [tuple(map(float, l.split())) for l in open(p) if l.strip()]
    per = statistics.median(t / it for t, it, _ in rows)
    return per, statistics.median(it for _, it, _ in rows), statistics.median(o for _, _, o in rows)
(sp, si, so), (kp, ki, ko), n = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
print(f"{'':28} {'s/iteration':>12} {'iterations':>11} {'objective':>14}")
print(f"{'starling kmeans, ' + n + ' members':28} {sp:12.4f} {si:11.0f} {so:14.6g}")
print(f"{'scikit-learn KMeans (lloyd)':28} {kp:12.4f} {ki:11.0f} {ko:14.6g}")
print(f"ratio starling / scikit-learn: {sp / kp:.2f}x (goal <= 1)")
PY
