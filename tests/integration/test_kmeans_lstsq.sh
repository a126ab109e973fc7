#!/usr/bin/env bash
# test_kmeans_lstsq.sh: `starling kmeans` and `starling lstsq` across real
# processes (docs/collectives.md, "Algorithms"). Three nodes (a tiny linear
# model that finishes its one epoch at once, so they idle) and a fourth on
# its own; the command runs next to each node on its own shard:
#   (a) kmeans on 3 members: every member prints the same centroids (every
#       digit of --json), and they equal the run of one process over all
#       the points (--shard 0/1 on the lone node) within 1e-9, which is also
#       a fixed point of Lloyd's algorithm in NumPy; the safetensors file
#       holds them;
#   (b) lstsq, closed form: every member the same weights, equal to NumPy's
#       float64 least squares within 1e-8; with --ridge, NumPy's ridge;
#   (c) lstsq on singular data (a repeated column): the message saying the
#       solve fell back to pivoted QR, and NumPy's minimum-norm solution;
#   (d) lstsq --method gd: every member the same weights, equal to the
#       closed form within 1e-5 (it stops at a gradient 1e-6 of its first);
#   (e) one member with another --k: every member fails, naming --k;
#   (f) lstsq's --out holds its --json's weights and bias;
#   (g) kmeans reads IDX (pixels / 255) as it reads the same values in CSV;
#   (h) a fourth node joins during a run: the run goes on (the default
#       group is frozen once the members agreed) and ends on every member.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

N=3
"$NUMPY_PY" - "$SCRATCH" <<'EOF'
import sys
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(7)
centres = rng.uniform(-8, 8, size=(5, 4))
pts = centres[rng.integers(0, 5, 3000)] + 2 * rng.normal(size=(3000, 4))
np.savetxt(d + "/points.csv", pts, fmt="%.6f", delimiter=",")
x = rng.normal(size=(2000, 5)) + np.arange(5)
y = x @ np.array([1.0, -2.0, 0.5, 3.0, 0.25]) + 4.0 + 0.1 * rng.normal(size=2000)
np.savetxt(d + "/rows.csv", np.c_[x, y], fmt="%.6f", delimiter=",")
xs = np.c_[x[:, :2], x[:, 1], x[:, 2:]]  # column 2 repeats column 1
np.savetxt(d + "/singular.csv", np.c_[xs, y], fmt="%.6f", delimiter=",")
xl = np.c_[rng.normal(size=600), 1e-3 * rng.normal(size=600)]  # cond ~1e6
np.savetxt(d + "/slow.csv", np.c_[xl, xl @ [1.0, 500.0] + 1], fmt="%.9f", delimiter=",")
EOF

ARGS=(--model linear:5-1 --data "csv:$SCRATCH/rows.csv" --epochs 1 --batch 500
      --device cpu --threads 1 --eval-every 0 --checkpoint-every 0
      --gossip-every 0 --ring-every 0)
node_start 0 "${ARGS[@]}"
node_up 0
seed=$NODE_ADDR
for ((k = 1; k < N; k++)); do node_start "$k" --join "$seed" "${ARGS[@]}"; done
node_start 9 "${ARGS[@]}" # a cluster of its own
for ((k = 1; k < N; k++)); do node_up "$k"; done
node_up 9
# Every member must see all N alive: the commands' default group is "every
# member alive" as each member sees it (a member that has not yet heard of
# a third one calls with a group of 2, and the group lists differ).
count_members() { [ "$(node_peers "$1" | "$NUMPY_PY" -c 'import json,sys; print(sum(m["state"] == "alive" for m in json.load(sys.stdin)))')" = "$N" ]; }
all_see_all() {
  local k
  for ((k = 0; k < N; k++)); do count_members "$k" || return 1; done
}
wait_for 20 "every member seeing $N members" all_see_all

