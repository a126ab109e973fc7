"""test_sync_sgd.py: synchronous data-parallel SGD (starling.SyncDataParallel,
client/python/starling/sync.py; docs/collectives.md, "Synchronous SGD
(Python)").

Without nodes (a one-member stand-in for the Comm): the bucket layout
(reverse registration order, bucket_bytes), buckets handed out in index
order even when a later one fills first, the averages written back,
gradient accumulation under no_sync(), a second backward without wait()
refused, a parameter without a gradient, a float16 model refused, which
members a failure leaves out (and a member named so stops).

Against four real `starling node --attach` processes on 127.0.0.1, one
thread per member, each with its own Comm on its own node:

  - equivalence: four members with batch b each and different initial
    parameters (rank 0's are broadcast) end 20 SGD steps (momentum, mean
    loss) where one plain PyTorch process ends on the 4b batch, within
    1e-5 relative; the gradients went out in several buckets, the first
    all-reduce of every step started while backward was still running (a
    layer whose backward sleeps keeps backward going after the first
    buckets are complete), and every member ends with the same bits;
  - the same with the models on a GPU (skipped without CUDA);
  - the optimizer's state made equal (optimizer=): two members whose
    momenta differ take rank 0's and end 5 steps with the same bits; two
    whose states differ in layout (one has stepped, one not) both clear
    theirs;
  - a member whose program stops (closes its Comm) mid-training, of four:
    the survivors' next step times out on it, is dropped, and training
    goes on in a group of three, the survivors' parameters the same bits;
  - a member whose node is killed mid-training, of three: the survivors'
    step fails at once, the group re-forms when the failure detector has
    removed the node, and training goes on, the survivors equal.

A node counts the operations on each group (client.h): a member that
stops leaves its node behind the others on that group, so each failure
test runs on a group the nodes are in step on (the four; then the three
that survived).
"""

from __future__ import annotations

import copy
import errno
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import torch

import starling
from conftest import SLOW, Cluster

N = 4  # members (nodes)
B = 8  # each member's batch
STEPS = 20
DIM_IN, DIM_OUT = 8, 4


class _Slow(torch.autograd.Function):
    """The identity, whose backward sleeps: backward goes on for a while
    after the buckets of the layers above it are complete."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        time.sleep(0.05)
        return g


class Slow(torch.nn.Module):
    def __init__(self, on: bool) -> None:
        super().__init__()
        self.on = on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Slow.apply(x) if self.on else x


def mlp(seed: int, slow: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM_IN, 32),
        torch.nn.Tanh(),
        Slow(slow),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, DIM_OUT),
    )


def data(steps: int, n: int) -> List[Any]:
    """steps batches of n * B examples (x, y): member r takes rows
    r*B:(r+1)*B of each."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(DIM_IN, DIM_OUT, generator=g)
    out = []
    for _ in range(steps):
        x = torch.randn(n * B, DIM_IN, generator=g)
        out.append((x, torch.sin(x @ w)))
    return out


