"""test_attach_hostile.py: the node's side of the attach protocol
(docs/attach.md, attach/attach.h) against programs that break it, spoken raw
from this process with the standard library only (socket.send_fds,
os.memfd_create, fcntl seals, mmap, struct): no client library is involved,
so every byte the node sees is one this file chose.

Every case starts a real `starling node --attach` (conftest.py) and asserts
  - the node's exact answer: the "error ..." line, or the attach reply frame
    {"ok":false,"error":...} with a recognizable phrase of its sentence,
    and that the node then closes the connection;
  - the node's count: `starling status --json` attach.refused counts each
    refused attach request, and nothing else (a line that is not "attach",
    a connection that closes mid-frame, a session that ends badly);
  - that the node is still up and attaches a correct program afterwards.

The cases: a line that is not "attach"; a request with no descriptor, an
unsealed one, one of the wrong size, a header with the wrong magic, version
or sizes; a request of another protocol version, malformed JSON, a frame
over 4 MiB (refused from its length alone); tensor lists the node refuses
(duplicate names, a zero dimension, dtype F16, ...); a connection closed
mid-frame; a list that differs from the node's model; a program that
scribbles over its segment's header and sends a malformed detach; NaN in
the first program's parameters; a program that writes n_floats or an
absurd step into its header afterwards; bytes sent before "ready".
"""

from __future__ import annotations

import fcntl
import json
import math
import mmap
import os
import socket
import struct
import time
from typing import List, Optional, Sequence, Tuple

import pytest

from conftest import SLOW, Cluster, NodeProc, wait_until

# attach/attach.h
PAGE = 4096
MAGIC = 0x48534154  # "TASH" little-endian
VERSION = 1
FRAME_MAX = 4 << 20
# Header offsets (st_attach_header_t).
OFF_MAGIC, OFF_VERSION, OFF_N_FLOATS, OFF_SEGMENT_BYTES = 0, 4, 8, 16
OFF_REQ_SEQ, OFF_REQ_FLAGS, OFF_STATE_STEP = 64, 72, 80
OFF_ACK_SEQ, OFF_ACK_STATUS, OFF_DOORBELL, OFF_STEP = 128, 136, 140, 144
OFF_LOSS, OFF_ACCURACY, OFF_BOUNDARIES = 152, 160, 168

# The model every correct program here registers: 6 + 3 floats.
MODEL: List[Tuple[str, List[int]]] = [("w", [2, 3]), ("b", [3])]
PARAMS = [0.5, -1.0, 2.0, 0.25, 3.0, -0.75, 1.5, -2.5, 4.0]
IO_TIMEOUT_S = 5.0 * SLOW


# ---- the protocol, raw ------------------------------------------------------


def area_bytes(n_floats: int) -> int:
    return (n_floats * 4 + PAGE - 1) // PAGE * PAGE


def segment_bytes(n_floats: int) -> int:
    return PAGE + 2 * area_bytes(n_floats)


def n_floats_of(tensors: Sequence[Tuple[str, Sequence[int]]]) -> int:
    return sum(math.prod(shape) for _, shape in tensors)


class Segment:
    """A program's shared segment: a memfd of `size` bytes (default: what
    n_floats needs), sealed against shrinking and growing unless told
    otherwise, with the header's first fields and area A written."""

    def __init__(
        self,
        n_floats: int,
        params: Optional[Sequence[float]] = None,
        size: Optional[int] = None,
        seals: int = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW,
        sealable: bool = True,
        magic: int = MAGIC,
        version: int = VERSION,
        header_n_floats: Optional[int] = None,
        header_bytes: Optional[int] = None,
    ) -> None:
        flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if sealable else 0)
        self.fd = os.memfd_create("test-attach", flags)
        self.n_floats = n_floats
        self.size = segment_bytes(n_floats) if size is None else size
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        hn = n_floats if header_n_floats is None else header_n_floats
        hb = segment_bytes(n_floats) if header_bytes is None else header_bytes
        struct.pack_into("<IIQQ", self.map, 0, magic, version, hn, hb)
        if params is not None:
            struct.pack_into(f"<{len(params)}f", self.map, PAGE, *params)
        if seals:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)

    def u64(self, off: int) -> int:
        return struct.unpack_from("<Q", self.map, off)[0]

    def put(self, fmt: str, off: int, *values: object) -> None:
        struct.pack_into(fmt, self.map, off, *values)

    def area_b(self) -> List[float]:
        off = PAGE + area_bytes(self.n_floats)
        return list(struct.unpack_from(f"<{self.n_floats}f", self.map, off))

    def close(self) -> None:
        os.close(self.fd)  # the mapping stays until the object goes


