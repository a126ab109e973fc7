#!/usr/bin/env bash
# bench_ring.sh: starling's ring all-reduce (issue #6) against Gloo's ring
# and Open MPI's MPI_Allreduce on this machine, in one run, as busbw and as a
# ratio starling / Gloo (docs/benchmarks.md).
#
#   starling  starling-bench ring (tools/bench/bench_ring.c): N processes running
#             gossip/ring.c over ENCRYPTED TCP (handshake + secretstream)
#   gloo      tests/bench/gloo_allreduce.cc: gloo::allreduce, ring
#             algorithm, Gloo's TCP transport, UNENCRYPTED
#   mpi       tests/bench/mpi_allreduce.c: MPI_Allreduce, Open MPI's TCP
#             BTL only (btl self,tcp), UNENCRYPTED, its own algorithm choice
#
# All three: the same float32 data (one generator, one seed), one warm-up
# round then REPEATS measured, each after a barrier; time = max(end) -
# min(start) over the ranks; the median; busbw = S / time * 2 (N - 1) / N
# (NCCL's definition, comparable with the link rate); every result checked
# against the float64 mean (a wrong sum fails the run).
#
# Two kinds of links:
#   loopback  127.0.0.1: bound by CPU (encryption, copies, the kernel's TCP)
#   netns     (NETNS=1; root) each rank in its own network namespace on a
#             bridge, every veth end shaped by
#             `tbf rate $RATE burst 64kb latency 50ms`, MTU $MTU: bound by
#             the link. MTU 9000 by default: at 1500 TCP's payload is at most
#             1448/1514 = 0.956 of the rate and a 2-core VM spends most of a
#             core on per-packet work; set MTU=1500 to see that.
#             MPI runs there too (MPI_NETNS=1): its ranks' runtime (PMIx)
#             talks to mpirun over TCP, so a veth from the root namespace to
#             the bridge (10.77.0.254/24, named strh$$) carries that control
#             traffic; the data stays on the shaped links.
#
#   tools/bench/bench_ring.sh                              N 2 4 8 x S 1 16 64 MiB
#   MEMBERS="2 4" MIBS="1 16" NETNS_MIBS=16 tools/bench/bench_ring.sh
#   NETNS=0 SYSTEMS="starling gloo" tools/bench/bench_ring.sh
#   SEGMENT_KIB=256 IN_FLIGHT=8 LANES=4 tools/bench/bench_ring.sh   starling's tuning
#   LOOPBACK=0 RATE=100mbit MTU=1500 NETNS_MEMBERS=4 NETNS_MIBS=16 \
#       tools/bench/bench_ring.sh                          shaped links only
#
# Installs what is missing (libgloo-dev, openmpi-bin, libopenmpi-dev) with
# apt-get and builds through tools/scripts/setup.sh (SETUP=0 skips both), then
# builds the two comparison programs into the build directory. Every run is
# bounded by TIMEOUT seconds; every namespace and link made here is removed
# by name on exit, failure or interrupt.
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_args "$0" "$@"

MEMBERS=${MEMBERS:-"2 4 8"}
MIBS=${MIBS:-"1 16 64"}
REPEATS=${REPEATS:-3}
RATE=${RATE:-1gbit}
MTU=${MTU:-9000}
NETNS_MEMBERS=${NETNS_MEMBERS:-$MEMBERS}
NETNS_MIBS=${NETNS_MIBS:-$MIBS}
SYSTEMS=${SYSTEMS:-"starling gloo mpi"}
TIMEOUT=${TIMEOUT:-300}
SEGMENT_KIB=${SEGMENT_KIB:-}      # starling's segment size, segments in flight
IN_FLIGHT=${IN_FLIGHT:-}          # and lanes; empty: starling-bench ring's
LANES=${LANES:-}                  # defaults (see its --help)
SETUP=${SETUP:-1}
LOOPBACK=${LOOPBACK:-1}
build=${ST_BUILD_DIR:-build}
if [ -z "${NETNS:-}" ]; then
  NETNS=0
  if [ "$(id -u)" -eq 0 ] && ip netns list >/dev/null 2>&1; then NETNS=1; fi
fi
MPI_NETNS=${MPI_NETNS:-$NETNS}

tag=s$$             # the shell's namespaces: st-ring-s$$nN-R
ctag=c$$            # starling-bench's own: st-ring-c$$-R
host_if=strh$$      # MPI's control veth in the root namespace
work=$(mktemp -d)
pids=()
up_ns=()            # "TAG N" of the namespace sets up now
status=0

# ---- Namespaces, the twin of tools/bench/bench_ring_netns.c ------------------------
ns_up() { bench_ns_up st-ring "$@"; }     # TAG N
ns_down() { bench_ns_down st-ring "$@"; } # TAG N
host_link_up() { # TAG: the root namespace's veth to the bridge, for PMIx
  ip link add "$host_if" mtu "$MTU" type veth peer name phost mtu "$MTU" netns "st-ring-$1-br"
  ip -n "st-ring-$1-br" link set phost master br0
  ip -n "st-ring-$1-br" link set phost up
  ip addr add 10.77.0.254/24 dev "$host_if"
  ip link set "$host_if" up
}

