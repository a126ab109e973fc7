#!/usr/bin/env bash
# test_function_length.sh: the function-length check
# (tools/scripts/check_function_length.py) passes on every layer of the
# tree, fails naming a synthetic function over 80 lines, and lets the same
# function pass once the comment above it gives a `Long:` reason.
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
CHECK=$SRC/tools/scripts/check_function_length.py

# Every layer's sources (no argument: base kernels optimizer crypto gossip
# node tools).
out=$(cd "$SRC" && $PY "$CHECK" 2>&1) ||
  fail "functions over 80 lines without a reason: $out"
grep -q "none over 80 lines" <<<"$out" || fail "no summary: $out"
echo "ok: the tree ($out)"

# long_function NAME [COMMENT]: a clang-formatted C function of 90 lines
# (brace to brace) with a multi-line signature, after COMMENT.
long_function() {
  printf '/* %s */\n' "${2:-a helper}"
  printf 'static int %s(int a,\n' "$1"
  printf '           int b) {\n'
  printf '  int x = a + b;\n'
  for i in $(seq 1 86); do printf '  x += %d;\n' "$i"; done
  printf '  return x;\n}\n'
}

{
  echo '/* long.c: a synthetic source for test_function_length.sh. */'
  echo 'static const int table[] = {'
  for i in $(seq 1 100); do echo "    $i,"; done
  echo '};'
  echo
  long_function too_long
  echo
  echo 'int short_one(void) {'
  echo '  return 0;'
  echo '}'
} >"$SCRATCH/long.c"
rc=0
err=$($PY "$CHECK" "$SCRATCH/long.c" 2>&1 >/dev/null) || rc=$?
[ "$rc" -eq 1 ] || fail "a 90-line function: exit $rc, want 1 ($err)"
grep -q "long.c:[0-9]* too_long 90$" <<<"$err" || fail "not named: $err"
grep -q "table\|short_one" <<<"$err" && fail "named a non-offender: $err"
echo "ok: a 90-line function fails, named"

{
  echo '/* excused.c: a synthetic source for test_function_length.sh. */'
  long_function with_reason \
    "one switch read top to bottom.
 * Long: a table of cases, clearer whole"
} >"$SCRATCH/excused.c"
out=$($PY "$CHECK" "$SCRATCH/excused.c" 2>&1) ||
  fail "a 90-line function with a Long: reason: $out"
out=$($PY "$CHECK" --list "$SCRATCH/excused.c") || fail "--list: $out"
grep -q "with_reason 90 (Long: a table of cases, clearer whole)" <<<"$out" ||
  fail "--list does not show the reason: $out"
echo "ok: a Long: reason excuses it, and --list shows it"

out=$($PY "$CHECK" --limit 100 "$SCRATCH/long.c") ||
  fail "--limit 100 on a 90-line function: $out"
echo "test_function_length: all passed"