def train_steps(
    model: torch.nn.Module,
    sync: Any,
    batches: List[Any],
    rank_of: Callable[[], int],
    after: Optional[Callable[[int], bool]] = None,
) -> List[bool]:
    """One SGD step per batch, each member on its rows of the group it is
    in now; after(step) returning False stops. The steps' results."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = []
    for k, (x, y) in enumerate(batches):
        r = rank_of()
        rows = slice(r * B, (r + 1) * B)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        out.append(sync.step(opt))
        if after is not None and not after(k):
            break
    return out


# ---- without nodes --------------------------------------------------------


class OneComm:
    """A Comm of one member: all-reduce and broadcast leave the data as it
    is; records the operations."""

    def __init__(self) -> None:
        self.calls: List[Any] = []

    def members(self) -> Any:
        return ["a" * 32], 0

    def last_group(self) -> Any:
        return 0, 1

    def all_reduce(self, x: Any, op: str = "sum", **_: Any) -> Any:
        n = x.numel() if isinstance(x, torch.Tensor) else len(x)
        self.calls.append(("all_reduce", op, n))
        return x

    def broadcast(self, x: Any, root: int, **_: Any) -> Any:
        self.calls.append(("broadcast", root, x.numel()))
        return x


def test_buckets_and_order() -> None:
    """Reverse registration order, bucket_bytes, and index order out."""
    model = mlp(0)
    comm = OneComm()
    with starling.SyncDataParallel(model, comm, bucket_bytes=600) as sync:
        sizes = [[p.numel() for p in b.params] for b in sync.buckets]
        # Linear(32,4): bias 4 + weight 128 floats (528 B) fit in 600 B;
        # the others do not go together.
        assert sizes == [[4, 128], [32], [1024], [32], [256]], sizes
        assert comm.calls[0][0] == "all_reduce"  # the signatures
        total = sum(p.numel() for p in model.parameters())
        assert comm.calls[1] == ("broadcast", 0, total)
        comm.calls.clear()
        # Bucket 1 complete before bucket 0: nothing goes out until 0 is.
        b0, b1 = sync.buckets[0], sync.buckets[1]
        sync._ready(b1.params[0], b1, 0)
        time.sleep(0.05)
        assert comm.calls == []
        sync._ready(b0.params[0], b0, 0)
        sync._ready(b0.params[1], b0, 1)
        assert sync.wait() is True
        assert [c[2] for c in comm.calls] == [132, 32, 1024, 32, 256]


def test_averages_written_back_and_accumulation() -> None:
    model = mlp(1)
    with starling.SyncDataParallel(model, OneComm(), bucket_bytes=1000) as sync:
        x = torch.randn(5, DIM_IN)
        model(x).sum().backward()
        want = [p.grad.clone() for p in model.parameters()]
        assert sync.wait()
        for p, w in zip(model.parameters(), want):
            assert torch.equal(p.grad, w)
        # no_sync: the first backward accumulates only; the second sends the sum.
        model.zero_grad()
        with sync.no_sync():
            model(x).sum().backward()
        model(x).sum().backward()
        assert sync.wait()
        for p, w in zip(model.parameters(), want):
            torch.testing.assert_close(p.grad, 2 * w)
        # A second backward without wait() is refused, naming the tensor.
        model(x).sum().backward()
        with pytest.raises(starling.StarlingError, match="came twice"):
            model(x).sum().backward()
        assert sync.wait()


def test_unused_parameter_and_dtype() -> None:
    model = mlp(2)
    with starling.SyncDataParallel(model, OneComm()) as sync:
        model.zero_grad(set_to_none=True)
        model[5](torch.randn(2, 32)).sum().backward()  # the last layer only
        assert sync.wait()
        assert torch.count_nonzero(model[0].weight.grad) == 0
        assert model[5].weight.grad.abs().sum() > 0
    with pytest.raises(starling.StarlingError, match="closed"):
        sync.wait()
    with pytest.raises(starling.StarlingError, match="float16"):
        starling.SyncDataParallel(mlp(3).half(), OneComm())


def test_who_is_left_out() -> None:
    """The members a failure names as gone (a program that went away, the
    members a timeout did not hear from, unless they are all the others);
    this member named so stops, unless the others would be alone."""
    a, b, c = "a" * 32, "b" * 32, "c" * 32
    with starling.SyncDataParallel(mlp(4), OneComm()) as sync:
        group = [a, b, c]
        gone = starling.MemberFailed(
            f"member {b}: rank 1 failed the operation: the program on "
            f"member {c} went away",
            errno.ECONNABORTED,
        )
        assert sync._gone(gone, group) == {c}
        late = starling.CollectiveTimeout(
            f"timed out after 2.0 s; no word yet from {b[:12]}", errno.ETIMEDOUT
        )
        assert sync._gone(late, group) == {b}
        dead = starling.MemberFailed(f"member {c}: it is dead", errno.ECONNABORTED)
        assert sync._gone(dead, group) == set()  # the failure detector's call
        me = starling.MemberFailed(
            f"member {b}: rank 1 failed the operation: timed out after 2.0 s; "
            f"no word yet from {a[:12]}",
            errno.ECONNABORTED,
        )
        with pytest.raises(starling.SyncError, match="left this member"):
            sync._gone(me, group)
        # Silence alone never leaves a member alone: named all, the others
        # stay (for the failure detector), and the same group is tried
        # again; so after a mismatch.
        both = starling.CollectiveTimeout(
            f"timed out after 2.0 s; no word yet from {b[:12]}, {c[:12]}",
            errno.ETIMEDOUT,
        )
        assert sync._gone(both, group) == set() and sync._again(both, group)
        assert not sync._again(late, group)
        gone_and_silent = starling.MemberFailed(
            f"member {b}: rank 1 failed the operation: the program on member "
            f"{c} went away; timed out after 2.0 s; no word yet from {c[:12]}",
            errno.ECONNABORTED,
        )
        assert sync._gone(gone_and_silent, group) == {c}
        mism = starling.CollectiveMismatch(
            "rank 1 called barrier(sum, root 0) of 1 float32 in a group of 3 "
            "(members 1); rank 0 (this member) called all_reduce(mean, root 0) "
            "of 9 float32 in a group of 3 (members 1)",
            errno.EINVAL,
        )
        assert sync._gone(mism, group) == set() and sync._again(mism, group)
        # Of two, neither leaves the other out on silence, nor itself.
        pair = [a, b]
        assert sync._gone(late, pair) == set() and sync._again(late, pair)
        named_me = starling.MemberFailed(
            f"member {b}: rank 1 failed the operation: timed out after 2.0 s; "
            f"no word yet from {a[:12]}",
            errno.ECONNABORTED,
        )
        assert sync._gone(named_me, pair) == set()


# ---- on real nodes --------------------------------------------------------


class Nodes:
    def __init__(self, cluster: Cluster, ids: List[str]) -> None:
        self.cluster = cluster
        self.ids = ids  # node k's member id

    def run(self, fn: Callable[[int], Any], who: List[int]) -> Dict[int, Any]:
        """fn(k) on a thread per node index k in who, all at once; the
        results (or exceptions) by k."""
        out: Dict[int, Any] = {}

        def body(k: int) -> None:
            try:
                out[k] = fn(k)
            except BaseException as e:  # handed to the test
                out[k] = e

        threads = [threading.Thread(target=body, args=(k,), daemon=True) for k in who]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60 * SLOW)
            if t.is_alive():
                pytest.fail("a member did not finish in 60 s" + self.cluster.logs())
        for k, v in out.items():
            if isinstance(v, BaseException):
                what = f"{type(v).__name__}: {v}"
                raise AssertionError(f"member on node{k}: {what}") from v
        return out


@pytest.fixture(scope="module")
def nodes(
    cluster_key: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Nodes]:
    """Four `starling node --attach` on the network (each given a model
    once), all seeing the four; one intra-op thread (the members share
    this process)."""
    c = Cluster(tmp_path_factory.mktemp("sync"), cluster_key)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for k in range(N):
            n = c.node(join=c.nodes[0].address() if k else None)
            model = torch.nn.Linear(2, 2)
            with starling.attach(model, socket=n.sock, timeout=30 * SLOW):
                pass
        comms = [starling.open_comm(n.sock, timeout=30) for n in c.nodes]
        deadline = time.monotonic() + 30 * SLOW
        while not all(len(cm.members()[0]) == N for cm in comms):
            if time.monotonic() > deadline:
                pytest.fail("the nodes never saw each other" + c.logs())
            time.sleep(0.1)
        ids = []
        for cm in comms:
            all_ids, rank = cm.members()
            ids.append(all_ids[rank])
            cm.close()
        yield Nodes(c, ids)
    finally:
        torch.set_num_threads(threads)
        c.close()


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def one_process(ref: torch.nn.Module, batches: List[Any]) -> torch.Tensor:
    """What one plain PyTorch process ends with: ref (on the CPU) trained
    on the whole of every batch, with the members' optimizer; checks that
    it moved."""
    init = flat(ref).clone()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x.cpu()), y.cpu()).backward()
        opt.step()
    want = flat(ref)
    assert (want - init).norm() > 1e-2 * init.norm()  # it trained
    return want


def test_equivalence_with_one_process(nodes: Nodes) -> None:
    batches = data(STEPS, N)
    # Each its own start (rank 0's wins), made here: torch's seed is global.
    models = [mlp(100 + k, slow=True) for k in range(N)]
    starts = [copy.deepcopy(m) for m in models]

    def member(k: int) -> Dict[str, Any]:
        model = models[k]
        with starling.open_comm(nodes.cluster.nodes[k].sock, timeout=30) as comm:
            sync = starling.SyncDataParallel(model, comm, bucket_bytes=600, timeout=30)
            ends, starts = [], []

            def after(step: int) -> bool:
                starts.append(sync.last_timings[0]["start"])
                return True

            # Backward's end: the moment backward() returns, before wait().
            orig = sync.step

            def step(opt: Any) -> bool:
                ends.append(time.monotonic())
                return orig(opt)

            sync.step = step  # type: ignore[method-assign]
            ok = train_steps(model, sync, batches, lambda: sync.rank, after)
            sync.close()
            return {
                "ok": ok,
                "rank": sync.rank,
                "params": flat(model),
                "buckets": len(sync.buckets),
                "overlap": [s < e for s, e in zip(starts, ends)],
            }

    out = nodes.run(member, list(range(N)))
    ranks = {v["rank"]: k for k, v in out.items()}
    assert sorted(ranks) == list(range(N))
    # One process, rank 0's start, the whole batch.
    ref = starts[ranks[0]]
    ref[2].on = False
    want = one_process(ref, batches)
    first = out[ranks[0]]["params"]
    for k, v in out.items():
        assert v["ok"] == [True] * STEPS, v["ok"]
        assert v["buckets"] == 5
        assert all(v["overlap"]), (
            f"node{k}: bucket 0 not started before backward ended: {v['overlap']}"
        )
        rel = ((v["params"] - want).norm() / want.norm()).item()
        assert rel <= 1e-5, f"node{k}: relative difference {rel:.3g}"
        torch.testing.assert_close(v["params"], want, rtol=1e-5, atol=1e-6)
        assert torch.equal(v["params"], first), f"node{k} differs from rank 0"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_equivalence_on_cuda(nodes: Nodes) -> None:
    """The same on GPU models (each bucket through a pinned host buffer):
    the members end where one process ends on the whole batch, and the
    parameters and gradients stay on the GPU."""
    batches = [(x.cuda(), y.cuda()) for x, y in data(STEPS, N)]
    models = [mlp(200 + k).cuda() for k in range(N)]
    starts = [copy.deepcopy(m).cpu() for m in models]

    def member(k: int) -> Dict[str, Any]:
        model = models[k]
        with starling.open_comm(nodes.cluster.nodes[k].sock, timeout=30) as comm:
            sync = starling.SyncDataParallel(model, comm, bucket_bytes=600, timeout=30)
            ok = train_steps(model, sync, batches, lambda: sync.rank)
            sync.close()
            on_gpu = all(p.is_cuda and p.grad.is_cuda for p in model.parameters())
            return {"ok": ok, "rank": sync.rank, "params": flat(model).cpu(), "gpu": on_gpu}

    out = nodes.run(member, list(range(N)))
    ranks = {v["rank"]: k for k, v in out.items()}
    assert sorted(ranks) == list(range(N))
    ref = starts[ranks[0]]
    want = one_process(ref, batches)
    first = out[ranks[0]]["params"]
    for k, v in out.items():
        assert v["ok"] == [True] * STEPS, v["ok"]
        assert v["gpu"], f"node{k}: a parameter or gradient left the GPU"
        # The GPU's float32 kernels sum in another order than the CPU's.
        rel = ((v["params"] - want).norm() / want.norm()).item()
        assert rel <= 1e-4, f"node{k}: relative difference {rel:.3g}"
        assert torch.equal(v["params"], first), f"node{k} differs from rank 0"


def test_optimizer_state_made_equal(nodes: Nodes) -> None:
    """optimizer=: rank 0's momentum goes with its parameters. Without it
    the members' parameters part at the first step (their momenta differ,
    as after a step that succeeded on one member and failed on another).
    Members whose optimizer states differ in layout clear theirs alike."""
    group = [nodes.ids[0], nodes.ids[1]]
    batches = data(5, 2)

    def member(k: int, warm: int) -> Dict[str, Any]:
        model = mlp(300 + k)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(k)
        for _ in range(warm):  # a momentum of its own
            opt.zero_grad()
            model(torch.randn(4, DIM_IN, generator=g)).sum().backward()
            opt.step()
        with starling.open_comm(nodes.cluster.nodes[k].sock, timeout=30) as comm:
            sync = starling.SyncDataParallel(
                model, comm, bucket_bytes=600, group=group, timeout=30, optimizer=opt
            )
            momenta = [opt.state[p]["momentum_buffer"].clone()
                       for p in model.parameters() if p in opt.state]
            for x, y in batches:
                rows = slice(sync.rank * B, (sync.rank + 1) * B)
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
                assert sync.step(opt)
            sync.close()
        return {"params": flat(model), "momenta": momenta, "resets": sync.optimizer_resets}

    out = nodes.run(lambda k: member(k, 1 + k), [0, 1])
    assert len(out[0]["momenta"]) == 6 and len(out[1]["momenta"]) == 6
    for a, b in zip(out[0]["momenta"], out[1]["momenta"]):
        assert torch.equal(a, b) and a.abs().sum() > 0
    assert torch.equal(out[0]["params"], out[1]["params"])
    assert out[0]["resets"] == out[1]["resets"] == 0
    # One member has stepped, the other not: both clear their states.
    out = nodes.run(lambda k: member(k, 1 - k), [0, 1])
    assert out[0]["momenta"] == [] and out[1]["momenta"] == []
    assert out[0]["resets"] == out[1]["resets"] == 1
    assert torch.equal(out[0]["params"], out[1]["params"])


def sync_member(
    nodes: Nodes,
    k: int,
    model: torch.nn.Module,
    group: List[str],
    batches: List[Any],
    timeout: float,
    after: Callable[[int], bool],
    leave: Optional[Callable[[Any, Any], None]] = None,
) -> Dict[str, Any]:
    """The member on node k: a SyncDataParallel of model over group that
    trains on batches (train_steps, with after). Its steps' results, and
    its parameters, group and counts; or, with leave, leave(sync, comm)
    at the end and only the steps' results."""
    comm = starling.open_comm(nodes.cluster.nodes[k].sock, timeout=30)
    try:
        sync = starling.SyncDataParallel(
            model, comm, bucket_bytes=600, group=group, timeout=timeout
        )
        ok = train_steps(model, sync, batches, lambda: sync.rank, after)
        if leave is not None:
            leave(sync, comm)
            return {"ok": ok}
        return {
            "ok": ok,
            "params": flat(model),
            "group": sync.group,
            "failed": sync.failed_steps,
            "reforms": sync.reforms,
        }
    finally:
        comm.close()


