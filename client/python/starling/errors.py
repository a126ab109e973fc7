"""starling.errors: the exceptions the package raises.

Every failure of the C client library (client/starling/client.h) comes back
as a negative errno and one sentence; the package raises the exception that
fits the errno, with the library's sentence as its message and the
(positive) errno in ``.errno``.
"""

from __future__ import annotations

import errno as _errno
import re as _re
from typing import List, Optional

__all__ = [
    "StarlingError",
    "NodeUnavailable",
    "ModelMismatch",
    "NodeBusy",
    "NonFiniteParameters",
    "CollectiveError",
    "CollectiveMismatch",
    "MemberFailed",
    "CollectiveTimeout",
    "NotPublished",
    "PublisherBusy",
    "error_for",
    "comm_error_for",
]


class StarlingError(Exception):
    """A starling call failed. ``errno`` is the positive errno (0 when the
    package itself refused, before calling the library)."""

    def __init__(self, message: str, errno: int = 0) -> None:
        super().__init__(message)
        self.errno = errno


class NodeUnavailable(StarlingError):
    """No node answers at the control socket, or the node went away (and,
    with ``reconnect=True``, did not come back in time)."""


class ModelMismatch(StarlingError):
    """The node has another model: the message names the first tensor that
    differs (name, dtype or shape)."""


class NodeBusy(StarlingError):
    """Another program is attached to the node."""


class NonFiniteParameters(StarlingError):
    """The parameters hold a NaN or an infinity at a step that served the
    node: nothing was shared and nothing was applied. The message names the
    first such tensor."""


class CollectiveError(StarlingError):
    """A collective (starling.Comm) failed on this member. On failure the
    operand's contents are unspecified: nothing partial is returned as
    complete. ``kind`` says why: "invalid" (a bad argument: a dtype, an op,
    a root, a group; ``errno`` 0 when the package refused it before asking
    the node), "mismatch", "member_failed" or "timeout" (the subclasses
    below). ``members`` lists the member ids the message names,
    as it writes them (32 hex digits, or the first 12 of them for members
    not heard from before a timeout)."""

    kind = "invalid"

    def __init__(self, message: str, errno: int = 0) -> None:
        super().__init__(message, errno)
        self.members: List[str] = _named_members(message)


class CollectiveMismatch(CollectiveError):
    """The members of the group did not call the same operation (kind,
    reduction, dtype, root, count or group): the message names both calls
    (for Comm.kmeans and Comm.lstsq: the option they disagree on, and its
    smallest and largest values). Every member of the group fails."""

    kind = "mismatch"


class MemberFailed(CollectiveError):
    """A member of the group died, left, or its program went away or failed
    the operation: the message names it. Every surviving member fails,
    within the failure detector's bound plus one round."""

    kind = "member_failed"


class CollectiveTimeout(CollectiveError):
    """The caller's timeout passed: the message names the members not heard
    from."""

    kind = "timeout"


class NotPublished(CollectiveError):
    """A fetch (or unpublish) found nothing published under the name on
    that member's node."""

    kind = "missing"


class PublisherBusy(CollectiveError):
    """The publisher's node serves as many fetches as it may at once: try
    again shortly."""

    kind = "busy"


# Two calls named: the machine's mismatch (gossip/coll.c), or the node's
# answer to a HELLO on "all" over another list (node/daemon/daemon_coll.c,
# foreign_hello and st__coll_late_hello: "it called ...; this member
# called ...").
_MISMATCH = _re.compile(
    r"rank \d+ called .*; rank \d+ \(this member\) called "
    r"|it called .*; this member called "
    r"|^the members disagree on "  # st_comm_kmeans, st_comm_lstsq
)
_FULL_ID = _re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")
_SILENT = _re.compile(r"no word yet from ((?:[0-9a-f]{12}(?:, )?)+)")


def _named_members(text: str) -> List[str]:
    out = _FULL_ID.findall(text)
    m = _SILENT.search(text)
    if m:
        out += [h for h in m.group(1).split(", ") if h]
    return list(dict.fromkeys(out))  # in order, once each


# The errnos that mean "the node is not there (any more)".
_UNAVAILABLE = {
    _errno.ENOENT,
    _errno.ECONNREFUSED,
    _errno.ENOTCONN,
    _errno.ECONNRESET,
    _errno.EPIPE,
}


def error_for(rc: int, message: str, attaching: bool) -> StarlingError:
    """The exception for the library's negative return ``rc``. ``attaching``
    tells whether it came from the attach (where -ETIMEDOUT means the node
    was slow to hand over the parameters, not that it went away)."""
    code = -rc
    text = message or _errno.errorcode.get(code, f"error {code}")
    cls: Optional[type] = None
    if code in _UNAVAILABLE or (code == _errno.ETIMEDOUT and not attaching):
        cls = NodeUnavailable
    elif code == _errno.EINVAL and ("model:" in text or "differ" in text):
        # The node's refusal of another model starts "model:"; other -EINVAL
        # refusals (a bad segment, non-finite initial parameters) are not
        # a mismatch.
        cls = ModelMismatch
    elif code == _errno.EBUSY:
        cls = NodeBusy
    elif code == _errno.EDOM:
        cls = NonFiniteParameters
    return (cls or StarlingError)(text, code)


def comm_error_for(rc: int, message: str, store: bool = False) -> StarlingError:
    """The exception for a collective's negative return ``rc`` (client.h,
    "Collectives"): a sentence that names two calls is a mismatch (with
    -EINVAL, or -ECONNABORTED on a member that heard of it from another);
    another -EINVAL is a refused argument; -ECONNABORTED a failed member;
    -ETIMEDOUT the caller's timeout; -ENOTCONN and the connection errnos
    mean the node went away (NodeUnavailable); -EBUSY the node refused the
    communicator (NodeBusy). For a call on published tensors (``store``:
    fetch, publish, unpublish), -ENOENT is NotPublished, -EBUSY
    PublisherBusy and -ENOSPC a CollectiveError (the node's bounds)."""
    code = -rc
    text = message or _errno.errorcode.get(code, f"error {code}")
    cls: type = StarlingError
    if store and code == _errno.ENOENT:
        cls = NotPublished
    elif store and code == _errno.EBUSY:
        cls = PublisherBusy
    elif store and code == _errno.ENOSPC:
        cls = CollectiveError
    elif code in _UNAVAILABLE:
        cls = NodeUnavailable
    elif code == _errno.EBUSY:
        cls = NodeBusy
    elif code in (_errno.EINVAL, _errno.ECONNABORTED) and _MISMATCH.search(text):
        # The library answers a refused argument and a mismatch with the
        # same -EINVAL, and a member that learns of the mismatch from
        # another (its ABORT) with -ECONNABORTED; the mismatch's sentence,
        # relayed as it is, is the only one that says what two calls were
        # (_MISMATCH), so every member raises the same kind.
        cls = CollectiveMismatch
    elif code == _errno.EINVAL:
        cls = CollectiveError
    elif code == _errno.ETIMEDOUT:
        cls = CollectiveTimeout
    elif code == _errno.ECONNABORTED:
        cls = MemberFailed
    return cls(text, code)
