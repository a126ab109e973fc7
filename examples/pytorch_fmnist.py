#!/usr/bin/env python3
"""pytorch_fmnist.py: a small PyTorch CNN trained on Fashion-MNIST through
the local `starling node --attach` (docs/attach.md).

The training loop is the one a PyTorch user writes; starling adds two
lines, marked "starling:" below. The program's position in the data follows
node.step_count, so a program that attaches to a running cluster (or is
restarted) continues at the cluster's step, with the cluster's learning
rate. Each program trains on its own shard (--shard K/N: the examples
i with i % N == K).

    build/starling keygen --cluster --out cluster.key
    build/starling node --attach --listen 127.0.0.1:7946 \\
        --cluster-key cluster.key --data-dir state &
    STARLING_LIB=build/libstarling.so PYTHONPATH=client/python \\
        python3 examples/pytorch_fmnist.py --socket state/control.sock --shard 0/2

--device cuda trains on the GPU (the data is moved there once); the node
still gets the parameters through pinned host copies at step boundaries.
--no-starling runs the same loop alone (for comparisons and overhead
measurements). Data: the Debian package dataset-fashion-mnist, or
--data-dir (or $STARLING_FASHION_MNIST_DIR) holding the four IDX .gz files.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import math
import os
import re
import sys
import time
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import starling
except ImportError:  # run from a checkout: the package is in client/python/
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python")
    )
    import starling

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


# ---- data -----------------------------------------------------------------


def read_idx(path: str) -> np.ndarray:
    """An IDX file (gzip'd) as an array of its shape (uint8)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} bytes of data for shape {dims}")
    return data.reshape(dims)


def load_data(
    data_dir: str, shard: Tuple[int, int]
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The shard's training images and labels and the whole test set, as
    float32 N x 1 x 28 x 28 standardized with the whole training set's
    mean and standard deviation (the same for every shard)."""
    paths = [os.path.join(data_dir, f) for f in FILES]
    for p in paths:
        if not os.path.exists(p):
            sys.exit(
                f"pytorch_fmnist: Fashion-MNIST not found ({p}): install it "
                "with `apt-get install dataset-fashion-mnist`, or pass --data-dir"
            )
    xtr, ytr, xte, yte = (read_idx(p) for p in paths)
    scaled = xtr.astype(np.float32) / 255.0
    mean, sd = float(scaled.mean()), float(scaled.std())
    k, n = shard
    idx = np.arange(k, len(xtr), n)

    def prep(x: np.ndarray) -> torch.Tensor:
        x = (x.astype(np.float32) / 255.0 - mean) / sd
        return torch.from_numpy(np.ascontiguousarray(x[:, None, :, :]))

    return (
        prep(xtr[idx]),
        torch.from_numpy(ytr[idx].astype(np.int64)),
        prep(xte),
        torch.from_numpy(yte.astype(np.int64)),
    )


# ---- the model --------------------------------------------------------------


class Net(nn.Module):
    """conv 1->16 3x3, BN, ReLU, max-pool 2; conv 16->32 3x3, BN, ReLU,
    max-pool 2; fc 32*7*7 -> 10. About 21k parameters. With hidden > 0 the
    head is fc 32*7*7 -> hidden, ReLU, fc hidden -> 10 instead (--hidden 256:
    0.42M parameters, for links that the default's 82 KB does not load)."""

    def __init__(self, hidden: int = 0) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 7 * 7, hidden) if hidden > 0 else None
        self.fc = nn.Linear(hidden if hidden > 0 else 32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2).flatten(1)
        if self.fc1 is not None:
            x = F.relu(self.fc1(x))
        return self.fc(x)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Test accuracy, in batches of 1000."""
    model.eval()
    right = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            right += int((model(x[i : i + 1000]).argmax(1) == y[i : i + 1000]).sum())
    model.train()
    return right / len(x)


def flat_params(model: nn.Module) -> np.ndarray:
    """Every tensor starling shares, concatenated in its order (float32)."""
    return np.concatenate(
        [t.detach().cpu().reshape(-1).numpy() for _, t in starling.model_tensors(model)]
    )


# ---- the loop -----------------------------------------------------------------


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--socket", default="state/control.sock", help="the node's control socket"
    )
    p.add_argument(
        "--shard", default="0/1", help="K/N: train on examples i with i %% N == K"
    )
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.02)  # 0.05 stalls near 0.88 on 4 nodes
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument(
        "--device",
        default="cpu",
        help="where the model trains: cpu, cuda or cuda:N (the node gets the "
        "parameters through pinned host copies at step boundaries)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--hidden",
        type=int,
        default=0,
        help="width of a hidden fully connected layer before the output (0: none)",
    )
    p.add_argument(
        "--target", type=float, default=None, help="stop at this test accuracy"
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="stop after this many steps of this run",
    )
    p.add_argument(
        "--log-every", type=int, default=100, help="steps between progress lines"
    )
    p.add_argument(
        "--data-dir", default=os.environ.get("STARLING_FASHION_MNIST_DIR", DEFAULT_DATA)
    )
    p.add_argument(
        "--json-out", default=None, help="write the final metrics here (JSON)"
    )
    p.add_argument(
        "--save-params", default=None, help="save the final flat parameters here (.npy)"
    )
    p.add_argument(
        "--no-starling", action="store_true", help="train alone, without a node"
    )
    p.add_argument(
        "--reconnect", action="store_true", help="wait for the node when it goes away"
    )
    p.add_argument(
        "--eval-at-attach",
        action="store_true",
        help="print the test accuracy of the parameters the node handed over",
    )
    a = p.parse_args(argv)
    try:
        k, n = (int(v) for v in a.shard.split("/"))
        assert 0 <= k < n
    except (ValueError, AssertionError):
        p.error(f"--shard: '{a.shard}' is not K/N with 0 <= K < N")
    a.shard = (k, n)
    if not (a.device == "cpu" or re.fullmatch(r"cuda(:[0-9]+)?", a.device)):
        p.error(f"--device: '{a.device}' is not cpu, cuda or cuda:N")
    return a


@functools.lru_cache(maxsize=2)
def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The shard's example order in one epoch: a function of the seed and
    the epoch only, so that any program at a given step sees the same batch."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def train(
    a: argparse.Namespace,
    model: nn.Module,
    node: Optional[starling.Node],
    data: Tuple[torch.Tensor, ...],
) -> dict:
    """The training loop, from the step the node says (0 alone) to the last
    step of --epochs (or --max-steps, or --target); returns the metrics."""
    xtr, ytr, xte, yte = data
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    per_epoch = math.ceil(len(xtr) / a.batch)
    total = a.epochs * per_epoch
    t0 = time.monotonic()
    step = node.step_count if node else 0
    did = {"apply": 0, "snapshot": 0, "state": 0}
    acc, ran, eval_s = None, 0, 0.0
    while step < total and (a.max_steps is None or ran < a.max_steps):
        epoch, b = divmod(step, per_epoch)
        sel = torch.from_numpy(
            epoch_order(a.seed, epoch, len(xtr))[b * a.batch :][: a.batch]
        ).to(xtr.device)
        lr = a.lr
        if a.schedule == "cosine":
            lr = a.lr * 0.5 * (1 + math.cos(math.pi * step / total))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = F.cross_entropy(model(xtr[sel]), ytr[sel])
        opt.zero_grad()
        loss.backward()
        opt.step()
        ran += 1
        if node:
            bits = node.step()  # starling: serve the node between steps
            for name, bit in (
                ("apply", starling.DID_APPLY),
                ("snapshot", starling.DID_SNAPSHOT),
                ("state", starling.DID_STATE),
            ):
                did[name] += bool(bits & bit)
            step = node.step_count  # follows the cluster after a reconnect
        else:
            step += 1
        if step % a.log_every == 0:
            print(
                f"step {step} epoch {epoch} loss {float(loss):.4f} lr {lr:.4f}",
                flush=True,
            )
            if node:
                node.report(loss=float(loss))
        if step % per_epoch == 0 or step >= total:
            te = time.monotonic()
            acc = evaluate(model, xte, yte)
            eval_s += time.monotonic() - te
            print(
                f"epoch {step // per_epoch} step {step} test acc {acc:.4f}", flush=True
            )
            if node:
                node.report(loss=float(loss), accuracy=acc)
            if a.target is not None and acc >= a.target:
                break
    if acc is None or (a.max_steps is not None and ran >= a.max_steps):
        te = time.monotonic()
        acc = evaluate(model, xte, yte)
        eval_s += time.monotonic() - te
    return {
        "test_accuracy": acc,
        "steps": step,
        "steps_here": ran,
        "wall_s": time.monotonic() - t0,
        "eval_s": eval_s,  # of wall_s: the evaluations
        "did": did,
    }


def main(argv: Optional[list] = None) -> int:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if a.device != "cpu" and not torch.cuda.is_available():
        sys.exit(f"pytorch_fmnist: --device {a.device}: PyTorch sees no CUDA device")
    device = torch.device(a.device)
    data = tuple(t.to(device) for t in load_data(a.data_dir, a.shard))
    model = Net(a.hidden).to(device)
    node = None
    if not a.no_starling:
        # starling: the model now holds the cluster's parameters.
        try:
            node = starling.attach(model, socket=a.socket, reconnect=a.reconnect)
        except starling.StarlingError as e:
            sys.exit(f"pytorch_fmnist: {e}")
        print(f"attached: {node}, cluster step {node.cluster_step}", flush=True)
        if a.eval_at_attach:
            acc = evaluate(model, data[2], data[3])
            print(f"at attach: step {node.cluster_step} test acc {acc:.4f}", flush=True)
    out = train(a, model, node, data)
    params = flat_params(model)
    print(
        f"done: step {out['steps']}, {out['steps_here']} steps here in "
        f"{out['wall_s']:.1f} s, test acc {out['test_accuracy']:.4f}, "
        f"averaging applied {out['did']['apply']} times",
        flush=True,
    )
    if a.save_params:
        np.save(a.save_params, params)
    if a.json_out:
        out.update(
            cluster_step=node.cluster_step if node else 0,
            param_norm=float(np.linalg.norm(params.astype(np.float64))),
            n_params=int(params.size),
            starling=node is not None,
        )
        with open(a.json_out, "w") as f:
            json.dump(out, f)
    if node:
        node.detach()
    return 0


if __name__ == "__main__":
    sys.exit(main())
