#!/usr/bin/env python3
"""torch_ddp.py: the PyTorch DistributedDataParallel twin of a starling
cluster, for tools/bench/bench_cluster_vs_ddp.sh: WORLD processes on this machine
(gloo backend over loopback), each training the same MLP on its strided
shard K/WORLD of Fashion-MNIST with the same per-process batch, optimizer
(SGD, momentum) and cosine schedule as the starling nodes, one intra-op
thread each (and OPENBLAS_NUM_THREADS=1, set by the caller).

Rank 0 evaluates on the test set every --eval-every seconds of wall time,
as each starling node does; when the accuracy reaches --target it records
the wall time since --t0 (the moment the caller launched the processes, so
that start-up counts on both sides) and the samples processed by all ranks,
and every rank stops at the next check (an all-reduce of one flag every
--check-every steps). Prints one JSON object on stdout.

With --rank R --master HOST:PORT the program is one rank only (the caller
starts WORLD of them, e.g. each in its own network namespace:
tools/bench/bench_compress.sh); rank 0 writes the JSON to --json-out.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_mlp import DATA_DIR, read_idx  # noqa: E402


def load(split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(DATA_DIR, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(DATA_DIR, f"{prefix}-labels-idx1-ubyte.gz"))
    x = images.reshape(images.shape[0], -1).astype(np.float32) / 255.0
    return x, labels.astype(np.int64)


def run(rank, args, master, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}",
                            rank=rank, world_size=args.world)
    xtr, ytr = load("train")
    xte, yte = load("test")
    # The training set's scalar mean and standard deviation, for both sets,
    # as starling's loader does.
    mean = xtr.mean(dtype=np.float64)
    sd = xtr.std(dtype=np.float64)
    xtr = torch.from_numpy(((xtr - mean) / sd).astype(np.float32))
    xte = torch.from_numpy(((xte - mean) / sd).astype(np.float32))
    ytr = torch.from_numpy(ytr)
    yte = torch.from_numpy(yte)
    shard = torch.arange(rank, xtr.shape[0], args.world)

    torch.manual_seed(args.seed)
    sizes = [int(s) for s in args.model.split(":")[1].split("-")]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr,
                          momentum=args.momentum)
    steps_per_epoch = math.ceil(len(shard) / args.batch)
    total = steps_per_epoch * args.epochs
    loss_fn = torch.nn.CrossEntropyLoss()

    step = 0
    reached = None
    last_eval = time.time()
    stop = torch.zeros(1)
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(args.seed * 1000003 + epoch)
        order = shard[torch.randperm(len(shard), generator=g)]
        for b in range(steps_per_epoch):
            idx = order[b * args.batch:(b + 1) * args.batch]
            for group in opt.param_groups:
                group["lr"] = 0.5 * args.lr * (1 + math.cos(math.pi * step / total))
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            step += 1
            if rank == 0 and reached is None and \
                    time.time() - last_eval >= args.eval_every:
                with torch.no_grad():
                    acc = (model(xte).argmax(1) == yte).float().mean().item()
                last_eval = time.time()
                if acc >= args.target:
                    reached = {
                        "time_to_target_s": time.time() - args.t0,
                        "samples_to_target": step * args.batch * args.world,
                        "steps_to_target": step,
                        "accuracy": acc,
                    }
                    stop[0] = 1
            if step % args.check_every == 0:
                flag = stop.clone()
                dist.all_reduce(flag)
                if flag.item() > 0:
                    break
        else:
            continue
        break
    if rank == 0:
        with torch.no_grad():
            final = (model(xte).argmax(1) == yte).float().mean().item()
        result = {"world": args.world, "steps": step, "final_accuracy": final,
                  "wall_s": time.time() - args.t0}
        result.update(reached or {"time_to_target_s": None})
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--model", default="mlp:784-256-128-10")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--target", type=float, default=0.87)
    p.add_argument("--eval-every", type=float, default=0.5)
    p.add_argument("--check-every", type=int, default=50)
    p.add_argument("--t0", type=float, default=None)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--rank", type=int, default=None,
                   help="run this rank only (with --master and --json-out)")
    p.add_argument("--master", default=None, help="HOST:PORT of rank 0")
    p.add_argument("--json-out", default=None, help="rank 0's result (JSON)")
    args = p.parse_args()
    if args.t0 is None:
        args.t0 = time.time()
    if args.rank is not None:
        if not args.master or not args.json_out:
            p.error("--rank needs --master HOST:PORT and --json-out FILE")
        run(args.rank, args, args.master, args.json_out)
        return
    out_path = f"/tmp/torch_ddp_{os.getpid()}.json"
    mp.spawn(run, args=(args, f"127.0.0.1:{args.port}", out_path),
             nprocs=args.world)
    with open(out_path) as f:
        print(f.read())
    os.unlink(out_path)


if __name__ == "__main__":
    main()