# shellcheck disable=SC2317,SC2015 # run by the trap
cleanup() {
  # timeout(1) passes TERM on to the rank it runs
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true; done
  ip link del "$host_if" 2>/dev/null || true
  for x in "${up_ns[@]:-}"; do [ -n "$x" ] && ns_down "${x% *}" "${x#* }"; done
  for n in $NETNS_MEMBERS; do ns_down "$ctag" "$n"; done # if starling-bench was killed
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- Setup ---------------------------------------------------------------------
mkdir -p "$build"
if [ "$SETUP" = 1 ]; then
  bench_setup "$build" libgloo-dev openmpi-bin libopenmpi-dev iproute2
fi
# The comparison programs: built after setup; with SETUP=0 a program already
# in the build directory is used as it is (a machine without the compilers).
if [[ " $SYSTEMS " == *" gloo "* ]] && { [ "$SETUP" = 1 ] || [ ! -x "$build/gloo_allreduce" ]; }; then
  g++ -O3 -std=c++17 tests/bench/gloo_allreduce.cc -o "$build/gloo_allreduce" -lgloo -pthread
fi
if [[ " $SYSTEMS " == *" mpi "* ]] && { [ "$SETUP" = 1 ] || [ ! -x "$build/mpi_allreduce" ]; }; then
  mpicc -O3 tests/bench/mpi_allreduce.c -o "$build/mpi_allreduce" -lm
fi

echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "os:      $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
echo "gloo:    libgloo-dev $(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null || echo '(prebuilt)'); open mpi $(dpkg-query -W -f='${Version}' openmpi-bin 2>/dev/null || echo '(not installed)')"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min; other work on these cores skews every figure)"
echo "runs:    1 warm-up + $REPEATS measured rounds each; median; TIMEOUT ${TIMEOUT}s per run"
echo

# ---- Runs ------------------------------------------------------------------------
jget() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" "$2" | head -1; }
rate_gbps() { echo "$1" | awk '/^[0-9.]+(k|m|g)?bit$/ {
  v = $0 + 0; if ($0 ~ /gbit$/) v *= 1e9; else if ($0 ~ /mbit$/) v *= 1e6;
  else if ($0 ~ /kbit$/) v *= 1e3; printf "%.6f", v / 1e9; exit } { print 0 }'; }

# run_gloo LINK N S TAG: rank 0's JSON in $work/gloo.json
run_gloo() {
  local link=$1 n=$2 s=$3 t=$4 r store=$work/store.$RANDOM$RANDOM
  mkdir -p "$store"
  local gp=()
  for ((r = 0; r < n; r++)); do
    if [ "$link" = netns ]; then
      timeout "$TIMEOUT" ip netns exec "st-ring-$t-$r" "$build/gloo_allreduce" --rank $r --size "$n" \
        --mib "$s" --repeats "$REPEATS" --store "$store" --host "10.77.0.$((r + 1))" --json \
        >"$work/gloo.$r" 2>"$work/gloo.$r.err" &
    else
      timeout "$TIMEOUT" "$build/gloo_allreduce" --rank $r --size "$n" --mib "$s" \
        --repeats "$REPEATS" --store "$store" --host 127.0.0.1 --json \
        >"$work/gloo.$r" 2>"$work/gloo.$r.err" &
    fi
    gp+=($!)
  done
  pids=("${gp[@]}")
  local ok=0
  for p in "${gp[@]}"; do wait "$p" || ok=1; done
  pids=()
  cp "$work/gloo.0" "$work/gloo.json"
  [ $ok -eq 0 ] || { cat "$work"/gloo.*.err >&2; return 1; }
}

run_mpi() { # LINK N S TAG
  local link=$1 n=$2 s=$3 t=$4
  local args=(--allow-run-as-root --oversubscribe -np "$n" --mca btl "self,tcp")
  if [ "$link" = netns ]; then
    PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=10.77.0.0/24 \
      timeout "$TIMEOUT" mpirun "${args[@]}" --mca btl_tcp_if_include 10.77.0.0/24 \
      --mca oob_tcp_if_include 10.77.0.0/24 \
      -x PMIX_MCA_ptl_tcp_remote_connections -x PMIX_MCA_ptl_tcp_if_include \
      sh -c "exec ip netns exec st-ring-$t-\$OMPI_COMM_WORLD_RANK \"\$0\" \"\$@\"" \
      "$build/mpi_allreduce" --mib "$s" --repeats "$REPEATS" --json \
      >"$work/mpi.json" 2>"$work/mpi.err"
  else
    timeout "$TIMEOUT" mpirun "${args[@]}" --mca btl_tcp_if_include lo \
      "$build/mpi_allreduce" --mib "$s" --repeats "$REPEATS" --json \
      >"$work/mpi.json" 2>"$work/mpi.err"
  fi
}

