"""test_collectives.py: the package's collectives (starling.Comm,
docs/collectives.md) across three real `starling node --attach` processes
on 127.0.0.1, one Python thread per node, each with its own communicator
on its own node, calling at the same time. Every member's operands are a
function of its rank, so every member checks its results against float64
values computed here.

  - all-reduce: sum, mean, min and max of float32 and float64 numpy arrays
    (small: the latency path), bit-identical on every member; a float32
    torch tensor of 256 KiB (the ring) in place through its own memory; a
    non-contiguous float64 tensor through a host copy; a CUDA tensor (when
    there is one); a Python list and a float;
  - reduce to rank 1 (the others keep their data), broadcast from rank 2
    (small and > 64 KiB), barrier, an explicit group of two members;
  - refusals before the node is asked (dtype, op, root, timeout,
    read-only array, a malformed group);
  - the shared segment ("collectives shm"): sealed, operands in it at an
    offset, the socket path beside it, out-of-range requests refused; the
    library's large operands use it, and it falls back to the socket with
    a node from before the segment;
  - a count mismatch: every member raises CollectiveMismatch, naming both
    calls;
  - a member that never comes: the others' barrier raises
    CollectiveTimeout (or MemberFailed, relayed) naming it;
  - publish and fetch: a tensor published on one node (by a program that
    then went away) fetched by the others, large and small, again after
    it is published anew; two programs fetching 256 MiB at once from one
    publisher; NotPublished, a size that differs, unpublish, the node's
    bound on names;
  - NodeUnavailable with no node, and once the node went away;
  - members() after an operation on an explicit group leaves "all" in
    step;
  - calls over lists that differ (crossed lists, on both paths; views of
    "all" that differ) fail on every member instead of hanging, with no
    timeout; a timeout under a millisecond is one; a node that never
    answers closes the communicator.
"""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
import torch

import starling
from conftest import SANITIZED, SLOW, Cluster

N = 3
OPS = ["sum", "mean", "min", "max"]


def value(rank: int, n: int) -> np.ndarray:
    """Member rank's operand of n elements, in float64 (as comm_probe's)."""
    i = np.arange(n, dtype=np.int64)
    return ((rank * 7919 + i * 104729) % 1000) / 1000.0 - 0.5 + rank


def expect(op: str, dtype: type, n: int) -> np.ndarray:
    """The reduction over all N members, in float64, of their operands as
    they are in dtype."""
    xs = np.stack([value(r, n).astype(dtype).astype(np.float64) for r in range(N)])
    return {
        "sum": xs.sum(0),
        "mean": xs.sum(0) / N,
        "min": xs.min(0),
        "max": xs.max(0),
    }[op]


class Members:
    """The three nodes, and one open communicator on each (index k: node
    k's), with its rank in the group "all"."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.comms: List[Any] = []
        self.ranks: List[int] = []
        self.ids: List[str] = []

    def run(
        self, fn: Callable[[Any, int], Any], who: Optional[List[int]] = None
    ) -> Dict[int, Any]:
        """fn(comm, rank) on a thread per member in who (the indexes of the
        nodes; None: all), all at once; their results (or exceptions) by
        rank. Fails when one has not returned in 60 s (every call here has
        a timeout)."""
        out: Dict[int, Any] = {}

        def body(k: int) -> None:
            try:
                out[self.ranks[k]] = fn(self.comms[k], self.ranks[k])
            except Exception as e:  # handed to the test
                out[self.ranks[k]] = e

        threads = [
            threading.Thread(target=body, args=(k,), daemon=True)
            for k in (range(N) if who is None else who)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60 * SLOW)
            if t.is_alive():
                pytest.fail("a collective did not return in 60 s" + self.cluster.logs())
        return out

    def ok(self, fn: Callable[[Any, int], Any]) -> Dict[int, Any]:
        """run(), failing on the first member that raised."""
        out = self.run(fn)
        for r, v in sorted(out.items()):
            if isinstance(v, Exception):
                pytest.fail(f"rank {r}: {type(v).__name__}: {v}" + self.cluster.logs())
        return out


@pytest.fixture(scope="module")
def members(
    cluster_key: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Members]:
    """Three `starling node --attach`, each given a model by a program that
    attached and detached (a node goes on the network with its first
    model, and then stays on it, idle), and a communicator on each."""
    c = Cluster(tmp_path_factory.mktemp("coll"), cluster_key)
    m = Members(c)
    try:
        for k in range(N):
            n = c.node(join=c.nodes[0].address() if k else None)
            model = torch.nn.Linear(2, 2)
            with starling.attach(model, socket=n.sock, timeout=30 * SLOW):
                pass
        m.comms = [starling.open_comm(n.sock, timeout=30) for n in c.nodes]
        deadline = time.monotonic() + 30 * SLOW
        while True:
            seen = [comm.members() for comm in m.comms]
            if all(len(ids) == N for ids, _ in seen):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"the nodes never saw {N} members: {seen}" + c.logs())
            time.sleep(0.1)
        assert all(ids == seen[0][0] for ids, _ in seen), seen
        m.ids = seen[0][0]
        m.ranks = [rank for _, rank in seen]
        assert sorted(m.ranks) == list(range(N))
        assert m.ids == sorted(m.ids)  # ranks are the ids in sorted order
        yield m
    finally:
        for comm in m.comms:
            comm.close()
        c.close()


def test_all_reduce_numpy(members: Members) -> None:
    """Every op on float32 and float64 arrays: the float64 reference on
    every member, and the same bits everywhere."""

    def fn(comm: Any, rank: int) -> Dict[Any, np.ndarray]:
        got = {}
        for dtype in (np.float32, np.float64):
            for op in OPS:
                x = value(rank, 1000).astype(dtype).reshape(10, 100)
                assert comm.all_reduce(x, op=op) is x  # in place
                assert comm.last_group() == (rank, N)
                got[(dtype, op)] = x
        return got

    out = members.ok(fn)
    for (dtype, op), x0 in out[0].items():
        tol = 1e-12 if dtype is np.float64 else 1e-6
        want = expect(op, dtype, 1000).reshape(10, 100)
        for r in range(N):
            x = out[r][(dtype, op)]
            assert x.dtype == dtype and x.shape == (10, 100)
            np.testing.assert_allclose(x, want, rtol=tol, atol=tol, err_msg=op)
            assert x.tobytes() == x0.tobytes(), f"{op} {dtype}: rank {r} differs"


def test_all_reduce_torch_and_python(members: Members) -> None:
    """A 256 KiB float32 tensor (the ring path) in its own memory; a
    transposed float64 tensor and a CUDA one through a host copy; a list
    and a float, whose results are returned."""
    big = 65536  # float32: 256 KiB, above the 64 KiB latency path
    cuda = torch.cuda.is_available()

    def fn(comm: Any, rank: int) -> Dict[str, Any]:
        t = torch.from_numpy(value(rank, big).astype(np.float32))
        ptr = t.data_ptr()
        assert comm.all_reduce(t, op="mean") is t
        assert t.data_ptr() == ptr
        tt = torch.from_numpy(value(rank, 600).reshape(20, 30)).t()  # not contiguous
        assert not tt.is_contiguous()
        comm.all_reduce(tt, op="max")
        got = {"big": t.numpy().copy(), "tt": tt.numpy().copy()}
        if cuda:
            g = torch.from_numpy(value(rank, 5000).astype(np.float32)).cuda()
            assert comm.all_reduce(g, op="sum") is g and g.is_cuda
            got["cuda"] = g.cpu().numpy()
        got["list"] = comm.all_reduce([float(rank), 2.5, -float(rank)], op="sum")
        got["float"] = comm.all_reduce(float(rank), op="min")
        return got

    out = members.ok(fn)
    for r in range(N):
        np.testing.assert_allclose(
            out[r]["big"], expect("mean", np.float32, big), rtol=1e-6, atol=1e-6
        )
        want_tt = expect("max", np.float64, 600).reshape(20, 30).T
        np.testing.assert_array_equal(out[r]["tt"], want_tt)
        if cuda:
            np.testing.assert_allclose(
                out[r]["cuda"], expect("sum", np.float32, 5000), rtol=1e-6, atol=1e-5
            )
        assert out[r]["list"] == [0.0 + 1 + 2, 2.5 * N, -3.0]
        assert out[r]["float"] == 0.0
        assert out[r]["big"].tobytes() == out[0]["big"].tobytes()


def test_reduce_broadcast_barrier(members: Members) -> None:
    """reduce to rank 1 (the others' data unchanged; small, and large through
    the shared segment), broadcast from rank 2
    of a small and a large tensor, a barrier."""

    def fn(comm: Any, rank: int) -> Dict[str, Any]:
        comm.barrier()
        d = value(rank, 50)
        assert comm.reduce(d, root=1, op="max") is d
        big = value(rank, 20000)  # 160 KB: the shared segment and the ring
        assert comm.reduce(big, root=1, op="sum") is big
        small = torch.from_numpy(value(rank, 10).astype(np.float32))
        comm.broadcast(small, root=2)
        large = np.ascontiguousarray(value(rank, 40000).astype(np.float32))
        comm.broadcast(large, root=2)  # 160 KB
        comm.barrier(timeout=30)
        return {"d": d, "big": big, "small": small.numpy(), "large": large}

    out = members.ok(fn)
    for r in range(N):
        want = expect("max", np.float64, 50) if r == 1 else value(r, 50)
        np.testing.assert_array_equal(out[r]["d"], want)
        if r == 1:
            np.testing.assert_allclose(out[r]["big"], expect("sum", np.float64, 20000),
                                       rtol=1e-12)
        else:  # the others keep their operand, though the node reduced in place
            np.testing.assert_array_equal(out[r]["big"], value(r, 20000))
        np.testing.assert_array_equal(out[r]["small"], value(2, 10).astype(np.float32))
        np.testing.assert_array_equal(
            out[r]["large"], value(2, 40000).astype(np.float32)
        )


def test_group_of_two(members: Members) -> None:
    """A group given by its ids: ranks are the group's sorted order."""
    pair = [members.ids[2], members.ids[0]]  # in any order
    who = [k for k in range(N) if members.ranks[k] in (0, 2)]

    def fn(comm: Any, rank: int) -> Any:
        x = np.full(4, float(rank), dtype=np.float64)
        comm.all_reduce(x, group=pair, timeout=30)
        return x, comm.last_group()

    out = members.run(fn, who=who)
    assert out[0][0].tolist() == [2.0] * 4 and out[0][1] == (0, 2), out
    assert out[2][0].tolist() == [2.0] * 4 and out[2][1] == (1, 2), out


