"""starling.plot: draws each node's training loss and test accuracy against
time and against step, from the logs of `starling node`, as PNG and SVG.

    python3 -m starling.plot out/cluster --out out/cluster/plot
    starling plot out/cluster                 # the same, through the CLI

A node writes a progress line every --log-every seconds on stderr
(node/daemon/daemon.c, log_cb)::

    [   12.34 181a493f] training step 840 epoch 1 loss 0.5123 test acc 0.8012 ...

that is: seconds since the node started, the first 8 hex digits of its id,
its state, then step, epoch, the mean training loss of the last steps and
the last test accuracy (``nan`` or ``-`` while there is none). The line
"epochs done at step N: test accuracy X" adds a last accuracy point, and
"log clock: second 0 of this log is Unix time T" (written once at start)
puts every node on one time axis: seconds since the first node started.
Every other line is ignored. Without a clock line in every log (an older
starling), the time axis is each node's own seconds since it started, and a
log that holds several lives of a node (restarted with its output appended)
goes on from where the previous life ended.

The figure has a row for the loss and a row for the accuracy, and a column
per x axis (``--x step``, ``--x time``, or both, the default); one line per
node in each panel. Each line carries the SVG id ``NODE-loss-step``,
``NODE-accuracy-time``, ... so that the SVG can be read by a program.
matplotlib (Debian: python3-matplotlib) draws it with the Agg backend: no
display is needed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = [
    "Point",
    "NodeLog",
    "PlotError",
    "parse_log",
    "find_logs",
    "time_origin",
    "plot",
    "main",
]

# "[ SECONDS IDPREFIX] STATE step N epoch E loss L test acc A ..."; STATE
# is one or more words ("training", "no program attached,").
_PROGRESS = re.compile(
    r"^\[\s*(?P<t>\d+(?:\.\d*)?)\s+(?P<id>[^\]\s]+)\]\s+(?P<state>.*?)\s*"
    r"\bstep (?P<step>\d+) epoch (?P<epoch>\d+) loss (?P<loss>\S+) "
    r"test acc (?P<acc>\S+)"
)
_DONE = re.compile(
    r"^\[\s*(?P<t>\d+(?:\.\d*)?)\s+(?P<id>[^\]\s]+)\]\s+epochs done at step "
    r"(?P<step>\d+): test accuracy (?P<acc>[^\s;]+)"
)
_CLOCK = re.compile(
    r"^\[\s*(?P<t>\d+(?:\.\d*)?)\s+[^\]\s]+\]\s+log clock: second 0 of this "
    r"log is Unix time (?P<unix>\d+(?:\.\d*)?)"
)
_NODE_FILE = re.compile(r"^node(\d+)\.log$")

X_AXES = ("step", "time")
DEBIAN_PACKAGE = "python3-matplotlib"


class PlotError(Exception):
    """A failure with a sentence for the user: a missing file, a log with
    no progress lines, matplotlib missing."""


@dataclass
class Point:
    """One progress line: seconds since the node started (restarts
    appended), step, epoch, loss and test accuracy (NaN when the line had
    none), and its Unix time when the log has a clock line (else None)."""

    t: float
    step: int
    epoch: int
    loss: float
    accuracy: float
    state: str
    unix: Optional[float] = None


@dataclass
class NodeLog:
    """The progress of one node, read from its log file."""

    name: str
    path: str
    node_id: str = ""
    points: List[Point] = field(default_factory=list)
    starts: List[float] = field(default_factory=list)  # Unix time of each life's start

    def series(
        self, x: str, y: str, origin: Optional[float] = None
    ) -> Tuple[List[float], List[float]]:
        """The finite (x, y) pairs of this node, x in "step" or "time", y in
        "loss" or "accuracy". Time is seconds since the Unix time origin
        when given (every point has a Unix time), else the node's own
        seconds. Against step, only the last point of a run of lines at the
        same step is kept (a node that is done or waiting repeats its last
        line)."""
        xs: List[float] = []
        ys: List[float] = []
        for p in self.points:
            v = p.loss if y == "loss" else p.accuracy
            if not math.isfinite(v):
                continue
            if x == "step":
                xv = float(p.step)
            elif origin is not None and p.unix is not None:
                xv = p.unix - origin
            else:
                xv = p.t
            if x == "step" and xs and xs[-1] == xv:
                ys[-1] = v
                continue
            xs.append(xv)
            ys.append(v)
        return xs, ys


def _number(text: str) -> float:
    """A logged value: a float, NaN for "nan", "-" or anything else."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def parse_log(path: str, name: Optional[str] = None) -> NodeLog:
    """Reads one node's log. Raises PlotError when the file cannot be read
    or holds no progress line."""
    if name is None:
        name = os.path.splitext(os.path.basename(path))[0]
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except FileNotFoundError:
        raise PlotError(f"no such file: '{path}'") from None
    except IsADirectoryError:
        raise PlotError(f"'{path}' is a directory, not a log") from None
    except OSError as e:
        raise PlotError(f"cannot read '{path}': {e.strerror}") from None
    log = NodeLog(name=name, path=path)
    offset = 0.0  # seconds of the earlier lives in this file
    last_t = 0.0
    start: Optional[float] = None  # Unix time of this life's second 0
    for line in lines:
        c = _CLOCK.match(line)
        if c is not None:
            start = float(c["unix"])
            log.starts.append(start)
        m = _PROGRESS.match(line) or _DONE.match(line)
        if m is None:
            continue
        t = float(m["t"])
        if t + offset < last_t:  # a new life: its clock starts again
            offset = last_t
        last_t = t + offset
        log.node_id = m["id"]
        g = m.groupdict()
        log.points.append(
            Point(
                t=last_t,
                step=int(g["step"]),
                epoch=int(g["epoch"]) if g.get("epoch") else -1,
                loss=_number(g["loss"]) if g.get("loss") else math.nan,
                accuracy=_number(g["acc"]),
                state=(g.get("state") or "done").rstrip(","),
                unix=None if start is None else start + t,
            )
        )
    if not log.points:
        raise PlotError(
            f"'{path}' has no progress lines (a node writes one every "
            "--log-every seconds: was it run with --log-every 0 or --quiet?)"
        )
    return log


