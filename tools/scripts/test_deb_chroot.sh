#!/usr/bin/env bash
# test_deb_chroot.sh: installs the starling .deb in a fresh Debian 12 and
# runs a node from it, the way a user of the package would. Too slow for
# the test suite (it downloads a minimal Debian and the package's
# dependencies: a few minutes), so it is run by hand; the suite's
# tests/integration/test_deb.sh checks the package's contents.
#
#   sudo tools/scripts/test_deb_chroot.sh [--deb FILE] [--dir DIR] [--keep]
#
# Needs root, debootstrap and Debian's archive (ST_MIRROR, default
# http://deb.debian.org/debian). Without --deb it builds one first: a
# CPU-only build configured for /usr in $ST_DEB_BUILD (default
# /tmp/starling-deb-build; ST_JOBS compile jobs, default all cores), then
# `cpack -G DEB` there. Then:
#   1. debootstrap --variant=minbase bookworm into DIR (default: a new
#      directory under /var/tmp; downloaded packages are kept in
#      /var/cache/starling-debootstrap for the next run);
#   2. `apt-get install ./starling_*.deb` in the chroot, which must find
#      every dependency in Debian 12; the postinst must make the user
#      `starling`;
#   3. /etc/starling/test.conf and the unit's own ExecStart line
#      (/usr/lib/systemd/system/starling@.service, %i = test), run as the
#      user `starling` as systemd would (there is no systemd in a chroot):
#      a node on 127.0.0.1 training a small CSV problem;
#   4. `starling status --data-dir /var/lib/starling/test` answers, and
#      `starling status --json` shows the node training;
#   5. SIGTERM (systemctl stop): the node leaves, writes its checkpoint
#      and exits 0;
#   6. `dpkg --purge starling` removes it cleanly.
# Prints one "ok:" line per step; exits 1 naming the step that failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

