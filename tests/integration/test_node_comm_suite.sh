#!/usr/bin/env bash
# test_node_comm_suite.sh: what tools/bench/bench_collectives.sh's figures
# rest on (docs/benchmarks.md, "User collectives vs Gloo"). Two nodes that
# have finished a one-epoch training on a tiny CSV; `comm_probe SOCKET suite`
# on each times barrier, broadcast, all-reduce (small path and ring) and the
# all-reduce on a group of its node alone, checking every result exactly, and
# prints one JSON line per operation and size; tools/bench/
# collectives_report.py turns both members' lines, with a gloo line and
# crypto rates, into the table (the ratio to gloo, the crypto limit of the
# large path, the CPU line); `comm_probe bench` prints its CPU time; a bad
# size list is refused.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

PROBE=${ST_BUILD_DIR:-$(dirname "$STARLING")}/comm_probe
[ -x "$PROBE" ] || fail "comm_probe not built at $PROBE"
N=2
awk 'BEGIN { srand(1); for (r = 0; r < 16; r++) printf "%.3f,%.3f,%d\n", rand(), rand(), r % 2 }' \
  >"$SCRATCH/data.csv"
ARGS=(--model softmax:2-2 --data "csv:$SCRATCH/data.csv" --epochs 1 --batch 4
      --device cpu --threads 1 --eval-every 0 --checkpoint-every 0
      --gossip-every 0 --ring-every 0)
sock() { echo "$(node_dir "$1")/control.sock"; }

node_start 0 --shard "0/$N" "${ARGS[@]}"
node_up 0
node_start 1 --join "$NODE_ADDR" --shard "1/$N" "${ARGS[@]}"
node_up 1

# 4 KiB (the small path) and 256 KiB (the ring), 2 rounds of up to 3.
pids=()
for ((k = 0; k < N; k++)); do
  timeout "$(scaled 60)" "$PROBE" "$(sock $k)" suite $N 4096,262144 2 3 >"$SCRATCH/s.$k" 2>&1 &
  pids+=("$!")
  PIDS+=("$!")
done
for k in "${!pids[@]}"; do
  wait "${pids[$k]}" || node_fail "suite on member $k: $(cat "$SCRATCH/s.$k")"
done
"$NUMPY_PY" - "$SCRATCH/s.0" "$SCRATCH/s.1" <<'PY' || node_fail "suite output: $(cat "$SCRATCH"/s.*)"
import json, sys
want = {("barrier", 0, 3), ("broadcast", 4096, 3), ("all_reduce", 4096, 3),
        ("self_all_reduce", 4096, 3), ("broadcast", 262144, 3),
        ("all_reduce", 262144, 3), ("self_all_reduce", 262144, 3)}
for rank, path in enumerate(sys.argv[1:]):
    recs = [json.loads(l) for l in open(path)]
    got = {(r["op"], r["bytes"], r["iters"]) for r in recs}
    assert got == want, (rank, got)
    for r in recs:
        assert r["system"] == "starling" and r["n"] == 2 and r["rank"] in (0, 1)
        assert len(r["start"]) == 2 and len(r["end"]) == 2
        assert all(0 < e - s < 60 for s, e in zip(r["start"], r["end"]))
PY
pass "suite: barrier, broadcast, all-reduce (small and ring) and self all-reduce checked and timed on both members"

# The bench mode prints its median and its own CPU time per operation.
for ((k = 0; k < N; k++)); do
  timeout "$(scaled 60)" "$PROBE" "$(sock $k)" bench 262144 2 1 >"$SCRATCH/b.$k" 2>&1 &
  pids[k]=$!
  PIDS+=("$!")
done
for ((k = 0; k < N; k++)); do wait "${pids[$k]}" || node_fail "bench on member $k: $(cat "$SCRATCH/b.$k")"; done
grep -Eq '^allreduce bytes 262144 seconds [0-9.]+ cpu_seconds [0-9.]+$' "$SCRATCH/b.0" ||
  fail "bench line: $(cat "$SCRATCH/b.0")"