def request(
    tensors: Sequence[Tuple[str, Sequence[int]]],
    version: int = VERSION,
    dtype: str = "F32",
) -> dict:
    return {
        "version": version,
        "pid": os.getpid(),
        "tensors": [{"name": n, "dtype": dtype, "shape": list(s)} for n, s in tensors],
    }


def frame(body: object) -> bytes:
    """4-byte little-endian length, then the JSON text (or the bytes)."""
    text = body if isinstance(body, bytes) else json.dumps(body).encode()
    return struct.pack("<I", len(text)) + text


class Conn:
    """One connection to the node's control socket, every read bounded."""

    def __init__(self, node: NodeProc) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(IO_TIMEOUT_S)
        self.s.connect(node.sock)

    def hello(self, line: bytes = b"attach\n") -> bytes:
        """Sends the first line; returns the node's answer line."""
        self.s.sendall(line)
        out = b""
        while not out.endswith(b"\n"):
            ch = self.s.recv(1)
            if not ch:
                break
            out += ch
        return out

    def send(self, data: bytes, fds: Sequence[int] = ()) -> None:
        """data whole; fds in SCM_RIGHTS on the first sendmsg."""
        n = socket.send_fds(self.s, [data], list(fds)) if fds else 0
        if n < len(data):  # sendall(b"") would still send (and may EPIPE)
            self.s.sendall(data[n:])

    def recv_exact(self, n: int) -> Optional[bytes]:
        out = b""
        while len(out) < n:
            got = self.s.recv(n - len(out))
            if not got:
                return None
            out += got
        return out

    def reply(self) -> dict:
        """The node's reply frame (fails on end of stream or time-out)."""
        hdr = self.recv_exact(4)
        assert hdr is not None, "the node closed the connection without a reply"
        body = self.recv_exact(struct.unpack("<I", hdr)[0])
        assert body is not None, "the node closed the connection mid-reply"
        return json.loads(body)

    def closed_by_node(self) -> bool:
        """The node closed its end (nothing more comes, within the
        deadline)."""
        try:
            return self.s.recv(1) == b""
        except socket.timeout:
            return False

    def close(self) -> None:
        self.s.close()


def refused(node: NodeProc) -> int:
    st = node.status()
    assert st is not None, "the node does not answer `starling status`"
    return st["attach"]["refused"]


def attach(
    node: NodeProc,
    tensors: Sequence[Tuple[str, Sequence[int]]] = MODEL,
    params: Sequence[float] = PARAMS,
) -> Tuple[Conn, Segment, dict]:
    """A correct program's attach, answered ok (a session that just ended
    may hold the node for a moment: "busy" is retried until the deadline)."""
    deadline = time.monotonic() + IO_TIMEOUT_S
    while True:
        c = Conn(node)
        line = c.hello()
        if line == b"ready\n":
            break
        c.close()
        assert line.startswith(b"error busy:"), line
        assert time.monotonic() < deadline, f"still busy after {IO_TIMEOUT_S} s"
        time.sleep(0.05)
    seg = Segment(n_floats_of(tensors), params)
    c.send(frame(request(tensors)), [seg.fd])
    r = c.reply()
    seg.close()
    assert r.get("ok") is True, r
    return c, seg, r


def detach(c: Conn, final: bool = False) -> None:
    c.send(frame({"op": "detach", "final": final}))
    assert c.closed_by_node(), "the node kept the connection after the detach"
    c.close()