def survive(
    nodes: Nodes,
    who: List[int],
    leaver: int,
    leave: Callable[[Any, Any], None],
    timeout: float,
) -> None:
    """The members on the nodes who (the group: their ids) train 12 steps
    on their own data; the one on node leaver stops after 4 steps with
    leave(sync, comm). The survivors drop exactly one step and end in a
    group of the others, with the same bits (though each changed its
    parameters before the failing step: re-forming made them equal)."""
    batches = data(12, len(who))
    group = [nodes.ids[k] for k in who]

    models = [mlp(200 + k) for k in range(N)]

    def member(k: int) -> Dict[str, Any]:
        model = models[k]

        def after(step: int) -> bool:
            if k == leaver:
                return step < 3
            if step == 3:  # the survivors differ (as when a member
                # applied the failing step and another dropped it)
                with torch.no_grad():
                    next(model.parameters()).add_(1e-3 * k)
            return True

        return sync_member(
            nodes, k, model, group, batches, timeout, after,
            leave if k == leaver else None,
        )

    out = nodes.run(member, who)
    assert out[leaver]["ok"] == [True] * 4
    alive = [k for k in who if k != leaver]
    want = sorted(nodes.ids[k] for k in alive)
    for k in alive:
        v = out[k]
        assert v["ok"][:4] == [True] * 4 and v["ok"][4] is False, v["ok"]
        assert v["ok"][5:] == [True] * 7, v
        assert v["failed"] == 1 and v["reforms"] == 1, v
        assert v["group"] == want, v
        assert torch.equal(v["params"], out[alive[0]]["params"]), f"node{k} differs"
    assert torch.isfinite(out[alive[0]]["params"]).all()


