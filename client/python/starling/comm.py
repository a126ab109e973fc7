"""starling.comm: collectives across the cluster through the local node
(all-reduce, reduce, broadcast, barrier), over the C client library
(client/starling/client.h, "Collectives"; docs/collectives.md).

    import starling

    with starling.open_comm("state0/control.sock") as comm:
        ids, rank = comm.members()
        comm.all_reduce(grad, op="mean")  # a numpy array or torch tensor, in place
        comm.broadcast(weights, root=0)
        comm.barrier(timeout=30)

Every member of a group calls the same operation (kind, reduction, dtype,
root and number of elements) in the same order; each call blocks until the
operation is complete on this member, or raises on every member
(CollectiveMismatch, MemberFailed, CollectiveTimeout, NodeUnavailable).

Operands: a float32 or float64 numpy array or torch tensor (or a bfloat16
tensor), changed in
place (a contiguous CPU one through its own memory; a CUDA or
non-contiguous one through a host copy that is copied back), or a Python
float or sequence of floats (float64), whose result is returned. Neither
numpy nor torch is imported here: an operand of theirs means the program
already has them.
"""

from __future__ import annotations

import ctypes
import numbers
import os
import sys
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from . import _lib
from .errors import CollectiveError, StarlingError, comm_error_for

__all__ = ["Comm", "open_comm"]

_ERR_LEN = 1024
Group = Union[None, str, Sequence[str]]


class _Operand:
    """What the library reads and writes for one operand: a pointer, its
    element count and dtype, and how to hand the result back."""

    def __init__(
        self,
        ptr: int,
        count: int,
        dtype: int,
        keep: Any,
        back: Optional[Callable[[], None]],
        result: Callable[[], Any],
    ) -> None:
        self.ptr, self.count, self.dtype = ptr, count, dtype
        self.keep = keep  # the memory ptr points into, alive for the call
        self.back = back  # copies a staged result back into the caller's
        self.result = result


def _refuse(what: str) -> CollectiveError:
    return CollectiveError(what, 0)


def _torch_operand(x: Any, torch: Any) -> _Operand:
    dtypes = {
        torch.float32: _lib.COMM_F32,
        torch.float64: _lib.COMM_F64,
        torch.bfloat16: _lib.COMM_BF16,
    }
    if x.dtype not in dtypes:
        raise _refuse(
            f"a {x.dtype} tensor: collectives take float32, float64 or "
            "bfloat16; cast it first (x.float() or x.double())"
        )
    if x.device.type == "cpu" and x.is_contiguous():
        return _Operand(x.data_ptr(), x.numel(), dtypes[x.dtype], x, None, lambda: x)
    # A CUDA or non-contiguous tensor: through a contiguous host copy
    # (pinned for CUDA, so that both copies are fast).
    host = torch.empty(tuple(x.shape), dtype=x.dtype, pin_memory=x.is_cuda)
    with torch.no_grad():
        host.copy_(x)

    def back() -> None:
        with torch.no_grad():
            x.copy_(host)

    return _Operand(
        host.data_ptr(), host.numel(), dtypes[x.dtype], host, back, lambda: x
    )


def _numpy_operand(x: Any, np: Any) -> _Operand:
    dtypes = {np.dtype(np.float32): _lib.COMM_F32, np.dtype(np.float64): _lib.COMM_F64}
    if x.dtype not in dtypes:
        raise _refuse(
            f"a {x.dtype} array: collectives take float32 or float64; "
            "convert it first (x.astype(np.float32))"
        )
    if not x.flags.writeable:
        raise _refuse(
            "a read-only array: the result is written in place; pass a "
            "writeable copy (x.copy())"
        )
    if x.flags.c_contiguous:
        return _Operand(x.ctypes.data, x.size, dtypes[x.dtype], x, None, lambda: x)
    host = np.ascontiguousarray(x)

    def back() -> None:
        x[...] = host

    return _Operand(host.ctypes.data, host.size, dtypes[x.dtype], host, back, lambda: x)