pass "bench: $(cat "$SCRATCH/b.0")"

# The report: starling against a gloo line, with crypto rates of 100 and
# 200 MB/s: the 256 KiB all-reduce's limit is 2 * 2 * 1/2 * 262144 *
# (1/100e6 + 1/200e6) / 2 cores = 3.93 ms.
cat >"$SCRATCH/crypto.json" <<'EOF'
{"benchmark": "crypto", "results": [
 {"op": "stream seal", "bytes": 1048576, "mb_per_sec": 100.0},
 {"op": "stream open", "bytes": 1048576, "mb_per_sec": 200.0}]}
EOF
echo '{"system": "gloo", "op": "all_reduce", "bytes": 262144, "n": 2, "rank": 0, "iters": 1, "start": [1.0, 2.0], "end": [1.5, 2.5]}' \
  >"$SCRATCH/gloo"
REPORT=$SRC/tools/bench/collectives_report.py
echo '{"bytes": 262144, "reps": 2, "node_cpu_s": 0.05, "program_cpu_s": 0.01}' >"$SCRATCH/cpu.json"
"$NUMPY_PY" "$REPORT" --crypto "$SCRATCH/crypto.json" --cpu "$SCRATCH/cpu.json" --cores 2 --json "$SCRATCH"/s.* "$SCRATCH/gloo" \
  >"$SCRATCH/report.json" || fail "collectives_report.py --json: exit status $?"
"$NUMPY_PY" - "$SCRATCH/report.json" <<'PY' || fail "report: $(cat "$SCRATCH/report.json")"
import json, sys
d = json.load(open(sys.argv[1]))
rows = {(r["op"], r["bytes"]): r for r in d["rows"]}
assert len(rows) == 7, rows.keys()
ar = rows[("all_reduce", 262144)]
assert abs(ar["gloo_s"] - 0.5) < 1e-9, ar
assert abs(ar["crypto_limit_s"] - 262144 * 2 * (1 / 100e6 + 1 / 200e6) / 2) < 1e-12, ar
assert ar["starling_s"] > 0 and abs(ar["starling_over_gloo"] - ar["starling_s"] / 0.5) < 1e-9
assert rows[("all_reduce", 4096)]["crypto_limit_s"] is None
assert rows[("barrier", 0)]["gloo_s"] is None and rows[("barrier", 0)]["starling_s"] > 0
assert abs(d["cpu"]["crypto_cpu_s"] - 2 * 262144 * (1 / 100e6 + 1 / 200e6)) < 1e-12, d["cpu"]
PY
"$NUMPY_PY" "$REPORT" --crypto "$SCRATCH/crypto.json" --cpu "$SCRATCH/cpu.json" --cores 2 \
  "$SCRATCH"/s.* "$SCRATCH/gloo" >"$SCRATCH/table" || fail "collectives_report.py: exit status $?"
grep -q '^CPU per all-reduce of 256 KiB (2 operations), all 2 members together: nodes 0.05 s, programs 0.01 s; the crypto alone needs 0.01 s' \
  "$SCRATCH/table" || fail "table's CPU line: $(cat "$SCRATCH/table")"
grep -Eq '^all_reduce +256 KiB +500\.00 ms' "$SCRATCH/table" || fail "table: $(cat "$SCRATCH/table")"
pass "report: ratio to gloo and the crypto limit ($(grep -E '^all_reduce +256' "$SCRATCH/table" | tr -s ' '))"

# A bad size list is refused, naming it.
"$PROBE" "$(sock 0)" suite $N 4096,1001 1 1 >"$SCRATCH/bad" 2>&1 && fail "size 1001 accepted"
grep -q 'sizes "4096,1001": byte counts, multiples of 4' "$SCRATCH/bad" || fail "bad sizes: $(cat "$SCRATCH/bad")"
pass "a size that is not a multiple of 4 is refused: $(cut -c1-100 "$SCRATCH/bad")"
