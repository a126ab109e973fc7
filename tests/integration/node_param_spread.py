#!/usr/bin/python3
"""node_param_spread.py: how far apart the models in starling checkpoints
are, with nothing but the standard library and NumPy.

Usage: /usr/bin/python3 node_param_spread.py [--all] CKPT...

Reads each checkpoint's model parameters (the "layers.L.weight" and
"layers.L.bias" tensors, in a fixed order; optimizer state is ignored; with
--all, every tensor, in name order: an attached node's checkpoint) as one
flat float64 vector and prints one line:
    max_pairwise_l2=<float> mean_norm=<float> ratio=<float> params=<int>
where ratio = max_pairwise_l2 / mean_norm. Exits 1 (with a message on
stderr) when a file cannot be read or the checkpoints' tensors differ in
names or shapes.
"""
import json
import re
import struct
import sys

import numpy as np

PARAM = re.compile(r"^layers\.(\d+)\.(weight|bias)$")


ALL = False


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    buf = raw[8 + n:]
    if ALL:
        names = sorted(header)
    else:
        names = sorted((k for k in header if PARAM.match(k)),
                       key=lambda k: (int(PARAM.match(k).group(1)), k))
    if not names:
        raise ValueError("no layers.L.weight/bias tensors")
    parts, shapes = [], []
    for k in names:
        e = header[k]
        if e["dtype"] != "F32":
            raise ValueError("%s has dtype %s" % (k, e["dtype"]))
        b, end = e["data_offsets"]
        x = np.frombuffer(buf[b:end], dtype="<f4").astype(np.float64)
        if x.size != int(np.prod(e["shape"])):
            raise ValueError("%s: shape %s and offsets disagree" % (k, e["shape"]))
        parts.append(x)
        shapes.append((k, tuple(e["shape"])))
    return shapes, np.concatenate(parts)


def main(argv):
    global ALL
    if len(argv) > 1 and argv[1] == "--all":
        ALL = True
        argv = argv[:1] + argv[2:]
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    vecs, layout = [], None
    for p in argv[1:]:
        try:
            shapes, v = load(p)
        except (OSError, ValueError, KeyError, struct.error) as e:
            sys.stderr.write("node_param_spread: %s: %s\n" % (p, e))
            return 1
        if layout is None:
            layout = shapes
        elif shapes != layout:
            sys.stderr.write("node_param_spread: %s: tensors %s differ from %s\n"
                             % (p, shapes, layout))
            return 1
        if not np.all(np.isfinite(v)):
            sys.stderr.write("node_param_spread: %s: non-finite parameters\n" % p)
            return 1
        vecs.append(v)
    worst = 0.0
    for i in range(len(vecs)):
        for j in range(i + 1, len(vecs)):
            worst = max(worst, float(np.linalg.norm(vecs[i] - vecs[j])))
    mean_norm = float(np.mean([np.linalg.norm(v) for v in vecs]))
    print("max_pairwise_l2=%.6g mean_norm=%.6g ratio=%.6g params=%d"
          % (worst, mean_norm, worst / mean_norm, vecs[0].size))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
