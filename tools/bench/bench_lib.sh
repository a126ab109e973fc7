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
