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

Collectives across the cluster (all-reduce, reduce, broadcast, barrier) go
through a communicator on any node's control socket::

    with starling.open_comm("state/control.sock") as comm:
        comm.all_reduce(tensor, op="mean")   # numpy or torch, in place

and fail with CollectiveError (CollectiveMismatch, MemberFailed,
CollectiveTimeout) or NodeUnavailable. A program can also publish a tensor
on its node for any member to fetch later, one-sided::

    comm.publish("weights", w)                  # on one member
    comm.fetch(publisher_id, "weights", w2)     # on any other, any time

Synchronous data-parallel SGD over those collectives (gradients averaged
in buckets while backward runs; a failed member leaves the group)::

    sync = starling.SyncDataParallel(model, comm, optimizer=optimizer)
    loss.backward()
    sync.step(optimizer)    # waits for the averages, then optimizer.step()

Parallel k-means and least squares, every member on its own rows::

    km = comm.kmeans(points, k=8)           # km.centroids: the same everywhere
    fit = comm.lstsq(x, y, ridge=0.1)       # fit.weight, fit.bias
"""

from ._lib import DID_APPLY, DID_SNAPSHOT, DID_STATE, PROTOCOL_VERSION
from .errors import (
    CollectiveError,
    CollectiveMismatch,
    CollectiveTimeout,
    MemberFailed,
    ModelMismatch,
    NodeBusy,
    NodeUnavailable,
    NonFiniteParameters,
    NotPublished,
    PublisherBusy,
    StarlingError,
)

# What needs PyTorch is imported on first use, so that the parts that do not
# (`python3 -m starling.plot`, starling._lib) work on a machine without it.
_LAZY = {
    "Comm": ".comm",
    "open_comm": ".comm",
    "load_checkpoint": ".checkpoint",
    "Node": ".node",
    "attach": ".node",
    "model_tensors": ".node",
    "SyncDataParallel": ".sync",
    "KMeansResult": ".algos",
    "LstsqResult": ".algos",
    "SyncError": ".sync",
}


def __getattr__(name: str):  # noqa: ANN202  (PEP 562)
    if name not in _LAZY:
        raise AttributeError(f"module 'starling' has no attribute '{name}'")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


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
    "open_comm",
    "Comm",
    "CollectiveError",
    "CollectiveMismatch",
    "MemberFailed",
    "CollectiveTimeout",
    "NotPublished",
    "PublisherBusy",
    "SyncDataParallel",
    "SyncError",
    "KMeansResult",
    "LstsqResult",
    "DID_APPLY",
    "DID_SNAPSHOT",
    "DID_STATE",
    "PROTOCOL_VERSION",
]
