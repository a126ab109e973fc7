#!/usr/bin/env python3
"""gen_libsvm.py: writes a synthetic sparse classification set in libsvm
format, for HogWild's tests and benchmark (docs/training.md, "Sparse data
and HogWild").

Like a bag-of-words set: each example names --nnz features drawn from
--dim with a Zipf-like popularity (feature of rank r drawn in proportion to
1 / r^--zipf: a few frequent features, a long tail; --zipf 0: uniform),
values positive and scaled so each row has unit norm; its class is the
argmax of a planted linear model's scores plus Gumbel noise (--noise), so
the classes overlap and a linear model cannot reach zero loss. Seeded,
so the same arguments write the same files.

    gen_libsvm.py OUT_PREFIX [--train N] [--test N] [--dim D] [--nnz K]
                  [--classes C] [--noise S] [--zipf S] [--seed S]

writes OUT_PREFIX.train and OUT_PREFIX.test and prints one line of JSON
(paths, sizes).
"""
import argparse
import json
import sys

import numpy as np


def examples(rng, n, dim, nnz, weights, noise, popularity):
    """n rows: (sorted feature indices, values, label)."""
    # Draw 3 * nnz candidates per row from the popularity's CDF and keep
    # the first nnz distinct ones; the rare row with too few is redrawn.
    cdf = np.cumsum(popularity)
    cand = np.searchsorted(cdf, rng.uniform(0, cdf[-1], size=(n, 3 * nnz)))
    cand = np.minimum(cand, dim - 1)
    idx = np.empty((n, nnz), dtype=np.int64)
    for i in range(n):
        _, first = np.unique(cand[i], return_index=True)
        if len(first) >= nnz:
            idx[i] = np.sort(cand[i][np.sort(first)[:nnz]])
        else:
            idx[i] = np.sort(rng.choice(dim, size=nnz, replace=False, p=popularity))
    val = rng.uniform(0.5, 1.5, size=(n, nnz))
    val /= np.linalg.norm(val, axis=1, keepdims=True)
    scores = np.einsum("nk,cnk->nc", val, weights[:, idx])
    scores += noise * rng.gumbel(size=scores.shape)
    return idx, val, scores.argmax(axis=1)


def write(path, idx, val, labels):
    with open(path, "w") as f:
        for i in range(len(labels)):
            feats = " ".join(
                "%d:%.6g" % (j + 1, v) for j, v in zip(idx[i], val[i])
            )
            f.write("%d %s\n" % (labels[i], feats))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("prefix")
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--test", type=int, default=5000)
    p.add_argument("--dim", type=int, default=20000)
    p.add_argument("--nnz", type=int, default=20)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--noise", type=float, default=0.5)
    p.add_argument("--zipf", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if not (0 < a.nnz <= a.dim and a.classes >= 2 and a.train > 0 and a.test > 0):
        sys.exit("gen_libsvm.py: want 0 < nnz <= dim, classes >= 2, train, test > 0")
    rng = np.random.default_rng(a.seed)
    rank = np.arange(1, a.dim + 1, dtype=np.float64)
    popularity = 1.0 / rank**a.zipf
    popularity /= popularity.sum()
    popularity = popularity[rng.permutation(a.dim)]
    weights = rng.normal(size=(a.classes, a.dim)) * 3.0
    out = {}
    for part, n in (("train", a.train), ("test", a.test)):
        idx, val, labels = examples(rng, n, a.dim, a.nnz, weights, a.noise, popularity)
        path = "%s.%s" % (a.prefix, part)
        write(path, idx, val, labels)
        out[part] = path
    out.update(dim=a.dim, classes=a.classes, nnz=a.nnz)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