# on_all OUT CMD ARGS...: CMD ARGS --data-dir DIR_K --shard K/N on every
# member at once, stdout to OUT.K, stderr to OUT.K.err; waits for all.
on_all() {
  local out=$1 k pids=()
  shift
  for ((k = 0; k < N; k++)); do
    timeout "$(scaled 60)" "$STARLING" "$@" --data-dir "$(node_dir "$k")" \
      --shard "$k/$N" >"$SCRATCH/$out.$k" 2>"$SCRATCH/$out.$k.err" &
    pids+=("$!")
    PIDS+=("$!")
  done
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}" || node_fail "$out: member $k failed: $(cat "$SCRATCH/$out.$k.err")"
  done
}

# same_json OUT KEY: KEY is the same in every member's JSON (every digit).
same_json() {
  "$NUMPY_PY" - "$SCRATCH/$1" "$2" "$N" <<'EOF' || node_fail "$1: the members differ on $2"
import json, sys
docs = [json.load(open("%s.%d" % (sys.argv[1], k))) for k in range(int(sys.argv[3]))]
vals = [json.dumps(d[sys.argv[2]]) for d in docs]
sys.exit(0 if all(v == vals[0] for v in vals) else 1)
EOF
}

# (a) kmeans: 3 members, one process, NumPy.
KM=(kmeans --data "csv:$SCRATCH/points.csv" --k 6 --tol 0 --seed 3 --json)
on_all km "${KM[@]}" --out "$SCRATCH/km.safetensors"
same_json km centroids
timeout "$(scaled 60)" "$STARLING" "${KM[@]}" --data-dir "$(node_dir 9)" \
  >"$SCRATCH/km1" 2>"$SCRATCH/km1.err" || node_fail "(a) one process: $(cat "$SCRATCH/km1.err")"
