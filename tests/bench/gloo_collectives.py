#!/usr/bin/env python3
"""gloo_collectives.py: the PyTorch twin of `comm_probe SOCKET suite`, for
tools/bench/bench_collectives.sh: WORLD processes on this machine joined by
torch.distributed with the gloo backend over loopback (UNENCRYPTED: gloo has
no encryption), one intra-op thread each, measuring what the starling side
measures in the same order: dist.barrier(), then for each size
dist.broadcast(src=0) and dist.all_reduce(SUM) of that many bytes of
float32.

Each operation and size: one warm-up round, then --rounds rounds of K
back-to-back operations after a dist.barrier() (K = --iters for barriers,
and --iters capped to 4 MiB / size, at least 1, for the rest), every result
checked exactly (rank + 1 everywhere before an all-reduce round, so that
after k sums every element is n(n+1)/2 * n^(k-1); the round's number at the
root of a broadcast). Prints one JSON line per rank, operation and size,
with every measured round's time.monotonic() (CLOCK_MONOTONIC, the clock
comm_probe reads) at its start and end; bench_collectives.sh turns both
systems' lines into one table (tools/bench/collectives_report.py).

    gloo_collectives.py [--world 4] [--sizes 4096,1048576,67108864]
                        [--rounds 7] [--iters 20]
"""
import argparse
import json
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CAP_BYTES = 4 << 20


def iters_for(op, nbytes, iters):
    if op == "barrier":
        return iters
    return max(1, min(iters, CAP_BYTES // max(nbytes, 1)))


def fill(op, v, rank, rnd):
    if op == "broadcast":
        v.fill_(float(rnd + 1) if rank == 0 else -1.0)
    else:
        v.fill_(float(rank + 1))


def want(op, n, rnd, k):
    if op == "broadcast":
        return float(rnd + 1)
    return float(n * (n + 1) // 2 * n ** (k - 1))


def one(op, nbytes, args, rank):
    """One operation and size: warm-up, measured rounds, the JSON record."""
    k = iters_for(op, nbytes, args.iters)
    v = torch.empty(max(nbytes // 4, 1), dtype=torch.float32)
    starts, ends = [], []
    for rnd in range(args.rounds + 1):
        fill(op, v, rank, rnd)
        dist.barrier()
        t0 = time.monotonic()
        for _ in range(k):
            if op == "barrier":
                dist.barrier()
            elif op == "broadcast":
                dist.broadcast(v, src=0)
            else:
                dist.all_reduce(v, op=dist.ReduceOp.SUM)
        t1 = time.monotonic()
        if op != "barrier":
            w = want(op, args.world, rnd, k)
            bad = int((v != w).sum())
            if bad:
                raise SystemExit(f"gloo_collectives: {op} of {nbytes} bytes on "
                                 f"rank {rank}: {bad} elements differ from {w}")
        if rnd > 0:
            starts.append(t0)
            ends.append(t1)
    return {"system": "gloo", "op": op, "bytes": 0 if op == "barrier" else nbytes,
            "n": args.world, "rank": rank, "iters": k, "start": starts,
            "end": ends}


def run(rank, args, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.world)
    records = [one("barrier", 0, args, rank)]
    for nbytes in args.sizes:
        for op in ("broadcast", "all_reduce"):
            records.append(one(op, nbytes, args, rank))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sizes_arg(text):
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(s < 4 or s % 4 for s in sizes):
        raise argparse.ArgumentTypeError(
            f"'{text}': byte counts, multiples of 4, separated by commas")
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--world", type=int, default=4, help="processes (default 4)")
    ap.add_argument("--sizes", type=sizes_arg, default=[4096, 1 << 20, 64 << 20],
                    help="bytes, comma-separated (default 4096,1048576,67108864)")
    ap.add_argument("--rounds", type=int, default=7,
                    help="measured rounds per operation and size (default 7)")
    ap.add_argument("--iters", type=int, default=20,
                    help="operations per round, capped to 4 MiB / size (default 20)")
    args = ap.parse_args()
    if args.world < 2 or args.rounds < 1 or args.iters < 1:
        ap.error("--world is at least 2, --rounds and --iters at least 1")
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(run, args=(args, free_port(), out_dir), nprocs=args.world)
        for r in range(args.world):
            with open(os.path.join(out_dir, f"rank{r}.json")) as f:
                sys.stdout.write(f.read())


if __name__ == "__main__":
    main()
