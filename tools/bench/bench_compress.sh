#!/usr/bin/env bash
# bench_compress.sh: what compressed averaging (--compress) saves: for each
# codec, 4 `starling node`s train the README's recipe (mlp:784-256-128-10,
# Fashion-MNIST quarters, batch 64, lr 0.05, momentum 0.9, cosine, 10
# epochs, one BLAS thread each) and the script reports, in one run, the
# wall time until every node's test accuracy reaches TARGET, the bytes each
# node had sent by then (all its traffic: membership, state transfer,
# gossip, rings), and at the end of the epochs the lowest test accuracy
# and bytes sent, each codec against `none` as a ratio (docs/benchmarks.md,
# "Compressed averaging").
#
# On loopback by default. With RATE (root only), every node runs in its own
# network namespace behind a veth shaped by `tbf rate $RATE` (bench_lib.sh,
# bench_ns_up): links like separate machines on a slow network.
#
#   tools/bench/bench_compress.sh                           none int8 topk:0.01, loopback
#   RATE=10mbit tools/bench/bench_compress.sh               shaped links
#   CODECS="none bf16" TARGET=0.87 EPOCHS=10 tools/bench/bench_compress.sh
#   CODECS="none none+outer int8+outer" tools/bench/bench_compress.sh
#
# An entry CODEC+outer adds OUTER_ARGS (default: --outer nesterov
# --local-steps 50) to that run: the outer optimizer (docs/compression.md,
# "The outer optimizer"). NODE_ARGS go to every run (e.g. --ring-every 1).
#
# With DDP=1, PyTorch DistributedDataParallel (gloo, 4 processes,
# tests/bench/torch_ddp.py: the same MLP, shards, batch, optimizer and
# schedule, one rank in each node's namespace when RATE is set) runs first
# on the same links, and every codec's time to the target is also given
# against DDP's, with the bytes each rank sent (its veth's counter) on
# shaped links.
#
#   DDP=1 RATE=100mbit tools/bench/bench_compress.sh        against DDP
#
# Environment: CODECS, TARGET (0.87), EPOCHS (10), RATE (unset: loopback),
# OUTER_ARGS, NODE_ARGS, TIMEOUT (seconds a cluster may take, 600), DDP
# (0), DDP_TIMEOUT (seconds DDP may take, 1800), ST_BUILD_DIR (build).
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

CODECS=${CODECS:-"none int8 topk:0.01"}
TARGET=${TARGET:-0.87}
EPOCHS=${EPOCHS:-10}
RATE=${RATE:-}
TIMEOUT=${TIMEOUT:-600}
DDP=${DDP:-0}
DDP_TIMEOUT=${DDP_TIMEOUT:-1800}
read -r -a OUTER_ARGS <<<"${OUTER_ARGS:---outer nesterov --local-steps 50}"
read -r -a NODE_ARGS <<<"${NODE_ARGS:-}"
PY=${PY:-/usr/bin/python3}
build=${ST_BUILD_DIR:-build}
S=$(cd "$build" 2>/dev/null && pwd)/starling
N=4

if [ -n "$RATE" ] && [ "$(id -u)" -ne 0 ]; then
  echo "bench_compress.sh: RATE needs root (network namespaces)" >&2
  exit 2
fi
if [ "$DDP" = 1 ]; then bench_setup "$build" python3-torch python3-numpy libopenblas0-pthread; else bench_setup "$build"; fi
S=$(cd "$build" && pwd)/starling

work=$(mktemp -d)
pids=()
up_ns=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  for u in "${up_ns[@]:-}"; do [ -n "$u" ] && bench_ns_down st-cmp $u; done
  rm -rf "$work"
}
trap cleanup EXIT
"$S" keygen --cluster --out "$work/ck" >/dev/null
[ -n "$RATE" ] && bench_ns_up st-cmp c "$N"

recipe=(--model mlp:784-256-128-10 --data fashion-mnist --epochs "$EPOCHS" --batch 64
        --lr 0.05 --momentum 0.9 --schedule cosine --device cpu --threads 1
        --eval-every 0.5 --log-every 0 --checkpoint-every 0 --quiet)

