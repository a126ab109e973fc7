#!/usr/bin/env bash
# attach_demo.sh: bring your own model, in one command. Installs what is
# missing (python3-torch included), builds, and runs a local cluster of N
# `starling node --attach` (default 4) on 127.0.0.1, each with one PyTorch
# program (examples/pytorch_fmnist.py: a small CNN with BatchNorm) that
# trains on its own shard K/N of Fashion-MNIST and lets its node average
# with the others. Shows one line per node (refreshed in place on a
# terminal, every 5 s otherwise) until every program has ended; then each
# program's test accuracy and how far apart the nodes' models are (their
# checkpoints, written when they leave, compared with
# tests/integration/node_param_spread.py --all).
#
#   tools/scripts/attach_demo.sh [--nodes N] [--epochs E] [--target ACC]
#                                [--dir DIR] [--no-setup] [PROGRAM_ARGS...]
#
#   --nodes N      nodes, one program each (default 4)
#   --epochs E     passes of each program over its shard (default 8)
#   --target ACC   a program stops at the first epoch end where its test
#                  accuracy is >= ACC (default: run every epoch)
#   --dir DIR      logs, checkpoints, results (default out/attach)
#   --no-setup     skip tools/scripts/setup.sh (use what ST_BUILD_DIR holds)
#   any other argument (or everything after --) goes to every program,
#   after the demo's own --lr 0.02 (e.g. --lr 0.03 --batch 128)
#
# The nodes average every 0.2 s and run a ring every 1 s (NODE_ARGS
# replaces "--gossip-every 0.2 --ring-every 1"). On 2 cores: about 110 s,
# 0.905-0.91 test accuracy each (0.90 from the 5th or 6th epoch).
#
# Every node waits for all N before the first step (--min-nodes N), so that
# the programs start together. Ctrl-C stops every program and node (by
# PID). Logs: DIR/nodeK.log and DIR/progK.log.
set -euo pipefail
cd "$(dirname "$0")/../.."

nodes=4
epochs=8
target=
dir=out/attach
setup=1
prog_args=(--lr 0.02) # lr 0.05 (the example's default) stalls near 0.88 here
NODE_ARGS=${NODE_ARGS:-"--gossip-every 0.2 --ring-every 1"}
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --no-setup) setup=0; shift ;;
    -h|--help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; prog_args+=("$@"); break ;;
    *) prog_args+=("$1"); shift ;;
  esac
done
case "$nodes" in ''|*[!0-9]*|0) echo "attach_demo: --nodes wants a number >= 1" >&2; exit 2 ;; esac
case "$epochs" in ''|*[!0-9]*|0) echo "attach_demo: --epochs wants a number >= 1" >&2; exit 2 ;; esac

build=${ST_BUILD_DIR:-build}
PY=/usr/bin/python3
if [ "$setup" = 1 ]; then
  ST_EXTRA_PACKAGES="python3-torch python3-numpy libopenblas0-pthread ${ST_EXTRA_PACKAGES:-}" \
    ST_BUILD_DIR="$build" tools/scripts/setup.sh
fi
S=$build/starling
LIB=$build/libstarling.so
for f in "$S" "$LIB"; do
  [ -e "$f" ] || { echo "attach_demo: $f is missing: build first (tools/scripts/setup.sh)" >&2; exit 1; }
done
"$PY" -c 'import torch, numpy' 2>/dev/null ||
  { echo "attach_demo: $PY cannot import torch and numpy: apt-get install python3-torch python3-numpy" >&2; exit 1; }

mkdir -p "$dir"
rm -rf "$dir"/node* "$dir"/prog* "$dir/cluster.key"
"$S" keygen --cluster --out "$dir/cluster.key" >/dev/null