grep -q "^iteration 1  objective" "$SCRATCH/km.0.err" || node_fail "(a) no progress lines: $(cat "$SCRATCH/km.0.err")"
"$NUMPY_PY" - "$SCRATCH" <<'EOF' || node_fail "(a) kmeans results differ"
import json, sys
import numpy as np
d = sys.argv[1]
dist, one = json.load(open(d + "/km.0")), json.load(open(d + "/km1"))
assert dist["members"] == 3 and one["members"] == 1, (dist["members"], one["members"])
assert dist["points"] == one["points"] == 3000
c, c1 = np.array(dist["centroids"]), np.array(one["centroids"])
err = np.abs(c - c1).max() / np.abs(c1).max()
assert err <= 1e-9, "3 members vs one process: %g" % err
assert dist["iterations"] == one["iterations"] and dist["converged"]
# A fixed point of Lloyd's algorithm over every point, in float64.
x = np.loadtxt(d + "/points.csv", delimiter=",", dtype=np.float32).astype(np.float64)
lab = ((x[:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
new = np.array([x[lab == j].mean(0) for j in range(6)])
assert np.abs(new - c).max() <= 1e-9 * np.abs(c).max(), np.abs(new - c).max()
obj = ((x - c[lab]) ** 2).sum()
assert abs(obj - dist["objective"]) <= 1e-9 * obj, (obj, dist["objective"])
assert list(np.bincount(lab, minlength=6)) == dist["counts"]
# The file: float32 centroids, read by NumPy.
raw = open(d + "/km.safetensors", "rb").read()
n = int.from_bytes(raw[:8], "little")
h = json.loads(raw[8:8 + n])
o = h["centroids"]["data_offsets"]
f = np.frombuffer(raw[8 + n + o[0]:8 + n + o[1]], dtype="<f4").reshape(h["centroids"]["shape"])
assert np.array_equal(f, c.astype(np.float32))
assert h["__metadata__"]["format"] == "starling-kmeans-1"
print("ok: kmeans %d iterations in %.2f s, objective %.6g, err vs one process %.2g" % (dist["iterations"], dist["time_s"], obj, err))
EOF
pass "(a) kmeans: $N members agree to every digit, equal one process and NumPy's Lloyd fixed point"

# lstsq_check OUT RIDGE CSV: member 0's weights and bias against NumPy.
lstsq_check() {
  "$NUMPY_PY" - "$SCRATCH/$1.0" "$2" "$3" "$4" <<'EOF' || node_fail "$1: weights differ from NumPy"
import json, sys
import numpy as np
r = json.load(open(sys.argv[1]))
ridge, tol = float(sys.argv[2]), float(sys.argv[4])
a = np.loadtxt(sys.argv[3], delimiter=",", dtype=np.float32).astype(np.float64)
x, y = a[:, :-1], a[:, -1]
xc, yc = x - x.mean(0), y - y.mean()
if ridge > 0:
    w = np.linalg.solve(xc.T @ xc + ridge * np.eye(x.shape[1]), xc.T @ yc)
else:
    w = np.linalg.lstsq(xc, yc, rcond=None)[0]  # the minimum-norm solution
b = y.mean() - x.mean(0) @ w
ref, got = np.r_[w, b], np.r_[r["weight"], r["bias"]]
err = np.abs(ref - got).max() / np.abs(ref).max()
assert err <= tol, "relative error %g > %g" % (err, tol)
print("ok: %s off NumPy by %.2g in %d iterations, %.2f s" % (r["solver"], err, r["iterations"], r["time_s"]))
EOF
}

# (b) the closed form, plain and ridge.
on_all ls lstsq --data "csv:$SCRATCH/rows.csv" --json --out "$SCRATCH/ls.safetensors"
same_json ls weight
same_json ls bias
lstsq_check ls 0 "$SCRATCH/rows.csv" 1e-8
on_all lr lstsq --data "csv:$SCRATCH/rows.csv" --ridge 50 --json
same_json lr weight
lstsq_check lr 50 "$SCRATCH/rows.csv" 1e-8
pass "(b) lstsq: $N members agree to every digit and equal NumPy within 1e-8 (plain and ridge)"

# (c) singular: the fallback says so, and gives the minimum-norm solution.
on_all lq lstsq --data "csv:$SCRATCH/singular.csv" --json
same_json lq weight
grep -q "singular\|ill-conditioned" "$SCRATCH/lq.0.err" &&
  grep -q "QR with column pivoting" "$SCRATCH/lq.0.err" ||
  node_fail "(c) no fallback message: $(cat "$SCRATCH/lq.0.err")"
lstsq_check lq 0 "$SCRATCH/singular.csv" 1e-6
pass "(c) singular X^T X: $(grep -m1 -o "X^T X is .*Cholesky" "$SCRATCH/lq.0.err")"

# (d) gradient descent: the same weights everywhere, near the closed form.
on_all lg lstsq --data "csv:$SCRATCH/rows.csv" --method gd --max-iter 3000 --json
same_json lg weight
lstsq_check lg 0 "$SCRATCH/rows.csv" 1e-5
pass "(d) lstsq --method gd: $N members agree, within 1e-5 of the closed form"

# (e) a member with another --k: everybody fails, naming it.
for ((k = 0; k < N; k++)); do
  timeout "$(scaled 60)" "$STARLING" kmeans --data "csv:$SCRATCH/points.csv" \
    --k $((k == 1 ? 4 : 5)) --data-dir "$(node_dir "$k")" --shard "$k/$N" \
    >/dev/null 2>"$SCRATCH/e.$k" &
  PIDS+=("$!")
  ep[$k]=$!
done
for ((k = 0; k < N; k++)); do
  if wait "${ep[$k]}"; then node_fail "(e) member $k did not fail"; fi
  grep -q "disagree on k, the number of clusters" "$SCRATCH/e.$k" || node_fail "(e) member $k: $(cat "$SCRATCH/e.$k")"
done
pass "(e) another --k on one member: all fail: $(head -c 140 "$SCRATCH/e.0")"

# (f) lstsq's --out of (b): the safetensors file holds the weights and bias
# of its --json, as float32.
"$NUMPY_PY" - "$SCRATCH/ls.safetensors" "$SCRATCH/ls.0" <<'PYEOF' || node_fail "(f) lstsq --out differs from its --json"
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
body = raw[8 + n:]
def tensor(name):
    t = head[name]
    assert t["dtype"] == "F32", t
    a, b = t["data_offsets"]
    return np.frombuffer(body[a:b], dtype="<f4").reshape(t["shape"])
r = json.load(open(sys.argv[2]))
names = sorted(k for k in head if k != "__metadata__")
w = tensor([k for k in names if "weight" in k][0]).ravel()
b = tensor([k for k in names if "bias" in k][0]).ravel()
assert np.array_equal(w, np.float32(r["weight"])), (w, r["weight"])
assert np.array_equal(b, np.float32([r["bias"]])), (b, r["bias"])
print("ok: %s: %s" % (sys.argv[1], ", ".join("%s %s" % (k, head[k]["shape"]) for k in names)))
PYEOF
pass "(f) lstsq --out holds the --json's weights and bias (float32)"

# (g) IDX input: kmeans on images (idx:IMAGES,LABELS, pixels / 255) gives
# the centroids of the same values written as CSV.
"$NUMPY_PY" - "$SCRATCH" <<'PYEOF'
import struct, sys
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(11)
centres = rng.integers(20, 235, size=(4, 2, 2))
img = np.clip(centres[rng.integers(0, 4, 300)] + rng.normal(0, 12, (300, 2, 2)), 0, 255).astype(np.uint8)
with open(d + "/img.idx", "wb") as f:
    f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, 300, 2, 2) + img.tobytes())
with open(d + "/lbl.idx", "wb") as f:
    f.write(struct.pack(">BBBBI", 0, 0, 8, 1, 300) + np.zeros(300, np.uint8).tobytes())
x = img.reshape(300, 4).astype(np.float32) / np.float32(255)
np.savetxt(d + "/img.csv", x, fmt="%.9g", delimiter=",")
PYEOF
on_all hi kmeans --data "idx:$SCRATCH/img.idx,$SCRATCH/lbl.idx" --k 4 --tol 0 --seed 2 --json
on_all hc kmeans --data "csv:$SCRATCH/img.csv" --k 4 --tol 0 --seed 2 --json
same_json hi centroids
"$NUMPY_PY" - "$SCRATCH/hi.0" "$SCRATCH/hc.0" <<'PYEOF' || node_fail "(g) kmeans on IDX differs from the same values as CSV"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["centroids"] == b["centroids"], (a["centroids"], b["centroids"])
assert a["points"] == b["points"] == 300, (a["points"], b["points"])
PYEOF
pass "(g) kmeans on idx:IMAGES,LABELS equals the same pixels / 255 as CSV, to every digit"

# (h) a node that joins while a run goes on does not stall it: the
# default group ("all") is frozen as a list once the members agreed. A
# long run (gradient descent on badly conditioned data runs all its
# iterations); the fourth node joins meanwhile; each step would otherwise
# wait for it (it never calls) until --timeout and fail.
fp=()
for ((k = 0; k < N; k++)); do
  timeout "$(scaled 120)" "$STARLING" lstsq --data "csv:$SCRATCH/slow.csv" \
    --method gd --max-iter 20000 --timeout 15 --json \
    --data-dir "$(node_dir "$k")" --shard "$k/$N" >"$SCRATCH/f.$k" 2>"$SCRATCH/f.$k.err" &
  PIDS+=("$!")
  fp[$k]=$!
done
started() { local k; for ((k = 0; k < N; k++)); do grep -q "^iteration" "$SCRATCH/f.$k.err" || return 1; done; }
wait_for 30 "every member's run started" started
node_start 3 --join "$seed" "${ARGS[@]}"
node_up 3
sees_four() { [ "$(node_peers 0 | "$NUMPY_PY" -c 'import json,sys; print(sum(m["state"] == "alive" for m in json.load(sys.stdin)))')" = 4 ]; }
wait_for 20 "node 0 seeing the fourth node" sees_four
running=0
for ((k = 0; k < N; k++)); do kill -0 "${fp[$k]}" 2>/dev/null && running=$((running + 1)); done
[ "$running" = "$N" ] || node_fail "(h) a run ended before node 0 saw the fourth node (it failed, or was too short): $(tail -c 400 "$SCRATCH/f.0.err")"
for ((k = 0; k < N; k++)); do
  wait "${fp[$k]}" || node_fail "(h) member $k failed after a node joined: $(cat "$SCRATCH/f.$k.err")"
done
same_json f weight
pass "(h) a node joined during a run of $N members: all $N finished, same weights"
