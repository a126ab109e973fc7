"""test_attach_torch.py: the Python package (client/python/starling) against real
PyTorch models and real `starling node --attach` processes on 127.0.0.1.

  - which tensors attach registers, and the refusals made before any node
    is asked (float64 and half models, no library);
  - (a) one node: attach, steps that do nothing, detach, and a re-attach
    that takes the node's parameters over the model's own;
  - (b) two nodes, two programs (examples/pytorch_fmnist.py) on disjoint
    shards: their final parameters are far closer than without starling;
  - (c) a model that differs from the node's or the cluster's is refused,
    naming the first differing tensor; a second program is refused while
    one is attached;
  - the same with models on a GPU (pinned host copies; skipped without
    CUDA);
  - (d) NodeUnavailable with no node, and when the node dies mid-run;
    reconnect=True takes the parameters of a node that comes back;
  - (f) a NaN in the parameters fails the step that would have shared it,
    which changes nothing, and never reaches the peer.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import starling
from conftest import REPO, SLOW, STARLING_BIN, Cluster, wait_until


class Small(nn.Module):
    """8 -> hidden (BatchNorm) -> 4: parameters, float buffers and an
    integer buffer (num_batches_tracked)."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.bn(self.fc1(x))))


SMALL_NAMES = [
    "fc1.weight",
    "fc1.bias",
    "bn.weight",
    "bn.bias",
    "bn.running_mean",
    "bn.running_var",
    "fc2.weight",
    "fc2.bias",
]


def flat(model: nn.Module) -> np.ndarray:
    """The registered tensors, concatenated (a copy)."""
    return np.concatenate(
        [
            t.detach().reshape(-1).cpu().numpy().copy()
            for _, t in starling.model_tensors(model)
        ]
    )


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator
) -> None:
    dev = next(model.parameters()).device
    x = torch.randn(32, 8, generator=gen).to(dev)
    y = torch.randint(0, 4, (32,), generator=gen).to(dev)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


# ---- no node needed ----


def test_registers_float_parameters_and_buffers_in_state_dict_order() -> None:
    names = [n for n, _ in starling.model_tensors(Small())]
    assert names == SMALL_NAMES  # num_batches_tracked (int64) is left out


def test_example_net_and_its_wider_head() -> None:
    """The example's CNN: 20,634 floats shared (parameters and BatchNorm's
    running statistics); --hidden H puts a hidden layer
    of H before the output (the benchmark's model for 100 Mbit/s links,
    docs/benchmarks.md); both map a batch of images to 10 logits."""
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import pytorch_fmnist as ex
    finally:
        sys.path.pop(0)
    count = lambda m: sum(t.numel() for _, t in starling.model_tensors(m))  # noqa: E731
    narrow, wide = ex.Net(), ex.Net(256)
    assert count(narrow) == 20634
    assert count(wide) == 20634 - (1568 * 10 + 10) + (1568 * 256 + 256) + (256 * 10 + 10)
    assert narrow.fc1 is None and wide.fc1.out_features == 256
    x = torch.zeros(3, 1, 28, 28)
    assert narrow(x).shape == wide(x).shape == (3, 10)
    assert ex.parse_args(["--hidden", "64"]).hidden == 64
    assert ex.parse_args([]).hidden == 0


def test_tied_parameters_registered_once() -> None:
    m = nn.Sequential(nn.Embedding(10, 6), nn.Linear(6, 10, bias=False))
    m[1].weight = m[0].weight  # tied, as in a language model
    pairs = starling.model_tensors(m)
    assert [n for n, _ in pairs] == ["0.weight"]
    assert pairs[0][1] is m[0].weight


@pytest.mark.parametrize("cast", [torch.float64, torch.float16])
def test_non_float32_model_refused_naming_the_tensor(cast: torch.dtype) -> None:
    m = Small().to(cast)
    with pytest.raises(starling.StarlingError) as e:
        starling.attach(m, socket="/nonexistent/control.sock")
    assert type(e.value) is starling.StarlingError
    assert "fc1.weight" in str(e.value) and "float32" in str(e.value)
    # One float64 buffer in a float32 model is named too.
    m = Small()
    m.bn.running_var = m.bn.running_var.double()
    with pytest.raises(starling.StarlingError, match="bn.running_var"):
        starling.model_tensors(m)