def _list_operand(x: Any) -> _Operand:
    scalar = isinstance(x, numbers.Real) and not isinstance(x, bool)
    try:
        values = [float(x)] if scalar else [float(v) for v in x]
    except (TypeError, ValueError):
        raise _refuse(
            f"an operand of type {type(x).__name__}: pass a float32 or "
            "float64 numpy array or torch tensor, a float, or a flat "
            "sequence of floats"
        ) from None
    buf = (ctypes.c_double * max(len(values), 1))(*values)

    def result() -> Any:
        return buf[0] if scalar else list(buf[: len(values)])

    n = len(values)
    return _Operand(ctypes.addressof(buf), n, _lib.COMM_F64, buf, None, result)


def _operand(x: Any) -> _Operand:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch_operand(x, torch)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return _numpy_operand(x, np)
    if isinstance(x, (str, bytes)):
        raise _refuse(f"an operand of type {type(x).__name__}: pass numbers")
    return _list_operand(x)


def _group(group: Group) -> Optional[bytes]:
    """None for "all"; else the comma-separated ids the library takes."""
    if group is None:
        return None
    if isinstance(group, str):
        return group.encode("ascii", "replace")
    ids = list(group)
    if not all(isinstance(i, str) for i in ids):
        raise _refuse(
            f"group {group!r}: None, \"all\", or a list of member ids "
            "(strings of 32 hex digits, as Comm.members() gives them)"
        )
    return ",".join(ids).encode("ascii", "replace")


