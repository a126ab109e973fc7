"""conftest.py: fixtures for the Python package's tests, which run real
`starling node --attach` processes on 127.0.0.1 (tests/integration/
test_python_attach.sh runs them under ctest).

$STARLING_BIN is the starling binary and $STARLING_LIB the client library
(default: build/starling and build/libstarling.so of this checkout). Every
process a test starts is killed by PID at the test's end; every wait has a
deadline and fails with the tail of the node's log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))

STARLING_BIN = os.environ.get("STARLING_BIN", str(REPO / "build" / "starling"))
os.environ.setdefault("STARLING_LIB", str(REPO / "build" / "libstarling.so"))
EXAMPLE = REPO / "examples" / "pytorch_fmnist.py"
# Deadlines are longer under sanitizers (ST_SANITIZE=ON in ctest).
SANITIZED = os.environ.get("ST_SANITIZE", "OFF") == "ON"
SLOW = 3 if SANITIZED else 1


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "training: trains a real model for whole epochs; skipped under the "
        "sanitizers (PyTorch with the ASan runtime preloaded runs ~4x slower: "
        "every tensor over 128 KiB becomes an mmap and a munmap), where the "
        "same library calls run in the shorter tests",
    )


def pytest_collection_modifyitems(
    config: pytest.Config, items: List[pytest.Item]
) -> None:
    if not SANITIZED:
        return
    skip = pytest.mark.skip(reason="whole-epoch training: plain build only")
    for item in items:
        if "training" in item.keywords:
            item.add_marker(skip)


class NodeProc:
    """One `starling node --attach` in the background: its data directory,
    control socket, log and process."""

    def __init__(self, name: str, root: Path, key: Path) -> None:
        self.name = name
        self.dir = root / name
        self.sock = str(self.dir / "control.sock")
        self.log = root / f"{name}.log"
        self.key = key
        self.proc: Optional[subprocess.Popen] = None

    def start(
        self, join: Optional[str] = None, extra: Sequence[str] = ()
    ) -> "NodeProc":
        """Starts the node and waits (deadline) until its control socket
        answers with its address."""
        cmd = [
            STARLING_BIN,
            "node",
            "--attach",
            "--listen",
            "127.0.0.1:0",
            "--cluster-key",
            str(self.key),
            "--data-dir",
            str(self.dir),
            "--gossip-every",
            "0.1",
            *extra,
        ]
        if join:
            cmd += ["--join", join]
        env = dict(os.environ)
        if "ST_NODE_ASAN_OPTIONS" in env:  # the node links ASan itself: keep its checks
            env["ASAN_OPTIONS"] = env["ST_NODE_ASAN_OPTIONS"]
            env.pop("LD_PRELOAD", None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + 20 * SLOW
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.fail(f"exited with status {self.proc.returncode} during start-up")
            if self.status() is not None:
                return self
            time.sleep(0.1)
        self.fail("did not answer on its control socket within 20 s")
        return self

    def address(self) -> str:
        """The node's HOST:PORT, once it listens: a node --attach binds its
        port when the first program has attached (waits, deadline)."""
        deadline = time.monotonic() + 20 * SLOW
        while time.monotonic() < deadline:
            a = self.field("address")
            if isinstance(a, str) and a and not a.endswith(":0"):
                return a
            time.sleep(0.1)
        self.fail("no listening address in its status within 20 s")
        return ""

    def status(self) -> Optional[dict]:
        """`starling status --json` (None when the node does not answer)."""
        r = subprocess.run(
            [STARLING_BIN, "status", "--json", "--data-dir", str(self.dir)],
            capture_output=True,
            timeout=10,
        )
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def field(self, key: str) -> object:
        """One field of the node's status (None when it does not answer)."""
        st = self.status()
        return None if st is None else st.get(key)

    def restart(
        self, join: Optional[str] = None, extra: Sequence[str] = ()
    ) -> "NodeProc":
        """Kills the node and starts it again on the same data directory."""
        self.kill()
        return self.start(join=join, extra=extra)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, by PID, and reap it."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def fail(self, what: str) -> None:
        pytest.fail(
            f"node {self.name}: {what}\n--- {self.log} (tail)\n{self.log_tail()}"
        )


class Cluster:
    """Starts nodes and programs for one test and kills them all (by PID)
    when it ends."""

    def __init__(self, root: Path, key: Path) -> None:
        self.root = root
        self.key = key
        self.nodes: List[NodeProc] = []
        self.procs: List[subprocess.Popen] = []

    def node(self, join: Optional[str] = None, extra: Sequence[str] = ()) -> NodeProc:
        n = NodeProc(f"node{len(self.nodes)}", self.root, self.key)
        self.nodes.append(n)
        return n.start(join=join, extra=extra)

    def example(self, name: str, args: Sequence[str]) -> subprocess.Popen:
        """Starts examples/pytorch_fmnist.py with args; its output goes to
        ROOT/NAME.out."""
        env = dict(os.environ, PYTHONPATH=str(REPO / "client" / "python"))
        out = open(self.root / f"{name}.out", "wb")
        p = subprocess.Popen(
            [sys.executable, str(EXAMPLE), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        out.close()
        self.procs.append(p)
        return p

    def output(self, name: str) -> str:
        return (self.root / f"{name}.out").read_text(errors="replace")

    def wait(self, p: subprocess.Popen, name: str, timeout: float) -> None:
        """Waits for a program to exit 0 (deadline), failing with its output."""
        try:
            rc = p.wait(timeout=timeout * SLOW)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"{name} still running after {timeout} s:\n{self.output(name)[-3000:]}"
                + self.logs()
            )
        assert rc == 0, (
            f"{name} exited {rc}:\n{self.output(name)[-3000:]}" + self.logs()
        )

    def logs(self) -> str:
        return "".join(f"\n--- {n.name} log (tail)\n{n.log_tail()}" for n in self.nodes)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        for n in self.nodes:
            n.kill()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ANN001, ANN201
    """A failed test's report ends with the tail of its nodes' logs."""
    outcome = yield
    rep = outcome.get_result()
    c = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None
    if rep.failed and rep.when == "call" and isinstance(c, Cluster) and c.nodes:
        rep.sections.append(("starling node logs", c.logs()))


def wait_until(
    cond, timeout: float, what: str, cluster: Optional[Cluster] = None
) -> None:  # noqa: ANN001
    """Polls cond() every 0.1 s until it is true; fails naming what (with
    the node logs) when timeout seconds (scaled) pass."""
    deadline = time.monotonic() + timeout * SLOW
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    pytest.fail(
        f"{what}: not within {timeout * SLOW} s" + (cluster.logs() if cluster else "")
    )


@pytest.fixture(scope="session")
def built() -> None:
    """The binary and the library are there. Skips the tests that need them
    when nothing is built and no path was given; fails when a given path is
    missing."""
    missing = [
        p for p in (STARLING_BIN, os.environ["STARLING_LIB"]) if not os.path.exists(p)
    ]
    if missing and "STARLING_BIN" not in os.environ:
        pytest.skip(
            f"not built: {', '.join(missing)} (set STARLING_BIN and STARLING_LIB)"
        )
    assert not missing, f"missing: {', '.join(missing)}"


@pytest.fixture(scope="session")
def cluster_key(built: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    key = tmp_path_factory.mktemp("key") / "cluster.key"
    subprocess.run(
        [STARLING_BIN, "keygen", "--cluster", "--out", str(key)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return key


@pytest.fixture
def cluster(tmp_path: Path, cluster_key: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, cluster_key)
    try:
        yield c
    finally:
        c.close()
