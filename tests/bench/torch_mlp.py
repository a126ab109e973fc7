#!/usr/bin/python3
"""torch_mlp.py: the PyTorch eager twin of `starling-bench train`.

Trains the same model (mlp:784-256-128-10 is nn.Sequential(Linear, ReLU,
Linear, ReLU, Linear)) on the same data (the Fashion-MNIST training set from
/usr/share/datasets/fashion-mnist, scaled to [0, 1] and then standardized
with the training set's scalar mean and standard deviation, as starling's
st_data_open does) with the same optimizer (SGD, momentum 0.9, lr 0.05,
F.cross_entropy), the same batches (a fresh random permutation every epoch,
the last batch of an epoch smaller, as a DataLoader with shuffle=True gives;
the batches are gathered by indexing a preloaded tensor, no workers), and
the same measurement (warm-up steps, then the median samples/s of R repeats
of N steps; the last step of each repeat reads the loss back).

Run it with Debian's python3 (python3-torch, python3-numpy), with
libopenblas0-pthread installed so that torch's BLAS is OpenBLAS rather than
the reference BLAS, and OPENBLAS_NUM_THREADS=1 so that OpenBLAS's threads do
not compete with torch's own intra-op threads:

  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 tests/bench/torch_mlp.py \\
      --batch 64,256 --threads 1

tools/bench/bench_train_vs_torch.sh runs it next to starling-bench.
"""

import argparse
import gzip
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

DATA_DIR = os.environ.get("STARLING_FASHION_MNIST_DIR",
                          "/usr/share/datasets/fashion-mnist")


def read_idx(path):
    """Reads an IDX file (gzip or raw) into a uint8 numpy array."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        sys.exit(f"torch_mlp.py: {path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big")
            for i in range(ndim)]
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    return body.reshape(dims)


def load_fashion_mnist():
    """Returns (x, y): x float32 (60000, 784) standardized, y int64."""
    images = read_idx(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(DATA_DIR, "train-labels-idx1-ubyte.gz"))
    x = images.reshape(images.shape[0], -1).astype(np.float32) / 255.0
    # One scalar mean and (population) standard deviation over every pixel,
    # accumulated in double, like node/train/data.c's normalize_scalar.
    mean = x.mean(dtype=np.float64)
    sd = x.std(dtype=np.float64)
    x = ((x - mean) / sd).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64))


def loaded_blas():
    """The BLAS library this process really loaded. Debian's torch is built
    against the generic libblas.so.3 (torch.__config__.show() says
    BLAS_INFO=generic); which implementation that is depends on the
    alternatives: OpenBLAS with libopenblas0-pthread, the slow reference
    BLAS without it."""
    torch.ones(2, 2) @ torch.ones(2, 2)
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "blas" in line}
    real = {os.path.realpath(lib) for lib in libs}
    if any("openblas" in lib for lib in real):
        return "OpenBLAS: " + ", ".join(sorted(real))
    return "NOT OpenBLAS: " + (", ".join(sorted(real)) or "no BLAS loaded")


def parse_model(spec):
    if not spec.startswith("mlp:"):
        sys.exit(f"torch_mlp.py: --model: only mlp:IN-H1-...-OUT, got {spec!r}")
    sizes = [int(s) for s in spec[4:].split("-")]
    if len(sizes) < 3:
        sys.exit(f"torch_mlp.py: --model: {spec!r} needs a hidden layer")
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Batches:
    """Shuffled batches over n examples: a new permutation every epoch, the
    last batch of an epoch smaller (DataLoader(shuffle=True) order)."""

    def __init__(self, x, y, batch, seed):
        self.x, self.y, self.batch = x, y, batch
        self.gen = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(len(x), generator=self.gen)
        self.pos = 0

    def next(self):
        if self.pos >= len(self.order):
            self.order = torch.randperm(len(self.x), generator=self.gen)
            self.pos = 0
        idx = self.order[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return self.x[idx], self.y[idx]


def bench_one(x, y, spec, batch, args, device):
    torch.manual_seed(1)
    model = parse_model(spec).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = Batches(x, y, batch, seed=1)

    def run_steps(n):
        samples, loss = 0, None
        for i in range(n):
            xb, yb = batches.next()
            if device.type != "cpu":
                xb = xb.to(device, non_blocking=True)
                yb = yb.to(device, non_blocking=True)
            samples += len(xb)
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        # Reading the loss waits for a GPU to finish the work.
        return samples, loss.item()

    if args.warmup_steps:
        run_steps(args.warmup_steps)
    rates, loss = [], float("nan")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        samples, loss = run_steps(args.steps)
        rates.append(samples / (time.perf_counter() - t0))
    return {"device": str(device), "model": spec, "batch": batch,
            "samples_per_sec": statistics.median(rates),
            "samples_per_sec_min": min(rates),
            "samples_per_sec_max": max(rates),
            "final_loss": loss, "repeats": rates}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp:784-256-128-10")
    p.add_argument("--batch", default="64,256",
                   help="comma-separated batch sizes (default 64,256)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    try:
        batch_sizes = [int(b) for b in args.batch.split(",")]
    except ValueError:
        p.error(f"--batch: {args.batch!r} is not a list like 64,256")
    if min(batch_sizes) < 1 or args.steps < 1 or args.repeats < 1:
        p.error("--batch, --steps and --repeats must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    x, y = load_fashion_mnist()
    log = sys.stderr if args.json else sys.stdout
    blas = loaded_blas()
    print(f"torch_mlp.py: torch {torch.__version__} ({blas}), "
          f"{torch.get_num_threads()} threads, OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
          f"{args.model}, median of {args.repeats} x {args.steps} steps",
          file=log, flush=True)
    results = [bench_one(x, y, args.model, b, args, device)
               for b in batch_sizes]
    if args.json:
        print(json.dumps({"benchmark": "train", "peer": "pytorch-eager", "blas": blas,
                          "torch": torch.__version__, "device": args.device,
                          "threads": torch.get_num_threads(),
                          "steps": args.steps,
                          "warmup_steps": args.warmup_steps,
                          "repeats": args.repeats, "results": results}))
    else:
        print(f"{'device':8} {'model':20} {'batch':>6} {'samples/s':>12} "
              f"{'ms/step':>9} {'loss':>8}")
        for r in results:
            print(f"{r['device']:8} {r['model']:20} {r['batch']:6d} "
                  f"{r['samples_per_sec']:12.0f} "
                  f"{1e3 * r['batch'] / r['samples_per_sec']:9.3f} "
                  f"{r['final_loss']:8.4f}")


if __name__ == "__main__":
    main()