def test_push_pull_notify_wait(members: Members) -> None:
    """Point to point: rank 0 pushes to ranks 1 and 2 (a large tensor, over
    the pipelined path, and two small ones of one name, which arrive in
    order); rank 2 notifies rank 0, which waits for it; rank 0 notifies
    rank 1 before rank 1 waits (the node keeps it)."""
    ids = members.ids
    big = np.arange(100000, dtype=np.float32) * 0.5  # 400 kB: the large path

    def fn(comm: Any, rank: int) -> Any:
        if rank == 0:
            comm.push(ids[1], "weights", big, timeout=30)
            comm.push(ids[2], "step", np.array([1.0]), timeout=30)
            comm.push(ids[2], "step", np.array([2.0]), timeout=30)
            comm.wait(ids[2], "done", timeout=30)
            comm.notify(ids[1], "go", timeout=30)
            return "waited"
        if rank == 1:
            got = comm.pull(ids[0], "weights", np.zeros(100000, np.float32))
            time.sleep(0.5)  # rank 0's notify comes first
            comm.wait(ids[0], "go", timeout=30)
            return got
        got = [
            comm.pull(ids[0], "step", np.zeros(1), timeout=30)[0] for _ in range(2)
        ]
        comm.notify(ids[0], "done", timeout=30)
        return got

    out = members.ok(fn)
    np.testing.assert_array_equal(out[1], big)
    assert out[2] == [1.0, 2.0] and out[0] == "waited", out


def test_push_names_are_apart(members: Members) -> None:
    """Pushes of different names do not wait for each other: rank 0 pushes
    "a" and "b" from two threads (two communicators on its node), rank 1
    pulls "b" first, then "a"."""
    ids = members.ids
    k0 = members.ranks.index(0)
    extra = starling.open_comm(members.cluster.nodes[k0].sock, timeout=30)
    try:

        def fn(comm: Any, rank: int) -> Any:
            if rank == 0:
                t = threading.Thread(
                    target=lambda: extra.push(ids[1], "b", [2.0], timeout=30)
                )
                t.start()
                comm.push(ids[1], "a", [1.0], timeout=30)
                t.join(60)
                return None
            if rank == 1:
                b = comm.pull(ids[0], "b", [0.0], timeout=30)
                a = comm.pull(ids[0], "a", [0.0], timeout=30)
                return a + b
            return None

        out = members.ok(fn)
        assert out[1] == [1.0, 2.0], out
    finally:
        extra.close()


