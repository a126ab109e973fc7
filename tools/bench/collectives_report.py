#!/usr/bin/env python3
"""collectives_report.py: the table of tools/bench/bench_collectives.sh.

Reads the JSON lines that `comm_probe SOCKET suite` (starling) and
tests/bench/gloo_collectives.py (gloo) print, one per rank, operation and
size, each with the CLOCK_MONOTONIC start and end of every measured round
of `iters` back-to-back operations; and `starling-bench crypto --json`.

A round's time per operation is (max end - min start over the ranks) /
iters; the figure is the median over the rounds (min in the JSON). busbw
is NCCL's: bytes / time, times 2(N-1)/N for an all-reduce.

"crypto limit" is the time the encryption alone needs on this machine for
the large path (above 64 KiB): every byte a member sends is sealed once and
opened once by the member it goes to, at the one-core stream seal and open
rates of `starling-bench crypto` (1 MiB frames), spread over
min(2N, cores) cores (each member seals and opens on the node's thread
pool), as `starling-bench ring` computes it:
  all-reduce (ring): N * 2(N-1)/N * S * (1/seal + 1/open) / cores
  broadcast (chain): (N-1) * S * (1/seal + 1/open) / cores
"of limit" is that time over the measured one (1.0: as fast as the
crypto allows; the issue's goal is 0.9).

With --cpu (bench_collectives.sh's measurement of the CPU seconds that all
the nodes, and all the programs, spend on one all-reduce of the largest
size) it also prints them beside the CPU seconds the crypto alone needs
for it: N * 2(N-1)/N * S * (1/seal + 1/open).

    collectives_report.py --crypto CRYPTO.json [--cpu CPU.json] [--cores N]
                          [--json] LINES...
"""
import argparse
import json
import os
import statistics
import sys

SMALL_BYTES = 64 << 10


def load_lines(paths):
    recs = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    recs.append(json.loads(line))
    return recs


def summarize(recs):
    """(system, op, bytes) -> {n, iters, median_s, min_s, rounds}."""
    groups = {}
    for r in recs:
        groups.setdefault((r["system"], r["op"], r["bytes"]), []).append(r)
    out = {}
    for key, ranks in groups.items():
        rounds = min(len(r["start"]) for r in ranks)
        per = []
        for i in range(rounds):
            t0 = min(r["start"][i] for r in ranks)
            t1 = max(r["end"][i] for r in ranks)
            per.append((t1 - t0) / ranks[0]["iters"])
        out[key] = {"n": ranks[0]["n"], "ranks": len(ranks),
                    "iters": ranks[0]["iters"], "rounds": rounds,
                    "median_s": statistics.median(per), "min_s": min(per)}
    return out


def crypto_rates(path):
    doc = json.load(open(path))
    rates = {r["op"]: r["mb_per_sec"] * 1e6 for r in doc["results"]
             if r["bytes"] >= (1 << 20)}
    return rates["stream seal"], rates["stream open"]


def crypto_limit_s(op, nbytes, n, seal, opn, cores):
    if nbytes <= SMALL_BYTES or op not in ("all_reduce", "broadcast"):
        return None
    moved = n * 2 * (n - 1) / n * nbytes if op == "all_reduce" else (n - 1) * nbytes
    return moved * (1 / seal + 1 / opn) / min(2 * n, cores)


def busbw(op, nbytes, n, t):
    if nbytes == 0:
        return None
    f = 2 * (n - 1) / n if op == "all_reduce" else 1.0
    return nbytes / t * f


def fmt_t(t):
    if t is None:
        return "-"
    return f"{t * 1e6:.0f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def fmt_size(b):
    if b == 0:
        return "-"
    if b >= 1 << 20:
        return f"{b >> 20} MiB"
    return f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"


