#!/usr/bin/env bash
# bench_collectives.sh: the user collectives (issue #15; client/starling/
# client.h, "Collectives") against PyTorch's torch.distributed with the gloo
# backend, in one run, on this machine (docs/benchmarks.md, "User collectives
# vs Gloo"):
#
#   starling  N `starling node`s on loopback and a program on each
#             (tests/integration/comm_probe.c, `suite` mode) calling the
#             client library: its node copies the operand in over the control
#             socket, runs the operation with its peers over ENCRYPTED TCP
#             (secretstream), and copies the result back
#   gloo      tests/bench/gloo_collectives.py: N processes, torch.distributed
#             gloo backend over loopback, UNENCRYPTED
#
# Both: barrier latency, then broadcast from rank 0 and all-reduce (float32
# sum) of each of SIZES bytes; one warm-up round then ROUNDS rounds of K
# back-to-back operations after a barrier (K = ITERS for barriers and ITERS
# capped to 4 MiB / size for the rest); a round's time per operation is
# (max end - min start over the ranks) / K; the median over the rounds.
# Every result is checked exactly on every rank (a wrong one fails the run).
# starling also times the same all-reduce on a group of its node alone
# (self_all_reduce: the client-node copies and the node's machinery, no
# network), and `starling-bench crypto` gives the seal and open rates from
# which the crypto limit of the large sizes is computed
# (tools/bench/collectives_report.py says how).
#
# The nodes train a 2-feature softmax model on a 2-row CSV made here for one
# epoch (a few milliseconds), then idle ("epochs done ... serving peers"):
# no training runs beside the measurements, and gossip averaging and the
# internal ring are off (--gossip-every 0 --ring-every 0); only membership's
# few packets a second remain. The nodes are stopped before gloo runs.
#
#   tools/bench/bench_collectives.sh
#   SETUP=0 ROUNDS=5 ITERS=10 SIZES=4096,1048576 tools/bench/bench_collectives.sh
#   JSON=1 tools/bench/bench_collectives.sh       the table as one JSON object
#
# Settings (environment): N members (4), SIZES bytes (4096,1048576,67108864),
# ROUNDS (7), ITERS (20), CPU_REPS all-reduces for the CPU figure (3; 0:
# none), TIMEOUT seconds a step (300), SETUP (1), JSON (0), ST_BUILD_DIR.
#
# Installs what is missing (python3-torch, python3-numpy) and builds through
# tools/scripts/setup.sh into ST_BUILD_DIR (default build; SETUP=0 uses the
# build as it is: it needs starling, starling-bench and comm_probe). Every
# step is bounded by TIMEOUT seconds; every process started here is killed by
# PID on exit.
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

N=${N:-4}
SIZES=${SIZES:-4096,1048576,67108864}
ROUNDS=${ROUNDS:-7}
ITERS=${ITERS:-20}
TIMEOUT=${TIMEOUT:-300}
SETUP=${SETUP:-1}
JSON=${JSON:-0}
CPU_REPS=${CPU_REPS:-3}
PY=${PY:-/usr/bin/python3}
build=${ST_BUILD_DIR:-build}

case "$N" in '' | *[!0-9]* | 0 | 1) echo "bench_collectives: N=$N: a member count of 2 or more" >&2; exit 2 ;; esac
work=$(mktemp -d)
pids=()
# shellcheck disable=SC2317,SC2015 # run by the trap
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# With JSON=1 the report alone goes to stdout, everything else to stderr.
exec 3>&1
[ "$JSON" = 1 ] && exec 1>&2
if [ "$SETUP" = 1 ]; then bench_setup "$build" python3-torch python3-numpy; fi
for f in starling starling-bench comm_probe; do
  [ -x "$build/$f" ] || { echo "bench_collectives: $build/$f is missing: build first (or SETUP=1)" >&2; exit 1; }
done
S=$build/starling

echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "os:      $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
echo "torch:   $($PY -c 'import torch; print(torch.__version__)') (python3-torch $(dpkg-query -W -f='${Version}' python3-torch 2>/dev/null || echo '?')), gloo backend"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min; other work on these cores skews every figure)"
echo "runs:    N=$N, sizes $SIZES bytes, 1 warm-up + $ROUNDS rounds, $ITERS operations a round (capped to 4 MiB / size)"
echo

