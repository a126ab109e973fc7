"""test_plot.py: `starling plot` / `python3 -m starling.plot`
(client/python/starling/plot.py), on log lines recorded from real `starling
node` runs: the PNG is a valid PNG that matplotlib reads back, the SVG is
XML with an <svg> root and one line per node in every panel, --json says
what was drawn, and the errors (no such file, a log without progress lines,
a directory without node logs, matplotlib missing) say what is wrong.

Needs no PyTorch; tests/integration/test_plot.sh runs it under ctest with
--noconftest (tests/python/conftest.py wants PyTorch). $STARLING_BIN, when
set, adds the checks through the `starling plot` command; $ST_PLOT_REAL_LOGS,
a folder of nodeK.log files from a real cluster, adds a plot of those.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import List, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "client" / "python"
sys.path.insert(0, str(PKG))

from starling import plot as sp  # noqa: E402

# Lines as `starling node --log-every 0.2` wrote them (2 nodes, --min-nodes
# 2, mlp:784-32-10), with the other kinds of line a log holds.
NODE0 = """\
[    1.49 6fb50895] waiting for 2 nodes before the first step (--min-nodes): 1 alive
[    1.49 6fb50895] node 6fb50895bb68c7e32e3d0f238461e102 listening on 127.0.0.1:32891 (boot epoch 91646500), model mlp:784-32-10 f32, first node: seeded initialization; control socket n0/control.sock
[    1.49 6fb50895] log clock: second 0 of this log is Unix time 1795714000.000
[    1.69 6fb50895] waiting step 0 epoch 0 loss nan test acc nan 0 samples/s peers 0 exchanges 0 ok 0 failed 0 busy
[    3.76 6fb50895] 2 nodes alive (--min-nodes 2): training starts
[    3.90 6fb50895] training step 941 epoch 2 loss 0.4314 test acc 0.8246 418515 samples/s peers 1 exchanges 0 ok 0 failed 0 busy
[    4.10 6fb50895] training step 2255 epoch 4 loss 0.3528 test acc 0.8472 419297 samples/s peers 1 exchanges 2 ok 0 failed 0 busy
[    4.30 6fb50895] training step 3487 epoch 7 loss 0.3428 test acc 0.8617 409776 samples/s peers 1 exchanges 2 ok 0 failed 0 busy
[    4.51 6fb50895] warning: clipped the pull of 39eb8afc5e77 (norm 1.6, bound 0.938, suspicion 0.12): 1 of its 3 averagings so far
[    4.51 6fb50895] training step 4562 epoch 9 loss 0.3136 test acc 0.8429 392780 samples/s peers 1 exchanges 2 ok 0 failed 0 busy
[    5.68 6fb50895] epochs done at step 5499: test accuracy 0.8638; serving peers until told to leave
[    5.73 6fb50895] done step 5499 epoch 11 loss 0.3269 test acc 0.8638 0 samples/s peers 1 exchanges 4 ok 0 failed 0 busy
[    5.93 6fb50895] done step 5499 epoch 11 loss 0.3269 test acc 0.8638 0 samples/s peers 1 exchanges 6 ok 0 failed 0 busy
[    6.08 6fb50895] leaving (asked by `starling leave`): announcing it to the cluster
[    6.08 6fb50895] checkpoint written to n0/checkpoint.safetensors
"""

# A second node: an attach-mode line, no test set ("-"), then a restart
# appended to the same file (its clock starts again at 0).
NODE1 = """\
[    0.72 39eb8afc] node 39eb8afc5e77 listening on 127.0.0.1:34119 (boot epoch 91646412), model mlp:784-32-10 f32, will synchronize from a peer; control socket n1/control.sock
[    0.72 39eb8afc] log clock: second 0 of this log is Unix time 1795714002.500
[    1.31 39eb8afc] no program attached, step 0 epoch 0 loss nan test acc - 0 samples/s peers 1 exchanges 0 ok 0 failed 0 busy
[    1.51 39eb8afc] training step 1574 epoch 3 loss 0.3830 test acc - 449281 samples/s peers 1 exchanges 0 ok 0 failed 0 busy
[    1.71 39eb8afc] training step 3109 epoch 6 loss 0.3618 test acc 0.8523 473242 samples/s peers 1 exchanges 2 ok 0 failed 0 busy
[    0.50 39eb8afc] node 39eb8afc5e77 listening on 127.0.0.1:34120 (boot epoch 91646413), model mlp:784-32-10 f32; control socket n1/control.sock
[    0.50 39eb8afc] log clock: second 0 of this log is Unix time 1795714010.000
[    0.90 39eb8afc] training step 3200 epoch 6 loss 0.3500 test acc 0.8530 473242 samples/s peers 1 exchanges 0 ok 0 failed 0 busy
"""

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_logs(d: Path, logs: Sequence[str]) -> List[Path]:
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, text in enumerate(logs):
        p = d / f"node{k}.log"
        p.write_text(text)
        paths.append(p)
    return paths


def check_png(path: Path) -> None:
    """A PNG: the signature, an IHDR chunk first with a non-zero size, and
    matplotlib reads it back as an image of that size."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path}: not a PNG signature"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13, f"{path}: no IHDR chunk first"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 0 and height > 0
    import matplotlib.image

    img = matplotlib.image.imread(str(path))
    assert img.shape[:2] == (height, width)


