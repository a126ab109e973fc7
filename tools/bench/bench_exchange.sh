#!/usr/bin/env bash
# bench_exchange.sh: how long one averaging exchange takes between two real
# nodes on this machine, against the floor (encrypting, carrying and
# decrypting the same bytes: `starling-bench exchange`), and how much memory
# a node holds against its model's size (docs/benchmarks.md).
#
# For each model: two `starling node`s on loopback that have finished their
# (one-step) training average with each other every --gossip-every 0.3 s
# (rings off, so that only exchanges run) for
# SECONDS; the figure is the mean of `exchange_ms_mean` over both nodes
# (connect to done, including the snapshot and the correction) and each
# node's peak anonymous memory (RssAnon sampled every 0.2 s: the heap, not
# the shared libraries' pages, which are ~65 MiB of RssFile with cuBLAS
# linked). The data is a 64-row CSV made here, so the memory is the model,
# its gradients and workspace, the exchange buffers and the runtime, not a
# dataset. The first row (a 16-unit model) gives the runtime's own share.
#
#   tools/bench/bench_exchange.sh                     models of ~1M, 10M, 50M parameters (issue 16)
#   MODELS="mlp:784-4096-1664-10" SECONDS_EACH=20 tools/bench/bench_exchange.sh
#
# Installs what is missing and builds through tools/scripts/setup.sh (SETUP=0
# skips it and uses ST_BUILD_DIR's programs as they are).
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

MODELS=${MODELS:-"mlp:784-16-10 mlp:784-1024-200-10 mlp:784-4096-1664-10 mlp:784-8192-5376-10"}
SECONDS_EACH=${SECONDS_EACH:-15}
build=${ST_BUILD_DIR:-build}
S=$build/starling
B=$build/starling-bench

SETUP=${SETUP:-1}
if [ "$SETUP" = 1 ]; then bench_setup "$build"; fi
for f in "$S" "$B"; do
  [ -x "$f" ] || { echo "bench_exchange: $f is missing (build first, or SETUP=1)" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
"$S" keygen --cluster --out "$work/ck" >/dev/null
awk 'BEGIN { srand(1); for (r = 0; r < 64; r++) { for (c = 0; c < 784; c++) printf "%.3f,", rand(); print r % 10 } }' \
  >"$work/data.csv"

num() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p"; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F)"
printf '%-24s %10s %9s %12s %10s %7s %13s %13s\n' model parameters MiB exchange_ms floor_ms ratio peak_anon_MiB 3x+64MiB_goal
for m in $MODELS; do
  dir=$work/$(echo "$m" | tr ':-' '__')
  mkdir -p "$dir"
  common=(--model "$m" --data "csv:$work/data.csv" --epochs 1 --batch 2 --device cpu
          --threads 1 --eval-every 0 --log-every 0 --checkpoint-every 0 --quiet
          --gossip-every 0.3 --ring-every 0 --cluster-key "$work/ck")
  "$S" node --listen 127.0.0.1:0 --data-dir "$dir/n0" --shard 0/2 "${common[@]}" 2>"$dir/n0.log" &
  p0=$!
  pids+=("$p0")
  seed=
  for _ in $(seq 200); do
    seed=$("$S" status --json --data-dir "$dir/n0" 2>/dev/null | sed -n 's/.*"address":"\([^"]*\)".*/\1/p' || true)
    [ -n "$seed" ] && break
    sleep 0.05
  done
  "$S" node --listen 127.0.0.1:0 --join "$seed" --data-dir "$dir/n1" --shard 1/2 "${common[@]}" 2>"$dir/n1.log" &
  p1=$!
  pids+=("$p1")
  peak=0
  for _ in $(seq $((SECONDS_EACH * 5))); do
    for p in $p0 $p1; do
      a=$(awk '/RssAnon/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
      [ "${a:-0}" -gt "$peak" ] && peak=$a
    done
    sleep 0.2
  done
  j0=$("$S" status --json --data-dir "$dir/n0")
  j1=$("$S" status --json --data-dir "$dir/n1")
  kill -TERM "$p0" "$p1"
  wait "$p0" "$p1" || true
  n=$(echo "$m" | awk -F'[:-]' '{ s = 0; for (i = 2; i < NF; i++) s += $i * $(i + 1) + $(i + 1); print s }')
  mib=$(awk -v n="$n" 'BEGIN { printf "%.1f", n * 4 / 1048576 }')
  ms=$(awk -v a="$(echo "$j0" | num exchange_ms_mean)" -v b="$(echo "$j1" | num exchange_ms_mean)" 'BEGIN { printf "%.1f", (a + b) / 2 }')
  floor=$("$B" exchange --mib "$(awk -v m="$mib" 'BEGIN { printf "%d", (m < 1) ? 1 : m + 0.5 }')" --repeats 5 --json | num limit_ms)
  rss=$(awk -v a="$peak" 'BEGIN { printf "%.0f", a / 1024 }')
  goal=$(awk -v m="$mib" 'BEGIN { printf "%.0f", 3 * m + 64 }')
  ratio=$(awk -v a="$ms" -v b="$floor" 'BEGIN { printf "%.2f", a / b }')
  printf '%-24s %10d %9s %12s %10s %7s %13s %13s\n' "$m" "$n" "$mib" "$ms" "$floor" "$ratio" "$rss" "$goal"
done
