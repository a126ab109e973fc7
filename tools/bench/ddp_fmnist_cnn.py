#!/usr/bin/env python3
"""ddp_fmnist_cnn.py: the PyTorch DistributedDataParallel twin of a cluster
of attached starling nodes running examples/pytorch_fmnist.py, for
tools/bench/bench_attach_ddp.sh. One process is one rank (the script starts
WORLD of them, each in its own network namespace when the links are
shaped); rank 0 is the rendezvous (gloo, TCP).

Everything but the averaging is the example's, imported from it: the CNN
(Net), the data (load_data: shard K/WORLD, the examples i with
i % WORLD == K, standardized the same way), the order of each epoch
(epoch_order(seed, epoch, n)), the per-rank batch, SGD with momentum, the
cosine schedule over --epochs of the shard, and the evaluation on the whole
test set at every epoch end, the device (--device cuda: gloo all-reduces
the CUDA gradients through host copies). What differs is what DDP is: the gradients are
averaged over the ranks at every step (an all-reduce), the model is one,
and rank 0 evaluates it while the others wait at the next collective.

Rank 0 stops every rank at the first epoch end where the test accuracy is
>= --target, and writes one JSON object to --json-out: time_to_target_s
(since --t0, the moment the caller launched the ranks: start-up counts, as
it does for the starling programs; null when not reached), steps,
test_accuracy, the accuracy at each epoch end, wall_s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
)
from pytorch_fmnist import (  # noqa: E402  (the example's own model and data)
    DEFAULT_DATA,
    Net,
    epoch_order,
    evaluate,
    load_data,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=4)
    p.add_argument(
        "--master", default="127.0.0.1:29533", help="rank 0's HOST:PORT (rendezvous)"
    )
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hidden", type=int, default=0, help="the example's --hidden")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--target", type=float, default=0.90)
    p.add_argument("--t0", type=float, default=None, help="launch time (time.time())")
    p.add_argument(
        "--data-dir", default=os.environ.get("STARLING_FASHION_MNIST_DIR", DEFAULT_DATA)
    )
    p.add_argument("--json-out", default=None, help="rank 0's results (JSON)")
    a = p.parse_args()
    if not 0 <= a.rank < a.world:
        p.error(f"--rank {a.rank}: want 0 <= rank < --world ({a.world})")
    return a


def epoch_end(
    a: argparse.Namespace, model: torch.nn.Module, data: tuple, step: int, log: dict
) -> bool:
    """Rank 0 evaluates; every rank learns whether to stop (a broadcast)."""
    stop = torch.zeros(1)
    if a.rank == 0:
        acc = evaluate(model, data[2], data[3])
        log["accuracies"].append([step, acc])
        log["test_accuracy"] = acc
        print(f"step {step} test acc {acc:.4f}", flush=True)
        if acc >= a.target and log["time_to_target_s"] is None:
            log["time_to_target_s"] = time.time() - a.t0
            stop[0] = 1
    dist.broadcast(stop, 0)
    return bool(stop[0] > 0)


def train(a: argparse.Namespace) -> dict:
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    data = tuple(t.to(device) for t in load_data(a.data_dir, (a.rank, a.world)))
    xtr, ytr = data[0], data[1]
    net = Net(a.hidden).to(device)
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    # Every rank takes the same number of steps (the smallest shard's), or
    # the all-reduces would not pair up; with 60000 examples and 4 ranks the
    # shards are equal.
    n = torch.tensor([len(xtr)])
    dist.all_reduce(n, op=dist.ReduceOp.MIN)
    per_epoch = math.ceil(int(n) / a.batch)
    total = a.epochs * per_epoch
    log = {"accuracies": [], "time_to_target_s": None, "test_accuracy": None}
    t_start, step = time.time(), 0
    while step < total:
        epoch, b = divmod(step, per_epoch)
        sel = torch.from_numpy(
            epoch_order(a.seed, epoch, len(xtr))[b * a.batch :][: a.batch]
        ).to(device)
        lr = a.lr
        if a.schedule == "cosine":
            lr = a.lr * 0.5 * (1 + math.cos(math.pi * step / total))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = F.cross_entropy(model(xtr[sel]), ytr[sel])
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        step += 1
        if step % per_epoch == 0 or step >= total:
            if epoch_end(a, net, data, step, log):
                break
    log.update(
        world=a.world,
        steps=step,
        wall_s=time.time() - a.t0,
        train_s=time.time() - t_start,
        batch=a.batch,
        lr=a.lr,
    )
    return log


def main() -> int:
    a = parse_args()
    if a.t0 is None:
        a.t0 = time.time()
    host, port = a.master.rsplit(":", 1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{host}:{port}", rank=a.rank, world_size=a.world
    )
    out = train(a)
    dist.destroy_process_group()
    if a.rank == 0 and a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
