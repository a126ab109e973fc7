# bench_lib.sh: what the benchmark scripts of tools/bench/ share (sourced,
# not run). They run from the source tree's root.

# bench_args SCRIPT [ARGS...]: with --help, prints SCRIPT's header comment
# (its second line up to `set -euo pipefail`) and exits 0; any other
# argument is refused with exit 2 (a benchmark's settings are environment
# variables). Then changes to the source tree's root. Every benchmark
# script starts with it:
#   source "$(dirname "$0")/bench_lib.sh"
#   bench_args "$0" "$@"
bench_args() {
  local script=$1 a
  shift
  for a in "$@"; do
    case $a in
      -h | --help) sed -n '2,/^set -euo/p' "$script" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) echo "$(basename "$script"): no arguments (settings are environment variables; see --help)" >&2; exit 2 ;;
    esac
  done
  cd "$(dirname "$script")/../.."
}

# bench_setup BUILD [PACKAGES...]: installs what is missing (PACKAGES too,
# besides tools/scripts/setup.sh's own) and builds into BUILD, with the
# output in BUILD/setup.log; on failure shows its end and exits 1.
bench_setup() {
  local build=$1
  shift
  mkdir -p "$build"
  echo "setup: tools/scripts/setup.sh (log in $build/setup.log)"
  ST_EXTRA_PACKAGES="$* ${ST_EXTRA_PACKAGES:-}" ST_BUILD_DIR="$build" \
    tools/scripts/setup.sh >"$build/setup.log" 2>&1 ||
    { tail -20 "$build/setup.log" >&2; exit 1; }
}

# Shaped links in network namespaces, for the benchmarks that compare
# systems across "machines" on one host (bench_ring.sh, bench_attach_ddp.sh).
# bench_ns_up PREFIX TAG N: a bridge namespace PREFIX-TAG-br and members
# PREFIX-TAG-0 .. N-1 (10.77.0.R+1/24 on eth0), every veth end shaped by
# `tbf rate $RATE burst 64kb latency 50ms` with MTU $MTU; "TAG N" is
# appended to the caller's up_ns array so that its cleanup can undo it.
# With RATE empty or unset the links are not shaped (MTU defaults to 1500):
# tools/scripts/chaos_net.sh drops packets in them instead.
bench_ns_up() {
  local p=$1 t=$2 n=$3 br="$1-$2-br" r ns mtu=${MTU:-1500}
  up_ns+=("$t $n")
  ip netns add "$br"
  ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up
  for ((r = 0; r < n; r++)); do
    ns="$p-$t-$r"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add eth0 mtu "$mtu" type veth peer name "p$r" mtu "$mtu" netns "$br"
    ip -n "$br" link set "p$r" master br0
    ip -n "$br" link set "p$r" up
    ip -n "$ns" addr add "10.77.0.$((r + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    [ -n "${RATE:-}" ] || continue
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$RATE" burst 64kb latency 50ms
    tc -n "$br" qdisc add dev "p$r" root tbf rate "$RATE" burst 64kb latency 50ms
  done
}

# bench_ns_down PREFIX TAG N: removes them; ignores what is not there.
bench_ns_down() {
  local p=$1 t=$2 n=$3 r
  for ((r = 0; r < n; r++)); do ip netns del "$p-$t-$r" 2>/dev/null || true; done
  ip netns del "$p-$t-br" 2>/dev/null || true
}

# bench_idle_nodes STARLING WORK N: N `starling node`s on 127.0.0.1 with
# data directories WORK/n0 .. n(N-1) (logs WORK/nK.log), one cluster key
# (WORK/ck), joined through node 0, that train a 2-feature softmax model on
# a 2-row CSV for one epoch (milliseconds) and then idle, serving their
# programs, with gossip averaging and the internal ring off: only
# membership's few packets a second run beside a measurement. Appends their
# PIDs to the caller's pids array; returns once every node sees N alive
# members (or fails, with node 0's log).
bench_idle_nodes() {
  local s=$1 work=$2 n=$3 k seed= seen
  "$s" keygen --cluster --out "$work/ck" >/dev/null
  printf '0.1,0.2,0\n0.3,0.4,1\n' >"$work/data.csv"
  local common=(--model softmax:2-2 --data "csv:$work/data.csv" --epochs 1 --batch 1
                --device cpu --threads 1 --eval-every 0 --log-every 0 --checkpoint-every 0
                --quiet --gossip-every 0 --ring-every 0 --cluster-key "$work/ck")
  "$s" node --listen 127.0.0.1:0 --data-dir "$work/n0" "${common[@]}" 2>"$work/n0.log" &
  pids+=($!)
  for _ in $(seq 200); do
    seed=$("$s" status --json --data-dir "$work/n0" 2>/dev/null | sed -n 's/.*"address":"\([^"]*\)".*/\1/p' || true)
    [ -n "$seed" ] && [ "${seed##*:}" != 0 ] && break
    sleep 0.05
  done
  [ -n "$seed" ] || { cat "$work/n0.log" >&2; echo "bench: node 0 did not start" >&2; exit 1; }
  for ((k = 1; k < n; k++)); do
    "$s" node --listen 127.0.0.1:0 --join "$seed" --data-dir "$work/n$k" "${common[@]}" 2>"$work/n$k.log" &
    pids+=($!)
  done
  for ((k = 0; k < n; k++)); do
    for _ in $(seq 300); do
      seen=$("$s" peers --json --data-dir "$work/n$k" 2>/dev/null | grep -o '"state":"alive"' | wc -l || true)
      [ "${seen:-0}" -ge "$n" ] && break
      sleep 0.1
    done
    [ "${seen:-0}" -ge "$n" ] || { tail -n 5 "$work/n$k.log" >&2; echo "bench: node $k sees $seen of $n members" >&2; exit 1; }
  done
}
