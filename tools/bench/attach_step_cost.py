#!/usr/bin/env python3
"""attach_step_cost.py: what one step boundary (starling.Node.step(), i.e.
st_client_step through ctypes) costs a PyTorch program, by what it served,
for tools/bench/bench_attach_overhead.sh.

Attaches a model to the node at --socket (the example's CNN, or with
--floats N one float32 parameter of N elements), then for --seconds calls
node.step() after --work-us microseconds of sleep (standing in for the
optimizer step, and leaving the cores to the node), timing each call with
perf_counter_ns and sorting it by the bits it returned:

  none       nothing to do: one shared-memory read (plus Python and ctypes)
  snapshot   the parameters copied into the shared segment for the node
  apply      an averaging correction added to the parameters
  both       snapshot and apply in the same boundary

and prints, for each, the count, median and 90th percentile in
microseconds, beside two references measured in the same process on the
same number of floats: one parameter copy (numpy.copyto) and one
correction (x += y). An exchange should cost at most about one copy beyond
the no-op. With --serve the program only steps (a partner for the node at
the other end of the exchanges) and prints nothing but a summary line.
JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict, List

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
from pytorch_fmnist import Net  # noqa: E402  (the example's CNN)

import starling  # noqa: E402  (PYTHONPATH=client/python, or the example's fallback)


class Flat(torch.nn.Module):
    """One float32 parameter of n elements."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n) * 0.01)


def quantiles(xs: List[float]) -> Dict[str, float]:
    if not xs:
        return {"count": 0, "median_us": None, "p90_us": None}
    xs = sorted(xs)
    return {
        "count": len(xs),
        "median_us": statistics.median(xs),
        "p90_us": xs[min(len(xs) - 1, int(0.9 * len(xs)))],
    }


def reference(n: int, reps: int = 50) -> Dict[str, float]:
    """Median microseconds of one copy and one x += y on n float32s."""
    src = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    dst = np.empty_like(src)
    copy, add = [], []
    for _ in range(reps):
        t = time.perf_counter_ns()
        np.copyto(dst, src)
        copy.append((time.perf_counter_ns() - t) / 1e3)
        t = time.perf_counter_ns()
        dst += src
        add.append((time.perf_counter_ns() - t) / 1e3)
    return {"copy_us": statistics.median(copy), "add_us": statistics.median(add)}


def run(node: starling.Node, seconds: float, work_us: float) -> Dict[str, list]:
    names = {0: "none", 1: "apply", 2: "snapshot", 3: "both"}
    got: Dict[str, list] = {k: [] for k in ("none", "apply", "snapshot", "both")}
    got["state"] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if work_us > 0:
            time.sleep(work_us / 1e6)
        t = time.perf_counter_ns()
        bits = node.step()
        dt = (time.perf_counter_ns() - t) / 1e3
        if bits & starling.DID_STATE:
            got["state"].append(dt)
        else:
            got[names[bits & 3]].append(dt)
    return got


def pending_floor(node: starling.Node, reps: int = 20000) -> float:
    """Median microseconds of node.pending(): one ctypes call that reads one
    shared word, the floor under which Python cannot call the library."""
    xs = []
    for _ in range(reps):
        t = time.perf_counter_ns()
        node.pending()
        xs.append((time.perf_counter_ns() - t) / 1e3)
    return statistics.median(xs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--floats", type=int, default=0, help="0: the example's CNN")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--work-us", type=float, default=1000)
    p.add_argument("--serve", action="store_true", help="only step (a partner)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    model = Flat(a.floats) if a.floats > 0 else Net()
    node = starling.attach(model, socket=a.socket)
    got = run(node, a.seconds, a.work_us)
    floor = pending_floor(node)
    node.detach()
    out = {
        "floats": node.num_floats,
        "bytes": 4 * node.num_floats,
        "steps": sum(len(v) for v in got.values()),
        "pending_us": floor,
        **{k: quantiles(v) for k, v in got.items()},
        **reference(node.num_floats),
    }
    if a.json:
        print(json.dumps(out))
    elif a.serve:
        print(f"served {out['steps']} steps", flush=True)
    else:
        print(
            f"{out['floats']} floats ({out['bytes'] / 1e6:.2f} MB), {out['steps']} steps"
        )
        for k in ("none", "snapshot", "apply", "both", "state"):
            q = out[k]
            if q["count"]:
                print(
                    f"  {k:9s} {q['count']:7d}  median {q['median_us']:10.2f} us"
                    f"  p90 {q['p90_us']:10.2f} us"
                )
        print(
            f"  one copy {out['copy_us']:.2f} us, one x += y {out['add_us']:.2f} us, "
            f"node.pending() {out['pending_us']:.2f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