def test_library_not_found_says_set_starling_lib(tmp_path: Path) -> None:
    code = (
        "import starling, torch\n"
        "try:\n"
        "    starling.attach(torch.nn.Linear(2, 2), socket='x.sock')\n"
        "except starling.StarlingError as e:\n"
        "    print('ERR', e)\n"
    )
    env = dict(
        os.environ,
        STARLING_LIB=str(tmp_path / "libnone.so"),
        PYTHONPATH=str(REPO / "client" / "python"),
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERR cannot load the starling client library"), r.stdout
    assert "libnone.so" in r.stdout and "set STARLING_LIB" in r.stdout


# ---- (d) no node ----


def test_no_node_at_socket(built: None, tmp_path: Path) -> None:
    with pytest.raises(starling.NodeUnavailable) as e:
        starling.attach(Small(), socket=str(tmp_path / "control.sock"), timeout=5)
    assert e.value.errno == errno.ENOENT
    assert str(tmp_path / "control.sock") in str(e.value)
    # A socket file nobody listens on (a node that died).
    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()
    with pytest.raises(starling.NodeUnavailable) as e:
        starling.attach(Small(), socket=path, timeout=5)
    assert e.value.errno == errno.ECONNREFUSED


# ---- (a) one node ----


def test_attach_step_detach_reattach(cluster: Cluster) -> None:
    n = cluster.node()
    torch.manual_seed(0)
    m = Small()
    p0 = flat(m)
    node = starling.attach(m, socket=n.sock, timeout=30 * SLOW)
    assert node.names == SMALL_NAMES
    assert node.num_floats == p0.size
    # The first program: the node takes its parameters, the model keeps them.
    assert np.array_equal(flat(m), p0)
    seen: Dict[int, np.ndarray] = {node.cluster_step: p0}
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    start, bits = node.step_count, []
    for _ in range(100):
        train_step(m, opt, gen)
        bits.append(node.step())
        seen[node.step_count] = flat(m)
    assert node.step_count == start + 100
    assert sum(b == 0 for b in bits) >= 90, f"step results {bits}"
    node.report(loss=0.5, accuracy=0.25)
    assert node.detach() is True
    assert not node.attached
    with pytest.raises(starling.StarlingError, match="detached"):
        node.step()

    # The model changes here; attaching again takes the node's parameters:
    # the ones the program left at detach, and their step.
    last = start + 100
    with torch.no_grad():
        for _, t in starling.model_tensors(m):
            t.fill_(7.0)
    with starling.attach(m, socket=n.sock, timeout=30 * SLOW) as again:
        got = flat(m)
        match = [s for s, v in seen.items() if np.array_equal(v, got)]
        assert again.cluster_step == last and match == [last], (
            f"re-attach: step {again.cluster_step} with the parameters of step(s) "
            f"{match}; want step {last} and its parameters (those left at detach)"
        )
        assert again.step_count == again.cluster_step
    assert not again.attached


def test_second_program_is_refused_while_one_is_attached(cluster: Cluster) -> None:
    n = cluster.node()
    with starling.attach(Small(), socket=n.sock, timeout=30 * SLOW):
        with pytest.raises(starling.NodeBusy) as e:
            starling.attach(Small(), socket=n.sock, timeout=10)
        assert e.value.errno == errno.EBUSY
    with starling.attach(Small(), socket=n.sock, timeout=30 * SLOW) as node:
        assert node.attached  # the first one's detach freed the node


def test_wrapped_optimizer_steps_the_node(cluster: Cluster) -> None:
    n = cluster.node()
    m = Small()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with starling.attach(m, socket=n.sock, timeout=30 * SLOW) as node:
        assert node.wrap(opt) is opt and node.wrap(opt) is opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        gen = torch.Generator().manual_seed(2)
        s0 = node.step_count
        for _ in range(3):
            before = flat(m)
            train_step(m, opt, gen)
            sched.step()
            assert not np.array_equal(flat(m), before)
        assert node.step_count == s0 + 3  # one node step per optimizer step
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 / 8)
    before = flat(m)
    train_step(m, opt, gen)  # detached: the optimizer steps alone
    assert not np.array_equal(flat(m), before) and node.step_count == s0 + 3


# ---- (c) mismatched models ----