deb=""
dir=""
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --deb) deb=$(realpath "$2"); shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test_deb_chroot.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, chroot): run it with sudo"
command -v debootstrap >/dev/null || fail "no debootstrap: apt-get install debootstrap"
mirror=${ST_MIRROR:-http://deb.debian.org/debian}

# The package, unless given.
if [ -z "$deb" ]; then
  build=${ST_DEB_BUILD:-/tmp/starling-deb-build}
  cmake -S . -B "$build" -DCMAKE_INSTALL_PREFIX=/usr -DSTARLING_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || fail "configuring $build"
  cmake --build "$build" -j"${ST_JOBS:-$(nproc)}" --target starling starling_client \
    starling_client_static starling_man >/dev/null || fail "building in $build"
  (cd "$build" && cpack -G DEB -D CPACK_INSTALL_CMAKE_PROJECTS= \
    -D CPACK_INSTALL_SCRIPTS="$build/cmake_install.cmake" >cpack.log 2>&1) ||
    fail "cpack in $build: $(tail -5 "$build/cpack.log")"
  deb=$(ls -t "$build"/starling_*.deb | head -n 1)
fi
[ -f "$deb" ] || fail "no package: $deb"
pass "package $deb"

# 1. A fresh Debian 12.
[ -n "$dir" ] || dir=$(mktemp -d /var/tmp/starling-chroot-XXXXXX)
chmod 0755 "$dir" # the chroot's /: mktemp's 0700 would lock out every user but root
mounted=""
cleanup() {
  [ -n "$mounted" ] && umount "$dir/proc" 2>/dev/null || true
  if [ "$keep" = 1 ]; then echo "chroot kept: $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT
if [ ! -x "$dir/usr/bin/apt-get" ]; then
  cache=/var/cache/starling-debootstrap
  mkdir -p "$cache"
  t0=$SECONDS
  debootstrap --variant=minbase --cache-dir="$cache" bookworm "$dir" "$mirror" \
    >"$dir.debootstrap.log" 2>&1 || fail "debootstrap: $(tail -5 "$dir.debootstrap.log")"
  rm -f "$dir.debootstrap.log"
  pass "debootstrap bookworm (minbase) in $dir ($((SECONDS - t0)) s)"
fi
cp /etc/resolv.conf "$dir/etc/resolv.conf"
mount -t proc proc "$dir/proc" && mounted=1 ||
  echo "note: /proc could not be mounted in the chroot; going on without it"
in_root() { chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

# 2. Install the package and its dependencies from Debian 12.
cp "$deb" "$dir/tmp/starling.deb"
in_root apt-get update -qq >/dev/null || fail "apt-get update in the chroot"
in_root apt-get install -y -qq --no-install-recommends /tmp/starling.deb \
  >"$dir/tmp/install.log" 2>&1 ||
  fail "apt-get install starling.deb: $(tail -8 "$dir/tmp/install.log")"
in_root getent passwd starling >/dev/null || fail "postinst made no user starling"
version=$(in_root starling --version) || fail "starling --version in the chroot"
pass "apt-get install ./$(basename "$deb") in bookworm: $version, user starling"

# 3. A node as the unit runs it: the unit's ExecStart, %i = test, with
# STARLING_ARGS from /etc/starling/test.conf, as the user starling.
in_root sh -c 'python3 - <<EOF
import random
random.seed(1)
with open("/var/tmp/train.csv", "w") as f:
    for i in range(600):
        x = [random.gauss(0, 1) for _ in range(4)]
        f.write(",".join("%.4f" % v for v in x) + ",%d\n" % (int(x[0] + x[1] > 0)))
EOF'
in_root starling keygen --cluster --out /etc/starling/cluster.key >/dev/null
in_root chown starling:starling /etc/starling/cluster.key
cat >"$dir/etc/starling/test.conf" <<'EOF'
STARLING_ARGS="--listen 127.0.0.1:0 --cluster-key /etc/starling/cluster.key --model softmax:4-2 --data csv:/var/tmp/train.csv --epochs 100000 --gossip-every 0"
EOF
unit=$dir/usr/lib/systemd/system/starling@.service
exec_start=$(sed -n 's/^ExecStart=//p' "$unit" | sed 's/%i/test/g')
[ -n "$exec_start" ] || fail "no ExecStart in $unit"
in_root install -d -o starling -g starling -m 0700 /var/lib/starling/test
chroot "$dir" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/var/lib/starling LANG=C.UTF-8 \
  /bin/sh -c ". /etc/starling/test.conf && exec setpriv --reuid=starling \
    --regid=starling --init-groups $exec_start" >"$dir/tmp/node.log" 2>&1 &
node=$!
pass "started the unit's command: $exec_start (pid $node)"

# 4. starling status answers and the node trains.
state=""
for _ in $(seq 1 300); do
  kill -0 "$node" 2>/dev/null || fail "the node exited: $(tail -5 "$dir/tmp/node.log")"
  state=$(in_root starling status --data-dir /var/lib/starling/test --json 2>/dev/null |
    sed -n 's/.*"state": *"\([a-z]*\)".*/\1/p' | head -n 1) || true
  [ "$state" = training ] && break
  sleep 0.2
done
[ "$state" = training ] ||
  fail "starling status never showed the node training (last: '$state'): $(tail -5 "$dir/tmp/node.log")"
in_root starling status --data-dir /var/lib/starling/test | sed 's/^/    /'
pass "starling status --data-dir /var/lib/starling/test: training"

# 5. SIGTERM, as systemctl stop sends it.
kill -TERM "$node"
status=0
wait "$node" || status=$?
[ "$status" -eq 0 ] || fail "the node exited $status after SIGTERM: $(tail -5 "$dir/tmp/node.log")"
[ -s "$dir/var/lib/starling/test/checkpoint.safetensors" ] ||
  fail "no checkpoint after SIGTERM: $(tail -5 "$dir/tmp/node.log")"
pass "SIGTERM: the node left, wrote its checkpoint and exited 0"

# 6. Removal.
in_root dpkg --purge starling >"$dir/tmp/purge.log" 2>&1 ||
  fail "dpkg --purge starling: $(tail -5 "$dir/tmp/purge.log")"
[ ! -e "$dir/usr/bin/starling" ] || fail "dpkg --purge left /usr/bin/starling"
pass "dpkg --purge starling"
