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
# would be its start's). Both start with k-means++ and run with tolerance
# 0, once to 2 iterations and once to MAX_ITER, REPEATS times each: the
# time per iteration is (T(MAX_ITER) - T(2)) / (MAX_ITER - 2), the start
# (k-means++, the members' checks) T(2) less two iterations, and the whole
# call T(MAX_ITER) (loading the data not counted), each the median over
# the repeats; the objectives are printed beside (they differ with the
# start). Each starling member's OpenBLAS gets cores / N threads (at least
# 1), so that the N members use the cores scikit-learn gets.
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
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

N=${N:-4}
POINTS=${POINTS:-1000000}
DIM=${DIM:-32}
K=${K:-16}
MAX_ITER=${MAX_ITER:-20}
REPEATS=${REPEATS:-3}
TIMEOUT=${TIMEOUT:-600}
SETUP=${SETUP:-1}
PY=${PY:-/usr/bin/python3}
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
blas_threads=$(($(nproc) / N))
[ "$blas_threads" -ge 1 ] || blas_threads=1
star_run() { # REP ITERS: one run of N members; prints member 0's "seconds iterations objective"
  local rep=$1 iters=$2 k ps=() ok=0
  for ((k = 0; k < N; k++)); do
    OPENBLAS_NUM_THREADS=$blas_threads timeout "$TIMEOUT" "$S" kmeans --data-dir "$work/n$k" \
      --data "idx:$work/points.idx,$work/labels.idx" \
      --shard "$k/$N" --k "$K" --max-iter "$iters" --tol 0 --json \
      >"$work/star.$rep.$k" 2>"$work/star.$rep.$k.err" &
    ps+=($!)
    pids+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || ok=1; done
  [ $ok -eq 0 ] || { tail -n 5 "$work"/star."$rep".*.err >&2; echo "bench_kmeans: a starling member failed" >&2; exit 1; }
  "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["time_s"], r["iterations"], r["objective"])' \
    "$work/star.$rep.0"
}
for ((r = 0; r < REPEATS; r++)); do
  star_run "$r" 2 >>"$work/star.lo"
  star_run "$r" "$MAX_ITER" >>"$work/star.hi"
done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done

# ---- scikit-learn: one process -------------------------------------------------------
sk_run() { # ITERS OUT
"$PY" - "$work" "$K" "$1" "$REPEATS" "$(nproc)" >"$2" <<'PY'
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
}
sk_run 2 "$work/sk.lo"
sk_run "$MAX_ITER" "$work/sk.hi"

"$PY" - "$work" "$N" <<'PY'
import statistics, sys
work, n = sys.argv[1], sys.argv[2]
def load(name):
    def rows(p):
        return [tuple(map(float, l.split())) for l in open(p) if l.strip()]
    lo, hi = rows(f"{work}/{name}.lo"), rows(f"{work}/{name}.hi")
    t_lo, t_hi = statistics.median(r[0] for r in lo), statistics.median(r[0] for r in hi)
    i_lo, i_hi = statistics.median(r[1] for r in lo), statistics.median(r[1] for r in hi)
    per = (t_hi - t_lo) / (i_hi - i_lo)
    return per, t_lo - i_lo * per, t_hi, i_hi, statistics.median(r[2] for r in hi)
rows = [("starling kmeans, " + n + " members", load("star")),
        ("scikit-learn KMeans (lloyd)", load("sk"))]
print(f"{'':30} {'s/iteration':>11} {'start s':>8} {'whole s':>8} {'iterations':>10} {'objective':>12}")
for name, (per, start, whole, it, obj) in rows:
    print(f"{name:30} {per:11.4f} {start:8.3f} {whole:8.3f} {it:10.0f} {obj:12.6g}")
(sp, ss, sw, _, _), (kp, ks, kw, _, _) = rows[0][1], rows[1][1]
print(f"starling / scikit-learn: {sp / kp:.2f}x per iteration (goal <= 1), {sw / kw:.2f}x the whole call")
PY