def test_push_pull_failures(members: Members) -> None:
    """A pull of another size than the push fails, naming both calls (the
    push returned once sent);
    a pull that nobody pushes to times out naming the peer; bad peers and
    names are refused, naming them."""
    ids = members.ids

    def fn(comm: Any, rank: int) -> Any:
        if rank == 0:
            comm.push(ids[1], "m", np.zeros(10, np.float32), timeout=10 * SLOW)
        elif rank == 1:
            comm.pull(ids[0], "m", np.zeros(20, np.float32), timeout=10 * SLOW)

    out = members.run(fn, who=[members.ranks.index(0), members.ranks.index(1)])
    assert out[0] is None and isinstance(out[1], starling.CollectiveMismatch), out
    text = str(out[1])
    assert "of 10 float32" in text and "of 20 float32" in text, text
    comm = members.comms[members.ranks.index(0)]
    with pytest.raises(starling.CollectiveTimeout, match=ids[2][:12]):
        comm.pull(ids[2], "never", np.zeros(3), timeout=1)
    cases = [
        (lambda: comm.push(ids[0], "x", [1.0]), "is this node"),
        (lambda: comm.push("zz", "x", [1.0]), "32 hex digits"),
        (lambda: comm.push(ids[1], "", [1.0]), "1 to 128 bytes"),
        (lambda: comm.notify(ids[1], "n" * 129), "1 to 128 bytes"),
        (lambda: comm.wait("ab" * 16, "x", timeout=5), "not an alive member"),
    ]
    for call, word in cases:
        with pytest.raises(starling.CollectiveError, match=word):
            call()
    # The pair is in step again: a push and its pull go through.
    out = members.run(
        lambda c, rank: c.push(ids[1], "m", [5.0], timeout=30)
        if rank == 0
        else c.pull(ids[0], "m", [0.0], timeout=30),
        who=[members.ranks.index(0), members.ranks.index(1)],
    )
    assert out[1] == [5.0], out


def recv_exact(s: socket.socket, n: int) -> bytes:
    """n bytes from s. (recv with MSG_WAITALL may return fewer on a socket
    with a timeout, which Python makes non-blocking: a test that took them
    as all once answered before the request had all come, and the library
    met a closed socket.)"""
    out = b""
    while len(out) < n:
        got = s.recv(n - len(out))
        if not got:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += got
    return out


def raw_session(path: str) -> socket.socket:
    """A collectives session on the control socket, without the library
    (docs/collectives.md, "The control-socket protocol")."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10 * SLOW)
    s.connect(path)
    s.sendall(b"collectives\n")
    assert recv_exact(s, 6) == b"ready\n"
    return s


def raw_request(s: socket.socket, req: Any, payload: bytes = b"") -> Dict[str, Any]:
    head = req if isinstance(req, bytes) else json.dumps(req).encode()
    s.sendall(struct.pack("<I", len(head)) + head + payload)
    n = struct.unpack("<I", recv_exact(s, 4))[0]
    reply = json.loads(recv_exact(s, n))
    if reply.get("bytes"):
        recv_exact(s, reply["bytes"])
    return reply


def test_p2p_requests_checked_by_the_node(members: Members) -> None:
    """What the library would never send, sent raw: each is refused with a
    sentence naming the field, and the session goes on (a header without
    its "bytes" ends it)."""
    k0 = members.ranks.index(0)
    me, other = members.ids[0], members.ids[1]
    base = {"dtype": "float32", "timeout_ms": 1000, "bytes": 0}
    cases = [
        ({"op": "send", "count": 0}, "push, pull, notify, wait, publish"),
        ({"op": "push", "peer": other, "count": 0}, '"name"'),
        ({"op": "push", "peer": me, "name": "x", "count": 0}, "is this node"),
        ({"op": "pull", "peer": "xyz", "name": "x", "count": 1}, '"peer"'),
        ({"op": "pull", "peer": other, "name": "n" * 129, "count": 1}, "1 to 128"),
        ({"op": "notify", "peer": other, "name": "x", "count": 1}, "no data"),
        ({"op": "push", "peer": other, "name": "x", "count": 2}, "a push carries"),
    ]
    with raw_session(members.cluster.nodes[k0].sock) as s:
        for req, word in cases:
            reply = raw_request(s, {**base, **req})
            assert reply["ok"] is False and reply["result"] == "invalid", (req, reply)
            assert word in reply["error"], (req, reply)
        reply = raw_request(s, b"{not json")
        assert reply["ok"] is False and '"bytes"' in reply["error"], reply
        assert s.recv(1) == b""  # and the node closed the session
    # The node serves the others as before.
    members.ok(lambda comm, rank: comm.barrier(timeout=30))


def test_publish_fetch(members: Members) -> None:
    """A program on node 0 publishes a large and a small tensor and goes
    away; the others fetch them (at the same time, with no call on node
    0), exactly; published anew, the next fetch sees the new values; the
    publisher's node counts what it served."""
    k0 = members.ranks.index(0)
    sock = members.cluster.nodes[k0].sock
    big = np.arange(300000, dtype=np.float32) * 0.25  # 1.2 MB: the chain
    with starling.open_comm(sock, timeout=30) as pub:
        pub.publish("weights", big)
        pub.publish("step", [7.0])
    served = members.cluster.nodes[k0].status()["collectives"]["fetches_served"]

    def fetch(comm: Any, rank: int) -> Any:
        if rank == 0:
            return None
        w = comm.fetch(members.ids[0], "weights", np.zeros(300000, np.float32))
        return w, comm.fetch(members.ids[0], "step", [0.0], timeout=30)

    for out in (members.ok(fetch), members.ok(fetch)):
        for r in (1, 2):
            np.testing.assert_array_equal(out[r][0], big)
            assert out[r][1] == [7.0], out[r][1]
    with starling.open_comm(sock, timeout=30) as pub:
        pub.publish("step", [8.0])
    assert members.comms[members.ranks.index(1)].fetch(
        members.ids[0], "step", [0.0], timeout=30
    ) == [8.0]
    st = members.cluster.nodes[k0].status()["collectives"]
    assert st["fetches_served"] - served == 9, st
    assert st["published"] == 2 and st["published_bytes"] == 1200008, st