# ---- The crypto rates -----------------------------------------------------------
echo "\$ $build/starling-bench crypto --seconds 0.2 --rounds 3 --json" >>"$work/commands"
timeout "$TIMEOUT" "$build/starling-bench" crypto --seconds 0.2 --rounds 3 --json >"$work/crypto.json"

# ---- starling: N nodes, a program on each -----------------------------------------
bench_idle_nodes "$S" "$work" "$N"
echo "\$ $build/comm_probe DATA_DIR/control.sock suite $N $SIZES $ROUNDS $ITERS   (on each of the $N nodes)" >>"$work/commands"
probes=()
for ((k = 0; k < N; k++)); do
  timeout "$TIMEOUT" "$build/comm_probe" "$work/n$k/control.sock" suite "$N" "$SIZES" "$ROUNDS" "$ITERS" \
    >"$work/starling.$k" 2>&1 &
  probes+=($!)
  pids+=($!)
done
ok=0
for p in "${probes[@]}"; do wait "$p" || ok=1; done
if [ $ok -ne 0 ]; then
  echo "bench_collectives: a starling member failed:" >&2
  grep -hv '^{' "$work"/starling.* >&2 || true
  tail -n 5 "$work"/n*.log >&2 || true
  exit 1
fi
node_pids=("${pids[@]:0:N}")

# Where the CPU goes: the nodes' CPU seconds (utime + stime, from /proc)
# over CPU_REPS all-reduces of the largest size (`comm_probe bench`, which
# prints its own CPU time per operation).
cpu_ticks() { # PID...: their utime + stime in clock ticks
  local p t=0
  for p in "$@"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done
  echo "$t"
}
largest=$(echo "$SIZES" | tr ',' '\n' | sort -n | tail -1)
if [ "$CPU_REPS" -gt 0 ]; then
  echo "\$ $build/comm_probe DATA_DIR/control.sock bench $largest $CPU_REPS 1   (on each node; the nodes' CPU from /proc)" >>"$work/commands"
  c0=$(cpu_ticks "${node_pids[@]}")
  probes=()
  for ((k = 0; k < N; k++)); do
    timeout "$TIMEOUT" "$build/comm_probe" "$work/n$k/control.sock" bench "$largest" "$CPU_REPS" 1 \
      >"$work/cpu.$k" 2>&1 &
    probes+=($!)
    pids+=($!)
  done
  ok=0
  for p in "${probes[@]}"; do wait "$p" || ok=1; done
  [ $ok -eq 0 ] || { cat "$work"/cpu.* >&2; echo "bench_collectives: the CPU run failed" >&2; exit 1; }
  c1=$(cpu_ticks "${node_pids[@]}")
  awk -v t=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" -v r="$CPU_REPS" -v b="$largest" \
    '/^allreduce/ { p += $7 }
     END { printf "{\"bytes\": %d, \"reps\": %d, \"node_cpu_s\": %.4f, \"program_cpu_s\": %.4f}\n",
           b, r, t / hz / r, p }' "$work"/cpu.* >"$work/cpu.json"
fi
kill -TERM "${node_pids[@]}" 2>/dev/null || true
for p in "${node_pids[@]}"; do wait "$p" 2>/dev/null || true; done

# ---- gloo ---------------------------------------------------------------------------
gcmd=("$PY" tests/bench/gloo_collectives.py --world "$N" --sizes "$SIZES" --rounds "$ROUNDS" --iters "$ITERS")
echo "\$ ${gcmd[*]}" >>"$work/commands"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout "$TIMEOUT" "${gcmd[@]}" >"$work/gloo" 2>"$work/gloo.err" ||
  { cat "$work/gloo.err" >&2; echo "bench_collectives: gloo failed" >&2; exit 1; }

# ---- The table ------------------------------------------------------------------------
report=("$PY" tools/bench/collectives_report.py --crypto "$work/crypto.json")
[ -s "$work/cpu.json" ] && report+=(--cpu "$work/cpu.json")
[ "$JSON" = 1 ] && report+=(--json)
"${report[@]}" "$work"/starling.* "$work/gloo" >&3
if [ "$JSON" != 1 ]; then
  echo
  echo "commands:"
  sed 's/^/  /' "$work/commands"
fi
