"""starling.errors: the exceptions the package raises.

Every failure of the C client library (client/starling/client.h) comes back
as a negative errno and one sentence; the package raises the exception that
fits the errno, with the library's sentence as its message and the
(positive) errno in ``.errno``.
"""

from __future__ import annotations

import errno as _errno
from typing import Optional

__all__ = [
    "StarlingError",
    "NodeUnavailable",
    "ModelMismatch",
    "NodeBusy",
    "NonFiniteParameters",
    "error_for",
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
