#!/usr/bin/python3
"""check_safetensors_numpy.py: reads a .safetensors file written by starling
with nothing but the Python standard library and NumPy, as an outside
consumer would, and checks the format's rules (the "Format" section of
https://github.com/huggingface/safetensors, plus the 8-byte alignment of
the data that Python's safetensors and starling both write).

Usage: /usr/bin/python3 check_safetensors_numpy.py FILE [--expect-count N]

Prints one line per tensor, in file order:
    tensor <json name> shape=<list> sum=<float64 sum of the float32 values>
then one line per metadata entry:
    meta <json key> = <json value>
and exits 0; on any problem prints "check_safetensors_numpy: FILE: what"
to stderr and exits 1.
"""
import json
import struct
import sys

import numpy as np

MAX_HEADER_BYTES = 100 * 1024 * 1024  # node/train/train.h: ST_SAFETENSORS_MAX_HEADER_BYTES
MAX_INT = 2 ** 53


class Bad(Exception):
    pass


def no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise Bad("duplicate key %s in the header" % json.dumps(k))
        d[k] = v
    return d


def reject_constant(name):
    raise Bad("%s is not valid JSON" % name)


def is_uint(v):
    return type(v) is int and 0 <= v <= MAX_INT


def check(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise Bad("file is %d bytes, shorter than the 8-byte length" % len(raw))
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER_BYTES:
        raise Bad("header length %d is over the cap" % n)
    if n > len(raw) - 8:
        raise Bad("header length %d is beyond the end of the file" % n)
    if n % 8 != 0:
        raise Bad("header length %d is not a multiple of 8" % n)
    try:
        text = raw[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise Bad("header is not UTF-8: %s" % e)
    stripped = text.rstrip(" ")
    if not stripped.startswith("{"):
        raise Bad("header does not start with '{'")
    try:
        header = json.loads(stripped, object_pairs_hook=no_duplicates,
                            parse_constant=reject_constant)
    except ValueError as e:
        raise Bad("header is not valid JSON: %s" % e)
    if not isinstance(header, dict):
        raise Bad("header is not a JSON object")
    buf = raw[8 + n:]

    meta = header.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict):
            raise Bad("__metadata__ is not an object")
        for k, v in meta.items():
            if not isinstance(v, str):
                raise Bad("metadata value of %s is not a string" % json.dumps(k))

    spans = []
    out = []
    for name, e in header.items():
        if not isinstance(e, dict):
            raise Bad("entry %s is not an object" % json.dumps(name))
        if sorted(e) != ["data_offsets", "dtype", "shape"]:
            raise Bad("entry %s has fields %s" % (json.dumps(name), sorted(e)))
        if e["dtype"] != "F32":
            raise Bad("tensor %s has dtype %r, not F32" % (json.dumps(name),
                                                           e["dtype"]))
        shape, off = e["shape"], e["data_offsets"]
        if not isinstance(shape, list) or not all(is_uint(d) for d in shape):
            raise Bad("shape of %s is not a list of non-negative integers"
                      % json.dumps(name))
        if (not isinstance(off, list) or len(off) != 2
                or not all(is_uint(o) for o in off)):
            raise Bad("data_offsets of %s is not two non-negative integers"
                      % json.dumps(name))
        begin, end = off
        count = 1
        for d in shape:
            count *= d
        if not begin <= end <= len(buf):
            raise Bad("data_offsets %s of %s are out of bounds (%d bytes)"
                      % (off, json.dumps(name), len(buf)))
        if count * 4 != end - begin:
            raise Bad("shape %s of %s needs %d bytes, offsets span %d"
                      % (shape, json.dumps(name), count * 4, end - begin))
        spans.append((begin, end, name))
        x = np.frombuffer(buf, dtype="<f4", count=count, offset=begin)
        x = x.reshape(shape)
        out.append((begin, name, shape, float(x.astype(np.float64).sum())))

    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise Bad("%s starts at %d, expected %d (%s)"
                      % (json.dumps(name), begin, at,
                         "overlap" if begin < at else "gap"))
        at = end
    if at != len(buf):
        raise Bad("%d trailing bytes after the last tensor" % (len(buf) - at))

    for _, name, shape, s in sorted(out, key=lambda t: t[0]):
        print("tensor %s shape=%s sum=%r" % (json.dumps(name), shape, s))
    for k, v in (meta or {}).items():
        print("meta %s = %s" % (json.dumps(k), json.dumps(v)))
    return len(out)


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4
                                   and argv[2] != "--expect-count"):
        sys.stderr.write(__doc__)
        return 2
    path = argv[1]
    try:
        count = check(path)
        if len(argv) == 4 and count != int(argv[3]):
            raise Bad("%d tensors, expected %s" % (count, argv[3]))
    except (Bad, OSError) as e:
        sys.stderr.write("check_safetensors_numpy: %s: %s\n" % (path, e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