def test_other_model_refused_by_the_same_node(cluster: Cluster) -> None:
    n = cluster.node()
    with starling.attach(Small(), socket=n.sock, timeout=30 * SLOW):
        pass
    with pytest.raises(starling.ModelMismatch) as e:
        starling.attach(Small(hidden=32), socket=n.sock, timeout=30 * SLOW)
    assert e.value.errno == errno.EINVAL
    assert "fc1.weight" in str(e.value), str(e.value)
    # One tensor fewer (no BatchNorm statistics) is a mismatch too.
    m = Small()
    m.bn.track_running_stats = False
    m.bn.running_mean = m.bn.running_var = None
    with pytest.raises(starling.ModelMismatch, match="bn.running_mean"):
        starling.attach(m, socket=n.sock, timeout=30 * SLOW)
    # The node still serves its model.
    with starling.attach(Small(), socket=n.sock, timeout=30 * SLOW) as node:
        assert node.attached


def attach_detach_first(cluster: Cluster):  # noqa: ANN201
    """Node 0 with a model (a program attached and detached: the node keeps
    serving its parameters) and node 1 joining it; returns both and the
    parameters."""
    n0 = cluster.node()
    torch.manual_seed(0)
    ma = Small()
    with starling.attach(ma, socket=n0.sock, timeout=30 * SLOW):
        pa = flat(ma)
    return n0, cluster.node(join=n0.address()), pa


def test_joiner_takes_the_cluster_parameters(cluster: Cluster) -> None:
    _, n1, pa = attach_detach_first(cluster)
    torch.manual_seed(99)
    mb = Small()
    assert not np.array_equal(flat(mb), pa)
    # Node 1 answers the attach once it has synchronized from node 0.
    with starling.attach(mb, socket=n1.sock, timeout=30 * SLOW) as b:
        assert np.array_equal(flat(mb), pa)  # the cluster's, not its own
        assert b.cluster_step == 0


def test_joiner_refuses_a_model_other_than_the_cluster_one(cluster: Cluster) -> None:
    _, n1, pa = attach_detach_first(cluster)
    with pytest.raises(starling.ModelMismatch) as e:
        starling.attach(Small(hidden=32), socket=n1.sock, timeout=30 * SLOW)
    # Both models are named (tensor count, parameters, first tensor), and
    # the first differing tensor, from the tensor list the donor sent.
    assert "276 params" in str(e.value) and "548 params" in str(e.value), str(e.value)
    assert (
        "tensor 0: 'fc1.weight' F32 [32, 8] in the program, "
        "'fc1.weight' F32 [16, 8] in the cluster" in str(e.value)
    ), str(e.value)
    # The node's model was fixed by that program: like a node started with
    # the wrong --model, it stops, saying why.
    deadline = time.monotonic() + 20 * SLOW
    while n1.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not n1.alive()
    assert n1.proc is not None and n1.proc.returncode != 0


def attach_while_serving(
    served: starling.Node, model: nn.Module, sock: str
) -> starling.Node:
    """Attaches model to the joining node at sock while the program of the
    node it joins serves its steps (the joiner's state comes from there)."""
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            served.step()
            time.sleep(0.01)

    t = threading.Thread(target=serve)
    t.start()
    try:
        return starling.attach(model, socket=sock, timeout=30 * SLOW)
    finally:
        stop.set()
        t.join()


