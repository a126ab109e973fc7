#!/usr/bin/env bash
# bench_sync.sh: how long a joining node takes to get the cluster's state
# from one donor (--sync-donors 1: FETCH) against several at once
# (--sync-donors 3: multi-donor sync), on shaped links (docs/benchmarks.md,
# "Joining from several donors"). Needs root (network namespaces).
#
# Three donors, each in its own network namespace on one bridge, train a
# ~10M-parameter MLP (40 MB, 39 chunks) on a small CSV for one epoch with
# a ring round every 10 steps and one at the end, so that they hold one
# agreed state; then a joiner in a fourth namespace is started REPEATS
# times with each setting, alternating, and the figure is the time from
# its start to "synchronized" in its own log (the sync itself: asking for
# the manifests, agreeing, fetching, checking). Two link set-ups:
#   symmetric      every link RATE both ways (the joiner's download is then
#                  the bottleneck whatever the donors)
#   donor-limited  the donors' links RATE, the joiner's JOINER_RATE (a
#                  joiner on a faster link than each donor's: a donor's
#                  upload is the bottleneck, as on home or shared links)
#
#   sudo tools/bench/bench_sync.sh
#   VERBOSE=1 ...    also prints each joiner's log lines about the sync
#   RATE=100mbit JOINER_RATE=1gbit REPEATS=3 SETUPS="symmetric donor-limited" MODEL=mlp:20-8192-1200-2 sudo -E tools/bench/bench_sync.sh
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

RATE=${RATE:-100mbit}
JOINER_RATE=${JOINER_RATE:-1gbit}
REPEATS=${REPEATS:-3}
SETUPS=${SETUPS:-"symmetric donor-limited"}
MODEL=${MODEL:-mlp:20-8192-1200-2}
build=${ST_BUILD_DIR:-build}
S=$build/starling
[ "$(id -u)" -eq 0 ] || { echo "bench_sync.sh: needs root (network namespaces)" >&2; exit 1; }

bench_setup "$build" iproute2

work=$(mktemp -d)
P=stbsync$$
pids=()
up_ns=()
stop_nodes() {
  for p in "${pids[@]:-}"; do
    if [ -n "$p" ]; then kill -9 "$p" 2>/dev/null || true; fi
  done
  pids=()
}
cleanup() {
  stop_nodes
  local u
  for u in "${up_ns[@]:-}"; do
    # shellcheck disable=SC2086 # "TAG N": two arguments
    if [ -n "$u" ]; then bench_ns_down "$P" $u; fi
  done
  rm -rf "$work"
}
trap cleanup EXIT
"$S" keygen --cluster --out "$work/ck" >/dev/null
awk 'BEGIN { srand(2); for (r = 0; r < 240; r++) { s = 0; for (c = 0; c < 20; c++) { v = rand() - 0.5; s += v; printf "%.4f,", v } print (s > 0) } }' \
  >"$work/data.csv"
common=(--model "$MODEL" --data "csv:$work/data.csv" --batch 8 --lr 0.01 --epochs 1
        --threads 1 --device cpu --gossip-every 0 --eval-every 0 --checkpoint-every 0
        --log-every 0 --cluster-key "$work/ck")

# field DIR KEY: one field of a node's status.
field() {
  "$S" status --json --data-dir "$1" 2>/dev/null |
    /usr/bin/python3 -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("."):
    v = v[k]
print(v)' "$2" 2>/dev/null
}

# donors SETUP: three donors done, holding one agreed state.
donors() {
  local t=$1 r ids
  stop_nodes
  RATE=$RATE bench_ns_up "$P" "$t" 4
  if [ "$t" = donor-limited ]; then
    tc -n "$P-$t-3" qdisc replace dev eth0 root tbf rate "$JOINER_RATE" burst 256kb latency 50ms
    tc -n "$P-$t-br" qdisc replace dev p3 root tbf rate "$JOINER_RATE" burst 256kb latency 50ms
  fi
  for r in 0 1 2; do
    rm -rf "$work/d$r"
    local join=()
    [ "$r" -gt 0 ] && join=(--join 10.77.0.1:7946)
    ip netns exec "$P-$t-$r" "$S" node --listen "10.77.0.$((r + 1)):7946" --data-dir "$work/d$r" \
      "${common[@]}" --shard "$r/3" --local-steps 10 --ring-every 0 --min-nodes 3 "${join[@]}" \
      2>"$work/d$r.log" &
    pids+=($!)
    sleep 0.5
  done
  for _ in $(seq 600); do
    ids=$(for r in 0 1 2; do field "$work/d$r" agreed.id || echo none; done | sort -u)
    if [ "$(echo "$ids" | wc -l)" = 1 ] && [ "$ids" != none ] &&
      [ "$(field "$work/d0" state)" = "done" ] && [ "$(field "$work/d1" state)" = "done" ] &&
      [ "$(field "$work/d2" state)" = "done" ]; then
      return 0
    fi
    sleep 0.5
  done
  tail -5 "$work"/d*.log >&2
  echo "bench_sync.sh: the donors did not reach one agreed state" >&2
  exit 1
}

# join SETUP K: seconds a joiner with --sync-donors K took to synchronize.
join() {
  local t=$1 k=$2 pid
  rm -rf "$work/j"
  ip netns exec "$P-$t-3" "$S" node --listen 10.77.0.4:7946 --data-dir "$work/j" \
    "${common[@]}" --shard 0/3 --ring-every 0 --sync-donors "$k" --join 10.77.0.1:7946 \
    --log-every 1 2>"$work/j.log" &
  pid=$!
  for _ in $(seq 1200); do
    grep -q "synchronized from" "$work/j.log" && break
    sleep 0.1
  done
  # A leave, not a kill: the donors forget it at once, so the next joiner
  # (at the same address) does not wait for its status.
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  [ -z "${VERBOSE:-}" ] || grep -E "listening|donor|agree|synchronized" "$work/j.log" | cut -c1-160 >&2
  grep -q "synchronized from" "$work/j.log" || { tail -5 "$work/j.log" >&2; exit 1; }
  # Seconds on the joiner's log clock: start-up line to the sync's.
  awk '/listening on/ && !a { a = $2 } /synchronized from/ && !b { b = $2 }
       END { printf "%.2f\n", b - a }' FS='[][ ]+' "$work/j.log"
}

params=$(awk -F'[:-]' '{ n = 0; for (i = 2; i < NF; i++) n += $i * $(i + 1) + $(i + 1); print n }' <<<"$MODEL")
echo "model $MODEL ($params parameters), donors' links $RATE, joiner's $JOINER_RATE in donor-limited; $REPEATS runs each"
echo "| links | 1 donor, s | 3 donors, s | speed-up |"
echo "|---|---:|---:|---:|"
for t in $SETUPS; do
  donors "$t"
  one=() three=()
  for ((i = 0; i < REPEATS; i++)); do
    one+=("$(join "$t" 1)")
    three+=("$(join "$t" 3)")
  done
  awk -v t="$t" -v a="${one[*]}" -v b="${three[*]}" 'BEGIN {
    n = split(a, x, " "); split(b, y, " "); sa = sb = 0
    for (i = 1; i <= n; i++) { sa += x[i]; sb += y[i] }
    printf "| %s | %.2f (%s) | %.2f (%s) | %.2fx |\n", t, sa / n, a, sb / n, b, sa / sb }'
  stop_nodes
done