class Comm:
    """A communicator on the local node (made by ``starling.open_comm``).

    ``timeout`` is the default of every call's ``timeout``: seconds, or
    None (and 0) for no limit. A Comm is for one thread at a time (calls
    from several threads are serialized); a program may open several. Close
    it with ``close()`` or a ``with`` block."""

    def __init__(
        self,
        socket: Union[str, "os.PathLike[str]"] = "state/control.sock",
        timeout: Optional[float] = None,
    ) -> None:
        self._c = ctypes.c_void_p()
        self._lock = threading.Lock()
        self.socket = os.fsdecode(socket)
        self.timeout = timeout
        self._lib = _lib.load()
        err = ctypes.create_string_buffer(_ERR_LEN)
        rc = self._lib.st_comm_open(
            os.fsencode(socket), ctypes.byref(self._c), err, _ERR_LEN
        )
        if rc != 0:
            self._c = ctypes.c_void_p()
            raise comm_error_for(rc, err.value.decode("utf-8", "replace"))

    # ---- the group ------------------------------------------------------

    def members(self) -> Tuple[List[str], int]:
        """The group "all" as the node sees it now: the member ids (32 hex
        digits each) in rank order, and this member's rank among them."""
        n, rank = ctypes.c_size_t(0), ctypes.c_size_t(0)
        cap = 16
        with self._lock:
            while True:
                ids = ((ctypes.c_char * _lib.ID_HEX) * cap)()
                rc = self._lib.st_comm_members(
                    self._require(), ids, cap, ctypes.byref(n), ctypes.byref(rank)
                )
                self._check(rc)
                if n.value <= cap:
                    break
                cap = n.value  # the membership grew: ask again
        return [ids[i].value.decode("ascii") for i in range(n.value)], rank.value

    def last_group(self) -> Tuple[int, int]:
        """This member's rank and the group's size in the last operation
        that succeeded ((0, 0) before any)."""
        rank, size = ctypes.c_uint32(0), ctypes.c_uint32(0)
        self._lib.st_comm_last_group(
            self._require(), ctypes.byref(rank), ctypes.byref(size)
        )
        return rank.value, size.value

    # ---- the operations -------------------------------------------------

    def all_reduce(
        self,
        x: Any,
        op: str = "sum",
        group: Group = None,
        timeout: Optional[float] = None,
    ) -> Any:
        """Makes ``x`` the reduction (op: "sum", "mean", "min" or "max";
        mean is the sum divided by the group's size) over the group, on
        every member, bit-identical everywhere. Returns ``x`` (an array or
        tensor, changed in place) or the result (for a float or a
        sequence)."""
        o, g, t, code = _operand(x), _group(group), self._t(timeout), self._op(op)
        return self._run(
            o,
            lambda c: self._lib.st_comm_all_reduce(
                c, g, o.ptr, o.count, o.dtype, code, t
            ),
        )

    def reduce(
        self,
        x: Any,
        root: int,
        op: str = "sum",
        group: Group = None,
        timeout: Optional[float] = None,
    ) -> Any:
        """The same reduction, kept by the member of rank ``root`` only:
        its ``x`` becomes the result; the others' is left as it was.
        Returns as all_reduce does."""
        o, g, t, code = _operand(x), _group(group), self._t(timeout), self._op(op)
        r = self._root(root)
        return self._run(
            o,
            lambda c: self._lib.st_comm_reduce(
                c, g, r, o.ptr, o.count, o.dtype, code, t
            ),
            only_rank=r,
        )

    def broadcast(
        self,
        x: Any,
        root: int,
        group: Group = None,
        timeout: Optional[float] = None,
    ) -> Any:
        """Copies the ``x`` of the member of rank ``root`` into every
        member's ``x`` (same dtype and number of elements everywhere).
        Returns as all_reduce does."""
        o, g, t, r = _operand(x), _group(group), self._t(timeout), self._root(root)
        return self._run(
            o,
            lambda c: self._lib.st_comm_broadcast(c, g, r, o.ptr, o.count, o.dtype, t),
        )

    def barrier(self, group: Group = None, timeout: Optional[float] = None) -> None:
        """Returns once every member of the group has called it."""
        g, t = _group(group), self._t(timeout)
        with self._lock:
            self._check(self._lib.st_comm_barrier(self._require(), g, t))

    # ---- point to point -------------------------------------------------
    #
    # Between this member and ``peer`` (a member id), matched by ``name``:
    # the k-th push of a name from A to B meets B's k-th pull of it from
    # A, the k-th notify the k-th wait. push and notify return once sent
    # (the peer's node keeps them until the pull or the wait); pull and
    # wait block until they come or the timeout passes.

    def push(
        self, peer: str, name: str, x: Any, timeout: Optional[float] = None
    ) -> None:
        """Sends ``x`` to member ``peer``, whose ``pull(<this member's
        id>, name, y)`` receives it; returns once it is sent."""
        o, p, n, t = _operand(x), self._peer(peer), self._name(name), self._t(timeout)
        with self._lock:
            self._check(
                self._lib.st_comm_push(
                    self._require(), p, n, o.ptr, o.count, o.dtype, t
                )
            )

    def pull(
        self, peer: str, name: str, x: Any, timeout: Optional[float] = None
    ) -> Any:
        """Fills ``x`` (the push's dtype and number of elements) with what
        ``peer`` pushes under ``name``. Returns as all_reduce does."""
        o, p, n, t = _operand(x), self._peer(peer), self._name(name), self._t(timeout)
        with self._lock:
            self._check(
                self._lib.st_comm_pull(
                    self._require(), p, n, o.ptr, o.count, o.dtype, t
                )
            )
        if o.back is not None:
            o.back()
        return o.result()

    def notify(self, peer: str, name: str, timeout: Optional[float] = None) -> None:
        """Signals ``peer``, which waits for it under ``name``; returns once
        the signal is sent."""
        p, n, t = self._peer(peer), self._name(name), self._t(timeout)
        with self._lock:
            self._check(self._lib.st_comm_notify(self._require(), p, n, t))

    def wait(self, peer: str, name: str, timeout: Optional[float] = None) -> None:
        """Returns once ``peer`` has notified this member under ``name``."""
        p, n, t = self._peer(peer), self._name(name), self._t(timeout)
        with self._lock:
            self._check(self._lib.st_comm_wait(self._require(), p, n, t))

    # ---- publish and fetch (one-sided) ----------------------------------
    #
    # A program publishes a named tensor on its node, which keeps a copy;
    # any member fetches it whenever it likes, with no call by the
    # publisher's program (which may have gone). Every holder of the
    # cluster key may fetch what is published.

    def publish(self, name: str, x: Any) -> None:
        """Keeps a copy of ``x`` under ``name`` on this node, replacing what
        was published under it."""
        o, n = _operand(x), self._name(name)
        with self._lock:
            self._check(
                self._lib.st_comm_publish(self._require(), n, o.ptr, o.count, o.dtype),
                store=True,
            )

    def unpublish(self, name: str) -> None:
        """Forgets what this node published under ``name`` (NotPublished
        when nothing)."""
        n = self._name(name)
        with self._lock:
            self._check(self._lib.st_comm_unpublish(self._require(), n), store=True)

    def fetch(
        self, peer: str, name: str, x: Any, timeout: Optional[float] = None
    ) -> Any:
        """Fills ``x`` (the published dtype and number of elements) with
        what member ``peer`` has published under ``name``. Raises
        NotPublished when nothing is, PublisherBusy when its node serves too
        many fetches at once, CollectiveError naming both when the dtype or
        size differs. Returns as all_reduce does."""
        o, p, n, t = _operand(x), self._peer(peer), self._name(name), self._t(timeout)
        with self._lock:
            self._check(
                self._lib.st_comm_fetch(
                    self._require(), p, n, o.ptr, o.count, o.dtype, t
                ),
                store=True,
            )
        if o.back is not None:
            o.back()
        return o.result()

    # ---- algorithms (starling.algos; numpy) ----------------------------

    def kmeans(
        self,
        x: Any,
        k: int,
        max_iter: int = 300,
        tol: float = 1e-4,
        seed: int = 1,
        group: Group = None,
        timeout: Optional[float] = None,
        progress: Optional[Callable[[int, float, float, int], None]] = None,
    ) -> Any:
        """Parallel k-means (Lloyd's algorithm, k-means++ start) of this
        member's points ``x`` (rows x features; numpy or torch, as float32)
        with the group's: every member calls it with the same options on its
        own rows (possibly none) and gets the same ``KMeansResult`` (float64
        centroids k x dim, counts, iterations, converged, objective, ...).
        Stops when no centroid moves more than ``tol`` (0: until no point
        changes cluster) or after ``max_iter``. A point equally near two
        centroids goes to the lower index; a cluster without a point keeps
        its previous centroid. ``progress(iteration, objective, moved,
        empty)`` after each iteration. ``timeout`` bounds each collective.
        Raises CollectiveMismatch naming the option the members disagree on
        (every member does), and as every call for failures."""
        from . import algos

        return algos.kmeans(self, x, k, max_iter, tol, seed, group, timeout, progress)

    def lstsq(
        self,
        x: Any,
        y: Any,
        ridge: float = 0.0,
        intercept: bool = True,
        method: str = "normal",
        max_iter: int = 1000,
        tol: float = 1e-6,
        alpha: float = 0.0,
        group: Group = None,
        timeout: Optional[float] = None,
        progress: Optional[Callable[[int, float, float], None]] = None,
    ) -> Any:
        """Least squares, min ||X w + b - y||^2 + ridge ||w||^2, over this
        member's rows (``x`` rows x features, ``y`` one value a row) and
        the group's: every member gets the same ``LstsqResult`` (weight,
        bias, solver, rss, rmse, ...). ``method="normal"``: the closed form
        from the summed X^T X and X^T y (Cholesky; pivoted QR, minimum
        norm, when singular or ill conditioned: ``solver == "qr"``);
        ``"gd"``: gradient descent, step alpha / (n sqrt(t)) (alpha 0:
        chosen from the data), until the gradient falls to ``tol`` of its
        first or ``max_iter``; ``progress(iteration, objective,
        grad_norm)``."""
        from . import algos

        return algos.lstsq(
            self, x, y, ridge, intercept, method, max_iter, tol, alpha, group,
            timeout, progress,
        )

    # ---- closing --------------------------------------------------------

    @property
    def closed(self) -> bool:
        return not self._c.value

    def close(self) -> None:
        """Closes the communicator (safe to call twice)."""
        with self._lock:
            if self._c.value:
                self._lib.st_comm_close(self._c)
                self._c = ctypes.c_void_p()

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if getattr(self, "_c", None) is not None and self._c.value:
                self._lib.st_comm_close(self._c)
                self._c = ctypes.c_void_p()
        except Exception:
            pass  # interpreter shutdown: the node sees the socket close

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<starling.Comm {state} on {self.socket}>"

    # ---- helpers --------------------------------------------------------

    def _require(self) -> ctypes.c_void_p:
        if not self._c.value:
            raise StarlingError("the communicator is closed; open another")
        return self._c

    def _check(self, rc: int, store: bool = False) -> None:
        if rc != 0:
            msg = self._lib.st_comm_error(self._c)
            text = msg.decode("utf-8", "replace") if msg else ""
            raise comm_error_for(rc, text, store)

    def _t(self, timeout: Optional[float]) -> float:
        t = self.timeout if timeout is None else timeout
        if t is None:
            return 0.0
        if not float(t) >= 0:
            raise _refuse(f"timeout {t!r}: seconds >= 0 (0 or None: no limit)")
        return float(t)

    @staticmethod
    def _op(op: str) -> int:
        if op not in _lib.COMM_OPS:
            raise _refuse(f'op {op!r}: one of "sum", "mean", "min", "max"')
        return _lib.COMM_OPS[op]

    @staticmethod
    def _peer(peer: str) -> bytes:
        if not isinstance(peer, str) or len(peer) != 32 or not all(
            ch in "0123456789abcdefABCDEF" for ch in peer
        ):
            raise _refuse(
                f"peer {peer!r}: a member id (32 hex digits, as Comm.members() gives)"
            )
        return peer.encode("ascii")

    @staticmethod
    def _name(name: str) -> bytes:
        b = name.encode("utf-8") if isinstance(name, str) else b""
        if not 1 <= len(b) <= 128:
            raise _refuse(f"name {name!r}: a string of 1 to 128 bytes (UTF-8)")
        return b

    @staticmethod
    def _root(root: int) -> int:
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < 2**32:
            raise _refuse(
                f"root {root!r}: a rank (an int from 0 to the group's size - 1)"
            )
        return root

    def _run(
        self,
        o: _Operand,
        call: Callable[[ctypes.c_void_p], int],
        only_rank: Optional[int] = None,
    ) -> Any:
        """Runs one operation on o; copies a staged result back (for a
        reduce, only on the root, where the data changed)."""
        with self._lock:
            self._check(call(self._require()))
            rank, _ = self.last_group()
        if o.back is not None and (only_rank is None or rank == only_rank):
            o.back()
        return o.result()


def open_comm(
    socket: Union[str, "os.PathLike[str]"] = "state/control.sock",
    timeout: Optional[float] = None,
) -> Comm:
    """Opens a communicator on the node whose control socket is ``socket``
    (DATA_DIR/control.sock of any `starling node`, built-in training or
    --attach). ``timeout`` (seconds; None: no limit) is the default of
    every call's. Raises NodeUnavailable (no node there), NodeBusy (the
    node refused: too many sessions, leaving), StarlingError (no library).
    """
    return Comm(socket, timeout=timeout)