def test_tensors_not_in_place_follow_through_host_copies(cluster: Cluster) -> None:
    """A tensor the library cannot use in place (here: not contiguous; on a
    GPU it is the same path) gets a host copy that follows the node: the
    cluster's parameters at attach, averaging corrections at steps."""
    n0 = cluster.node()
    torch.manual_seed(0)
    ma = Small()
    a = starling.attach(ma, socket=n0.sock, timeout=30 * SLOW)
    n1 = cluster.node(join=n0.address())
    torch.manual_seed(5)
    mb = Small()
    mb.fc1.weight = nn.Parameter(torch.randn(8, 16).t())  # [16, 8], strided
    weight = mb.fc1.weight
    assert not weight.is_contiguous()
    b = attach_while_serving(a, mb, n1.sock)
    assert np.array_equal(flat(mb), flat(ma))  # copied into the strided tensor

    # B trains (its host copy is stale until a step needs it); A only serves
    # its node: averaging brings B's training to A.
    def w(m: nn.Module) -> np.ndarray:  # the strided tensor only
        return m.fc1.weight.detach().numpy().copy()

    pa = w(ma)
    opt = torch.optim.SGD(mb.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        train_step(mb, opt, gen)
        a.step()
        b.step()
    gap0 = np.linalg.norm(w(ma) - w(mb))
    assert gap0 > 0
    applied, deadline = 0, time.monotonic() + 20 * SLOW
    while time.monotonic() < deadline:
        a.step()
        applied += bool(b.step() & starling.DID_APPLY)
        if applied and np.linalg.norm(w(ma) - w(mb)) < 0.01 * gap0:
            break
        time.sleep(0.01)
    gap = np.linalg.norm(w(ma) - w(mb))
    assert applied and gap < 0.01 * gap0, (applied, gap, gap0)
    assert np.linalg.norm(w(ma) - pa) > 0.1 * gap0  # A got B's training
    assert mb.fc1.weight is weight and not weight.is_contiguous()
    b.detach()
    a.detach()


def test_detach_hands_over_the_current_values_of_host_copies(cluster: Cluster) -> None:
    """detach() gives the node the tensors' values at that moment, also for
    a tensor the library reaches through a host copy (not contiguous here;
    on a GPU the same path), which is stale between step boundaries."""
    n = cluster.node()
    torch.manual_seed(0)
    m = Small()
    m.fc1.weight = nn.Parameter(torch.randn(8, 16).t())  # [16, 8], strided
    node = starling.attach(m, socket=n.sock, timeout=30 * SLOW)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        train_step(m, opt, gen)
        node.step()
    train_step(m, opt, gen)  # after the last boundary
    want = flat(m)
    assert node.detach() is True
    torch.manual_seed(9)
    fresh = Small()
    with starling.attach(fresh, socket=n.sock, timeout=30 * SLOW):
        assert np.array_equal(flat(fresh), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_model_follows_through_pinned_host_copies(cluster: Cluster) -> None:
    """Models on the GPU (the path for every CUDA tensor: a pinned host
    copy each): the joiner's GPU tensors get the cluster's parameters and
    buffers at attach, both programs train on the GPU and averaging brings
    them together at steps, in the same CUDA tensors; num_batches_tracked
    stays each program's own."""
    n0 = cluster.node()
    torch.manual_seed(0)
    ma = Small().cuda()
    a = starling.attach(ma, socket=n0.sock, timeout=30 * SLOW)
    n1 = cluster.node(join=n0.address())
    torch.manual_seed(5)
    mb = Small().cuda()
    before = {n: t for n, t in mb.state_dict(keep_vars=True).items()}
    b = attach_while_serving(a, mb, n1.sock)
    assert np.array_equal(flat(mb), flat(ma))  # the cluster's, on the GPU
    assert all(t.is_cuda for _, t in starling.model_tensors(mb))

    opt_a = torch.optim.SGD(ma.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(mb.parameters(), lr=0.1)
    gen_a = torch.Generator().manual_seed(1)
    gen_b = torch.Generator().manual_seed(2)
    for _ in range(30):
        train_step(ma, opt_a, gen_a)
        train_step(mb, opt_b, gen_b)
        a.step()
        b.step()
    gap0 = np.linalg.norm(flat(ma) - flat(mb))
    assert gap0 > 0
    applied, deadline = 0, time.monotonic() + 20 * SLOW
    while time.monotonic() < deadline:
        applied += bool(a.step() & starling.DID_APPLY)
        applied += bool(b.step() & starling.DID_APPLY)
        if applied and np.linalg.norm(flat(ma) - flat(mb)) < 0.01 * gap0:
            break
        time.sleep(0.01)
    gap = np.linalg.norm(flat(ma) - flat(mb))
    assert applied and gap < 0.01 * gap0, (applied, gap, gap0)
    after = mb.state_dict(keep_vars=True)
    assert all(after[n] is t and t.is_cuda for n, t in before.items())
    # Each program's own count of BatchNorm batches (30 + attach's none).
    assert int(mb.bn.num_batches_tracked) == 30
    assert np.isfinite(flat(mb)).all()
    b.detach()
    a.detach()


# ---- (d) the node dies ----


def step_until_error(node: starling.Node, seconds: float) -> starling.StarlingError:
    deadline = time.monotonic() + seconds * SLOW
    while time.monotonic() < deadline:
        try:
            node.step()
        except starling.StarlingError as e:
            return e
        time.sleep(0.01)
    pytest.fail(f"no error from step() within {seconds * SLOW} s")


def test_node_killed_mid_run(cluster: Cluster) -> None:
    n = cluster.node()
    node = starling.attach(Small(), socket=n.sock, timeout=30 * SLOW)
    for _ in range(10):
        node.step()
    n.kill()
    e = step_until_error(node, 10)
    assert isinstance(e, starling.NodeUnavailable), repr(e)
    assert node.detach() is False  # the node had gone: no error, just False
    assert not node.attached


def test_reconnect_takes_the_parameters_of_the_node_that_came_back(
    cluster: Cluster,
) -> None:
    n = cluster.node()
    m = Small()
    node = starling.attach(
        m, socket=n.sock, timeout=30 * SLOW, reconnect=True, reconnect_timeout=30 * SLOW
    )
    for _ in range(10):
        node.step()
    n.kill()
    result: List[object] = []

    def stepper() -> None:
        deadline = time.monotonic() + 40 * SLOW
        try:
            while time.monotonic() < deadline:
                bits = node.step()
                if bits & starling.DID_STATE:
                    result.append(bits)
                    return
                time.sleep(0.01)
        except starling.StarlingError as e:
            result.append(e)

    t = threading.Thread(target=stepper)
    t.start()
    time.sleep(0.5)
    n.start()
    t.join(60 * SLOW)
    assert not t.is_alive(), "step() still blocked 60 s after the node came back"
    assert result and isinstance(result[0], int), (
        f"no DID_STATE: {result}" + cluster.logs()
    )
    assert node.step_count == node.cluster_step
    assert np.isfinite(flat(m)).all()
    assert node.detach() is True

    # Without reconnect, a node that goes away fails the step with NodeUnavailable
    # even if it comes back; with reconnect and no node, after reconnect_timeout.
    node = starling.attach(
        m, socket=n.sock, timeout=30 * SLOW, reconnect=True, reconnect_timeout=1
    )
    n.kill()
    t0 = time.monotonic()
    e = step_until_error(node, 15)
    assert isinstance(e, starling.NodeUnavailable), repr(e)
    assert time.monotonic() - t0 >= 0.9
    node.detach()


# ---- (f) non-finite parameters ----


def test_nan_fails_the_sharing_step_and_never_spreads(cluster: Cluster) -> None:
    n0 = cluster.node()
    ma, mb = Small(), Small()
    a = starling.attach(ma, socket=n0.sock, timeout=30 * SLOW)
    n1 = cluster.node(join=n0.address())
    # Program A keeps stepping (serving node 0) while B's attach waits for
    # node 1 to synchronize from node 0.
    b = attach_while_serving(a, mb, n1.sock)
    assert np.array_equal(flat(mb), flat(ma))
    with torch.no_grad():
        mb.bn.weight[3] = float("nan")
    deadline = time.monotonic() + 20 * SLOW
    err = None
    while err is None and time.monotonic() < deadline:
        a.step()
        before = flat(mb)
        try:
            bits = b.step()
            assert bits & (starling.DID_APPLY | starling.DID_SNAPSHOT) == 0, bits
            assert np.array_equal(flat(mb), before, equal_nan=True)
        except starling.NonFiniteParameters as e:
            err = e
            assert np.array_equal(
                flat(mb), before, equal_nan=True
            ), "applied despite NaN"
        time.sleep(0.01)
    assert err is not None, "no NonFiniteParameters within 20 s" + cluster.logs()
    assert err.errno == errno.EDOM
    assert "bn.weight" in str(err), str(err)
    # Node 0's program keeps finite parameters while averaging goes on.
    for _ in range(100):
        a.step()
        time.sleep(0.01)
    assert np.isfinite(flat(ma)).all()
    b.detach()
    a.detach()


# ---- (b) two programs, two nodes ----


def run_example(
    cluster: Cluster, name: str, shard: int, common: List[str], sock: str = ""
) -> subprocess.Popen:
    """Starts examples/pytorch_fmnist.py on shard K/2 (alone without sock),
    writing NAME.json and NAME.npy."""
    out = cluster.root / name
    args = [
        *common,
        "--shard",
        f"{shard}/2",
        "--json-out",
        f"{out}.json",
        "--save-params",
        f"{out}.npy",
    ]
    return cluster.example(
        name, args + (["--socket", sock] if sock else ["--no-starling"])
    )


@pytest.mark.training
def test_two_programs_on_two_nodes_agree(cluster: Cluster) -> None:
    common = [
        "--epochs",
        "1",
        "--max-steps",
        "300",
        "--batch",
        "64",
        "--lr",
        "0.05",
        "--seed",
        "5",
        "--threads",
        "1",
        "--log-every",
        "100",
    ]
    n0 = cluster.node()
    pa = run_example(cluster, "attached0", 0, common, n0.sock)
    wait_until(
        lambda: "attached:" in cluster.output("attached0"),
        60,
        "program 0 attaching",
        cluster,
    )
    n1 = cluster.node(join=n0.address())
    pb = run_example(cluster, "attached1", 1, common, n1.sock)
    cluster.wait(pa, "attached0", 240)
    cluster.wait(pb, "attached1", 240)
    res = [json.load(open(cluster.root / f"attached{k}.json")) for k in (0, 1)]
    for k, r in enumerate(res):
        assert r["starling"] and r["test_accuracy"] > 0.75, (k, r)
        assert r["did"]["apply"] > 0, f"program {k} never averaged: {r}"
    # The second program started at the cluster's step, not at 0.
    assert res[1]["cluster_step"] > 0, res[1]

    # The same two alone, from the same initialization.
    alone = [run_example(cluster, f"alone{k}", k, common) for k in (0, 1)]
    for k, p in enumerate(alone):
        cluster.wait(p, f"alone{k}", 240)
    a, b, a0, b0 = (
        np.load(cluster.root / f"{n}.npy")
        for n in ("attached0", "attached1", "alone0", "alone1")
    )
    together, apart = np.linalg.norm(a - b), np.linalg.norm(a0 - b0)
    print(
        f"distance between the programs: {together:.4f} averaged, {apart:.4f} alone "
        f"(norm {np.linalg.norm(a):.2f}); test accuracy "
        f"{[r['test_accuracy'] for r in res]}, cluster step {res[1]['cluster_step']}, "
        f"applied {[r['did']['apply'] for r in res]}"
    )
    assert together < 0.1 * apart, (together, apart)


def test_checkpoints_by_program_steps(cluster: Cluster) -> None:
    """--checkpoint-every 5steps on an attached node: checkpoints follow
    the program's steps (the default, 30 s, would write none in this
    test's few seconds), and none before the fifth."""
    n = cluster.node(extra=["--checkpoint-every", "5steps"])
    m = Small()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(5)
    with starling.attach(m, socket=n.sock, timeout=30 * SLOW) as node:
        for _ in range(3):
            train_step(m, opt, gen)
            node.step()
        time.sleep(0.5)
        assert n.field("checkpoints_written") == 0, n.status()
        for _ in range(9):
            train_step(m, opt, gen)
            node.step()
        wait_until(
            lambda: (n.field("checkpoints_written") or 0) >= 1,
            10,
            "a checkpoint by steps",
            cluster,
        )
        st = n.status()
        assert st is not None and 5 <= st["checkpoint_step"] <= 12, st
        assert st["checkpoints_written"] <= 2, st  # at most at 5 and 10
    assert (n.dir / "checkpoint.safetensors").stat().st_size > 0


def test_checkpoint_loads_into_the_model(cluster: Cluster) -> None:
    """The node's checkpoint (written at its leave) has the program's
    tensor names: starling.load_checkpoint + load_state_dict(strict=False)
    gives back the parameters the program left, and the step."""
    n = cluster.node()
    torch.manual_seed(3)
    m = Small()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(4)
    with starling.attach(m, socket=n.sock, timeout=30 * SLOW) as node:
        for _ in range(20):
            train_step(m, opt, gen)
            node.step()
        step = node.step_count
    left = flat(m)
    subprocess.run(
        [STARLING_BIN, "leave", "--control", n.sock], check=True, capture_output=True
    )
    n.proc.wait(timeout=30 * SLOW)
    state, meta = starling.load_checkpoint(str(n.dir / "checkpoint.safetensors"))
    assert list(state) == SMALL_NAMES or set(state) == set(SMALL_NAMES)
    fresh = Small()
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    assert not unexpected
    assert all("num_batches_tracked" in k for k in missing), missing
    assert np.array_equal(flat(fresh), left)
    assert int(meta["step"]) == step
    # Restarted on its checkpoint, the node has the model before any program
    # attaches: another tensor list is refused naming the first difference,
    # the same one resumes from the checkpoint's parameters and step.
    n.start()
    with pytest.raises(starling.ModelMismatch, match="fc1.weight"):
        starling.attach(Small(hidden=32), socket=n.sock, timeout=30 * SLOW)
    again = Small()
    with starling.attach(again, socket=n.sock, timeout=30 * SLOW) as node:
        assert node.cluster_step == step
        assert np.array_equal(flat(again), left)
    with pytest.raises(starling.StarlingError, match="8-byte header"):
        bad = n.dir / "bad.safetensors"
        bad.write_bytes(b"\x01")
        starling.load_checkpoint(str(bad))