def assert_serves(node: NodeProc, n_refused: int) -> dict:
    """The node is up, counted n_refused refusals, and attaches a correct
    program; returns that attach's reply."""
    assert node.alive(), f"node exited:\n{node.log_tail()}"
    assert refused(node) == n_refused
    c, seg, r = attach(node)
    detach(c)
    assert node.alive()
    return r


def send_request(
    node: NodeProc, body: object, seg: Optional[Segment]
) -> Tuple[Conn, dict]:
    """ "attach", then one request frame (with seg's descriptor, if any);
    returns the connection and the reply."""
    c = Conn(node)
    assert c.hello() == b"ready\n"
    c.send(frame(body), [seg.fd] if seg is not None else [])
    return c, c.reply()


# ---- refusals before any model ----------------------------------------------

N = n_floats_of(MODEL)  # 9 floats: one page per area, 12288 bytes in all

# (id, Segment keyword arguments or None for no descriptor, request, the
# phrase the reply's error holds).
REFUSALS = [
    (
        "no_descriptor",
        None,
        request(MODEL),
        "the request came without a shared segment (a memfd in SCM_RIGHTS)",
    ),
    (
        "not_sealable",
        dict(sealable=False, seals=0),
        request(MODEL),
        "the shared segment is not sealed against shrinking",
    ),
    (
        "sealed_against_growing_only",
        dict(seals=fcntl.F_SEAL_GROW),
        request(MODEL),
        "the shared segment is not sealed against shrinking",
    ),
    (
        "a_page_bigger",
        dict(size=segment_bytes(N) + PAGE),
        request(MODEL),
        "the shared segment has 16384 bytes; 9 tensor elements need 12288",
    ),
    (
        "a_page_smaller",
        dict(size=segment_bytes(N) - PAGE),
        request(MODEL),
        "the shared segment has 8192 bytes; 9 tensor elements need 12288",
    ),
    (
        "a_byte_smaller",
        dict(size=segment_bytes(N) - 1),
        request(MODEL),
        "the shared segment has 12287 bytes; 9 tensor elements need 12288",
    ),
    (
        "wrong_magic",
        dict(magic=0x12345678),
        request(MODEL),
        "the shared segment starts with 0x12345678, not the attach magic " "0x48534154",
    ),
    (
        "header_version_2",
        dict(version=2),
        request(MODEL),
        "version: the shared segment is attach protocol version 2 and this "
        "side speaks version 1",
    ),
    (
        "header_n_floats",
        dict(header_n_floats=10),
        request(MODEL),
        "the shared segment's header says 10 floats but the tensor list " "holds 9",
    ),
    (
        "header_segment_bytes",
        dict(header_bytes=4096),
        request(MODEL),
        "the shared segment is 12288 bytes (its header says 4096)",
    ),
    (
        # The C client maps the "version:" prefix to -EPROTO
        # (tests/unit/test_client.c); Python raises StarlingError.
        "request_version_2",
        dict(),
        request(MODEL, version=2),
        "version: the program speaks attach protocol version 2 and this node "
        "version 1",
    ),
    (
        "malformed_json",
        dict(),
        b'{"version":1,"pid":1,"tensors":[{"name":"w"',
        "the attach request is not valid JSON",
    ),
    ("not_an_object", dict(), [1, 2], "the attach request is an array"),
    (
        "no_version",
        dict(),
        {"pid": 1, "tensors": []},
        "the attach request has no protocol 'version'",
    ),
    (
        "no_tensors",
        dict(),
        request([]),
        "the attach request lists no tensors",
    ),
    (
        "duplicate_names",
        dict(),
        request([("w", [2, 3]), ("w", [3])]),
        "tensor 1: 'w' is already tensor 0; every name must be unique",
    ),
    (
        "zero_dimension",
        dict(),
        request([("w", [2, 0]), ("b", [9])]),
        "tensor 'w': dimension 1 is 0",
    ),
    (
        "dtype_f16",
        dict(),
        request(MODEL, dtype="F16"),
        "tensor 'w': dtype 'F16' is not supported; only F32",
    ),
    (
        "nine_dimensions",
        dict(),
        request([("w", [1] * 8 + [9])]),
        "tensor 0 of the attach request has 9 dimensions; at most 8",
    ),
    (
        "negative_dimension",
        dict(),
        request([("w", [-9])]),
        "tensor 0 of the attach request: dimension 0 is not a non-negative " "integer",
    ),
    (
        "name_with_control_character",
        dict(),
        request([("w\nx", [9])]),
        "tensor 0: its name holds a control character at byte 1",
    ),
    (
        "name_of_256_bytes",
        dict(),
        request([("n" * 256, [9])]),
        "tensor 0: its name is longer than 255 bytes",
    ),
]