# status DIR KEY...: the fields of `status --json` (a.b for nested ones),
# one per line; nothing when the node does not answer.
status() {
  local dir=$1
  shift
  "$S" status --json --data-dir "$dir" 2>/dev/null | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
for k in sys.argv[1:]:
    v = d
    for p in k.split("."):
        v = v[p]
    print(v)' "$@" 2>/dev/null || true
}

# node K ENTRY DIR [SEED]: starts node K (in its namespace when shaped);
# ENTRY is a codec, or CODEC+outer.
node() {
  local k=$1 codec=${2%+outer} dir=$3 seed=${4:-} listen=127.0.0.1:0 pre=()
  local extra=("${NODE_ARGS[@]}")
  [ "$2" != "$codec" ] && extra+=("${OUTER_ARGS[@]}")
  if [ -n "$RATE" ]; then
    listen=10.77.0.$((k + 1)):7946
    pre=(ip netns exec "st-cmp-c-$k")
  fi
  local join=()
  [ -n "$seed" ] && join=(--join "$seed")
  "${pre[@]}" "$S" node --listen "$listen" --cluster-key "$work/ck" \
    --data-dir "$dir/n$k" --shard "$k/$N" --compress "$codec" "${join[@]}" \
    "${recipe[@]}" "${extra[@]}" 2>"$dir/n$k.log" &
  pids+=($!)
}