def test_fetches_at_once(members: Members) -> None:
    """Two programs on one node fetch 256 MiB from another at once: the
    publisher's send queue holds one fetch at a time (busy beyond); the
    library asks again, and both get every byte."""
    k0, k1 = members.ranks.index(0), members.ranks.index(1)
    n = 64 << 20  # float32: 256 MiB
    want = (np.arange(n, dtype=np.int64) % 999983).astype(np.float32)  # exact
    with starling.open_comm(members.cluster.nodes[k0].sock, timeout=30) as pub:
        pub.publish("huge", want)
    comms = [starling.open_comm(members.cluster.nodes[k1].sock) for _ in range(2)]
    got: Dict[int, Any] = {}

    def body(i: int) -> None:
        try:
            got[i] = comms[i].fetch(
                members.ids[0], "huge", np.empty(n, np.float32), timeout=120 * SLOW
            )
        except Exception as e:  # handed to the test
            got[i] = e

    try:
        threads = [threading.Thread(target=body, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180 * SLOW)
        for i in range(2):
            assert isinstance(got.get(i), np.ndarray), got.get(i)
            assert np.array_equal(got[i], want)
            del got[i]
    finally:
        for c in comms:
            c.close()
        with starling.open_comm(members.cluster.nodes[k0].sock, timeout=30) as pub:
            pub.unpublish("huge")


def test_fetch_failures(members: Members) -> None:
    """Nothing published: NotPublished naming the name; another size than
    the published one: an error naming both calls; unpublish forgets (a
    second one raises NotPublished); names past the node's 1024 are
    refused, saying so; bad names and peers are refused before the node."""
    k0 = members.ranks.index(0)
    me = members.comms[members.ranks.index(1)]
    have = members.cluster.nodes[k0].status()["collectives"]["published"]
    with starling.open_comm(members.cluster.nodes[k0].sock, timeout=30) as pub:
        pub.publish("m", np.zeros(10, np.float32))
        with pytest.raises(starling.NotPublished, match='"absent"'):
            me.fetch(members.ids[0], "absent", [0.0], timeout=30)
        with pytest.raises(starling.CollectiveError, match="of 11 float32") as e:
            me.fetch(members.ids[0], "m", np.zeros(11, np.float32), timeout=30)
        assert "of 10 float32" in str(e.value), e.value
        with pytest.raises(starling.CollectiveError, match="float64"):
            me.fetch(members.ids[0], "m", np.zeros(10), timeout=30)
        pub.unpublish("m")
        with pytest.raises(starling.NotPublished):
            pub.unpublish("m")
        with pytest.raises(starling.NotPublished, match='"m"'):
            me.fetch(members.ids[0], "m", np.zeros(10, np.float32), timeout=30)
        for i in range(1024 - have):
            pub.publish(f"n{i}", [float(i)])
        with pytest.raises(starling.CollectiveError, match="at most 1024"):
            pub.publish("one-too-many", [1.0])
        assert me.fetch(members.ids[0], "n7", [0.0], timeout=30) == [7.0]
        for i in range(1024 - have):
            pub.unpublish(f"n{i}")
        with pytest.raises(starling.CollectiveError, match="1 to 128 bytes"):
            pub.publish("x" * 129, [1.0])
        with pytest.raises(starling.CollectiveError, match="32 hex digits"):
            me.fetch("zz", "m", [0.0])
    st = members.cluster.nodes[k0].status()["collectives"]
    assert st["published"] == have and st["fetches_missing"] >= 2, st


def shm_session(path: str) -> Any:
    """A raw session that asks for the shared segment: the socket, and the
    segment's descriptor that came with "ready"."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10 * SLOW)
    s.connect(path)
    s.sendall(b"collectives shm\n")
    msg, fds, _, _ = socket.recv_fds(s, 6, 1)
    assert msg == b"ready\n" and len(fds) == 1, (msg, fds)
    return s, fds[0]


def test_shared_segment(members: Members) -> None:
    """"collectives shm" hands the program a sealed segment; an operand
    placed in it at an offset comes back reduced at that offset, the frame
    carrying no bytes; the same operand on the socket of a plain session
    (what a client from before the segment sends) gives the same result;
    requests that point outside the segment, or use one that the session
    does not have, are refused naming it, and the session goes on. The
    library's own large operations go through the segment (status counts
    them)."""
    k0 = members.ranks.index(0)
    node = members.cluster.nodes[k0]
    me = members.ids[0]
    n = 40000  # 160 KB of float32: the ring's size class
    x = (np.arange(n, dtype=np.float32) * 0.5 - 7.0).astype(np.float32)
    req = {"op": "all_reduce", "rop": "sum", "dtype": "float32", "count": n,
           "timeout_ms": 10000, "bytes": 0, "group": [me]}
    before = node.status()["collectives"]["shm_ops"]
    s, fd = shm_session(node.sock)
    try:
        size = os.fstat(fd).st_size
        assert size == 1 << 30, size
        seals = fcntl.fcntl(fd, 1034)  # F_GET_SEALS
        assert seals & 0x7 == 0x7, seals  # SEAL, SHRINK, GROW
        with pytest.raises(OSError):
            os.ftruncate(fd, 4096)
        seg = mmap.mmap(fd, size)
        off = 3 * 4096 + 8
        view = np.frombuffer(seg, dtype=np.float32, count=n, offset=off)
        view[:] = x
        reply = raw_request(s, {**req, "shm": off})
        assert reply["ok"] is True and reply["bytes"] == 0, reply
        assert reply["shm"] == 4 * n and reply["n"] == 1, reply
        assert np.array_equal(view, x)  # a group of one: the sum is x
        cases = [
            ({"shm": size - 4 * n + 4}, "end past the shared segment"),
            ({"shm": -8}, "an offset in bytes"),
            ({"shm": 0, "bytes": 4 * n}, "carries no bytes on the socket"),
        ]
        for extra, word in cases:
            payload = b"\0" * extra.get("bytes", 0)
            reply = raw_request(s, {**req, **extra}, payload)
            assert reply["ok"] is False and word in reply["error"], (extra, reply)
        reply = raw_request(s, {**req, "shm": off})
        assert reply["ok"] is True, reply
        del view
        seg.close()
    finally:
        s.close()
        os.close(fd)
    with raw_session(node.sock) as s:
        reply = raw_request(s, {**req, "shm": 0})
        assert reply["ok"] is False and "without a shared segment" in reply["error"]
        head = json.dumps({**req, "bytes": 4 * n}).encode()
        s.sendall(struct.pack("<I", len(head)) + head + x.tobytes())
        m = struct.unpack("<I", recv_exact(s, 4))[0]
        reply = json.loads(recv_exact(s, m))
        assert reply["ok"] is True and reply["bytes"] == 4 * n, reply
        got = np.frombuffer(recv_exact(s, 4 * n), dtype=np.float32)
        assert np.array_equal(got, x)
    assert node.status()["collectives"]["shm_ops"] == before + 2

    # The library: 1 MiB through the segment, 4 KiB in the frame.
    counts = [st.status()["collectives"]["shm_ops"] for st in members.cluster.nodes]
    out = members.ok(lambda comm, rank: (
        comm.all_reduce(value(rank, 1 << 18).astype(np.float32), op="sum"),
        comm.all_reduce(value(rank, 1024).astype(np.float32), op="sum"),
    ))
    for r in range(N):
        np.testing.assert_allclose(out[r][0], expect("sum", np.float32, 1 << 18),
                                   rtol=1e-6, atol=1e-5)
    after = [st.status()["collectives"]["shm_ops"] for st in members.cluster.nodes]
    assert [a - b for a, b in zip(after, counts)] == [1] * N, (counts, after)


def test_wait_before_notify_keeps_nothing(members: Members) -> None:
    """A wait called before its notify: the waiter's first message reaches
    the notifier's node before the notify starts there, and is kept until
    then; the notify (an eager send) ends at once, and what was kept for
    it is let go with it, not held for 300 s (collectives.kept_bytes stays
    where it was)."""
    a, b = 0, 1  # node indexes
    ida, idb = members.ids[members.ranks[a]], members.ids[members.ranks[b]]
    node_b = members.cluster.nodes[b]
    before = node_b.status()["collectives"]["kept_bytes"]

    def fn(comm: Any, rank: int) -> None:
        if rank == members.ranks[a]:
            comm.wait(idb, "kept", timeout=30)
        else:
            time.sleep(0.3)  # the wait's first message gets there first
            comm.notify(ida, "kept", timeout=30)

    for _ in range(3):
        out = members.run(fn, who=[a, b])
        assert all(v is None for v in out.values()), out
    assert node_b.status()["collectives"]["kept_bytes"] == before


def test_bfloat16(members: Members) -> None:
    """bfloat16 torch tensors, small (one round) and large (the ring, 96
    KiB): a sum within a rounding per combine of the float64 sum (the
    bound of gossip.h's st_coll_dtype_t), a max exact, a broadcast bit for
    bit, and the same bits on every member."""
    sizes = [1000, 49152]

    def fn(comm: Any, rank: int) -> Dict[Any, torch.Tensor]:
        got = {}
        for n in sizes:
            x = torch.from_numpy(value(rank, n)).to(torch.bfloat16)
            comm.all_reduce(x, op="sum")
            m = torch.from_numpy(value(rank, n)).to(torch.bfloat16)
            comm.all_reduce(m, op="max")
            b = torch.from_numpy(value(rank, n)).to(torch.bfloat16)
            comm.broadcast(b, root=1)
            got[n] = (x, m, b)
        return got

    out = members.ok(fn)
    for n in sizes:
        xs = np.stack([
            torch.from_numpy(value(r, n)).to(torch.bfloat16).double().numpy()
            for r in range(N)
        ])
        bound = (N + 2) * 2.0**-8 * np.abs(xs).sum(0)
        for r in range(N):
            x, m, b = out[r][n]
            assert x.dtype == torch.bfloat16
            err = np.abs(x.double().numpy() - xs.sum(0))
            assert (err <= bound).all(), (n, float((err - bound).max()))
            assert np.array_equal(m.double().numpy(), xs.max(0))
            assert np.array_equal(b.double().numpy(), xs[1])
            for k in range(3):
                assert torch.equal(out[r][n][k], out[0][n][k]), (n, r, k)


def test_refusals(members: Members) -> None:
    """Bad operands and arguments are refused, naming them, before the
    node is asked (a malformed group by the library); nothing changes."""
    comm = members.comms[0]
    before = comm.last_group()
    cases = [
        (lambda: comm.all_reduce(torch.zeros(3, dtype=torch.float16)), "float16"),
        (lambda: comm.all_reduce(np.zeros(3, dtype=np.int32)), "int32"),
        (lambda: comm.all_reduce(np.zeros(3), op="avg"), "'avg'"),
        (lambda: comm.reduce(np.zeros(3), root=-1), "root -1"),
        (lambda: comm.all_reduce(np.zeros(3), timeout=-1), "timeout -1"),
        (lambda: comm.all_reduce("abc"), "str"),
        (lambda: comm.all_reduce([[1.0]]), "list"),
    ]
    ro = np.zeros(3)
    ro.flags.writeable = False
    cases.append((lambda: comm.all_reduce(ro), "read-only"))
    for call, word in cases:
        with pytest.raises(starling.CollectiveError, match=word) as e:
            call()
        assert e.value.kind == "invalid"
    with pytest.raises(starling.CollectiveError, match="32 hex digits") as e:
        comm.barrier(group=["not-an-id"], timeout=5)
    assert e.value.errno == errno.EINVAL and type(e.value) is starling.CollectiveError
    assert comm.last_group() == before and not comm.closed


def test_mismatch(members: Members) -> None:
    """One member all-reduces 99 floats, the others 100: every member
    raises CollectiveMismatch, and the sentence names both calls."""

    def fn(comm: Any, rank: int) -> Any:
        n = 99 if rank == 2 else 100
        comm.all_reduce(np.zeros(n, dtype=np.float32), timeout=10 * SLOW)

    out = members.run(fn)
    for r in range(N):
        e = out[r]
        assert isinstance(e, starling.CollectiveMismatch), f"rank {r}: {out}"
        # -EINVAL where it was found, -ECONNABORTED where it was relayed.
        assert e.kind == "mismatch", repr(e)
        assert e.errno in (errno.EINVAL, errno.ECONNABORTED), repr(e)
    text = " | ".join(str(out[r]) for r in range(N))
    assert "of 99 float32" in text and "of 100 float32" in text, text
    # Everyone is in step again.
    members.ok(lambda comm, rank: comm.barrier(timeout=30))


@pytest.mark.parametrize("count", [10, 20000])
def test_crossed_lists_without_timeout(members: Members, count: int) -> None:
    """Rank 0 all-reduces over the list [0, 1], ranks 1 and 2 over [0, 1,
    2], with no timeout: the op ids differ, so the calls never meet. The
    crossed-call rule ends it anyway, in about 5 s (ST__COLL_CROSSED_MS):
    every member raises CollectiveMismatch, and the sentences name both
    lists' calls. A hang here is what the rule prevents (run's 60 s). The
    same calls with a timeout fail at the timeout instead. Both paths: 10
    floats go in one round, 20000 (80 KB) on the pipelined ring, where
    every member's first message goes to every other one too."""
    pair, trio = members.ids[:2], list(members.ids)
    t0 = time.monotonic()

    def fn(comm: Any, rank: int) -> Any:
        group = pair if rank == 0 else trio
        comm.all_reduce(np.ones(count, dtype=np.float32), group=group, timeout=0)

    out = members.run(fn)
    took = time.monotonic() - t0
    for r in range(N):
        e = out[r]
        assert isinstance(e, starling.CollectiveMismatch), f"rank {r}: {out}"
    text = " | ".join(str(out[r]) for r in range(N))
    assert "in a group of 2" in text and "in a group of 3" in text, text
    assert "same group list" in text, text
    assert 4.5 < took < 30 * SLOW, f"{took:.1f} s"

    # With a timeout the rule stays out of it: the caller's limit decides.
    def timed(comm: Any, rank: int) -> Any:
        group = pair if rank == 0 else trio
        comm.all_reduce(np.ones(count, dtype=np.float32), group=group, timeout=7)

    t0 = time.monotonic()
    out = members.run(timed)
    took = time.monotonic() - t0
    for r in range(N):
        e = out[r]
        assert isinstance(e, (starling.CollectiveTimeout, starling.MemberFailed)), (
            f"rank {r}: {out}"
        )
        assert "timed out after" in str(e), str(e)
    assert took > 6.5, f"{took:.1f} s"
    # The next call on "all" meets everyone.
    members.ok(lambda comm, rank: comm.barrier(timeout=30))


