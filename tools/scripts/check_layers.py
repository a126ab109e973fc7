#!/usr/bin/env python3
"""check_layers.py: fails when an arrow between starling's layers points up.

The allowed arrows are the table in docs/architecture.md between the lines
`<!-- layers -->` and `<!-- /layers -->`: one line a layer, `layer: folder
-> the layers it may use`. This script checks two kinds of arrows against it:

- every `#include "X/..."` of our own in a layer's .c/.h/.cu/.cuh file: the
  included file's layer must be the layer itself or one it may use;
- every CMake link of a layer's library (`st_layer_library(st_NAME ...)` and
  `target_link_libraries(st_NAME ...)`): each `st_*` it names likewise.

It also checks the foreign libraries each layer alone may include
(libsodium in crypto/, msgpack in gossip/, libuv in the daemon, jansson
in base/), as docs/architecture.md says.

    tools/scripts/check_layers.py [ROOT]     (ROOT: the source tree, default .)

Exits 0 and prints a one-line summary when every arrow is allowed; exits 1
naming each file, line and arrow that is not.
"""
import os
import re
import sys

# Where a foreign header may be included: header -> layers allowed. The one
# exception is tools/bench/bench_crypto.c, whose raw-AEAD baseline measures
# libsodium itself (named below).
FOREIGN = {
    "sodium.h": {"crypto"},
    "msgpack.h": {"gossip"},
    "uv.h": {"daemon"},
    "jansson.h": {"base"},
}
FOREIGN_EXCEPTIONS = {("tools/bench/bench_crypto.c", "sodium.h")}
SOURCE_SUFFIXES = (".c", ".h", ".cu", ".cuh")


def read_table(root):
    path = os.path.join(root, "docs", "architecture.md")
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        sys.exit(f"check_layers: cannot read {path}: {e.strerror}")
    m = re.search(r"<!-- layers -->(.*?)<!-- /layers -->", text, re.S)
    if not m:
        sys.exit(f"check_layers: {path} has no <!-- layers --> table")
    layers = {}  # name -> (folder, allowed set)
    for line in m.group(1).splitlines():
        line = line.strip().strip("|").strip()
        mm = re.match(r"`?(\w+)`?\s*\|\s*`?([\w/]+)/?`?\s*\|\s*(.*)", line)
        if not mm or mm.group(1) == "layer":
            continue
        name, folder, uses = mm.groups()
        allowed = set(re.findall(r"\w+", uses.replace("nothing", "")))
        layers[name] = (folder.rstrip("/"), allowed | {name})
    if not layers:
        sys.exit(f"check_layers: the table in {path} lists no layer")
    for name, (_, allowed) in layers.items():
        unknown = allowed - set(layers)
        if unknown:
            sys.exit(f"check_layers: layer {name} may use unknown "
                     f"layer(s) {sorted(unknown)} in {path}")
    return layers


def layer_of(path, layers):
    """The layer whose folder holds path (the longest folder wins)."""
    best = None
    for name, (folder, _) in layers.items():
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(layers[best][0]):
                best = name
    return best


def check_includes(root, layers, errors):
    checked = 0
    for name, (folder, allowed) in layers.items():
        top = os.path.join(root, folder)
        for dirpath, _, files in os.walk(top):
            for f in sorted(files):
                if not f.endswith(SOURCE_SUFFIXES):
                    continue
                full = os.path.join(dirpath, f)
                rel = os.path.relpath(full, root)
                if layer_of(rel, layers) != name:
                    continue  # a sub-folder that is a layer of its own
                checked += 1
                with open(full, encoding="utf-8", errors="replace") as fh:
                    for no, line in enumerate(fh, 1):
                        m = re.match(r'\s*#\s*include\s*([<"])([^">]+)[">]',
                                     line)
                        if not m:
                            continue
                        target = m.group(2)
                        if m.group(1) == "<":
                            ok = FOREIGN.get(target)
                            if ok is not None and name not in ok and \
                                    (rel, target) not in FOREIGN_EXCEPTIONS:
                                errors.append(
                                    f"{rel}:{no}: layer {name} includes "
                                    f"<{target}>, which only "
                                    f"{'/'.join(sorted(ok))} may use")
                            continue
                        to = layer_of(target, layers)
                        if to is not None and to not in allowed:
                            errors.append(
                                f"{rel}:{no}: {name} -> {to} (#include "
                                f"\"{target}\") points up; {name} may use "
                                f"{', '.join(sorted(allowed - {name})) or 'nothing'}")
    return checked


def check_cmake(root, layers, errors):
    path = os.path.join(root, "CMakeLists.txt")
    text = open(path, encoding="utf-8").read()
    lib_to_layer = {f"st_{n}": n for n in layers}
    checked = 0
    for m in re.finditer(
            r"(st_layer_library|target_link_libraries)\(\s*(st_\w+)([^)]*)\)",
            text):
        lib, args = m.group(2), m.group(3)
        frm = lib_to_layer.get(lib)
        if frm is None:
            continue
        no = text.count("\n", 0, m.start()) + 1
        allowed = layers[frm][1]
        for dep in re.findall(r"\bst_\w+", args):
            to = lib_to_layer.get(dep)
            checked += 1
            if to is None:
                errors.append(f"CMakeLists.txt:{no}: {lib} links {dep}, "
                              "which is no layer of the table")
            elif to not in allowed:
                errors.append(f"CMakeLists.txt:{no}: {lib} links {dep}: "
                              f"{frm} -> {to} points up")
    return checked


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    if len(sys.argv) > 2 or root in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if root in ("-h", "--help") else 2
    layers = read_table(root)
    errors = []
    files = check_includes(root, layers, errors)
    links = check_cmake(root, layers, errors)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"check_layers: {len(errors)} arrow(s) not allowed by "
              "docs/architecture.md", file=sys.stderr)
        return 1
    print(f"check_layers: {len(layers)} layers, {files} files, {links} "
          "CMake links: every arrow points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