# ---- processes, cleaned up by PID -----------------------------------------------
node_pids=()
prog_pids=()
stop_all() { # programs first (kill -9: nothing of theirs needs saving), then
  # the nodes with SIGTERM: each announces its leave and writes a checkpoint
  local p
  for p in "${prog_pids[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  for p in "${node_pids[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true; done
  for p in "${prog_pids[@]:-}" "${node_pids[@]:-}"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null || true
  done
  prog_pids=()
  node_pids=()
}
trap stop_all EXIT
trap 'trap - INT TERM; echo; echo "stopping every program and node"; exit 130' INT TERM

status_of() { "$S" status --data-dir "$dir/node$1" 2>/dev/null || true; }
pick() { # pick TEXT LABEL: the value on the line of a status table
  awk -v l="$2" 'index($0, l) == 1 { sub(l " *", ""); print; exit }' <<<"$1"
}

start_node() { # start_node K [--join ADDR]
  local k=$1
  shift
  # shellcheck disable=SC2086 # NODE_ARGS: words on purpose
  "$S" node --attach --listen 127.0.0.1:0 --cluster-key "$dir/cluster.key" \
    --data-dir "$dir/node$k" --min-nodes "$nodes" "$@" ${NODE_ARGS:-} \
    >"$dir/node$k.log" 2>&1 &
  node_pids[$k]=$!
  local _
  for _ in $(seq 200); do
    "$S" status --data-dir "$dir/node$k" >/dev/null 2>&1 && return 0
    kill -0 "${node_pids[$k]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "attach_demo: node $k did not start; its log ($dir/node$k.log):" >&2
  tail -5 "$dir/node$k.log" >&2
  exit 1
}

start_prog() { # start_prog K: the example on node K's socket, shard K/N
  local k=$1
  STARLING_LIB=$LIB PYTHONPATH=client/python OPENBLAS_NUM_THREADS=1 \
    "$PY" examples/pytorch_fmnist.py --socket "$dir/node$k/control.sock" \
    --shard "$k/$nodes" --epochs "$epochs" ${target:+--target "$target"} \
    --json-out "$dir/prog$k.json" "${prog_args[@]}" >"$dir/prog$k.log" 2>&1 &
  prog_pids[$k]=$!
}

# ---- start: node 0 and its program (which brings the model: only then does
# node 0 open its network port), then the others joining node 0 ------------------
t_start=$(date +%s)
start_node 0
start_prog 0
seed=
for _ in $(seq 600); do
  seed=$(pick "$(status_of 0)" address)
  [ -n "$seed" ] && [ "${seed##*:}" != 0 ] && break
  seed=
  kill -0 "${prog_pids[0]}" 2>/dev/null ||
    { echo "attach_demo: program 0 exited; its log:" >&2; tail -5 "$dir/prog0.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$seed" ] || { echo "attach_demo: node 0 has no address after 60 s; see $dir/node0.log" >&2; exit 1; }
for ((k = 1; k < nodes; k++)); do
  start_node "$k" --join "$seed"
  start_prog "$k"
done
echo "cluster of $nodes attached nodes, seed $seed; programs: examples/pytorch_fmnist.py" \
  "--epochs $epochs${target:+ --target $target} ${prog_args[*]}"
echo "logs in $dir/nodeK.log and $dir/progK.log; Ctrl-C stops everything"

# ---- live view ------------------------------------------------------------------
prog_rc=()
reap() { # reap K: records program K's exit status once it has ended (in
  # this shell, which is its parent: not in a $(...) subshell)
  local k=$1 rc=0
  [ -n "${prog_rc[$k]:-}" ] && return 0
  kill -0 "${prog_pids[$k]}" 2>/dev/null && return 0
  wait "${prog_pids[$k]}" 2>/dev/null || rc=$?
  prog_rc[$k]=$rc
}
prog_state() { # prog_state K: running, or "exit S"
  if [ -n "${prog_rc[$1]:-}" ]; then echo "exit ${prog_rc[$1]}"; else echo running; fi
}

node_line() { # node_line K: one line about node K and its program
  local k=$1 t st step ex rings acc
  t=$(status_of "$k")
  st=$(pick "$t" state); step=$(pick "$t" step); ex=$(pick "$t" exchanges)
  rings=$(pick "$t" rings)
  # The program's last evaluation ("epoch E step S test acc A").
  acc=$(sed -n 's/^epoch \([0-9]*\) step [0-9]* test acc \([0-9.]*\)$/\2 (epoch \1)/p' \
    "$dir/prog$k.log" 2>/dev/null | tail -n 1)
  printf 'node %d  %-8s step %-6s exchanges %-5s rings %-4s  program %-8s test acc %s' \
    "$k" "${st:-?}" "${step%% *}" "${ex%% ok*}" "${rings%% ok*}" "$(prog_state "$k")" "${acc:--}"
}

tty=0
[ -t 1 ] && tty=1
printed=0
last=0
while :; do
  lines=()
  running=0
  for ((k = 0; k < nodes; k++)); do
    reap "$k"
    lines+=("$(node_line "$k")")
    [ -z "${prog_rc[$k]:-}" ] && running=$((running + 1))
    kill -0 "${node_pids[$k]}" 2>/dev/null ||
      { echo "attach_demo: node $k exited; its log:" >&2; tail -5 "$dir/node$k.log" >&2; exit 1; }
  done
  now=$(date +%s)
  if [ $tty = 1 ]; then
    [ $printed = 1 ] && printf '\033[%dA' "$nodes"
    for l in "${lines[@]}"; do printf '\r\033[K%s\n' "$l"; done
    printed=1
  elif [ $((now - last)) -ge 5 ] || [ $running = 0 ]; then
    echo "--- $((now - t_start)) s"
    printf '%s\n' "${lines[@]}"
    last=$now
  fi
  [ $running = 0 ] && break
  sleep 1
done
wall=$(($(date +%s) - t_start))

# ---- results ----------------------------------------------------------------------
echo
echo "every program ended after $wall s:"
failed=0
accs=()
for ((k = 0; k < nodes; k++)); do
  rc=${prog_rc[$k]}
  if [ "$rc" = 0 ] && [ -e "$dir/prog$k.json" ]; then
    line=$("$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print("%.4f  step %d, %d steps in %.1f s, averaging applied %d times"
      % (d["test_accuracy"], d["steps"], d["steps_here"], d["wall_s"], d["did"]["apply"]))' \
      "$dir/prog$k.json")
    echo "  program $k  test accuracy $line"
    accs+=("${line%% *}")
  else
    echo "  program $k  exited $rc: $(tail -1 "$dir/prog$k.log")"
    failed=1
  fi
done
if [ ${#accs[@]} -gt 1 ]; then
  printf '%s\n' "${accs[@]}" | awk 'NR == 1 { lo = hi = $1 } { if ($1 < lo) lo = $1; if ($1 > hi) hi = $1 }
    END { printf "  spread between the programs: %.4f (min %.4f, max %.4f)\n", hi - lo, lo, hi }'
fi

# The nodes' models once a ring round (an exact mean) has run after the last
# program ended, then every node leaves, writing its checkpoint.
rings_now() { "$S" status --json --data-dir "$dir/node0" 2>/dev/null |
  "$PY" -c 'import json, sys; print(json.load(sys.stdin)["ring_rounds_ok"])' 2>/dev/null || echo 0; }
if [ "$nodes" -gt 1 ]; then
  r0=$(rings_now)
  for _ in $(seq 300); do
    [ "$(rings_now)" -ge $((r0 + 2)) ] && break
    sleep 0.1
  done
fi
for ((k = 0; k < nodes; k++)); do "$S" leave --data-dir "$dir/node$k" >/dev/null || true; done
for p in "${node_pids[@]}"; do wait "$p" 2>/dev/null || true; done
node_pids=()
ckpts=()
for ((k = 0; k < nodes; k++)); do ckpts+=("$dir/node$k/checkpoint.safetensors"); done
if [ "$nodes" -gt 1 ]; then
  spread=$("$PY" tests/integration/node_param_spread.py --all "${ckpts[@]}") || spread="(not readable)"
  echo "  spread between the nodes' models (checkpoints): $spread"
fi
echo "every node left; checkpoints in $dir/nodeK/checkpoint.safetensors"
exit $failed