def test_eager_sender_far_ahead_is_no_crossing(members: Members) -> None:
    """Rank 0 pushes 300 times to rank 1 (each push returns once sent),
    more than the 256 operations a node remembers as ended; rank 1 then
    pulls them, so its first messages reach rank 0 after rank 0's pushes
    ended there. Then every rank all-reduces on "all" (the explicit lists
    of earlier tests are out of step) with no timeout, rank 1 7 s after
    the others. Rank 0 has numbered those pulls'
    operations already: it drops their late first messages, and the
    crossed-call rule (5 s) does not take them for a call waiting on
    another list; the all-reduce completes everywhere."""
    ids = members.ids
    pushes = 300

    def push(comm: Any, rank: int) -> None:
        for i in range(pushes):
            comm.push(ids[1], "far-ahead", np.full(1, i, dtype=np.float32))

    def pull(comm: Any, rank: int) -> None:
        for i in range(pushes):
            got = comm.pull(ids[0], "far-ahead", np.zeros(1, dtype=np.float32))
            assert got[0] == i

    for fn, rank in ((push, 0), (pull, 1)):
        out = members.run(fn, who=[members.ranks.index(rank)])
        assert out[rank] is None, repr(out[rank])

    def reduce(comm: Any, rank: int) -> Any:
        if rank == 1:
            time.sleep(7)
        return comm.all_reduce(np.ones(4, dtype=np.float32), timeout=0)  # "all"

    out = members.ok(reduce)
    for r in range(N):
        assert out[r].tolist() == [3.0] * 4, out