def rows(summ, seal, opn, cores):
    keys = sorted({(op, b) for (_, op, b) in summ},
                  key=lambda k: (k[1], ["barrier", "broadcast", "all_reduce",
                                        "self_all_reduce"].index(k[0])))
    out = []
    for op, b in keys:
        st = summ.get(("starling", op, b))
        gl = summ.get(("gloo", op, b))
        n = (st or gl)["n"]
        row = {"op": op, "bytes": b, "n": n,
               "starling_s": st["median_s"] if st else None,
               "starling_min_s": st["min_s"] if st else None,
               "gloo_s": gl["median_s"] if gl else None,
               "gloo_min_s": gl["min_s"] if gl else None}
        row["starling_over_gloo"] = (row["starling_s"] / row["gloo_s"]
                                     if st and gl else None)
        row["starling_busbw"] = busbw(op, b, n, row["starling_s"]) if st else None
        row["gloo_busbw"] = busbw(op, b, n, row["gloo_s"]) if gl else None
        lim = crypto_limit_s(op, b, n, seal, opn, cores)
        row["crypto_limit_s"] = lim
        row["of_crypto_limit"] = lim / row["starling_s"] if lim and st else None
        out.append(row)
    return out


def cpu_summary(path, n, seal, opn):
    doc = json.load(open(path))
    b = doc["bytes"]
    doc["crypto_cpu_s"] = n * 2 * (n - 1) / n * b * (1 / seal + 1 / opn)
    return doc


def print_cpu(c, n):
    print(f"\nCPU per all-reduce of {fmt_size(c['bytes'])} ({c['reps']} "
          f"operations), all {n} members together: nodes {c['node_cpu_s']:.2f} s, "
          f"programs {c['program_cpu_s']:.2f} s; the crypto alone needs "
          f"{c['crypto_cpu_s']:.2f} s ({c['crypto_cpu_s'] / c['node_cpu_s']:.0%} "
          f"of the nodes')")


def print_table(table, seal, opn, cores):
    def f(x, spec):
        return "-" if x is None else format(x, spec)
    print(f"crypto: stream seal {seal / 1e6:.0f} MB/s, open {opn / 1e6:.0f} MB/s "
          f"on one core (1 MiB frames); {cores} cores")
    hdr = ("op", "size", "gloo", "starling", "st/gloo", "gloo busbw",
           "st busbw", "crypto limit", "of limit")
    print("%-16s %7s %10s %10s %8s %11s %11s %12s %8s" % hdr)
    print("%-16s %7s %10s %10s %8s %11s %11s %12s %8s" %
          ("", "", "median", "median", "time", "MB/s", "MB/s", "", ""))
    for r in table:
        print("%-16s %7s %10s %10s %8s %11s %11s %12s %8s" % (
            r["op"], fmt_size(r["bytes"]), fmt_t(r["gloo_s"]),
            fmt_t(r["starling_s"]), f(r["starling_over_gloo"], ".2f"),
            f(r["gloo_busbw"] and r["gloo_busbw"] / 1e6, ".0f"),
            f(r["starling_busbw"] and r["starling_busbw"] / 1e6, ".0f"),
            fmt_t(r["crypto_limit_s"]), f(r["of_crypto_limit"], ".2f")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--crypto", required=True,
                    help="`starling-bench crypto --json` output")
    ap.add_argument("--cores", type=int, default=os.cpu_count(),
                    help="cores the crypto may use (default: this machine's)")
    ap.add_argument("--cpu", help="bench_collectives.sh's CPU measurement")
    ap.add_argument("--json", action="store_true", help="one JSON object")
    ap.add_argument("lines", nargs="+", help="files of JSON lines")
    args = ap.parse_args()
    try:
        seal, opn = crypto_rates(args.crypto)
        summ = summarize(load_lines(args.lines))
        n = max(s["n"] for s in summ.values())
        cpu = cpu_summary(args.cpu, n, seal, opn) if args.cpu else None
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"collectives_report: cannot read the inputs: {e}")
    table = rows(summ, seal, opn, args.cores)
    if args.json:
        print(json.dumps({"seal_bytes_per_s": seal, "open_bytes_per_s": opn,
                          "cores": args.cores, "rows": table, "cpu": cpu}))
    else:
        print_table(table, seal, opn, args.cores)
        if cpu:
            print_cpu(cpu, n)


if __name__ == "__main__":
    main()
