#!/usr/bin/env bash
# test_keygen.sh: `starling keygen` end to end: a node identity and a
# cluster key written with mode 0600, their public parts printed (plain and
# --json) and the secret nowhere in the output, --show on both kinds, and
# the refusals an operator may meet: an existing file, no --out, a key file
# others can read, a link, a directory, a file that is not a key.
source "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3

# --- --help and usage errors -------------------------------------------------
"$STARLING" keygen --help >"$SCRATCH/help" || fail "keygen --help exit status"
grep -q -- "--out FILE" "$SCRATCH/help" || fail "keygen --help lacks --out"
grep -q -- "--show FILE" "$SCRATCH/help" || fail "keygen --help lacks --show"
grep -q "keygen" <<<"$("$STARLING" --help)" || fail "starling --help lacks keygen"
pass "help"
expect_fail "no --out" 2 "--out FILE is required: secret keys are never written to stdout" -- \
  "$STARLING" keygen
expect_fail "cluster without --out" 2 "--out FILE is required" -- \
  "$STARLING" keygen --cluster
expect_fail "unknown option" 2 "unknown option '--bogus'" -- \
  "$STARLING" keygen --bogus --out "$SCRATCH/x.key"
expect_fail "--out without value" 2 "needs a value" -- "$STARLING" keygen --out
expect_fail "stray argument" 2 "unexpected argument 'extra'" -- \
  "$STARLING" keygen --out "$SCRATCH/x.key" extra
expect_fail "--show with --out" 2 "takes neither --out nor --cluster" -- \
  "$STARLING" keygen --show "$SCRATCH/x.key" --out "$SCRATCH/y.key"
[ ! -e "$SCRATCH/x.key" ] || fail "a usage error wrote a key file"

# --- A node identity -----------------------------------------------------------
"$STARLING" keygen --out "$SCRATCH/node.key" >"$SCRATCH/node.out" 2>"$SCRATCH/node.err" ||
  fail "keygen identity: $(cat "$SCRATCH/node.err")"
[ -f "$SCRATCH/node.key" ] || fail "no identity file"
[ "$(stat -c %a "$SCRATCH/node.key")" = 600 ] ||
  fail "identity file mode $(stat -c %a "$SCRATCH/node.key")"
head -c 21 "$SCRATCH/node.key" | grep -qx "starling-identity-v1 " ||
  fail "identity file header: $(head -c 30 "$SCRATCH/node.key")"
node_id=$(sed -n 's/^node id *\([0-9a-f]\{32\}\)$/\1/p' "$SCRATCH/node.out")
public_key=$(sed -n 's/^public key *\([A-Za-z0-9_-]\{43\}\)$/\1/p' "$SCRATCH/node.out")
[ -n "$node_id" ] || fail "no node id in: $(cat "$SCRATCH/node.out")"
[ -n "$public_key" ] || fail "no public key in: $(cat "$SCRATCH/node.out")"
grep -qxF -- "$public_key  # node $node_id" "$SCRATCH/node.out" ||
  fail "no allow-list line in: $(cat "$SCRATCH/node.out")"
# The secret seed is in the file and nowhere in the output.
seed=$(cut -d' ' -f2 "$SCRATCH/node.key")
! grep -q -- "$seed" "$SCRATCH/node.out" "$SCRATCH/node.err" || fail "secret key printed"
pass "keygen identity (node $node_id)"

# --- A cluster key, with --json ------------------------------------------------
"$STARLING" keygen --cluster --out "$SCRATCH/cluster.key" --json \
  >"$SCRATCH/cluster.json" 2>"$SCRATCH/cluster.err" ||
  fail "keygen cluster: $(cat "$SCRATCH/cluster.err")"
[ "$(stat -c %a "$SCRATCH/cluster.key")" = 600 ] ||
  fail "cluster key mode $(stat -c %a "$SCRATCH/cluster.key")"
"$PY" -c '
import json, sys
o = json.load(open(sys.argv[1]))
assert set(o) == {"kind", "path", "key_id"}, o
assert o["kind"] == "cluster-key", o
assert o["path"] == sys.argv[2], o
assert isinstance(o["key_id"], int) and 0 <= o["key_id"] <= 255, o
' "$SCRATCH/cluster.json" "$SCRATCH/cluster.key" || fail "cluster --json: $(cat "$SCRATCH/cluster.json")"
key_id=$(json_field "$SCRATCH/cluster.json" key_id)
pass "keygen --cluster --json (key id $key_id)"

"$STARLING" keygen --cluster --out "$SCRATCH/cluster2.key" >"$SCRATCH/cluster2.out" ||
  fail "keygen cluster (plain)"