# run CODEC: prints "seconds_to_target bytes_at_target min_final_acc bytes_at_end compressed".
run() {
  local codec=$1 dir=$work/${1//[:+]/_} t0 seed= k
  mkdir -p "$dir"
  pids=()
  t0=$(date +%s.%N)
  node 0 "$codec" "$dir"
  for _ in $(seq 400); do
    seed=$(status "$dir/n0" address)
    [ -n "$seed" ] && [ "${seed##*:}" != 0 ] && break
    sleep 0.05
  done
  for ((k = 1; k < N; k++)); do node "$k" "$codec" "$dir" "$seed"; done
  local at_target="" bytes_target=0
  while :; do
    local now ok=0 done_n=0 bytes=0
    now=$(date +%s.%N)
    if awk -v a="$now" -v b="$t0" -v t="$TIMEOUT" 'BEGIN { exit !(a - b > t) }'; then
      echo "timeout"
      return
    fi
    for ((k = 0; k < N; k++)); do
      local f
      mapfile -t f < <(status "$dir/n$k" test_accuracy bytes_out state)
      [ ${#f[@]} -eq 3 ] || continue
      bytes=$((bytes + f[1]))
      awk -v a="${f[0]}" -v t="$TARGET" 'BEGIN { exit !(a != "None" && a >= t) }' && ok=$((ok + 1))
      [ "${f[2]}" = done ] && done_n=$((done_n + 1))
    done
    if [ -z "$at_target" ] && [ $ok -eq $N ]; then
      at_target=$(awk -v a="$now" -v b="$t0" 'BEGIN { printf "%.1f", a - b }')
      bytes_target=$((bytes / N))
    fi
    [ $done_n -eq $N ] && break
    sleep 0.25
  done
  sleep 1 # the last evaluation (every 0.5 s)
  local min_acc=1 bytes_end=0 comp=0
  for ((k = 0; k < N; k++)); do
    local f
    mapfile -t f < <(status "$dir/n$k" test_accuracy bytes_out compression.exchanges_compressed)
    min_acc=$(awk -v a="$min_acc" -v b="${f[0]}" 'BEGIN { print (b < a ? b : a) }')
    bytes_end=$((bytes_end + f[1]))
    comp=$((comp + f[2]))
  done
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  echo "${at_target:-never} $bytes_target $min_acc $((bytes_end / N)) $comp"
}

# tx_bytes R: bytes sent so far on rank R's veth (shaped links only).
tx_bytes() { ip netns exec "st-cmp-c-$1" cat /sys/class/net/eth0/statistics/tx_bytes; }

# run_ddp: sets DDP_RESULT to "seconds_to_target MB_per_rank@end final_acc"
# ("-" for what is not known), or "timeout"/"failed". Runs in this shell (not
# a subshell), so that the trap knows every rank's PID.
run_ddp() {
  local r host=127.0.0.1 ifname=lo port=$((29500 + RANDOM % 1000)) t0 pre before=() mb=- p
  [ -n "$RATE" ] && host=10.77.0.1 ifname=eth0
  if [ -n "$RATE" ]; then for ((r = 0; r < N; r++)); do before+=("$(tx_bytes $r)"); done; fi
  rm -f "$work/ddp.json"
  pids=()
  t0=$(date +%s.%N)
  for ((r = 0; r < N; r++)); do
    pre=()
    [ -n "$RATE" ] && pre=(ip netns exec "st-cmp-c-$r")
    "${pre[@]}" env GLOO_SOCKET_IFNAME=$ifname OPENBLAS_NUM_THREADS=1 \
      timeout "$DDP_TIMEOUT" "$PY" tests/bench/torch_ddp.py --rank "$r" --world "$N" \
      --master "$host:$port" --json-out "$work/ddp.json" --epochs "$EPOCHS" \
      --target "$TARGET" --t0 "$t0" --eval-every 0.5 >"$work/ddp$r.log" 2>&1 &
    pids+=($!)
  done
  DDP_RESULT=
  for p in "${pids[@]}"; do wait "$p" || DDP_RESULT=failed; done
  pids=()
  if [ -n "$DDP_RESULT" ] || [ ! -s "$work/ddp.json" ]; then
    grep -q . "$work/ddp0.log" && tail -3 "$work/ddp0.log" >&2
    DDP_RESULT=failed
    return
  fi
  if [ -n "$RATE" ]; then
    local sum=0
    for ((r = 0; r < N; r++)); do sum=$((sum + $(tx_bytes $r) - before[r])); done
    mb=$(awk -v b="$sum" -v n="$N" 'BEGIN { printf "%.1f", b / n / 1e6 }')
  fi
  DDP_RESULT=$("$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
t = d["time_to_target_s"]
print("%s %s %.4f" % ("never" if t is None else "%.1f" % t, sys.argv[2], d["final_accuracy"]))' "$work/ddp.json" "$mb")
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u '+%F %H:%M UTC')"
echo "4 nodes, $EPOCHS epochs; links: ${RATE:-loopback}; target test accuracy $TARGET (every node)"
echo "every run: ${NODE_ARGS[*]:-(no extra flags)}; +outer: ${OUTER_ARGS[*]}"
printf '%-12s %10s %16s %12s %16s %12s\n' codec to_target_s MB_per_node@tgt final_min_acc MB_per_node@end compressed
base_t="" base_b="" ddp_t=""
if [ "$DDP" = 1 ]; then
  run_ddp
  read -r ddp_t ddp_mb ddp_acc <<<"$DDP_RESULT"
  printf '%-12s %10s %16s %12s %16s %12s\n' "ddp (gloo)" "$ddp_t" - "${ddp_acc:--}" "${ddp_mb:--}" -
  [ "$ddp_t" = failed ] && ddp_t=""
fi
for codec in $CODECS; do
  read -r t bt acc be comp < <(run "$codec")
  printf '%-12s %10s %16.1f %12s %16.1f %12s\n' "$codec" "$t" \
    "$(awk -v b="$bt" 'BEGIN { print b / 1e6 }')" "$acc" \
    "$(awk -v b="$be" 'BEGIN { print b / 1e6 }')" "$comp"
  if [ "$codec" = none ]; then
    base_t=$t base_b=$bt
  elif [ -n "$base_b" ] && [ "$bt" -gt 0 ] && [ "$t" != never ] && [ "$base_t" != never ]; then
    awk -v c="$codec" -v b="$base_b" -v x="$bt" -v tb="$base_t" -v tx="$t" \
      'BEGIN { printf "  %s vs none: %.2fx fewer bytes to the target, %.2fx the time\n", c, b / x, tx / tb }'
  fi
  if [ -n "$ddp_t" ] && [ "$ddp_t" != never ] && [ "$t" != never ] && [ "$t" != timeout ]; then
    awk -v c="$codec" -v d="$ddp_t" -v x="$t" 'BEGIN { printf "  %s vs DDP: %.2fx the time\n", c, x / d }'
  fi
done
