# bench_lib.sh: what the benchmark scripts of tools/bench/ share (sourced,
# not run). They run from the source tree's root.

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
