#!/usr/bin/env bash
# cluster.sh: runs a local starling cluster on 127.0.0.1 and shows it live.
#
#   tools/scripts/cluster.sh [--nodes N] [--dir DIR] [--starling PATH] -- NODE_FLAGS...
#
# Makes a cluster key, starts N nodes (node 0 first, the others joining it
# through its address), each training shard K/N of the data with the given
# `starling node` flags and --min-nodes N (no node steps before all N are
# up: on a GPU node 0 could otherwise finish before the others join),
# shows one line per node (refreshed in place on a terminal) until every
# node has run its epochs, then prints each node's
# test accuracy and the spread between nodes, and makes every node leave
# (each writes its checkpoint into DIR/nodeK). Ctrl-C makes them leave too.
# Logs: DIR/nodeK.log (a progress line a second). Last, draws every node's
# loss and test accuracy into DIR/plot.png and DIR/plot.svg (`starling
# plot`; needs python3-matplotlib).
set -euo pipefail

nodes=4
dir=out/cluster
starling=build/starling
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --starling) starling=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster.sh: unknown option '$1' (node flags go after --)" >&2; exit 2 ;;
  esac
done
case "$nodes" in ''|*[!0-9]*|0) echo "cluster.sh: --nodes wants a number >= 1" >&2; exit 2 ;; esac

mkdir -p "$dir"
rm -rf "$dir"/node* "$dir/cluster.key"
"$starling" keygen --cluster --out "$dir/cluster.key" >/dev/null

pids=()
stop_all() {
  trap - INT TERM
  for ((k = 0; k < ${#pids[@]}; k++)); do
    kill -TERM "${pids[$k]}" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
# plot_all: draws the nodes' logs (`starling plot`) and says where, or how
# to get matplotlib.
plot_all() {
  if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
    "$starling" plot "$dir" --out "$dir/plot" >/dev/null &&
      echo "loss and test accuracy per node: $dir/plot.png (and $dir/plot.svg)"
  else
    echo "no plot: matplotlib is missing (sudo apt-get install python3-matplotlib; then: $starling plot $dir)"
  fi
}
trap 'echo; echo "stopping every node (each announces its leave and writes a checkpoint)"; stop_all; plot_all || true; exit 130' INT TERM

status_of() { # status_of NODE: `starling status` (the table); empty while
  # the node is not answering yet
  "$starling" status --data-dir "$dir/node$1" 2>/dev/null || true
}

pick() { # pick TEXT LABEL: the value on the line of a status table
  awk -v l="$2" 'index($0, l) == 1 { sub(l " *", ""); print; exit }' <<<"$1"
}

field() { # field NODE LABEL: one value of node NODE's status
  pick "$(status_of "$1")" "$2"
}

start_node() { # start_node K [--join ADDR]
  local k=$1
  shift
  "$starling" node --listen 127.0.0.1:0 --cluster-key "$dir/cluster.key" \
    --data-dir "$dir/node$k" --shard "$k/$nodes" --min-nodes "$nodes" \
    --log-every 1 "$@" \
    >"$dir/node$k.log" 2>&1 &
  pids+=($!)
}

start_node 0 "$@"
seed=
for _ in $(seq 100); do
  seed=$(field 0 address || true)
  [ -n "$seed" ] && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$dir/node0.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$seed" ] || { echo "cluster.sh: node 0 did not start; see $dir/node0.log" >&2; stop_all; exit 1; }
for ((k = 1; k < nodes; k++)); do
  start_node "$k" --join "$seed" "$@"
done
echo "cluster of $nodes nodes, seed $seed; logs in $dir/nodeK.log; Ctrl-C stops every node"

tty=0
[ -t 1 ] && tty=1
start=$(date +%s)
last_print=0
while :; do
  done_count=0
  lines=()
  for ((k = 0; k < nodes; k++)); do
    if ! kill -0 "${pids[$k]}" 2>/dev/null; then
      echo "node $k exited; its log:" >&2
      tail -5 "$dir/node$k.log" >&2
      stop_all
      exit 1
    fi
    t=$(status_of "$k") # one request a node a refresh
    st=$(pick "$t" state); step=$(pick "$t" step); loss=$(pick "$t" loss)
    acc=$(pick "$t" "test acc"); sps=$(pick "$t" "samples/s")
    ex=$(pick "$t" exchanges)
    [ "$st" = done ] && done_count=$((done_count + 1))
    lines+=("$(printf 'node %d  %-8s step %-16s loss %-7s test acc %-7s %7s samples/s  exchanges %s' \
      "$k" "${st:-?}" "${step:-?}" "${loss:-?}" "${acc:-?}" "${sps:-?}" "${ex%% busy*}")")
  done
  now=$(date +%s)
  if [ $tty -eq 1 ]; then
    [ "$last_print" -ne 0 ] && printf '\033[%dA' "$nodes"
    for l in "${lines[@]}"; do printf '\r\033[K%s\n' "$l"; done
    last_print=1
  elif [ $((now - last_print)) -ge 5 ] || [ $done_count -eq "$nodes" ]; then
    echo "--- $((now - start)) s"
    printf '%s\n' "${lines[@]}"
    last_print=$now
  fi
  [ $done_count -eq "$nodes" ] && break
  sleep 1
done

# A few more averaging rounds after the last node finished, then the result.
sleep 2
echo
echo "all $nodes nodes ran their epochs in $(( $(date +%s) - start )) s:"
min=1; max=0
for ((k = 0; k < nodes; k++)); do
  acc=$(field "$k" "test acc")
  echo "  node $k  test accuracy $acc"
  min=$(awk -v a="$acc" -v m="$min" 'BEGIN { print (a < m) ? a : m }')
  max=$(awk -v a="$acc" -v m="$max" 'BEGIN { print (a > m) ? a : m }')
done
awk -v lo="$min" -v hi="$max" 'BEGIN { printf "  spread between nodes: %.4f (min %.4f, max %.4f)\n", hi - lo, lo, hi }'
stop_all
echo "every node left; checkpoints in $dir/nodeK/checkpoint.safetensors"
plot_all || echo "cluster.sh: the plot failed (see above); the logs are in $dir/nodeK.log" >&2
