#!/usr/bin/env python3
"""sync_sgd_member.py: one member of tools/bench/bench_sync_sgd.sh: trains
an MLP on synthetic data with synchronous data-parallel SGD, either through
its starling node (starling.SyncDataParallel, --mode starling --socket S)
or as one rank of PyTorch DistributedDataParallel over gloo (--mode ddp
--rank R --port P), with the same model, batch, bucket size and optimizer
(plain SGD), one intra-op thread. After --warmup steps and a barrier, it
times --steps steps and prints one JSON object: the seconds, and the
samples/s of the whole group (members x batch x steps / seconds).
"""
import argparse
import json
import os
import sys
import time

import torch


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["starling", "ddp", "alone"], required=True)
    ap.add_argument("--socket", help="the node's control socket (starling)")
    ap.add_argument("--rank", type=int, default=0, help="this rank (ddp)")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--port", type=int, default=0, help="rendezvous port (ddp)")
    ap.add_argument("--model", default="784-512-512-10")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--bucket-bytes", type=int, default=1 << 20)
    a = ap.parse_args()
    torch.set_num_threads(1)
    sizes = [int(s) for s in a.model.split("-")]
    torch.manual_seed(0)
    model = mlp(sizes)
    g = torch.Generator().manual_seed(a.rank + 1)
    xs = [torch.randn(a.batch, sizes[0], generator=g) for _ in range(4)]
    ys = [torch.randint(0, sizes[-1], (a.batch,), generator=g) for _ in range(4)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    world = a.world
    if a.mode == "starling":
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..",
                                        "client", "python"))
        import starling

        comm = starling.open_comm(a.socket, timeout=120)
        sync = starling.SyncDataParallel(model, comm, bucket_bytes=a.bucket_bytes,
                                         timeout=120)
        world = sync.size
        fwd = model

        def step():
            sync.step(opt)

        def barrier():
            comm.barrier(group=sync.group)
    elif a.mode == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}",
                                rank=a.rank, world_size=a.world)
        fwd = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=a.bucket_bytes / 2**20)

        def step():
            opt.step()

        barrier = dist.barrier
    else:
        world = 1
        fwd = model

        def step():
            opt.step()

        def barrier():
            pass

    def one(k):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(fwd(xs[k % 4]), ys[k % 4]).backward()
        step()

    for k in range(a.warmup):
        one(k)
    barrier()
    t0 = time.monotonic()
    for k in range(a.steps):
        one(k)
    barrier()
    dt = time.monotonic() - t0
    print(json.dumps({
        "mode": a.mode, "members": world, "batch": a.batch, "steps": a.steps,
        "seconds": round(dt, 4),
        "samples_per_s": round(world * a.batch * a.steps / dt, 1),
        "params": sum(p.numel() for p in model.parameters()),
    }))


if __name__ == "__main__":
    main()
