"""starling: train a PyTorch model through the local `starling node --attach`.

Two lines in an ordinary training loop::

    import starling

    node = starling.attach(model, socket="state/control.sock")
    for ...:
        loss.backward()
        optimizer.step()
        node.step()          # the node averages with its peers between steps
    node.detach()

attach() registers the model's float32 parameters and buffers with the
node (through the C client library, libstarling.so: set STARLING_LIB to its
path when it is not beside this package or on the library path), and the
model then holds the cluster's parameters. Failures raise StarlingError or
one of its kinds (NodeUnavailable, ModelMismatch, NodeBusy,
NonFiniteParameters) with the library's sentence.
"""

from ._lib import DID_APPLY, DID_SNAPSHOT, DID_STATE, PROTOCOL_VERSION
from .errors import (
    ModelMismatch,
    NodeBusy,
    NodeUnavailable,
    NonFiniteParameters,
    StarlingError,
)
from .checkpoint import load_checkpoint
from .node import Node, attach, model_tensors

__version__ = "0.1.0"

__all__ = [
    "attach",
    "load_checkpoint",
    "Node",
    "model_tensors",
    "StarlingError",
    "NodeUnavailable",
    "ModelMismatch",
    "NodeBusy",
    "NonFiniteParameters",
    "DID_APPLY",
    "DID_SNAPSHOT",
    "DID_STATE",
    "PROTOCOL_VERSION",
]
