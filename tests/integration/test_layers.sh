#!/usr/bin/env bash
# test_layers.sh: the layering check (tools/scripts/check_layers.py) passes
# on the tree, and fails, naming the file and the arrow, on copies of the
# tree where one arrow points up: an #include, a CMake link, a foreign
# library outside its layer, a table that names an unknown layer.
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
CHECK=$SRC/tools/scripts/check_layers.py

out=$($PY "$CHECK" "$SRC") || fail "the tree breaks its own layering: $out"
grep -q "every arrow points down" <<<"$out" || fail "no summary: $out"
echo "ok: the tree ($out)"

# A copy of what the check reads: the sources of every layer, CMake, docs.
copy() {
  rm -rf "$SCRATCH/t" && mkdir -p "$SCRATCH/t/docs"
  (cd "$SRC" && cp -r base kernels optimizer crypto gossip node tools \
     CMakeLists.txt "$SCRATCH/t/") 
  cp "$SRC/docs/architecture.md" "$SCRATCH/t/docs/"
}

# expect_refusal WHAT PATTERN: the check fails on the copy and says PATTERN.
expect_refusal() {
  local what=$1 pattern=$2 err rc=0
  err=$($PY "$CHECK" "$SCRATCH/t" 2>&1 >/dev/null) || rc=$?
  [ "$rc" -eq 1 ] || fail "$what: exit $rc, want 1 ($err)"
  grep -qF -- "$pattern" <<<"$err" || fail "$what: '$pattern' not in: $err"
  echo "ok: $what"
}

copy
echo '#include "kernels/kernels.h"' >>"$SCRATCH/t/gossip/ring.c"
expect_refusal "gossip including kernels" \
  'gossip/ring.c:'"$(wc -l <"$SCRATCH/t/gossip/ring.c")"': gossip -> kernels'

copy
echo '#include "node/daemon/daemon.h"' >>"$SCRATCH/t/node/train/trainer.c"
expect_refusal "the training library including the daemon" "train -> daemon"

copy
echo '#include "tools/cli/cli.h"' >>"$SCRATCH/t/base/rng.c"
expect_refusal "base including a tool" "base -> cli"

copy
sed -i 's/st_layer_library(st_gossip "${ST_GOSSIP_SRC}" st_crypto/st_layer_library(st_gossip "${ST_GOSSIP_SRC}" st_kernels st_crypto/' \
  "$SCRATCH/t/CMakeLists.txt"
grep -q 'st_gossip "${ST_GOSSIP_SRC}" st_kernels' "$SCRATCH/t/CMakeLists.txt" ||
  fail "the test's edit of CMakeLists.txt did not apply"
expect_refusal "gossip linking kernels in CMake" "st_gossip links st_kernels"

copy
echo '#include <uv.h>' >>"$SCRATCH/t/gossip/exchange.c"
expect_refusal "libuv outside the daemon" "includes <uv.h>"

copy
sed -i 's/^| crypto | `crypto\/` | base |$/| crypto | `crypto\/` | base, network |/' \
  "$SCRATCH/t/docs/architecture.md"
expect_refusal "a table naming an unknown layer" "unknown layer"
echo "test_layers: all passed"