def test_program_leaves(nodes: Nodes) -> None:
    """The member on node 3 closes its Comm after 4 steps (its node stays):
    the survivors' next all-reduce times out on it (2 s), it is left out."""

    def leave(sync: Any, comm: Any) -> None:
        sync.close()
        comm.close()

    t0 = time.monotonic()
    survive(nodes, [0, 1, 2, 3], 3, leave, timeout=2.0)
    assert time.monotonic() - t0 < 20 * SLOW


def test_one_of_two_paused(nodes: Nodes) -> None:
    """Of two members (nodes 0 and 2), the one on node 2 pauses 5 s after
    its 4th step, past the 2 s timeout. The other drops its step but does
    not re-form alone on that silence: it keeps the paused one, meets it at
    the re-forming's barrier once it is back, and both finish every step as
    the group of two, with the same bits."""
    who = [0, 2]
    batches = data(12, len(who))
    group = [nodes.ids[k] for k in who]
    models = {k: mlp(300 + k) for k in who}

    def member(k: int) -> Dict[str, Any]:
        def after(step: int) -> bool:
            if k == 2 and step == 3:
                time.sleep(5)
            return True

        return sync_member(nodes, k, models[k], group, batches, 2.0, after)

    out = nodes.run(member, who)
    for k in who:
        v = out[k]
        assert v["group"] == sorted(group), v
        assert len(v["ok"]) == 12 and v["failed"] >= 1 and v["reforms"] >= 1, v
    assert torch.equal(out[0]["params"], out[2]["params"])


def test_node_killed(nodes: Nodes) -> None:
    """Of the three left in step, the node of the member on node 1 is
    killed after 4 steps: the survivors re-form when the failure detector
    has removed it. (Last: it kills a node of the module's.)"""

    def leave(sync: Any, comm: Any) -> None:
        sync.close()
        nodes.cluster.nodes[1].kill()

    survive(nodes, [0, 1, 2], 1, leave, timeout=30.0)