grep -Eq "^key id +[0-9]{1,3}$" "$SCRATCH/cluster2.out" ||
  fail "no key id in: $(cat "$SCRATCH/cluster2.out")"
pass "keygen --cluster prints the key id"

# --- An identity with --json, and a path that needs escaping ---------------------
odd="$SCRATCH/a \"quoted\" name.key"
"$STARLING" keygen --out "$odd" --json >"$SCRATCH/id.json" || fail "keygen --json"
"$PY" -c '
import json, re, sys
o = json.load(open(sys.argv[1]))
assert set(o) == {"kind", "path", "node_id", "public_key"}, o
assert o["kind"] == "identity" and o["path"] == sys.argv[2], o
assert re.fullmatch("[0-9a-f]{32}", o["node_id"]), o
assert re.fullmatch("[A-Za-z0-9_-]{43}", o["public_key"]), o
' "$SCRATCH/id.json" "$odd" || fail "identity --json: $(cat "$SCRATCH/id.json")"
pass "keygen --json (identity)"

# --- Never overwrite -------------------------------------------------------------
cp "$SCRATCH/node.key" "$SCRATCH/node.key.before"
expect_fail "refuses to overwrite an identity" 1 "refusing to overwrite" -- \
  "$STARLING" keygen --out "$SCRATCH/node.key"
expect_fail "refuses to overwrite with a cluster key" 1 "choose another path" -- \
  "$STARLING" keygen --cluster --out "$SCRATCH/node.key"
cmp -s "$SCRATCH/node.key" "$SCRATCH/node.key.before" || fail "identity file changed"
expect_fail "missing directory" 1 "$SCRATCH/nodir/k.key: cannot create" -- \
  "$STARLING" keygen --out "$SCRATCH/nodir/k.key"

# --- --show --------------------------------------------------------------------
"$STARLING" keygen --show "$SCRATCH/node.key" >"$SCRATCH/show.out" ||
  fail "--show identity"
grep -q "$node_id" "$SCRATCH/show.out" || fail "--show: no node id"
grep -qF -- "$public_key" "$SCRATCH/show.out" || fail "--show: no public key"
"$STARLING" keygen --show "$SCRATCH/node.key" --json >"$SCRATCH/show.json" ||
  fail "--show --json identity"
[ "$(json_field "$SCRATCH/show.json" node_id)" = "$node_id" ] || fail "--show --json node id"
[ "$(json_field "$SCRATCH/show.json" public_key)" = "$public_key" ] ||
  fail "--show --json public key"
"$STARLING" keygen --show "$SCRATCH/cluster.key" --json >"$SCRATCH/showc.json" ||
  fail "--show --json cluster key"
[ "$(json_field "$SCRATCH/showc.json" kind)" = cluster-key ] || fail "--show kind"
[ "$(json_field "$SCRATCH/showc.json" key_id)" = "$key_id" ] || fail "--show key id"
"$STARLING" keygen --show "$SCRATCH/cluster.key" | grep -Eq "^key id +$key_id$" ||
  fail "--show cluster key (plain)"
pass "--show on both kinds"

chmod 644 "$SCRATCH/cluster.key"
expect_fail "--show a 0644 cluster key" 1 "mode 0644.*chmod 600 $SCRATCH/cluster.key" -- \
  "$STARLING" keygen --show "$SCRATCH/cluster.key"
chmod 640 "$SCRATCH/node.key"
expect_fail "--show a 0640 identity" 1 "readable by group or others.*chmod 600" -- \
  "$STARLING" keygen --show "$SCRATCH/node.key"
chmod 600 "$SCRATCH/node.key" "$SCRATCH/cluster.key"
expect_fail "--show a missing file" 1 "$SCRATCH/nope.key" -- \
  "$STARLING" keygen --show "$SCRATCH/nope.key"
printf 'hello\n' >"$SCRATCH/hello.txt"
chmod 644 "$SCRATCH/hello.txt" # not a key: no advice to chmod it
expect_fail "--show not a key file" 1 "first word 'starling-identity-v1' or 'starling-cluster-key-v1'" -- \
  "$STARLING" keygen --show "$SCRATCH/hello.txt"
! grep -q chmod "$SCRATCH/err" || fail "--show advised chmod for a file that is no key"
ln -s "$SCRATCH/node.key" "$SCRATCH/link.key"
expect_fail "--show a symbolic link" 1 "symbolic link" -- \
  "$STARLING" keygen --show "$SCRATCH/link.key"
expect_fail "--show a directory" 1 "is a directory" -- \
  "$STARLING" keygen --show "$SCRATCH"

echo "all keygen checks passed"
