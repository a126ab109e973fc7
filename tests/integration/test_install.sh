#!/usr/bin/env bash
# test_install.sh: `DESTDIR=STAGE cmake --install BUILD`, as a packager runs
# it (packaging/packaging.cmake):
#   (a) every expected file lands under STAGE at the configured prefix, and
#       nothing outside STAGE;
#   (b) the staged binary runs `--version`;
#   (c) one man page per command of `starling --help`, each rendering with
#       no groff warning;
#   (d) the unit names the staged prefix's binary and configuration, passes
#       `systemd-analyze verify` and keeps its hardening (`systemd-analyze
#       security` exposure at most 2.0); skipped, saying so, without
#       systemd-analyze;
#   (e) example.conf's STARLING_ARGS are flags `starling node` takes: with
#       a real key, the node gets as far as listening on the placeholder
#       address;
#   (f) examples/client.c builds against the staged tree with pkg-config
#       (install_lib.sh, as test_node_attach.sh does for --prefix).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/install_lib.sh"

BUILD=${ST_BUILD_DIR:?ST_BUILD_DIR: the build directory}
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt"; }
prefix=$(cache CMAKE_INSTALL_PREFIX)
libdir=$(cache CMAKE_INSTALL_LIBDIR)
pydir=$(cache STARLING_PYTHON_DIR)
etc=$prefix/etc
[ "$prefix" = /usr ] && etc=/etc
STAGE=$SCRATCH/stage
P=$STAGE$prefix

# (a) the files, and where the install wrote.
DESTDIR=$STAGE cmake --install "$BUILD" >"$SCRATCH/install.log" 2>&1 ||
  fail "DESTDIR=$STAGE cmake --install $BUILD: $(tail -5 "$SCRATCH/install.log")"
outside=$(sed -n 's/^-- \(Installing\|Up-to-date\): //p' "$SCRATCH/install.log" |
  grep -v "^$STAGE/" || true)
[ -z "$outside" ] || fail "(a) files installed outside DESTDIR: $outside"
commands=$("$STARLING" --help | sed -n 's/^  \([a-z][a-z0-9-]*\)  .*/\1/p')
[ -n "$commands" ] || fail "starling --help lists no commands"
want=(bin/starling include/starling/client.h "$libdir/libstarling.so"
      "$libdir/libstarling.a" "$libdir/pkgconfig/starling.pc"
      "$pydir/starling/__init__.py" "$pydir/starling/_installed.py"
      lib/systemd/system/starling@.service lib/sysusers.d/starling.conf
      share/doc/starling/README.md share/doc/starling/operations.md
      share/doc/starling/examples/client.c share/man/man1/starling.1)
for c in $commands; do want+=("share/man/man1/starling-$c.1"); done
for f in "${want[@]}"; do
  [ -e "$P/$f" ] || fail "(a) $prefix/$f not installed (under $STAGE)"
done
[ -f "$STAGE$etc/starling/example.conf" ] ||
  fail "(a) $etc/starling/example.conf not installed (under $STAGE)"
grep -qx "LIBDIR = '$prefix/$libdir'" "$P/$pydir/starling/_installed.py" ||
  fail "(a) _installed.py names $(cat "$P/$pydir/starling/_installed.py"), want $prefix/$libdir"
if [ -f "$BUILD/libstarling_cuda.so" ]; then
  [ ! -e "$P/$libdir/starling/libstarling_cuda.so" ] ||
    fail "(a) the CUDA module was installed without --component cuda"
fi
pass "(a) ${#want[@]} files under $prefix and example.conf in $etc, none outside DESTDIR"

# (b) the staged binary runs.
version=$("$P/bin/starling" --version) || fail "(b) $P/bin/starling --version"
[ "$version" = "$("$STARLING" --version)" ] ||
  fail "(b) the staged binary says '$version'"
pass "(b) the staged binary: $version"

# (c) the man pages render cleanly.
if command -v groff >/dev/null; then
  for c in "" $commands; do
    page=$P/share/man/man1/starling${c:+-$c}.1
    text=$(groff -man -Tutf8 -ww "$page" 2>"$SCRATCH/groff.err") ||
      fail "(c) groff $page"
    [ ! -s "$SCRATCH/groff.err" ] ||
      fail "(c) groff warns on $page: $(head -3 "$SCRATCH/groff.err")"
    grep -q "starling${c:+-$c} - " <<<"$text" || fail "(c) $page has no NAME line"
  done
  pass "(c) $(wc -w <<<"$commands") command pages and starling(1) render (groff -ww)"
else
  echo "skip: (c) no groff here (apt-get install groff-base) to render the pages"
fi

# (d) the unit.
unit=$P/lib/systemd/system/starling@.service
grep -qx "ExecStart=$prefix/bin/starling node --data-dir /var/lib/starling/%i \$STARLING_ARGS" "$unit" ||
  fail "(d) the unit's ExecStart: $(grep ExecStart= "$unit")"
grep -qx "EnvironmentFile=$etc/starling/%i.conf" "$unit" ||
  fail "(d) the unit's EnvironmentFile: $(grep EnvironmentFile= "$unit")"
if command -v systemd-analyze >/dev/null; then
  # verify wants the binary where ExecStart says and the man pages that
  # Documentation= names: point both at the staged tree.
  sed "s|^ExecStart=$prefix/|ExecStart=$P/|" "$unit" >"$SCRATCH/starling@test.service"
  MANPATH=$P/share/man systemd-analyze verify "$SCRATCH/starling@test.service" \
    >"$SCRATCH/verify.log" 2>&1 || fail "(d) systemd-analyze verify: $(cat "$SCRATCH/verify.log")"
  systemd-analyze security --offline=yes --threshold=20 \
    "$SCRATCH/starling@test.service" >"$SCRATCH/security.log" 2>&1 ||
    fail "(d) systemd-analyze security: $(tail -1 "$SCRATCH/security.log")"
  pass "(d) the unit passes systemd-analyze verify; $(tail -1 "$SCRATCH/security.log" | sed 's/^→ //')"
else
  echo "skip: (d) no systemd-analyze here (apt-get install systemd): the unit is not verified"
fi

# (e) example.conf: its flags parse, its data and model load; the node stops
# at the placeholder address (192.0.2.10 is TEST-NET-1, on no machine).
"$STARLING" keygen --cluster --out "$SCRATCH/cluster.key" >/dev/null
(
  # shellcheck disable=SC1090
  source "$STAGE$etc/starling/example.conf"
  args=${STARLING_ARGS//\/etc\/starling\/cluster.key/$SCRATCH/cluster.key}
  # shellcheck disable=SC2086 # the unit splits $STARLING_ARGS too
  expect_fail "(e) the flags of example.conf" 1 "cannot listen on .*192\.0\.2\.10" -- \
    timeout 60 "$P/bin/starling" node --data-dir "$SCRATCH/d" $args
)

# (f) the C example against the staged tree.
client_build_against "$STAGE" "$SCRATCH/client"
pass "(f) examples/client.c builds against the staged tree (pkg-config)"
# It runs on the staged library (its rpath), and says there is no node.
expect_fail "(f) the example on the staged library" 1 "no starling node at" -- \
  "$SCRATCH/client" --socket "$SCRATCH/nowhere.sock" --steps 1