def test_tiny_timeout_is_a_timeout(members: Members) -> None:
    """A timeout under half a millisecond is still one (it went to the node
    as 0 ms, which means none, and the call waited for ever): rank 0 alone
    calls a barrier that nobody joins."""
    t0 = time.monotonic()
    out = members.run(lambda comm, rank: comm.barrier(timeout=0.0001), who=[0])
    e = out[members.ranks[0]]
    assert isinstance(e, starling.CollectiveTimeout), out
    assert time.monotonic() - t0 < 10 * SLOW


def test_unanswered_call_closes_the_communicator(tmp_path: Path) -> None:
    """A node that never answers a call (here a fake one on a Unix socket):
    the call fails REPLY_GRACE_S (10 s) past its timeout and closes the
    communicator, so that a late answer is never read as the next call's."""
    path = str(tmp_path / "fake.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    got: Dict[str, bytes] = {}

    def exact(conn: socket.socket, n: int) -> bytes:
        b = b""
        while len(b) < n:
            part = conn.recv(n - len(b))
            if not part:
                break
            b += part
        return b

    def fake_node() -> None:
        conn, _ = srv.accept()
        line = b""
        while not line.endswith(b"\n"):
            part = conn.recv(1)
            if not part:
                break
            line += part
        got["open"] = line
        conn.sendall(b"ready\n")
        n = struct.unpack("<I", exact(conn, 4))[0]
        got["call"] = exact(conn, n)  # the request's JSON; never answered in time
        time.sleep(12)
        body = b'{"ok":true,"rank":0,"n":1,"bytes":0}'
        try:
            conn.sendall(struct.pack("<I", len(body)) + body)  # late
        except OSError:
            pass  # the client closed it, as it should
        conn.close()

    t = threading.Thread(target=fake_node, daemon=True)
    t.start()
    comm = starling.open_comm(path, timeout=0.01)
    t0 = time.monotonic()
    with pytest.raises(starling.CollectiveTimeout, match="closed"):
        comm.barrier()
    assert 9 < time.monotonic() - t0 < 20 * SLOW
    with pytest.raises(starling.NodeUnavailable, match="closed"):
        comm.barrier()
    comm.close()
    t.join(20)
    srv.close()
    assert got["open"].startswith(b"collectives") and b'"barrier"' in got["call"]


def _node_with_model(cluster: Cluster, join: Optional[str]) -> Any:
    """A node on the network, whose program has attached a model (so that
    it is a member that runs one) and gone."""
    n = cluster.node(join=join)
    with starling.attach(torch.nn.Linear(2, 2), socket=n.sock, timeout=30 * SLOW):
        pass
    return n


def _all_reduce_into(out: Dict[str, Any], name: str, comm: Any) -> None:
    """A thread's body: an all_reduce on "all" with no timeout; out[name]
    is "returned" or the exception it raised."""
    try:
        comm.all_reduce(np.ones(10, dtype=np.float32), timeout=0)
        out[name] = "returned"
    except Exception as e:  # handed to the test
        out[name] = e


def test_views_of_all_differ(cluster: Cluster) -> None:
    """Node A's program calls all_reduce on "all" while A knows A and B;
    then C joins, and C's program makes the same call on "all", now A, B
    and C; B's program never calls. The two calls share their operation id
    (the first on "all" on each node) but not their lists: A gets a first
    message from a member outside its list. Both fail with a mismatch
    naming both calls, with no timeout set; without it, each would wait
    for ever (A for B, C for B and for A's data)."""
    a = _node_with_model(cluster, None)
    _node_with_model(cluster, a.address())
    ca = starling.open_comm(a.sock, timeout=30)
    deadline = time.monotonic() + 30 * SLOW
    while len(ca.members()[0]) != 2:
        assert time.monotonic() < deadline, "A never saw B" + cluster.logs()
        time.sleep(0.1)
    out: Dict[str, Any] = {}

    ta = threading.Thread(target=_all_reduce_into, args=(out, "a", ca), daemon=True)
    ta.start()
    time.sleep(0.5)  # A's call is made, on [A, B]
    c = _node_with_model(cluster, a.address())
    cc = starling.open_comm(c.sock, timeout=30)
    look = starling.open_comm(a.sock, timeout=30)  # ca is in its call
    while len(cc.members()[0]) != 3 or len(look.members()[0]) != 3:
        assert time.monotonic() < deadline, "C never saw all" + cluster.logs()
        time.sleep(0.1)
    tc = threading.Thread(target=_all_reduce_into, args=(out, "c", cc), daemon=True)
    tc.start()
    for t in (ta, tc):
        t.join(30 * SLOW)
        assert not t.is_alive(), "a call on all hangs" + cluster.logs()
    for k in ("a", "c"):
        assert isinstance(out[k], starling.CollectiveError), out
    text = f"{out['a']} | {out['c']}"
    assert "in a group of 2" in text and "in a group of 3" in text, text
    assert "lists differ" in text, text
    for comm in (ca, cc, look):
        comm.close()


def test_late_call_on_all_after_it_ended(cluster: Cluster) -> None:
    """A and B make their first call on "all" while they know only each
    other, and it completes. Then C joins, and C's program makes its first
    call on "all", now A, B and C: the same operation id, which has ended on
    A and B, so nothing there waits for C's first message. Each answers it
    with an ABORT naming both calls, and C's call fails at once with a
    mismatch, with no timeout set; without that answer it would wait for
    ever."""
    a = _node_with_model(cluster, None)
    b = _node_with_model(cluster, a.address())
    ca = starling.open_comm(a.sock, timeout=30)
    cb = starling.open_comm(b.sock, timeout=30)
    deadline = time.monotonic() + 30 * SLOW
    while len(ca.members()[0]) != 2 or len(cb.members()[0]) != 2:
        assert time.monotonic() < deadline, "A and B never met" + cluster.logs()
        time.sleep(0.1)
    out: Dict[str, Any] = {}

    first = [threading.Thread(target=_all_reduce_into, args=(out, k, m), daemon=True)
             for k, m in (("a", ca), ("b", cb))]
    for t in first:
        t.start()
    for t in first:
        t.join(30 * SLOW)
    assert out == {"a": "returned", "b": "returned"}, out
    c = _node_with_model(cluster, a.address())
    cc = starling.open_comm(c.sock, timeout=30)
    while any(len(m.members()[0]) != 3 for m in (ca, cb, cc)):
        assert time.monotonic() < deadline, "C never saw all" + cluster.logs()
        time.sleep(0.1)
    t0 = time.monotonic()
    tc = threading.Thread(target=_all_reduce_into, args=(out, "c", cc), daemon=True)
    tc.start()
    tc.join(10 * SLOW)
    assert not tc.is_alive(), "a late call on all hangs" + cluster.logs()
    e = out["c"]
    assert isinstance(e, starling.CollectiveMismatch), repr(e)
    assert time.monotonic() - t0 < 5 * SLOW
    text = str(e)
    assert "in a group of 2" in text and "in a group of 3" in text, text
    assert "had ended here" in text and "lists differ" in text, text
    for comm in (ca, cb, cc):
        comm.close()


def test_timeout_names_the_absent_member(members: Members) -> None:
    """Ranks 0 and 1 wait in a barrier with a 1 s timeout that rank 2
    never joins: the first to time out raises CollectiveTimeout naming rank
    2; the other the same, or MemberFailed when the first's failure
    reached it first (naming both). Rank 2's own late barrier then times
    out alone."""
    absent = members.ids[2]
    t0 = time.monotonic()
    out = members.run(
        lambda comm, rank: comm.barrier(timeout=1),
        who=[k for k in range(N) if members.ranks[k] != 2],
    )
    took = time.monotonic() - t0
    for r in (0, 1):
        e = out[r]
        assert isinstance(e, (starling.CollectiveTimeout, starling.MemberFailed)), (
            f"rank {r}: {e!r}"
        )
        assert "timed out after" in str(e), str(e)
        assert absent[:12] in str(e) and absent[:12] in e.members, str(e)
        if isinstance(e, starling.MemberFailed):
            assert e.errno == errno.ECONNABORTED and e.members[0] in members.ids
        else:
            assert e.errno == errno.ETIMEDOUT
    assert any(isinstance(out[r], starling.CollectiveTimeout) for r in (0, 1)), out
    assert took < 10 * SLOW, f"the timeout of 1 s took {took:.1f} s"
    late = members.run(
        lambda comm, rank: comm.barrier(timeout=1),
        who=[members.ranks.index(2)],
    )
    # It fails (timed out, or the others' ABORT kept for it): never passes.
    assert isinstance(
        late[2], (starling.CollectiveTimeout, starling.MemberFailed)
    ), repr(late[2])


def test_members_after_a_group_keeps_all_in_step(members: Members) -> None:
    """Asking for the members is not an operation, even after an operation
    on an explicit group: the next operation on "all" still matches the
    other members'. (Last of the tests on `members`: when it fails, the
    node it asked is one operation ahead on "all".)"""
    pair = [members.ids[0], members.ids[2]]
    who = [k for k in range(N) if members.ranks[k] in (0, 2)]
    members.run(lambda comm, rank: comm.barrier(group=pair, timeout=10), who=who)
    members.comms[who[0]].members()
    out = members.run(lambda comm, rank: comm.barrier(timeout=2))
    assert all(v is None for v in out.values()), out


def test_error_kinds() -> None:
    """The errno and sentence of each failure (client.h, docs/collectives.md,
    "Failures") give its exception, with the members it names."""
    a, b = "1e72" + "0" * 28, "7cc3" + "f" * 28
    mism = (
        f"member {a}: rank 0 called all_reduce(sum, root 0) of 99 float32 in a "
        "group of 3 (members 8fdd0123456789ab); rank 2 (this member) called "
        "all_reduce(sum, root 0) of 100 float32 in a group of 3 (members "
        "8fdd0123456789ab)"
    )
    relayed = f"member {b}: rank 1 failed the operation: " + mism.split(": ", 1)[1]
    late = (
        f"member {b}: rank 0 failed the operation: member {a}: it called "
        "all_reduce(sum, root 0) of 10 float32 in a group of 3 (members "
        "0ac6d3fe01234567); this member called all_reduce(sum, root 0) of 10 "
        "float32 in a group of 2 (members 99334e4401234567), which had ended "
        "here before that call came (the members' lists differ)"
    )
    silent = f"timed out after 1.0 s; no word yet from {a[:12]}, {b[:12]}"
    dead = f"member {a} is not an alive member of the cluster"
    cases = [
        (-errno.EINVAL, mism, starling.CollectiveMismatch, [a]),
        (-errno.ECONNABORTED, relayed, starling.CollectiveMismatch, [b]),
        (-errno.ECONNABORTED, late, starling.CollectiveMismatch, [b, a]),
        (-errno.EINVAL, dead, starling.CollectiveError, [a]),
        (-errno.ECONNABORTED, f"member {b}: it is dead", starling.MemberFailed, [b]),
        (-errno.ETIMEDOUT, silent, starling.CollectiveTimeout, [a[:12], b[:12]]),
        (-errno.ENOTCONN, "the node went away", starling.NodeUnavailable, None),
        (-errno.EBUSY, "too many sessions", starling.NodeBusy, None),
        (-errno.ENOMEM, "", starling.StarlingError, None),
    ]
    for rc, text, cls, named in cases:
        e = starling.errors.comm_error_for(rc, text)
        assert type(e) is cls and e.errno == -rc, (text, e)
        assert str(e) == (text or "ENOMEM")
        if named is not None:
            assert e.members == named, (text, e.members)


def test_no_node(tmp_path: Path, built: None) -> None:
    with pytest.raises(starling.NodeUnavailable, match="no starling node"):
        starling.open_comm(str(tmp_path / "control.sock"))


def test_library_falls_back_to_a_node_without_the_segment(
    tmp_path: Path, built: None
) -> None:
    """A node from before the shared segment refuses "collectives shm" as
    an unknown request: the library opens a plain session instead and
    sends a large operand on the socket. (A stand-in node in a thread,
    speaking the old protocol: it doubles the operand.)"""
    path = str(tmp_path / "old.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(2)
    srv.settimeout(10)
    seen: Dict[str, Any] = {}

    def line(c: socket.socket) -> bytes:
        out = b""
        while not out.endswith(b"\n"):
            out += c.recv(1)
        return out

    def old_node() -> None:
        c, _ = srv.accept()
        seen["first"] = line(c)
        c.sendall(b"error: unknown request; expected status, ... or collectives\n")
        c.close()
        c, _ = srv.accept()
        c.settimeout(10)
        seen["second"] = line(c)
        c.sendall(b"ready\n")
        n = struct.unpack("<I", recv_exact(c, 4))[0]
        req = json.loads(recv_exact(c, n))
        seen["req"] = req
        data = np.frombuffer(recv_exact(c, req["bytes"]), np.float32)
        head = json.dumps({"ok": True, "bytes": req["bytes"], "rank": 0, "n": 1})
        c.sendall(struct.pack("<I", len(head)) + head.encode() + (2 * data).tobytes())
        c.close()

    t = threading.Thread(target=old_node, daemon=True)
    t.start()
    try:
        x = np.full(20000, 1.5, dtype=np.float32)  # 80 KB: the segment's size class
        with starling.open_comm(path, timeout=10) as comm:
            comm.all_reduce(x)
        t.join(10)
        assert seen["first"] == b"collectives shm\n", seen
        assert seen["second"] == b"collectives\n", seen
        assert seen["req"]["bytes"] == 80000 and "shm" not in seen["req"], seen
        assert np.all(x == 3.0)
    finally:
        srv.close()


def test_node_went_away(cluster: Cluster) -> None:
    """A node alone is a group of one; when it dies, the next call and
    every later one raise NodeUnavailable."""
    n = cluster.node()
    with starling.attach(torch.nn.Linear(2, 2), socket=n.sock, timeout=30 * SLOW):
        pass
    with starling.open_comm(n.sock, timeout=10) as comm:
        x = np.arange(3.0)
        comm.all_reduce(x, op="max")
        assert x.tolist() == [0.0, 1.0, 2.0] and comm.last_group() == (0, 1)
        n.kill()
        for _ in range(2):
            with pytest.raises(starling.NodeUnavailable, match="went away"):
                comm.barrier()
    assert comm.closed


def two_nodes(cluster: Cluster) -> Tuple[Any, Any]:
    """Two fresh nodes of cluster, each given a model by a program that
    attached and detached, once each sees both as members."""
    a = cluster.node()
    with starling.attach(torch.nn.Linear(2, 2), socket=a.sock, timeout=30 * SLOW):
        pass
    b = cluster.node(join=a.address())
    with starling.attach(torch.nn.Linear(2, 2), socket=b.sock, timeout=30 * SLOW):
        pass
    deadline = time.monotonic() + 30 * SLOW
    for n in (a, b):
        with starling.open_comm(n.sock, timeout=30) as comm:
            while len(comm.members()[0]) < 2:
                assert time.monotonic() < deadline, "the nodes never saw each other"
                time.sleep(0.1)
    return a, b


def test_pull_from_a_member_that_dies(cluster: Cluster) -> None:
    """A pull waiting on a peer that is killed (-9) fails with MemberFailed
    naming it, well before its own timeout; the pull never returns data."""
    a, b = two_nodes(cluster)
    with starling.open_comm(a.sock, timeout=30) as comm:
        ids, rank = comm.members()
        peer = ids[1 - rank]
        out: Dict[str, Any] = {}

        def pull() -> None:
            t0 = time.monotonic()
            try:
                comm.pull(peer, "never-pushed", np.zeros(4), timeout=60 * SLOW)
            except Exception as e:  # handed to the test
                out["error"] = e
            out["took"] = time.monotonic() - t0

        t = threading.Thread(target=pull, daemon=True)
        t.start()
        time.sleep(0.5)
        b.kill()
        t.join(60 * SLOW)
        assert not t.is_alive(), "the pull did not return after its peer died"
        e = out.get("error")
        assert isinstance(e, starling.MemberFailed), repr(e)
        assert peer[:12] in str(e), str(e)
        assert out["took"] < 30 * SLOW, out


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.mark.skipif(
    SANITIZED,
    reason="AddressSanitizer's quarantine keeps freed memory resident "
    "(256 MiB by default), so RSS does not show pacing",
)
def test_large_fetch_is_paced(cluster: Cluster) -> None:
    """A fetch of 256 MiB from fresh nodes: the publisher takes its
    segments only while fewer than 64 frames (16 MiB) wait on the
    connection (ST__COLL_PACE_FRAMES), so its memory grows by far less
    than the tensor while it serves (every sealed frame at once before:
    about +256 MiB). The fetcher gets every byte."""
    a, b = two_nodes(cluster)
    n = 64 << 20  # float32: 256 MiB
    want = (np.arange(n, dtype=np.int64) % 999983).astype(np.float32)
    with starling.open_comm(a.sock, timeout=30) as pub, starling.open_comm(
        b.sock, timeout=30
    ) as fetcher:
        ids, rank = fetcher.members()
        pub.publish("big", want)
        assert a.proc is not None
        base = rss_mib(a.proc.pid)
        peak = [base]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_mib(a.proc.pid))
                time.sleep(0.01)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            got = fetcher.fetch(
                ids[1 - rank], "big", np.empty(n, np.float32), timeout=120 * SLOW
            )
        finally:
            done.set()
            t.join(10)
        assert np.array_equal(got, want)
        grew = peak[0] - base
        assert grew < 96, f"the publisher grew by {grew:.0f} MiB serving 256 MiB"