def svg_line_ids(path: Path) -> List[str]:
    """The ids of the SVG's elements, after checking it parses as XML with
    an <svg> root."""
    root = ET.parse(str(path)).getroot()
    assert root.tag in ("svg", "{http://www.w3.org/2000/svg}svg"), root.tag
    return [e.get("id") for e in root.iter() if e.get("id")]


def run_module(args: Sequence[str], env_extra: dict = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(PKG), PYTHONDONTWRITEBYTECODE="1")
    env.pop("STARLING_PLOT_PROG", None)
    env.update(env_extra or {})
    return subprocess.run(
        ["/usr/bin/python3", "-m", "starling.plot", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


# ---- parsing (no matplotlib needed) ------------------------------------------


def test_parse_recorded_lines(tmp_path: Path) -> None:
    p0, p1 = write_logs(tmp_path, [NODE0, NODE1])
    n0 = sp.parse_log(str(p0))
    assert n0.name == "node0" and n0.node_id == "6fb50895"
    # 7 progress lines and the "epochs done" line; the others are ignored.
    assert len(n0.points) == 8
    assert [p.step for p in n0.points][:2] == [0, 941]
    xs, ys = n0.series("step", "loss")
    assert xs == [941, 2255, 3487, 4562, 5499] and ys[-1] == pytest.approx(0.3269)
    xs, ys = n0.series("time", "accuracy")
    assert xs[0] == pytest.approx(3.90) and ys[-1] == pytest.approx(0.8638)
    assert len(xs) == 7  # every line with an accuracy, the "epochs done" one too

    n1 = sp.parse_log(str(p1))
    states = [p.state for p in n1.points]
    assert states == ["no program attached", "training", "training", "training"]
    _, acc = n1.series("step", "accuracy")
    assert acc == [pytest.approx(0.8523), pytest.approx(0.8530)]  # "-" is no value

    # Every log has its clock line: one time axis, from the first start.
    origin = sp.time_origin([n0, n1])
    assert origin == pytest.approx(1795714000.0)
    xs, _ = n1.series("time", "loss", origin)
    # node 1 started 2.5 s after node 0; its second life at +10 s.
    assert xs == [pytest.approx(2.5 + 1.51), pytest.approx(2.5 + 1.71), pytest.approx(10.90)]


def test_logs_without_clock_lines(tmp_path: Path) -> None:
    """An older log (no clock line): each node's own seconds; a restart
    appended to the file goes on from the previous life's last line."""
    old = "".join(l + "\n" for l in NODE1.splitlines() if "log clock" not in l)
    p0, p1 = write_logs(tmp_path, [NODE0, old])
    logs = [sp.parse_log(str(p0)), sp.parse_log(str(p1))]
    assert sp.time_origin(logs) is None
    assert logs[1].points[-1].t == pytest.approx(1.71 + 0.90)
    xs, _ = logs[1].series("time", "loss", sp.time_origin(logs))
    assert xs == [pytest.approx(1.51), pytest.approx(1.71), pytest.approx(2.61)]


def test_find_logs_orders_nodes(tmp_path: Path) -> None:
    for k in (10, 2, 0):
        (tmp_path / f"node{k}.log").write_text(NODE0)
    (tmp_path / "cluster.key").write_text("x")
    got = [os.path.basename(p) for p in sp.find_logs([str(tmp_path)])]
    assert got == ["node0.log", "node2.log", "node10.log"]


# ---- drawing ------------------------------------------------------------------


def test_png_and_svg(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    write_logs(tmp_path / "logs", [NODE0, NODE1])
    out = tmp_path / "plots" / "run"
    assert sp.main([str(tmp_path / "logs"), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in summary["nodes"]] == ["node0", "node1"]
    assert [n["points"] for n in summary["nodes"]] == [8, 4]
    assert summary["points"] == 12
    assert summary["nodes"][0]["last_loss"] == pytest.approx(0.3269)
    assert summary["time_axis"] == "first node started"
    assert summary["png"] == f"{out}.png" and summary["svg"] == f"{out}.svg"

    check_png(Path(summary["png"]))
    ids = svg_line_ids(Path(summary["svg"]))
    for y in ("loss", "accuracy"):
        for x in ("step", "time"):
            panel = [i for i in ids if i.endswith(f"-{y}-{x}")]
            assert sorted(panel) == [f"node0-{y}-{x}", f"node1-{y}-{x}"], ids


# ---- errors -----------------------------------------------------------------------


def test_no_such_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.log"
    r = run_module([str(missing), "--out", str(tmp_path / "p")])
    assert r.returncode == 1
    assert f"no such file or directory: '{missing}'" in r.stderr
    assert not (tmp_path / "p.png").exists()


def test_log_without_progress_lines(tmp_path: Path) -> None:
    good, bad = write_logs(tmp_path, [NODE0, NODE0.splitlines()[1] + "\n"])
    r = run_module([str(good), str(bad), "--out", str(tmp_path / "p")])
    assert r.returncode == 1
    assert f"'{bad}' has no progress lines" in r.stderr
    assert "--log-every" in r.stderr


def test_directory_without_node_logs(tmp_path: Path) -> None:
    r = run_module([str(tmp_path), "--out", str(tmp_path / "p")])
    assert r.returncode == 1
    assert f"'{tmp_path}' holds no nodeK.log files" in r.stderr


def test_bad_usage(tmp_path: Path) -> None:
    r = run_module(["--x", "epoch"])
    assert r.returncode == 2 and "invalid choice: 'epoch'" in r.stderr


def test_matplotlib_missing(tmp_path: Path) -> None:
    """A matplotlib that cannot be imported (a stand-in first on the path)
    gives the Debian package to install."""
    (log,) = write_logs(tmp_path / "logs", [NODE0])
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    r = run_module(
        [str(log), "--out", str(tmp_path / "p")],
        {"PYTHONPATH": f"{tmp_path / 'fake'}:{PKG}"},
    )
    assert r.returncode == 1
    assert "matplotlib is not installed" in r.stderr
    assert "apt-get install python3-matplotlib" in r.stderr


# ---- through the `starling plot` command ------------------------------------


@pytest.fixture
def starling_bin() -> str:
    b = os.environ.get("STARLING_BIN")
    if not b:
        pytest.skip("STARLING_BIN not set (the starling binary)")
    return b


def test_cli(tmp_path: Path, starling_bin: str) -> None:
    pytest.importorskip("matplotlib")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)  # the command finds the package itself
    run = lambda *a: subprocess.run(  # noqa: E731
        [starling_bin, "plot", *a], capture_output=True, text=True, timeout=120, env=env
    )
    r = run("--help")
    assert r.returncode == 0 and "usage: starling plot" in r.stdout
    for flag in ("--out", "--x", "--json"):
        assert flag in r.stdout
    write_logs(tmp_path / "logs", [NODE0, NODE1])
    r = run(str(tmp_path / "logs"), "--out", str(tmp_path / "cli"), "--x", "time")
    assert r.returncode == 0, r.stderr
    assert f"wrote {tmp_path}/cli.png and {tmp_path}/cli.svg (2 nodes, 12 points)" in r.stdout
    check_png(tmp_path / "cli.png")
    ids = svg_line_ids(tmp_path / "cli.svg")
    assert "node1-loss-time" in ids and not any(i.endswith("-step") for i in ids)
    r = run(str(tmp_path / "none.log"))
    assert r.returncode == 1
    assert r.stderr.startswith("starling plot: no such file or directory")


# ---- a real cluster's logs ------------------------------------------------------


def test_real_logs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    d = os.environ.get("ST_PLOT_REAL_LOGS")
    if not d:
        pytest.skip("ST_PLOT_REAL_LOGS not set (tests/integration/test_plot.sh sets it)")
    pytest.importorskip("matplotlib")
    assert sp.main([d, "--out", str(tmp_path / "real"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert len(summary["nodes"]) == 2
    # The nodes' "log clock" lines put both on one time axis.
    assert summary["time_axis"] == "first node started"
    for n in summary["nodes"]:
        log = sp.parse_log(n["log"])
        xs, _ = log.series("step", "loss")
        assert len(xs) >= 2, f"{n['log']}: fewer than 2 loss points"
        assert n["last_accuracy"] is not None and 0 < n["last_accuracy"] <= 1
    check_png(Path(summary["png"]))
    ids = svg_line_ids(Path(summary["svg"]))
    assert {"node0-loss-step", "node1-loss-step", "node0-accuracy-time"} <= set(ids)
