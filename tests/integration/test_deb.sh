#!/usr/bin/env bash
# test_deb.sh: the Debian package CPack makes of the build
# (packaging/packaging.cmake), read with dpkg-deb:
#   (a) `cpack -G DEB` makes starling_VERSION_ARCH.deb;
#   (b) its control declares the runtime dependencies by their Debian 12
#       names, and every library the binary links (readelf -d NEEDED) comes
#       from a declared package (dpkg -S on this machine);
#   (c) it holds the binary, the client library, header and pkg-config
#       file, the Python package, a man page per command, the unit, its
#       sysusers.d entry and example.conf (a conffile), and not the CUDA
#       module; the maintainer scripts are valid sh;
#   (d) nothing in it names the staging tree, and its binary runs.
# Installing it in a fresh Debian is tools/scripts/test_deb_chroot.sh (root,
# debootstrap, minutes): docs/operations.md, "Installing".
source "$(dirname "$0")/lib.sh"

BUILD=${ST_BUILD_DIR:?ST_BUILD_DIR: the build directory}
command -v dpkg-deb >/dev/null || { echo "skip: no dpkg-deb here (not Debian)"; exit 0; }
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt"; }
prefix=$(cache CMAKE_INSTALL_PREFIX)
libdir=$(cache CMAKE_INSTALL_LIBDIR)
pydir=$(cache STARLING_PYTHON_DIR)
etc=$prefix/etc
[ "$prefix" = /usr ] && etc=/etc

# (a) The package, staged from the build's install script: a test does not
# run CPack's preinstall step, which would rebuild the tree other tests
# are running (`cpack -G DEB` as a user runs it does).
cpack -G DEB -B "$SCRATCH/pkg" --config "$BUILD/CPackConfig.cmake" \
  -D CPACK_INSTALL_CMAKE_PROJECTS= \
  -D CPACK_INSTALL_SCRIPTS="$BUILD/cmake_install.cmake" >"$SCRATCH/cpack.log" 2>&1 ||
  fail "(a) cpack -G DEB: $(tail -5 "$SCRATCH/cpack.log")"
version=$("$STARLING" --version | awk '{print $2}')
deb=$SCRATCH/pkg/starling_${version}_$(dpkg --print-architecture).deb
[ -f "$deb" ] || fail "(a) no $deb; cpack made: $(ls "$SCRATCH/pkg")"
pass "(a) cpack made $(basename "$deb") ($(stat -c %s "$deb") bytes)"

# (b) Declared dependencies, and those the binary needs.
dpkg-deb -f "$deb" Depends >"$SCRATCH/depends"
# The package names alone, one a line (alternatives too, versions dropped).
tr ',|' '\n\n' <"$SCRATCH/depends" | sed 's/(.*//; s/ //g; /^$/d' >"$SCRATCH/names"
declared() { grep -qxF -- "$1" "$SCRATCH/names"; }
for p in libc6 libuv1 libsodium23 libmsgpackc2 libopenblas0 zlib1g python3; do
  declared "$p" || fail "(b) Depends lacks $p: $(cat "$SCRATCH/depends")"
done
ROOT=$SCRATCH/root
dpkg-deb -x "$deb" "$ROOT"
bin=$ROOT$prefix/bin/starling
# Each NEEDED soname -> its file here (ldconfig's cache) -> the package
# that owns the file (one dpkg -S for all: it reads the whole database).
ldconfig -p >"$SCRATCH/ldcache"
paths=()
for soname in $(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
  # A sanitizer build (never one to ship) links the sanitizers' runtimes.
  if [ "${ST_SANITIZE:-OFF}" = ON ] && [[ $soname == lib[a-z]*san.so* ]]; then
    echo "skip: (b) $soname: the sanitizers' runtime of this build"
    continue
  fi
  path=$(awk -v s="$soname" '$1 == s { print $NF; exit }' "$SCRATCH/ldcache")
  [ -n "$path" ] || fail "(b) $soname (needed by the binary) is not on this machine"
  echo "$soname $path $(readlink -f "$path")" >>"$SCRATCH/libs"
  paths+=("$path" "$(readlink -f "$path")")
done
dpkg -S "${paths[@]}" >"$SCRATCH/owners" 2>/dev/null || true
needed=""
while read -r soname path real; do
  pkg=$(awk -v a="$path" -v b="$real" '{ f = $NF } (f == a || f == b) && $1 !~ /^diversion/ {
          sub(/:.*/, "", $1); print $1; exit }' "$SCRATCH/owners")
  [ -n "$pkg" ] || fail "(b) no Debian package owns $path ($soname)"
  # A flavour (libopenblas0-pthread) is what its metapackage (libopenblas0)
  # pulls in.
  declared "$pkg" || declared "${pkg%-*}" ||
    fail "(b) the binary needs $soname from $pkg, which Depends does not name: $(cat "$SCRATCH/depends")"
  needed+=" $soname($pkg)"
done <"$SCRATCH/libs"
pass "(b) Depends: $(cat "$SCRATCH/depends")"
pass "(b) every library the binary links is declared:$needed"

# (c) Contents and control files.
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$SCRATCH/contents"
commands=$("$STARLING" --help | sed -n 's/^  \([a-z][a-z0-9-]*\)  .*/\1/p')
want=("$prefix/bin/starling" "$prefix/include/starling/client.h"
      "$prefix/$libdir/libstarling.so.0" "$prefix/$libdir/pkgconfig/starling.pc"
      "$prefix/$pydir/starling/__init__.py"
      "$prefix/lib/systemd/system/starling@.service"
      "$prefix/lib/sysusers.d/starling.conf" "$etc/starling/example.conf"
      "$prefix/share/man/man1/starling.1")
for c in $commands; do want+=("$prefix/share/man/man1/starling-$c.1"); done
for f in "${want[@]}"; do
  grep -qx -- "$f" "$SCRATCH/contents" || fail "(c) the package lacks $f"
done
! grep -q libstarling_cuda "$SCRATCH/contents" || fail "(c) the package holds the CUDA module"
CTRL=$SCRATCH/control
dpkg-deb -e "$deb" "$CTRL"
grep -qx "$etc/starling/example.conf" "$CTRL/conffiles" ||
  fail "(c) conffiles: $(cat "$CTRL/conffiles")"
for s in postinst prerm postrm; do
  [ -x "$CTRL/$s" ] || fail "(c) no executable $s in the control archive"
  sh -n "$CTRL/$s" || fail "(c) $s is not valid sh"
done
grep -q "systemd-sysusers starling.conf" "$CTRL/postinst" || fail "(c) postinst makes no user"
pass "(c) ${#want[@]} files, conffiles and the maintainer scripts in place; no CUDA module"

# (d) No staging path leaked into the files; the binary runs.
if grep -rlI -e "_CPack_Packages" -e "$SCRATCH" "$ROOT" >"$SCRATCH/leaks"; then
  fail "(d) files name the staging tree: $(cat "$SCRATCH/leaks")"
fi
grep -qx "LIBDIR = '$prefix/$libdir'" "$ROOT$prefix/$pydir/starling/_installed.py" ||
  fail "(d) _installed.py: $(cat "$ROOT$prefix/$pydir/starling/_installed.py")"
[ "$("$bin" --version)" = "starling $version" ] || fail "(d) the packaged binary's --version"
pass "(d) no staging path in the package; the packaged binary runs"
