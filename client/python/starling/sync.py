"""starling.sync: synchronous data-parallel SGD for PyTorch programs over
the cluster's collectives (starling.Comm; docs/collectives.md,
"Synchronous SGD (Python)").

Every member runs the same program on its own batch, against its own node:

    comm = starling.open_comm("state0/control.sock")
    sync = starling.SyncDataParallel(model, comm, optimizer=opt)  # rank 0's state
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # buckets all-reduced as they fill
        sync.step(opt)                    # wait, average, step (or skip)

As in PyTorch's DistributedDataParallel, the parameters are cut into
buckets of about ``bucket_bytes`` in reverse registration order (the order
backward produces their gradients). A hook on each parameter's gradient
accumulator copies the accumulated gradient into its bucket's flat buffer;
when a bucket is complete it is handed to one background thread, which
all-reduces it (op "mean") while backward goes on (the Comm releases the
GIL while it waits). Buckets go out in index order on every member, even
when a later one fills first, so that every member's sequence of
operations is the same. ``wait()`` waits for every bucket and writes the
averaged gradients back into ``param.grad``.

A failed all-reduce (a member died, its program went away, a timeout)
drops the step everywhere (every ``param.grad`` becomes None, so that
``optimizer.step()`` changes nothing), re-forms the group from the
survivors and makes them equal again (rank 0's parameters, buffers and,
when the optimizer is known, its state); the next step runs on the
smaller group. See the docs for how the batch
and the learning rate change.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
import time
import zlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Union

import torch

from .errors import (
    CollectiveError,
    CollectiveMismatch,
    NodeUnavailable,
    StarlingError,
)

__all__ = ["SyncDataParallel", "SyncError"]

# "the program on member <id> went away" (daemon_coll_session.c) and the
# members a timeout did not hear from (gossip/coll.c): the members a failed
# step leaves out of the next group at once, without waiting for the
# failure detector (their nodes are alive; their programs are not there).
_GONE = re.compile(r"the program on member ([0-9a-f]{32}) went away")
_SILENT = re.compile(r"no word yet from ((?:[0-9a-f]{12}(?:, )?)+)")
_DTYPES = (torch.float32, torch.float64)


class SyncError(StarlingError):
    """The group could not be re-formed after a failed step within
    ``recover_timeout`` seconds; the message holds the last failure."""


class _Bucket:
    """Parameters whose gradients are all-reduced together, as one flat
    buffer (CPU; pinned when the parameters are on a GPU)."""

    def __init__(self, index: int, params: List[torch.Tensor], pin: bool) -> None:
        self.index = index
        self.params = params
        self.offsets: List[int] = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.numel = n
        self.buf = torch.zeros(n, dtype=params[0].dtype, pin_memory=pin)
        self.pending = len(params)
        self.ready_t = self.start_t = self.end_t = 0.0

    @property
    def nbytes(self) -> int:
        return self.numel * self.buf.element_size()


class SyncDataParallel:
    """Synchronous data-parallel training of ``model`` with the members of
    ``comm``'s cluster that run the same program.

    ``bucket_bytes``: the size a bucket grows to (a larger parameter gets a
    bucket of its own). ``group``: None (the members alive now, "all") or a
    list of member ids; kept as an explicit list, so that a node that joins
    later, without this program, does not stall training. ``timeout``:
    seconds an all-reduce waits before the step fails (None: the Comm's).
    ``settle``, ``detect_timeout``, ``recover_timeout``: how a failed step
    waits for the failure detector (see ``wait``). ``optimizer``: the
    optimizer whose state (momentum, Adam's moments and step) is made
    equal with the parameters, at construction and at every re-forming
    (every member gives one, or none does: it is part of the check at
    construction). Without it a step that succeeded on one member and
    failed on another (the last segment of an all-reduce reached one
    before its sender died) leaves their momenta apart.

    Construction is itself collective: every member of the group must make
    its SyncDataParallel at about the same time; it checks that every
    member has the same parameters (shapes, dtypes, bucket layout; raises
    StarlingError naming what differs) and copies rank 0's parameters and
    floating-point buffers to every member."""

    def __init__(
        self,
        model: torch.nn.Module,
        comm: Any,
        bucket_bytes: int = 1 << 20,
        group: Union[None, str, Sequence[str]] = None,
        timeout: Optional[float] = 60.0,
        settle: float = 0.5,
        detect_timeout: float = 30.0,
        recover_timeout: float = 180.0,
        optimizer: Optional[torch.optim.Optimizer] = None,
    ) -> None:
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise StarlingError(f"bucket_bytes {bucket_bytes!r}: a positive int")
        self.module = model
        self.comm = comm
        self.timeout = timeout
        self.settle = settle
        self.detect_timeout = detect_timeout
        self.recover_timeout = recover_timeout
        self.steps = 0  # steps whose gradients were averaged
        self.failed_steps = 0  # steps dropped by a failure
        self.reforms = 0  # times the group was re-formed
        # Re-formings whose members' optimizer states had different
        # layouts (one had stepped, another not yet): every member cleared
        # its state instead.
        self.optimizer_resets = 0
        self.optimizer = optimizer
        self.last_failure: Optional[BaseException] = None
        # Per bucket of the last step: bytes, and when it was complete,
        # its all-reduce started and ended (time.monotonic(); 0: skipped).
        self.last_timings: List[Dict[str, Any]] = []
        self._names = {id(p): n for n, p in model.named_parameters()}
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise StarlingError("the model has no parameters that require grad")
        for p in self._params:
            if p.dtype not in _DTYPES:
                raise StarlingError(
                    f"parameter '{self._names.get(id(p), '?')}' is {p.dtype}: "
                    "SyncDataParallel all-reduces float32 or float64 "
                    "gradients; cast the model first (model.float())"
                )
        self.buckets = self._make_buckets(bucket_bytes)
        self._excluded: Set[str] = set()
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._paused = False
        self._closed = False
        self._reset_step()
        self._group = self._agree(group)
        self._sync_state(self._group)
        self._queue: "queue.Queue[Optional[_Bucket]]" = queue.Queue()
        self._worker = threading.Thread(
            target=self._work, name="starling-sync", daemon=True
        )
        self._worker.start()
        self._hooks = self._install_hooks()

    # ---- the group --------------------------------------------------------

    @property
    def group(self) -> List[str]:
        """The member ids of the group now, in rank order."""
        return list(self._group)

    @property
    def size(self) -> int:
        return len(self._group)

    @property
    def rank(self) -> int:
        """This member's rank in the group now (0 holds the parameters
        that re-forming copies to the others)."""
        return self._group.index(self._self)

    def _signature(self) -> List[float]:
        """What every member must agree on, as exact float64 values: the
        number of parameters, of elements, the bucket layout, a CRC of the
        shapes and dtypes, and whether an optimizer was given (its state
        is made equal in collective calls of their own)."""
        shapes = ";".join(f"{tuple(p.shape)}:{p.dtype}" for p in self._params)
        layout = ";".join(str(b.numel) for b in self.buckets)
        return [
            float(len(self._params)),
            float(sum(p.numel() for p in self._params)),
            float(len(self.buckets)),
            float(zlib.crc32(shapes.encode())),
            float(zlib.crc32(layout.encode())),
            float(self.optimizer is not None),
        ]

    def _agree(self, group: Union[None, str, Sequence[str]]) -> List[str]:
        """Checks the members' signatures in one all-reduce (max of the
        values and of their negations) and returns the group as a list."""
        explicit = None if group in (None, "all") else sorted(group)
        sig = self._signature()
        deadline = time.monotonic() + self.recover_timeout
        while True:
            v = sig + [-x for x in sig]
            try:
                v = self.comm.all_reduce(
                    v, op="max", group=explicit, timeout=self.timeout
                )
            except CollectiveMismatch:
                # Two views of "all" (a member not seen everywhere yet).
                if explicit is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
                continue
            ids, me = self.comm.members()
            _, n = self.comm.last_group()
            if explicit is not None or len(ids) == n:
                break
            if time.monotonic() > deadline:  # the membership keeps changing
                raise StarlingError(
                    f"the members of \"all\" kept changing for "
                    f"{self.recover_timeout:.0f} s; pass group= explicitly"
                )
        self._self = ids[me]
        k = len(sig)
        what = [
            "parameters", "elements", "buckets", "shapes", "bucket sizes",
            "optimizer= (given or not)",
        ]
        for i in range(k):
            if v[i] != -v[k + i]:
                raise StarlingError(
                    f"the members' models differ in their {what[i]} (this "
                    f"member: {sig[i]:.0f}; from {-v[k + i]:.0f} to "
                    f"{v[i]:.0f}): run the same model with the same "
                    "bucket_bytes and optimizer= on every member"
                )
        return explicit if explicit is not None else ids

    # ---- buckets and hooks -------------------------------------------------

    def _make_buckets(self, bucket_bytes: int) -> List[_Bucket]:
        pin = torch.cuda.is_available() and any(p.is_cuda for p in self._params)
        out: List[_Bucket] = []
        cur: List[torch.Tensor] = []
        size = 0
        for p in reversed(self._params):  # backward's order, roughly
            nb = p.numel() * p.element_size()
            if cur and (size + nb > bucket_bytes or p.dtype != cur[0].dtype):
                out.append(_Bucket(len(out), cur, pin))
                cur, size = [], 0
            cur.append(p)
            size += nb
        out.append(_Bucket(len(out), cur, pin))
        self._where = {}
        for b in out:
            for slot, p in enumerate(b.params):
                self._where[id(p)] = (b, slot)
        return out

    def _install_hooks(self) -> List[Any]:
        """A hook on each parameter's AccumulateGrad node: it runs after
        the gradient is accumulated into ``param.grad`` (a tensor hook runs
        before, and would miss gradients accumulated under no_sync)."""
        self._accs = []
        handles = []
        for p in self._params:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            b, slot = self._where[id(p)]
            self._accs.append(acc)  # the param holds it weakly: keep it

            def hook(*_: Any, p: torch.Tensor = p, b: _Bucket = b, slot: int = slot):
                self._ready(p, b, slot)

            handles.append(acc.register_hook(hook))
        return handles

    def _reset_step(self) -> None:
        for b in self.buckets:
            b.pending = len(b.params)
            b.ready_t = b.start_t = b.end_t = 0.0
        self._seen: Set[int] = set()
        self._next = 0  # the next bucket to hand to the worker
        self._done = 0
        self._error: Optional[BaseException] = None

    def _copy_in(self, p: torch.Tensor, b: _Bucket, slot: int) -> None:
        off = b.offsets[slot]
        dst = b.buf[off : off + p.numel()]
        if p.grad is None:
            dst.zero_()
        else:
            dst.copy_(p.grad.detach().reshape(-1))

    def _ready(self, p: torch.Tensor, b: _Bucket, slot: int) -> None:
        """A parameter's gradient is complete: into its bucket; hands the
        buckets that are complete, in index order, to the worker."""
        if self._paused:
            return
        with self._lock:
            if id(p) in self._seen:
                raise StarlingError(
                    f"the gradient of '{self._names.get(id(p), '?')}' came "
                    "twice in one step: call wait() (or step(optimizer)) "
                    "after every backward, or accumulate under no_sync()"
                )
            self._seen.add(id(p))
            self._copy_in(p, b, slot)
            b.pending -= 1
            if b.pending == 0:
                b.ready_t = time.monotonic()
            self._launch()

    def _launch(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._queue.put(self.buckets[self._next])
            self._next += 1

    def _work(self) -> None:
        """The worker: all-reduces the buckets in the order it gets them;
        after a failure, skips the rest of the step."""
        while True:
            b = self._queue.get()
            if b is None:
                return
            err: Optional[BaseException] = None
            if self._error is None:
                b.start_t = time.monotonic()
                try:
                    self.comm.all_reduce(
                        b.buf, op="mean", group=self._group, timeout=self.timeout
                    )
                except BaseException as e:  # handed to wait()
                    err = e
                b.end_t = time.monotonic()
            with self._cv:
                if err is not None and self._error is None:
                    self._error = err
                self._done += 1
                self._cv.notify_all()

    # ---- the step ----------------------------------------------------------

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate into ``param.grad``; the
        first backward after it all-reduces the sum (gradient
        accumulation)."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def wait(self) -> bool:
        """Waits until every bucket of this step is averaged over the group
        and writes the averages into ``param.grad``. Parameters whose
        gradient backward did not produce are averaged as they are (zeros
        where ``grad`` is None). Returns True, or False when the step
        failed: then every ``param.grad`` is None (so that an optimizer
        step changes nothing), the group has been re-formed from the
        survivors and their parameters made equal (rank 0's), and the
        next step runs on it.

        Re-forming: members named by the failure as gone (a program that
        went away, members a timeout did not hear from) are left out at
        once; otherwise it waits (up to ``detect_timeout`` s) until the
        node's failure detector removes a member of the group, then until
        the membership has not changed for ``settle`` s. A member never
        re-forms alone on silence: when the members a timeout did not hear
        from are all the others, they stay (only the failure detector takes
        them out) and the same group is tried again at once; so it is after
        a mismatch (one member already re-forming, another still in the
        step). The group meets at a barrier, then rank 0's state is
        broadcast. Raises
        NodeUnavailable when this member's node went away,
        CollectiveError for a refused argument, and SyncError when no
        group could be re-formed within ``recover_timeout`` s."""
        if self._closed:
            raise StarlingError("this SyncDataParallel is closed")
        with self._lock:
            for b in self.buckets:
                for slot, p in enumerate(b.params):
                    if id(p) not in self._seen:
                        self._seen.add(id(p))
                        self._copy_in(p, b, slot)
                if b.pending > 0:
                    b.pending = 0
                    b.ready_t = time.monotonic()
            self._launch()
            while self._done < len(self.buckets):
                self._cv.wait()
            err = self._error
            self.last_timings = [
                {
                    "bucket": b.index,
                    "bytes": b.nbytes,
                    "ready": b.ready_t,
                    "start": b.start_t,
                    "end": b.end_t,
                }
                for b in self.buckets
            ]
            self._reset_step()
        if err is None:
            self._copy_out()
            self.steps += 1
            return True
        self._fail(err)
        return False

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """``wait()``, then ``optimizer.step()`` when the step succeeded.
        Returns what wait() returned. (The optimizer whose state re-forming
        makes equal is the one given at construction: a member that
        learned of one only here would make calls the others do not.)"""
        ok = self.wait()
        if ok:
            optimizer.step()
        return ok

    def _copy_out(self) -> None:
        with torch.no_grad():
            for b in self.buckets:
                for slot, p in enumerate(b.params):
                    off = b.offsets[slot]
                    avg = b.buf[off : off + p.numel()].view_as(p)
                    if p.grad is None:
                        p.grad = avg.to(p.device, copy=True)
                    else:
                        p.grad.copy_(avg)

    # ---- failures ----------------------------------------------------------

    def _fail(self, err: BaseException) -> None:
        """Drops the step and re-forms the group (see wait)."""
        if isinstance(err, NodeUnavailable) or not isinstance(err, CollectiveError):
            raise err
        if err.errno == 0:
            raise err  # refused before the node was asked: a program error
        self.failed_steps += 1
        self.last_failure = err
        for p in self._params:
            p.grad = None
        self._reform(err)

    def _gone(self, err: CollectiveError, group: List[str]) -> Set[str]:
        """The members of group that the failure says are not there: whose
        program went away, and those a timeout did not hear from, unless
        they are all the others (then silence alone would leave this member
        alone; they stay, for the failure detector to judge)."""
        text = str(err)
        gone = set(_GONE.findall(text)) & set(group)
        silent: Set[str] = set()
        m = _SILENT.search(text)
        if m:
            for prefix in filter(None, m.group(1).split(", ")):
                silent.update(i for i in group if i.startswith(prefix))
        if self._self in silent and len(silent) + 1 < len(group):
            # The others timed out on this member (it was slower than the
            # timeout, or came late): they go on without it, so it stops
            # rather than go on alone. (Named beside every other member but
            # the one that failed, it is kept: that one would be alone.)
            raise SyncError(
                f"the other members left this member ({self._self}) out of "
                f"the group: it was not heard from in time ({err}); make "
                "the timeout longer than a step and start again",
                err.errno,
            ) from err
        silent.discard(self._self)
        others = set(group) - {self._self} - gone
        if others and others <= silent:
            silent = set()
        return gone | silent

    def _again(self, err: CollectiveError, group: List[str]) -> bool:
        """Whether the failure keeps the same group: a mismatch (members
        alive and talking, their counts kept equal by the failed call), or
        a timeout whose silence _gone overlooked."""
        if isinstance(err, CollectiveMismatch):
            return True
        m = _SILENT.search(str(err))
        return bool(m) and not self._gone(err, group) and len(group) > 1

    def _reform(self, err: CollectiveError) -> None:
        old = list(self._group)
        deadline = time.monotonic() + self.recover_timeout
        self._excluded |= self._gone(err, old)
        wait_for_loss = not (self._excluded & set(old)) and not self._again(err, old)
        while True:
            group = [
                i for i in self._settle(old, deadline, wait_for_loss)
                if i not in self._excluded
            ]
            wait_for_loss = False
            try:
                # A barrier first: symmetric, where the broadcast's root
                # would pass alone. One that met nobody is withdrawn on
                # every side, so retries of one group stay in step.
                self.comm.barrier(group=group, timeout=self.timeout)
                self._sync_state(group)
                self._group = group
                self.reforms += 1
                return
            except NodeUnavailable:
                raise
            except CollectiveError as e:
                if e.errno == 0:
                    raise
                self.last_failure = e
                self._excluded |= self._gone(e, group)
                if time.monotonic() > deadline:
                    raise SyncError(
                        f"could not re-form the group of {len(old)} members "
                        f"within {self.recover_timeout:.0f} s after a failed "
                        f"step ({err}); last failure: {e}",
                        e.errno,
                    ) from e

    def _settle(
        self, old: List[str], deadline: float, wait_for_loss: bool
    ) -> List[str]:
        """The members of old that the node still lists, once that list has
        not changed for ``settle`` s (and, with wait_for_loss, once it lost
        one, or detect_timeout s passed)."""
        start = since = time.monotonic()
        last: Optional[List[str]] = None
        while True:
            ids, _ = self.comm.members()
            alive = [i for i in old if i in ids]
            now = time.monotonic()
            if alive != last:
                last, since = alive, now
            lost = len(alive) < len(old) or now - start >= self.detect_timeout
            if now - since >= self.settle and (lost or not wait_for_loss):
                return alive
            if now >= deadline:
                return alive
            time.sleep(0.05)

    # ---- state -------------------------------------------------------------

    def _state(self) -> List[torch.Tensor]:
        """The tensors made equal at construction and re-forming: the
        parameters and the floating-point buffers, in module order."""
        out = [p for p in self.module.parameters()]
        out += [t for t in self.module.buffers() if t.dtype in _DTYPES]
        return out

    def _sync_state(self, group: List[str]) -> None:
        """Copies rank 0's parameters and buffers to every member of group,
        one broadcast per dtype (the tensors flattened into one buffer),
        then the optimizer's state (_sync_optimizer)."""
        self._broadcast_tensors(self._state(), group)
        if self.optimizer is not None:
            self._sync_optimizer(group)

    def _broadcast_tensors(self, tensors: List[torch.Tensor], group: List[str]) -> None:
        """Rank 0's values of tensors (float32 and float64 ones) to every
        member of group, one broadcast per dtype, in place."""
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for t in tensors:
            if t.dtype in _DTYPES and t.numel() > 0:
                by_dtype.setdefault(t.dtype, []).append(t)
        for dtype in _DTYPES:
            ts = by_dtype.get(dtype)
            if not ts:
                continue
            with torch.no_grad():
                flat = torch.cat([t.detach().reshape(-1).cpu() for t in ts])
                self.comm.broadcast(flat, root=0, group=group, timeout=self.timeout)
                off = 0
                for t in ts:
                    n = t.numel()
                    t.copy_(flat[off : off + n].view_as(t))
                    off += n

    def _optimizer_layout(self) -> Any:
        """The optimizer's state for the parameters, in parameter order:
        its layout as text (each entry's key, kind, dtype and shape), the
        float32 and float64 tensors, and the plain numbers (key path,
        value). Tensors of other dtypes and other entries are left as they
        are (their layout must still agree)."""
        assert self.optimizer is not None
        state = self.optimizer.state
        words: List[str] = []
        tensors: List[torch.Tensor] = []
        numbers: List[Any] = []
        for i, p in enumerate(self._params):
            st = state.get(p, {})
            for key in sorted(st, key=str):
                v = st[key]
                if isinstance(v, torch.Tensor):
                    words.append(f"{i}.{key}:{v.dtype}{tuple(v.shape)}")
                    if v.dtype in _DTYPES:
                        tensors.append(v)
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    words.append(f"{i}.{key}:{type(v).__name__}")
                    numbers.append((st, key))
                else:  # kept as it is: its type, not its value, must agree
                    words.append(f"{i}.{key}:{type(v).__name__}")
        return ";".join(words), tensors, numbers

    def _sync_optimizer(self, group: List[str]) -> None:
        """Rank 0's optimizer state to every member of group. The members
        first compare the state's layout (one all-reduce of its hash, max
        and negated max); when it differs (a member that has stepped and
        one that has not yet), every member clears its state, so that all
        go on alike (momentum starts again; counted in optimizer_resets)."""
        assert self.optimizer is not None
        layout, tensors, numbers = self._optimizer_layout()
        h = float(zlib.crc32(layout.encode()))
        both = torch.tensor([h, -h], dtype=torch.float64)
        self.comm.all_reduce(both, op="max", group=group, timeout=self.timeout)
        if both[0].item() != -both[1].item():
            self.optimizer.state.clear()
            self.optimizer_resets += 1
            return
        self._broadcast_tensors(tensors, group)
        if numbers:
            vals = torch.tensor([float(st[k]) for st, k in numbers], dtype=torch.float64)
            self.comm.broadcast(vals, root=0, group=group, timeout=self.timeout)
            for (st, k), v in zip(numbers, vals.tolist()):
                st[k] = type(st[k])(v)

    # ---- closing -----------------------------------------------------------

    def close(self) -> None:
        """Removes the hooks and stops the worker (the Comm stays open: it
        is the caller's). Safe to call twice."""
        self._closed = True
        for h in getattr(self, "_hooks", []):
            h.remove()
        self._hooks = []
        w = getattr(self, "_worker", None)
        if w is not None and w.is_alive():
            self._queue.put(None)
            w.join()

    def __enter__(self) -> "SyncDataParallel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the model (as DistributedDataParallel's forward does)."""
        return self.module(*args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"<starling.SyncDataParallel {len(self._params)} parameters in "
            f"{len(self.buckets)} buckets, group of {len(self._group)}>"
        )
