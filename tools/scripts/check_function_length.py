#!/usr/bin/env python3
"""check_function_length.py: fails when a C/CUDA function is longer than a limit.

STYLE.md asks for functions under about 80 lines, split into named steps,
unless a comment says why one is better left whole. This script lists every
function definition longer than the limit in the project's sources.

A function's length is counted from the line holding the opening brace of its
body to the line holding its closing brace, both included. The sources are
clang-formatted (.clang-format), so a top-level function body opens with a `{`
ending its signature line (the signature may run over several lines) and
closes with a `}` at column 0; that is all this script relies on. Struct,
enum and array initialisers (no parameter list, or an `=` before it) are not
functions and are skipped.

A function may exceed the limit when it says why, with a line

    Long: <reason>

(the marker `Long:` followed by a non-empty reason) in the comment right
above its signature, or in a comment among the first lines of its body. For
example:

    /* Encodes one message per case of one switch: a table read top to
     * bottom, which named steps would only scatter.
     * Long: the codec's one table of message types. */
    int st_wire_encode(...) {

    tools/scripts/check_function_length.py [--limit N] [--list] [PATH...]

PATH: source files or folders (searched for .c, .h, .cu, .cuh; any folder
named `tests` is skipped). Without PATH: base kernels optimizer crypto gossip
node tools under the source tree that holds this script.

Exits 1, printing `file:line name length` (line: where the signature starts)
for each function over the limit without a `Long:` reason; exits 0 with a
one-line summary otherwise; exits 2 when a PATH does not exist. With --list, prints every function over the limit,
with its reason when it has one, and exits 0.
"""
import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".c", ".h", ".cu", ".cuh")
DEFAULT_DIRS = ("base", "kernels", "optimizer", "crypto", "gossip", "attach",
                "client", "node", "tools", "examples")
# How many lines of a body's start are searched for a `Long:` reason.
BODY_REASON_LINES = 8
LONG_RE = re.compile(r"^\s*(?://+|/\*+|\*+)?\s*Long:\s*(\S.*?)\s*(?:\*/)?\s*$")
NAME_RE = re.compile(r"([A-Za-z_][A-Za-z_0-9]*)\s*\($")


def source_files(paths):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames
                                 if d != "tests" and not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    yield os.path.join(dirpath, name)


def starts_signature(line):
    """Whether a line at column 0 may begin a top-level declaration."""
    if not line or line[0].isspace():
        return False
    return not line.startswith(("#", "/", "*", "}", "{"))


def function_name(signature):
    """The name before the parameter list (the last top-level parenthesised
    group, so `__attribute__((...)) int f(...)` gives f), or None when the
    text is not a function's signature."""
    depth = 0
    last_open = None
    top_equals = False
    for i, ch in enumerate(signature):
        if ch == "(":
            if depth == 0:
                last_open = i
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "=" and depth == 0:
            top_equals = True  # an initialiser: `x = {...}` is not a body
    if last_open is None or top_equals:
        return None
    m = NAME_RE.search(signature[:last_open + 1])
    return m.group(1) if m else None


def comment_above(lines, start):
    """The lines of the comment block right above line index start."""
    out = []
    i = start - 1
    while i >= 0:
        s = lines[i].strip()
        if not s:
            break
        if s.startswith(("//", "/*", "*")) or s.endswith("*/"):
            out.append(lines[i])
            i -= 1
            continue
        break
    return out


def reason_in(lines):
    for line in lines:
        m = LONG_RE.match(line)
        if m:
            return m.group(1)
    return None


def functions(path):
    """Yields (line, name, length, reason) for every function in path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        if not starts_signature(line):
            i += 1
            continue
        # Gather the signature until a line ends with `{` (a body or an
        # initialiser) or `;` (a declaration), or a blank line.
        start = i
        sig = []
        j = i
        while j < n:
            s = lines[j].rstrip()
            if not s or (j > start and s.startswith(("#", "}"))):
                break
            sig.append(s.strip())
            if s.endswith("{") or s.endswith(";"):
                break
            j += 1
        if j >= n or not lines[j].rstrip().endswith("{"):
            i = max(j, i + 1)
            continue
        open_line = j
        name = function_name(" ".join(sig))
        k = open_line + 1
        while k < n and not lines[k].startswith("}"):
            k += 1
        if name is None:
            i = k + 1
            continue
        length = k - open_line + 1
        body = lines[open_line + 1:min(k, open_line + 1 + BODY_REASON_LINES)]
        body_comments = [b for b in body
                         if b.strip().startswith(("//", "/*", "*"))]
        reason = reason_in(comment_above(lines, start)) or reason_in(
            body_comments)
        yield start + 1, name, length, reason
        i = k + 1


def main(argv):
    ap = argparse.ArgumentParser(
        description="List C/CUDA functions longer than a limit.")
    ap.add_argument("--limit", type=int, default=80,
                    help="most lines a function may have (default 80)")
    ap.add_argument("--list", action="store_true",
                    help="print every function over the limit, with its "
                    "reason when it has one; exit 0")
    ap.add_argument("paths", nargs="*",
                    help="files or folders (default: the project's layers)")
    args = ap.parse_args(argv)
    paths = args.paths
    if not paths:
        root = os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        paths = [os.path.join(root, d) for d in DEFAULT_DIRS
                 if os.path.isdir(os.path.join(root, d))]
        rel = root
    else:
        rel = None
    for path in paths:
        if not os.path.exists(path):
            print(f"{path}: no such file or folder", file=sys.stderr)
            return 2
    offenders = []
    excused = []
    count = 0
    for path in source_files(paths):
        shown = os.path.relpath(path, rel) if rel else path
        for line, name, length, reason in functions(path):
            count += 1
            if length <= args.limit:
                continue
            if reason:
                excused.append((shown, line, name, length, reason))
            else:
                offenders.append((shown, line, name, length))
    if args.list:
        for f, line, name, length in offenders:
            print(f"{f}:{line} {name} {length}")
        for f, line, name, length, reason in excused:
            print(f"{f}:{line} {name} {length} (Long: {reason})")
        print(f"{len(offenders) + len(excused)} of {count} functions over "
              f"{args.limit} lines ({len(excused)} with a Long: reason)")
        return 0
    if offenders:
        for f, line, name, length in offenders:
            print(f"{f}:{line} {name} {length}", file=sys.stderr)
        print(f"{len(offenders)} functions over {args.limit} lines without "
              f"a `Long:` reason", file=sys.stderr)
        return 1
    print(f"{count} functions, none over {args.limit} lines without a reason "
          f"({len(excused)} with a Long: reason)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
