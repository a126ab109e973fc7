"""test_algos.py: parallel k-means and least squares as library calls
(Comm.kmeans, Comm.lstsq over the C library's st_comm_kmeans and
st_comm_lstsq; docs/collectives.md, "Algorithms") across three real
`starling node --attach` processes on 127.0.0.1, one thread per member,
each with its own communicator on its own node and its own third of the
rows.

  - k-means: the same centroids on every member, to the bit; a fixed point
    of Lloyd's algorithm on all the rows; the same centroids (within 1e-9)
    as one member alone on all the rows (the k-means++ draw does not
    depend on the sharding); a torch tensor as input;
  - least squares: the closed form equals NumPy's float64 solve on all the
    rows within 1e-8 (plain; ridge, the intercept not penalized), gradient
    descent within 1e-4 of it, on every member to the bit; progress
    called;
  - members whose options differ all fail, naming the option; so do all
    when one member's rows hold a NaN (each says whose); a y of the wrong
    length and a bad method are refused before any call.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import numpy as np
import pytest
import torch

import starling
from conftest import SLOW, Cluster

N = 3


class Three:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.comms: List[Any] = []
        self.ranks: List[int] = []
        self.ids: List[str] = []

    def run(self, fn: Callable[[Any, int], Any]) -> Dict[int, Any]:
        """fn(comm, rank) on a thread per member, all at once; results (or
        exceptions) by rank."""
        out: Dict[int, Any] = {}

        def body(k: int) -> None:
            try:
                out[self.ranks[k]] = fn(self.comms[k], self.ranks[k])
            except Exception as e:  # handed to the test
                out[self.ranks[k]] = e

        threads = [threading.Thread(target=body, args=(k,), daemon=True) for k in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60 * SLOW)
            if t.is_alive():
                pytest.fail("a member did not return in 60 s" + self.cluster.logs())
        return out

    def ok(self, fn: Callable[[Any, int], Any]) -> Dict[int, Any]:
        out = self.run(fn)
        for r, v in sorted(out.items()):
            if isinstance(v, Exception):
                pytest.fail(f"rank {r}: {type(v).__name__}: {v}" + self.cluster.logs())
        return out


@pytest.fixture(scope="module")
def three(cluster_key: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Three]:
    c = Cluster(tmp_path_factory.mktemp("algos"), cluster_key)
    m = Three(c)
    try:
        for k in range(N):
            n = c.node(join=c.nodes[0].address() if k else None)
            with starling.attach(torch.nn.Linear(2, 2), socket=n.sock, timeout=30 * SLOW):
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
        m.ids = seen[0][0]
        m.ranks = [rank for _, rank in seen]
        yield m
    finally:
        for comm in m.comms:
            comm.close()
        c.close()


def blobs() -> np.ndarray:
    rng = np.random.default_rng(3)
    centres = rng.uniform(-5, 5, size=(4, 3))
    return (centres[rng.integers(0, 4, 300)] + rng.normal(0, 0.7, (300, 3))).astype(np.float32)


def test_kmeans(three: Three) -> None:
    x = blobs()
    seen: List[int] = []

    def fn(comm: Any, rank: int) -> Any:
        shard = x[rank::N]
        if rank == 1:
            shard = torch.from_numpy(shard.copy())  # a tensor works too
        return comm.kmeans(
            shard, k=4, tol=0, seed=5, timeout=30,
            progress=(lambda i, obj, moved, empty: seen.append(i)) if rank == 0 else None,
        )

    out = three.ok(fn)
    r0 = out[0]
    for r, v in out.items():
        assert np.array_equal(v.centroids, r0.centroids), f"rank {r} differs"
        assert np.array_equal(v.counts, r0.counts)
        assert (v.rank, v.size, v.points) == (r, N, 300)
        assert v.converged and not v.same_data
    assert seen == list(range(1, r0.iterations + 1))
    # A fixed point of Lloyd's algorithm on all the rows (float64).
    xd = x.astype(np.float64)
    d = ((xd[:, None, :] - r0.centroids[None]) ** 2).sum(-1)
    near = d.argmin(1)
    for j in range(4):
        assert r0.counts[j] == (near == j).sum()
        np.testing.assert_allclose(r0.centroids[j], xd[near == j].mean(0), rtol=1e-9)
    assert abs(r0.objective - d.min(1).sum()) <= 1e-9 * r0.objective
    # One member alone on every row: the same start, the same end.
    k0 = three.ranks.index(0)
    alone = three.comms[k0].kmeans(x, k=4, tol=0, seed=5, group=[three.ids[0]], timeout=30)
    assert alone.size == 1 and alone.iterations == r0.iterations
    np.testing.assert_allclose(alone.centroids, r0.centroids, rtol=1e-9, atol=1e-12)


def regression() -> Any:
    rng = np.random.default_rng(8)
    x = rng.normal(size=(240, 4)).astype(np.float32)
    w = np.array([1.5, -2.0, 0.25, 3.0])
    y = (x @ w + 0.5 + rng.normal(0, 0.1, 240)).astype(np.float32)
    return x, y


def reference(x: np.ndarray, y: np.ndarray, ridge: float) -> Any:
    """float64 ridge with an unpenalized intercept, on centred data."""
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    xm, ym = xd.mean(0), yd.mean()
    xc, yc = xd - xm, yd - ym
    w = np.linalg.solve(xc.T @ xc + ridge * np.eye(x.shape[1]), xc.T @ yc)
    return w, ym - xm @ w


def test_lstsq(three: Three) -> None:
    x, y = regression()
    iters: List[int] = []
    for ridge in (0.0, 5.0):
        want_w, want_b = reference(x, y, ridge)
        out = three.ok(lambda comm, r: comm.lstsq(x[r::N], y[r::N], ridge=ridge, timeout=30))
        for r, v in out.items():
            assert np.array_equal(v.weight, out[0].weight) and v.bias == out[0].bias
            assert (v.solver, v.points, v.size) == ("cholesky", 240, N)
        got = out[0]
        rel = np.abs(got.weight - want_w).max() / np.abs(want_w).max()
        assert rel <= 1e-8, f"ridge {ridge}: weight off by {rel:.3g}"
        assert abs(got.bias - want_b) <= 1e-8 * max(1.0, abs(want_b))
        assert got.rmse < 0.2
    want_w, _ = reference(x, y, 0.0)

    def gd(comm: Any, r: int) -> Any:
        cb = (lambda i, obj, g: iters.append(i)) if r == 0 else None
        return comm.lstsq(x[r::N], y[r::N], method="gd", tol=1e-9, max_iter=20000,
                          timeout=30, progress=cb)

    out = three.ok(gd)
    for v in out.values():
        assert np.array_equal(v.weight, out[0].weight) and v.solver == "gd"
    np.testing.assert_allclose(out[0].weight, want_w, rtol=1e-4, atol=1e-4)
    assert out[0].converged and iters and iters[-1] == out[0].iterations


def test_members_that_differ_and_bad_rows(three: Three) -> None:
    x = blobs()
    out = three.run(lambda comm, r: comm.kmeans(x[r::N], k=4 + (r == 2), timeout=30))
    for r, v in out.items():
        assert isinstance(v, starling.CollectiveMismatch), f"rank {r}: {v!r}"
        assert "disagree on k, the number of clusters (from 4 to 5)" in str(v), str(v)
    bad = x.copy()
    bad[7, 1] = np.nan
    out = three.run(lambda comm, r: comm.kmeans(bad[r::N] if r == 1 else x[r::N], k=4, timeout=30))
    for r, v in out.items():
        assert isinstance(v, starling.CollectiveError), f"rank {r}: {v!r}"
        whose = "this member's rows hold a NaN" if r == 1 else "not this member's"
        assert whose in str(v), f"rank {r}: {v}"
    comm = three.comms[0]
    with pytest.raises(starling.CollectiveError, match="values for"):
        comm.lstsq(x, np.zeros(5, np.float32))
    with pytest.raises(starling.CollectiveError, match="method"):
        comm.lstsq(x, x[:, 0], method="svd")
    # The group is still in step after the refusals: a call that works.
    x2, y2 = regression()
    out = three.ok(lambda c, r: c.lstsq(x2[r::N], y2[r::N], timeout=30))
    assert all(np.array_equal(v.weight, out[0].weight) for v in out.values())