def _node_key(fname: str) -> Tuple[int, str]:
    m = _NODE_FILE.match(fname)
    return (int(m.group(1)) if m else sys.maxsize, fname)


def find_logs(inputs: Sequence[str]) -> List[str]:
    """The log files named by inputs: a file as it is, a directory as its
    nodeK.log files in the order of K. Raises PlotError for a path that
    does not exist and a directory without any."""
    out: List[str] = []
    for p in inputs:
        if os.path.isdir(p):
            found = sorted(
                (f for f in os.listdir(p) if _NODE_FILE.match(f)), key=_node_key
            )
            if not found:
                raise PlotError(
                    f"'{p}' holds no nodeK.log files (tools/scripts/cluster.sh "
                    "writes DIR/node0.log, node1.log, ...); name the log files instead"
                )
            out.extend(os.path.join(p, f) for f in found)
        elif os.path.exists(p):
            out.append(p)
        else:
            raise PlotError(f"no such file or directory: '{p}'")
    return out


def _names(paths: Sequence[str]) -> List[str]:
    """Each log's label: its file name without .log, or its path when two
    logs share a file name."""
    stems = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    return [
        s if stems.count(s) == 1 else os.path.splitext(p)[0]
        for s, p in zip(stems, paths)
    ]


def _matplotlib():
    """matplotlib's Figure and Agg canvas, or PlotError naming the Debian
    package."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotError(
            f"matplotlib is not installed ({e}); install it with: "
            f"sudo apt-get install {DEBIAN_PACKAGE}"
        ) from None
    return Figure, FigureCanvasAgg


_LABELS = {
    "loss": "training loss",
    "accuracy": "test accuracy",
    "step": "step",
    "time": "seconds since the node started",
    "cluster_time": "seconds since the first node started",
}


def time_origin(logs: Sequence[NodeLog]) -> Optional[float]:
    """The Unix time of the earliest node's start when every point of every
    log has a Unix time (each log has its clock line), else None."""
    if not logs or any(p.unix is None for log in logs for p in log.points):
        return None
    return min(log.starts[0] for log in logs)


def plot(
    logs: Sequence[NodeLog], prefix: str, xs: Sequence[str] = X_AXES
) -> Dict[str, str]:
    """Draws logs into PREFIX.png and PREFIX.svg (directories made as
    needed); one column per x axis in xs, rows loss and accuracy. Returns
    {"png": path, "svg": path}. Raises PlotError without matplotlib or
    when a file cannot be written."""
    Figure, FigureCanvasAgg = _matplotlib()
    origin = time_origin(logs)
    fig = Figure(figsize=(6.4 * len(xs), 7.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(xs), squeeze=False)
    colors = [f"C{i % 10}" for i in range(len(logs))]
    for col, x in enumerate(xs):
        for row, y in enumerate(("loss", "accuracy")):
            ax = axes[row][col]
            for log, color in zip(logs, colors):
                px, py = log.series(x, y, origin)
                label = log.name + (f" ({log.node_id})" if log.node_id else "")
                (line,) = ax.plot(
                    px,
                    py,
                    color=color,
                    label=label,
                    marker="." if len(px) < 50 else None,
                    drawstyle="steps-post" if y == "accuracy" else "default",
                )
                line.set_gid(f"{log.name}-{y}-{x}")
            shared = x == "time" and origin is not None
            ax.set_xlabel(_LABELS["cluster_time" if shared else x])
            ax.set_ylabel(_LABELS[y])
            ax.grid(True, alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize="small")
    fig.suptitle(f"starling: {len(logs)} node{'s' if len(logs) != 1 else ''}")
    paths = {"png": prefix + ".png", "svg": prefix + ".svg"}
    try:
        d = os.path.dirname(prefix)
        if d:
            os.makedirs(d, exist_ok=True)
        for fmt, p in paths.items():
            fig.savefig(p, format=fmt, dpi=100)
    except OSError as e:
        what = e.filename or prefix
        raise PlotError(f"cannot write '{what}': {e.strerror}") from None
    return paths


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Draws each node's training loss and test accuracy against "
        "step and time, from\nthe logs of `starling node` (a progress line "
        "every --log-every seconds),\nas PREFIX.png and PREFIX.svg. Needs "
        f"matplotlib\n(apt-get install {DEBIAN_PACKAGE}).",
        epilog="Examples:\n"
        f"  {prog} out/cluster                  # every out/cluster/nodeK.log\n"
        f"  {prog} n0.log n1.log --out run1 --x time\n"
        "Exit status: 0 written, 1 a log or the plot failed, 2 bad usage.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "logs",
        nargs="*",
        metavar="LOG|DIR",
        help="node log files, or directories of nodeK.log files "
        "(default: out/cluster)",
    )
    p.add_argument(
        "--out",
        default=os.path.join("out", "cluster", "plot"),
        metavar="PREFIX",
        help="write PREFIX.png and PREFIX.svg (default: out/cluster/plot)",
    )
    p.add_argument(
        "--x",
        choices=("step", "time", "both"),
        default="both",
        help="the x axis: step, time (seconds since the first node started; "
        "a log of an older starling: since its node started), or both side "
        "by side (default)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print a summary as JSON: nodes, points, the files written",
    )
    return p


def _summary(logs: Sequence[NodeLog], paths: Dict[str, str]) -> dict:
    nodes = []
    for log in logs:
        last = log.points[-1]
        loss = [p.loss for p in log.points if math.isfinite(p.loss)]
        acc = [p.accuracy for p in log.points if math.isfinite(p.accuracy)]
        nodes.append(
            {
                "name": log.name,
                "log": log.path,
                "id": log.node_id,
                "points": len(log.points),
                "last_step": last.step,
                "last_seconds": last.t,
                "started_unix": log.starts[0] if log.starts else None,
                "last_loss": loss[-1] if loss else None,
                "last_accuracy": acc[-1] if acc else None,
            }
        )
    return {
        "nodes": nodes,
        "points": sum(len(n.points) for n in logs),
        # What the time axis counts from: every log had its clock line, or not.
        "time_axis": "first node started" if time_origin(logs) is not None
        else "each node started",
        "png": paths["png"],
        "svg": paths["svg"],
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; returns the exit status."""
    prog = os.environ.get("STARLING_PLOT_PROG") or "python3 -m starling.plot"
    args = _parser(prog).parse_args(argv)
    try:
        files = find_logs(args.logs or [os.path.join("out", "cluster")])
        logs = [parse_log(f, n) for f, n in zip(files, _names(files))]
        xs = X_AXES if args.x == "both" else (args.x,)
        paths = plot(logs, args.out, xs)
    except PlotError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(_summary(logs, paths), indent=2))
    else:
        n = sum(len(log.points) for log in logs)
        print(
            f"wrote {paths['png']} and {paths['svg']} "
            f"({len(logs)} node{'s' if len(logs) != 1 else ''}, {n} points)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