@pytest.mark.parametrize(
    "seg_kw,body,phrase", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_bad_request_refused_counted_and_node_serves_on(
    cluster: Cluster, seg_kw: Optional[dict], body: object, phrase: str
) -> None:
    node = cluster.node()
    seg = Segment(N, PARAMS, **seg_kw) if seg_kw is not None else None
    c, r = send_request(node, body, seg)
    assert r["ok"] is False and phrase in r["error"], r
    assert c.closed_by_node()
    c.close()
    if seg is not None:
        seg.close()
    # The refused program brought no model: the next one does.
    assert assert_serves(node, 1)["source"] == "its own: the first node"


def test_a_line_that_is_not_attach_is_answered_and_not_counted(
    cluster: Cluster,
) -> None:
    node = cluster.node()
    for line in (b"hello\n", b"attach please\n", b"\x00\xff\x01garbage\n"):
        c = Conn(node)
        assert c.hello(line) == (
            b"error: unknown request; expected status, peers, join, keys, "
            b"force-leave, leave, monitor, attach or collectives\n"
        )
        assert c.closed_by_node()
        c.close()
    assert_serves(node, 0)


def test_bytes_before_ready_are_refused(cluster: Cluster) -> None:
    """A request sent with "attach" instead of after "ready" would be read
    by the line reader and lost: the node refuses such a connection at once
    (it must not hold the node's one session) and counts it."""
    node = cluster.node()
    c = Conn(node)
    assert c.hello(b"attach\n" + frame({"version": 1})).startswith(
        b"error protocol: bytes came after"
    )
    assert c.closed_by_node()
    c.close()
    assert refused(node) == 1
    assert_serves(node, 1)


def test_second_program_is_told_busy_on_the_line(cluster: Cluster) -> None:
    node = cluster.node()
    c1, _, _ = attach(node)
    c2 = Conn(node)
    assert c2.hello() == b"error busy: another program is attached to this node\n"
    assert c2.closed_by_node()
    c2.close()
    assert refused(node) == 1
    detach(c1)
    assert_serves(node, 1)


@pytest.mark.parametrize("length", [FRAME_MAX + 1, 0xFFFFFFFF])
def test_frame_over_4_mib_refused_from_its_length(
    cluster: Cluster, length: int
) -> None:
    """Only the length and 16 bytes are sent: the reply comes without the
    node waiting for (or reading) the rest."""
    node = cluster.node()
    seg = Segment(N, PARAMS)
    c = Conn(node)
    assert c.hello() == b"ready\n"
    c.send(struct.pack("<I", length) + b"{" * 16, [seg.fd])
    r = c.reply()
    assert r == {
        "ok": False,
        "error": f"a frame of {length} bytes is over the limit of {FRAME_MAX}",
    }
    assert c.closed_by_node()
    c.close()
    seg.close()
    assert_serves(node, 1)


def test_frame_of_exactly_4_mib_is_read_whole(cluster: Cluster) -> None:
    """The limit itself is allowed: a request padded with JSON whitespace
    to 4 MiB attaches."""
    node = cluster.node()
    text = json.dumps(request(MODEL)).encode()
    text += b" " * (FRAME_MAX - len(text))
    seg = Segment(N, PARAMS)
    c, r = send_request(node, text, seg)
    assert r["ok"] is True and r["source"] == "its own: the first node", r
    assert seg.area_b() == pytest.approx(PARAMS)
    detach(c)
    seg.close()
    assert_serves(node, 0)


# (id, what is sent after "attach\n" before the connection closes)
_BODY = frame(request(MODEL))
CUTS = [
    ("before_reading_ready", None),
    ("two_bytes_of_the_length", _BODY[:2]),
    ("half_the_body_with_the_descriptor", _BODY[: len(_BODY) // 2]),
    ("all_but_the_last_byte", _BODY[:-1]),
]


@pytest.mark.parametrize("cut", [c[1] for c in CUTS], ids=[c[0] for c in CUTS])
def test_connection_closed_mid_frame(cluster: Cluster, cut: Optional[bytes]) -> None:
    """The node neither hangs nor keeps the session: the next program
    attaches (not "busy"), and nothing was counted as refused."""
    node = cluster.node()
    seg = Segment(N, PARAMS)
    c = Conn(node)
    if cut is None:
        c.s.sendall(b"attach\n")
    else:
        assert c.hello() == b"ready\n"
        c.send(cut, [seg.fd] if len(cut) > 4 else [])
    c.close()
    seg.close()
    assert assert_serves(node, 0)["source"] == "its own: the first node"


# ---- the first program ------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_first_program_with_non_finite_parameters_refused(
    cluster: Cluster, bad: float
) -> None:
    node = cluster.node()
    params = list(PARAMS)
    params[4] = bad
    seg = Segment(N, params)
    c, r = send_request(node, request(MODEL), seg)
    assert r == {
        "ok": False,
        "error": "the program's initial parameters are not finite (element 4)",
    }
    assert c.closed_by_node()
    c.close()
    seg.close()
    # The model is still open: the next program's own parameters start it.
    assert node.field("model") == ""
    c, seg, r = attach(node)
    assert r["source"] == "its own: the first node"
    assert seg.area_b() == pytest.approx(PARAMS)
    detach(c)
    assert refused(node) == 1


# ---- a node that has its model ----------------------------------------------

PREFIX = "model: the program's tensor list differs from this node's model: "
MISMATCHES = [
    (
        "shape",
        [("w", [3, 2]), ("b", [3])],
        "tensor 0: 'w' F32 [3, 2] the program's, 'w' F32 [2, 3] the node's",
    ),
    (
        "second_name",
        [("w", [2, 3]), ("bias", [3])],
        "tensor 1: 'bias' F32 [3] the program's, 'b' F32 [3] the node's",
    ),
    (
        "one_more",
        [("w", [2, 3]), ("b", [3]), ("c", [1])],
        "3 tensors the program's, 2 the node's: tensor 2 'c' F32 [1] is only "
        "the program's",
    ),
    (
        "one_fewer",
        [("w", [2, 3])],
        "1 tensors the program's, 2 the node's: tensor 1 'b' F32 [3] is only "
        "the node's",
    ),
]


@pytest.mark.parametrize(
    "tensors,diff", [m[1:] for m in MISMATCHES], ids=[m[0] for m in MISMATCHES]
)
def test_other_tensor_list_refused_naming_the_first_difference(
    cluster: Cluster, tensors: list, diff: str
) -> None:
    node = cluster.node()
    c, _, _ = attach(node)
    detach(c, final=False)
    seg = Segment(n_floats_of(tensors), [1.0] * n_floats_of(tensors))
    c, r = send_request(node, request(tensors), seg)
    assert r == {"ok": False, "error": PREFIX + diff}
    assert c.closed_by_node()
    c.close()
    seg.close()
    assert assert_serves(node, 1)["source"] == "the node's"


def test_scribbled_header_and_malformed_detach_end_the_session(
    cluster: Cluster,
) -> None:
    """A program attaches, then overwrites every header field it owns
    (those it wrote before sending, and those it writes as it steps) and
    fills area A with NaN, acknowledges the node's snapshot request with a
    status that is not ok, and sends a detach frame that is not one. The
    node ends the session (it counts no refusal: the attach itself was
    good), stays up, and hands the next program the parameters it had:
    nothing of the scribbling got into its copy."""
    node = cluster.node()
    c, seg, _ = attach(node)
    seg.put("<IIQQ", OFF_MAGIC, 0xDEADBEEF, 77, 1 << 40, 3)
    seg.put("<IQ", OFF_DOORBELL, 0xFFFFFFFF, 1234567)  # doorbell, step
    seg.put("<QQQ", OFF_LOSS, 0x7FF8DEADBEEF0001, 0xFFF0000000000000, 2**64 - 1)
    struct.pack_into(f"<{N}f", seg.map, PAGE, *([math.nan] * N))  # area A
    # The node's copy follows the program at least every second: it asks
    # for a snapshot, which this program answers with a bad status.
    deadline = time.monotonic() + 3.0 * SLOW
    while seg.u64(OFF_REQ_SEQ) == 0:
        assert time.monotonic() < deadline, "no request from the node in 3 s"
        time.sleep(0.02)
    seg.put("<i", OFF_ACK_STATUS, 12345)
    seg.put("<Q", OFF_ACK_SEQ, seg.u64(OFF_REQ_SEQ))
    wait_until(
        lambda: (node.status() or {"attach": {}})["attach"].get("program_requests", 0)
        >= 1,
        3.0,
        "the node took the acknowledgement",
        cluster,
    )
    c.send(frame(b'{"op":"detach","final":"yes"}'))
    assert c.closed_by_node()
    c.close()
    assert node.alive(), node.log_tail()
    assert "ended: a malformed frame" in node.log.read_text()
    st = node.status()
    assert st is not None and st["attach"]["attached"] is False
    assert st["attach"]["nonfinite_snapshots"] >= 1
    c, seg, r = attach(node)
    assert r["source"] == "the node's"
    assert seg.area_b() == pytest.approx(PARAMS)
    detach(c)
    assert refused(node) == 0


def test_detach_final_hands_over_the_last_parameters(cluster: Cluster) -> None:
    """{"op":"detach","final":true}: area A holds the program's last
    parameters and step; the next program gets them."""
    node = cluster.node()
    c, seg, _ = attach(node)
    last = [float(i) for i in range(N)]
    struct.pack_into(f"<{N}f", seg.map, PAGE, *last)
    seg.put("<Q", OFF_STEP, 41)
    detach(c, final=True)
    c, seg, r = attach(node)
    assert r["step"] == 41 and r["source"] == "the node's"
    assert seg.area_b() == pytest.approx(last)
    detach(c)


# ---- the program's header fields are not trusted ----------------------------


def test_scribbled_n_floats_with_a_peer_does_not_crash_the_node(
    cluster: Cluster,
) -> None:
    """Two nodes average; node1's program overwrites n_floats after its
    attach and acknowledges every request (without touching its
    parameters). node1's next correction goes to area B: the node must
    find it from its own count, not the program's."""
    n0 = cluster.node()
    c0, s0, _ = attach(n0)
    n1 = cluster.node(join=n0.address())
    c1, s1, r1 = attach(n1)
    assert r1["source"] == "the cluster's"
    s1.put("<Q", OFF_N_FLOATS, 1 << 40)
    struct.pack_into(f"<{N}f", s0.map, PAGE, *[5.0] * N)
    deadline = time.monotonic() + 3.0 * SLOW
    while time.monotonic() < deadline and n1.alive():
        for s in (s0, s1):
            req = s.u64(OFF_REQ_SEQ)
            if req != s.u64(OFF_ACK_SEQ):
                s.put("<i", OFF_ACK_STATUS, 0)
                s.put("<Q", OFF_ACK_SEQ, req)
        time.sleep(0.005)
    st = n1.status()
    assert n1.alive(), f"node1 died ({n1.proc.returncode}):\n{n1.log_tail()}"
    assert st is not None and st["corrections_applied"] > 0


def test_step_beyond_json_integers_does_not_lock_out_later_programs(
    cluster: Cluster,
) -> None:
    node = cluster.node()
    c, seg, _ = attach(node)
    seg.put("<Q", OFF_STEP, 2**64 - 1)
    time.sleep(0.3)  # the node reads the program's step every 50 ms
    detach(c)
    c, seg, r = attach(node)
    detach(c)
    assert 0 <= r["step"] <= 2**53  # ST_JSON_MAX_INT, what the C client decodes
