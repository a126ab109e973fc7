#!/usr/bin/env python3
"""tcp_flood.py: an outsider's connection flood against a `starling node`
(tests/integration/test_node_flood.sh).

Opens TCP connections to HOST:PORT from the source addresses 127.0.0.2,
127.0.0.3, ... (--sources of them, round robin; Linux routes all of
127.0.0.0/8 on lo), at --rate new connections a second, and keeps every one
open and silent until the node closes it, when it opens another: what an
outsider without the cluster key does to hold a node's connection slots.
At most --max-open are open at once. Stops after --seconds (or on SIGTERM)
and prints one JSON object:

  {"opened": N, "closed_by_node": N, "connect_failed": N, "max_open": N,
   "held_median_s": S, "held_n": N, "seconds": S}

held_median_s is the median time the node held a connection it closed,
over those it held at least 0.5 s (held_n of them): its handshake deadline
(5 s, or 1 s under pressure), unless connections are evicted sooner. A
refusal closes at once, but on a loaded machine (sanitizer builds, two
cores) "at once" can take a tenth of a second, so the cut sits well above
that and well below the shortest deadline.
"""
import argparse
import errno
import json
import selectors
import signal
import socket
import sys
import time

HELD_AT_LEAST_S = 0.5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connect", required=True, help="HOST:PORT of the node")
    ap.add_argument("--sources", type=int, default=1,
                    help="source addresses 127.0.0.2 .. 127.0.0.(1+N)")
    ap.add_argument("--rate", type=float, default=300.0,
                    help="new connections a second")
    ap.add_argument("--max-open", type=int, default=600)
    ap.add_argument("--seconds", type=float, required=True)
    a = ap.parse_args()
    host, port = a.connect.rsplit(":", 1)
    target = (host, int(port))
    sources = ["127.0.0.%d" % (2 + i) for i in range(a.sources)]

    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    sel = selectors.DefaultSelector()
    held = []
    stats = {"opened": 0, "closed_by_node": 0, "connect_failed": 0,
             "max_open": 0}
    t0 = time.monotonic()
    next_src = 0
    budget = 0.0
    last = t0

    def drop(s):
        sel.unregister(s)
        s.close()

    while not stop[0] and time.monotonic() - t0 < a.seconds:
        now = time.monotonic()
        budget = min(budget + (now - last) * a.rate, a.rate)
        last = now
        while budget >= 1 and len(sel.get_map()) < a.max_open:
            budget -= 1
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.bind((sources[next_src], 0))
                next_src = (next_src + 1) % len(sources)
                rc = s.connect_ex(target)
            except OSError:
                s.close()
                stats["connect_failed"] += 1
                continue
            if rc not in (0, errno.EINPROGRESS):
                s.close()
                stats["connect_failed"] += 1
                continue
            sel.register(s, selectors.EVENT_READ, time.monotonic())
            stats["opened"] += 1
        stats["max_open"] = max(stats["max_open"], len(sel.get_map()))
        # Readable means the node closed it (or refused it): open another.
        for key, _ in sel.select(timeout=0.01):
            s = key.fileobj
            try:
                data = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                stats["closed_by_node"] += 1
                life = time.monotonic() - key.data
                if life >= HELD_AT_LEAST_S:
                    held.append(life)
                drop(s)
    held.sort()
    stats["held_median_s"] = round(held[len(held) // 2], 2) if held else None
    stats["held_n"] = len(held)
    stats["seconds"] = round(time.monotonic() - t0, 1)
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
