# install_lib.sh: helpers for the tests of an installed starling (sourced
# after lib.sh): what a user does with the tree `cmake --install` makes,
# whether at a prefix (--prefix DIR) or in a staging tree (DESTDIR).
# shellcheck shell=bash

# client_build_against TREE OUT: builds examples/client.c into OUT against
# the client library installed under TREE, as a user would: with the
# starling.pc found there, `cc ... $(pkg-config --cflags --libs starling)`,
# the library's directory in the program's rpath. Fails the test otherwise.
client_build_against() {
  local tree=$1 out=$2 pc flags libdir
  pc=$(find "$tree" -name starling.pc | head -n 1)
  [ -n "$pc" ] || fail "no starling.pc installed under $tree"
  flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs starling) ||
    fail "pkg-config starling (with $pc)"
  libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir starling)
  # The sanitizers' runtime, when the library was built with them.
  local san=()
  # shellcheck disable=SC2054 # one flag, whose value has commas
  [ "${ST_SANITIZE:-OFF}" = ON ] && san=(-fsanitize=address,undefined)
  # shellcheck disable=SC2086 # the flags are words
  cc -std=c11 -Wall -Wextra -Werror "${san[@]}" "$SRC/examples/client.c" \
    $flags -lm -Wl,-rpath,"$libdir" -o "$out" ||
    fail "building examples/client.c against the library installed under $tree"
}

# python_finds_library TREE WANT: the Python package installed under TREE
# imports, and the first library it would load lies under WANT (the
# prefix the install was for).
python_finds_library() {
  local tree=$1 want=$2 init
  init=$(find "$tree" -path '*/starling/_installed.py' | head -n 1)
  [ -n "$init" ] || fail "no Python package (starling/_installed.py) under $tree"
  PYTHONPATH=$(dirname "$(dirname "$init")") "$NUMPY_PY" -c '
import sys, starling._lib as L
c = L._candidates()
assert c and c[0].startswith(sys.argv[1]), c' "$want" ||
    fail "the Python package under $tree does not look for the library under $want"
}