run_starling() { # LINK N S
  local link=$1 n=$2 s=$3
  local cmd=("$build/starling-bench" ring --members "$n" --mib "$s" --repeats "$REPEATS" --json
             --timeout "$TIMEOUT" ${SEGMENT_KIB:+--segment-kib "$SEGMENT_KIB"}
             ${IN_FLIGHT:+--in-flight "$IN_FLIGHT"} ${LANES:+--lanes "$LANES"})
  if [ "$link" = netns ]; then
    cmd+=(--netns --rate "$RATE" --mtu "$MTU" --netns-tag "$ctag")
  fi
  echo "\$ ${cmd[*]}" >>"$work/commands"
  timeout "$((TIMEOUT + 30))" "${cmd[@]}" >"$work/starling.json" 2>"$work/starling.err"
}

# row LINK SYSTEM N S JSON GLOO_BUSBW
row() {
  local link=$1 sys=$2 n=$3 s=$4 f=$5 gb=$6 ms bw vs="" note=""
  ms=$(awk -v t="$(jget seconds_median "$f")" 'BEGIN { printf "%.2f", t * 1e3 }')
  bw=$(jget busbw_gbps "$f")
  if [ "$sys" = starling ] && [ -n "$gb" ]; then
    vs=$(awk -v a="$bw" -v b="$gb" 'BEGIN { printf "%.2f", a / b }')
  fi
  if [ "$link" = netns ]; then
    note=$(awk -v a="$bw" -v r="$(rate_gbps "$RATE")" -v n="$RATE" \
      'BEGIN { printf "%.3f of %s", a / r, n }')
  fi
  if [ "$sys" = starling ]; then
    note="$note${note:+; }crypto limit $(awk -v t="$(jget crypto_limit_seconds "$f")" 'BEGIN { printf "%.1f ms", t * 1e3 }'), measured/limit $(jget measured_over_limit "$f")"
    [ "$(jget crypto_limit_all_cores_seconds "$f")" = "$(jget crypto_limit_seconds "$f")" ] ||
      note="$note, over all cores' limit $(jget measured_over_all_cores_limit "$f")"
  fi
  printf '%-8s %-9s %3s %5s %10s %8.3f %8s  %s\n' "$link" "$sys" "$n" "$s" "$ms" "$bw" "${vs:--}" "$note"
}

header() {
  printf '%-8s %-9s %3s %5s %10s %8s %8s  %s\n' link system N MiB "median ms" busbw "st/gloo" note
  printf '%-8s %-9s %3s %5s %10s %8s %8s\n' "" "" "" "" "" "Gbit/s" busbw
}

fail_row() { # LINK SYSTEM N S FILE
  printf '%-8s %-9s %3s %5s %10s\n' "$1" "$2" "$3" "$4" FAILED
  tail -5 "$5" | sed 's/^/    /' >&2
  status=1
}

has() { case " $SYSTEMS " in *" $1 "*) return 0 ;; esac; return 1; }

run_link() { # LINK "N..." "S..."
  local link=$1 n s gb t
  for n in $2; do
    t=${tag}n$n
    if [ "$link" = netns ]; then
      ns_up "$t" "$n"
      if [ "$MPI_NETNS" = 1 ] && has mpi; then host_link_up "$t"; fi
    fi
    for s in $3; do
      gb=""
      if has gloo; then
        if run_gloo "$link" "$n" "$s" "$t"; then
          gb=$(jget busbw_gbps "$work/gloo.json")
          row "$link" gloo "$n" "$s" "$work/gloo.json" ""
        else fail_row "$link" gloo "$n" "$s" /dev/null; fi
      fi
      if has starling; then
        if run_starling "$link" "$n" "$s"; then
          row "$link" starling "$n" "$s" "$work/starling.json" "$gb"
        else fail_row "$link" starling "$n" "$s" "$work/starling.err"; fi
      fi
      if has mpi && { [ "$link" = loopback ] || [ "$MPI_NETNS" = 1 ]; }; then
        if run_mpi "$link" "$n" "$s" "$t"; then
          row "$link" mpi "$n" "$s" "$work/mpi.json" ""
        else fail_row "$link" mpi "$n" "$s" "$work/mpi.err"; fi
      fi
    done
    if [ "$link" = netns ]; then
      ip link del "$host_if" 2>/dev/null || true
      ns_down "$t" "$n"
    fi
  done
}

header
if [ "$LOOPBACK" = 1 ]; then run_link loopback "$MEMBERS" "$MIBS"; fi
if [ "$NETNS" = 1 ]; then
  echo "netns: tbf $RATE each way per link, MTU $MTU; goal: starling busbw >= 0.95 of the rate and >= gloo's"
  run_link netns "$NETNS_MEMBERS" "$NETNS_MIBS"
fi
echo
echo "starling's commands:"
sed 's/^/  /' "$work/commands" 2>/dev/null || true
exit $status
