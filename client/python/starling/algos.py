"""starling.algos: parallel k-means and least squares over a group of the
cluster, each member on its own rows (``Comm.kmeans``, ``Comm.lstsq``;
client/starling/client.h, "Algorithms over a group"; docs/collectives.md,
"Algorithms"). The same calls as `starling kmeans` and `starling lstsq`:

    with starling.open_comm("state0/control.sock", timeout=60) as comm:
        km = comm.kmeans(my_points, k=8)          # every member, its own rows
        km.centroids                              # the same on every member
        fit = comm.lstsq(my_x, my_y, ridge=0.1)
        fit.weight, fit.bias

Every member of the group makes the same call (the same options) on its own
rows, and gets the same result, to the bit. Rows are float32 (numpy arrays
or torch tensors, converted); results are float64 numpy arrays.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from . import _lib
from .errors import CollectiveError

__all__ = ["KMeansResult", "LstsqResult"]


@dataclass
class KMeansResult:
    """What ``Comm.kmeans`` found (the same on every member)."""

    centroids: Any  # numpy float64, k x dim
    counts: Any  # numpy float64, k: points nearest each centroid
    points: int  # over every member
    iterations: int
    converged: bool  # stopped by tol (False: by max_iter)
    objective: float  # sum of squared distances at the final centroids
    moved: float  # the last iteration's largest move
    rank: int  # this member in the group
    size: int
    same_data: bool  # every member held the same rows (give each its own)


@dataclass
class LstsqResult:
    """What ``Comm.lstsq`` found (the same on every member)."""

    weight: Any  # numpy float64, dim
    bias: float  # 0 without an intercept
    points: int  # rows over every member
    method: str  # "normal" or "gd"
    solver: str  # "cholesky", "qr" (singular or ill conditioned) or "gd"
    rcond: float  # normal: the normal matrix's reciprocal condition estimate
    solve_rank: int  # normal: dim, or the rank QR found
    rss: float  # sum of squared residuals
    objective: float  # rss + ridge ||weight||^2
    rmse: float
    iterations: int  # gd (1 for normal)
    converged: bool  # gd: stopped by tol
    grad_norm: float  # gd: the last ||g_t|| / ||g_1||
    alpha: float  # gd: the alpha used
    rank: int
    size: int
    same_data: bool


def _refuse(what: str) -> CollectiveError:
    # errno 0: refused here, before the node was asked (as comm.py's).
    return CollectiveError(what, 0)


def _rows(x: Any, name: str, dims: int) -> Any:
    """x as a C-contiguous float32 numpy array of dims dimensions. (A NaN
    or an infinity in it is the library's to refuse, on every member
    alike: refused here, the others would wait for this member.)"""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        x = x.detach().cpu().numpy()
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if a.ndim != dims:
        raise _refuse(
            f"{name}: {a.ndim} dimensions, want {dims} "
            f"({'rows x features' if dims == 2 else 'one value a row'})"
        )
    return a


def _fptr(a: Any) -> Any:
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def _dptr(a: Any) -> Any:
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_double))


def kmeans(
    comm: Any,
    x: Any,
    k: int,
    max_iter: int = 300,
    tol: float = 1e-4,
    seed: int = 1,
    group: Any = None,
    timeout: Optional[float] = None,
    progress: Optional[Callable[[int, float, float, int], None]] = None,
) -> KMeansResult:
    """See Comm.kmeans."""
    from .comm import _group  # comm imports this module lazily

    a = _rows(x, "x", 2)
    n, dim = a.shape
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise _refuse(f"k {k!r}: the number of clusters, an int >= 1")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or not 0 <= max_iter < 2**32:
        raise _refuse(f"max_iter {max_iter!r}: an int >= 0")
    if not float(tol) >= 0:
        raise _refuse(f"tol {tol!r}: >= 0")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise _refuse(f"seed {seed!r}: an int from 0 to 2**64 - 1")
    lib = comm._lib
    opts = _lib.KmeansOpts()
    lib.st_comm_kmeans_opts_default(ctypes.byref(opts))
    opts.k, opts.max_iter, opts.tol, opts.seed = k, max_iter, float(tol), seed
    if progress is not None:
        def call(_: Any, it: Any) -> None:
            i = it.contents
            progress(i.iteration, i.objective, i.moved, i.empty)

        opts.progress = _lib.KMEANS_PROGRESS(call)
    centroids = np.zeros((k, dim), dtype=np.float64)
    counts = np.zeros(k, dtype=np.float64)
    info = _lib.KmeansInfo()
    g, t = _group(group), comm._t(timeout)
    with comm._lock:
        rc = lib.st_comm_kmeans(
            comm._require(), g, _fptr(a), n, dim, ctypes.byref(opts), t,
            _dptr(centroids), _dptr(counts), ctypes.byref(info),
        )
        comm._check(rc)
    return KMeansResult(
        centroids, counts, info.points, info.iterations, bool(info.converged),
        info.objective, info.moved, info.rank, info.size, bool(info.same_data),
    )


def lstsq(
    comm: Any,
    x: Any,
    y: Any,
    ridge: float = 0.0,
    intercept: bool = True,
    method: str = "normal",
    max_iter: int = 1000,
    tol: float = 1e-6,
    alpha: float = 0.0,
    group: Any = None,
    timeout: Optional[float] = None,
    progress: Optional[Callable[[int, float, float], None]] = None,
) -> LstsqResult:
    """See Comm.lstsq."""
    from .comm import _group

    a = _rows(x, "x", 2)
    b = _rows(y, "y", 1)
    n, dim = a.shape
    if b.shape[0] != n:
        raise _refuse(f"y has {b.shape[0]} values for {n} rows of x")
    if method not in _lib.LSTSQ_METHODS:
        raise _refuse(f'method {method!r}: "normal" (the closed form) or "gd"')
    for name, v in (("ridge", ridge), ("tol", tol), ("alpha", alpha)):
        if not float(v) >= 0:
            raise _refuse(f"{name} {v!r}: >= 0")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or not 1 <= max_iter < 2**32:
        raise _refuse(f"max_iter {max_iter!r}: an int >= 1")
    lib = comm._lib
    opts = _lib.LstsqOpts()
    lib.st_comm_lstsq_opts_default(ctypes.byref(opts))
    opts.method = _lib.LSTSQ_METHODS[method]
    opts.intercept = 1 if intercept else 0
    opts.ridge, opts.max_iter, opts.tol, opts.alpha = (
        float(ridge), max_iter, float(tol), float(alpha)
    )
    if progress is not None:
        def call(_: Any, it: Any) -> None:
            i = it.contents
            progress(i.iteration, i.objective, i.grad_norm)

        opts.progress = _lib.LSTSQ_PROGRESS(call)
    weight = np.zeros(dim, dtype=np.float64)
    info = _lib.LstsqInfo()
    g, t = _group(group), comm._t(timeout)
    with comm._lock:
        rc = lib.st_comm_lstsq(
            comm._require(), g, _fptr(a), _fptr(b), n, dim, ctypes.byref(opts), t,
            _dptr(weight), ctypes.byref(info),
        )
        comm._check(rc)
    gd = method == "gd"
    return LstsqResult(
        weight, info.bias, info.points, method,
        "gd" if gd else ("qr" if info.qr else "cholesky"),
        info.rcond, info.solve_rank, info.rss, info.objective, info.rmse,
        info.iterations if gd else 1, bool(info.converged), info.grad_norm,
        info.alpha, info.rank, info.size, bool(info.same_data),
    )
