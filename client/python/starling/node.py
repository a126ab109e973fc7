"""starling.node: attaching a torch.nn.Module to the local `starling node
--attach`, over the C client library (client/starling/client.h).

The package is thin: it lists the model's float tensors, hands their memory
to the library, and turns the library's errors into exceptions. Everything
else (membership, averaging, state for joiners, checkpoints) is the node's.

Memory: a contiguous CPU tensor is registered as it is (the library reads
and writes it in place, at attach and at step boundaries). Any other tensor
(on a GPU, or not contiguous) goes through a host copy of its own (pinned
when CUDA is there): the package copies it to the host only when the node
has asked for the parameters (st_client_pending), and back when the library
changed them.
"""

from __future__ import annotations

import ctypes
import math
import os
import types
from typing import Any, List, Optional, Tuple, Union

import torch

from . import _lib
from .errors import StarlingError, error_for

__all__ = ["Node", "attach", "model_tensors"]

_ERR_LEN = 1024


def model_tensors(model: torch.nn.Module) -> List[Tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs that attach registers, in state_dict order:
    every floating-point parameter and persistent buffer (BatchNorm's
    running_mean and running_var included), each once (a tied tensor under
    its first name), leaving out integer and bool tensors (BatchNorm's
    num_batches_tracked) and empty ones. Raises StarlingError naming the
    first floating tensor that is not float32."""
    out: List[Tuple[str, torch.Tensor]] = []
    seen_ids = set()
    seen_mem = set()
    for name, t in model.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):
            continue
        if not (t.is_floating_point() or t.is_complex()):
            continue  # counters and masks: not averaged
        if t.dtype != torch.float32:
            raise StarlingError(
                f"tensor '{name}' is {t.dtype}: starling averages float32 "
                "tensors only; cast the model to float32 (model.float()) "
                "before attaching"
            )
        if t.numel() == 0:
            continue
        mem = (t.device, t.data_ptr(), tuple(t.shape), t.stride())
        if id(t) in seen_ids or mem in seen_mem:
            continue  # tied: the same tensor under a second name
        seen_ids.add(id(t))
        seen_mem.add(mem)
        out.append((name, t))
    if not out:
        raise StarlingError(
            "the model has no float32 parameters or buffers to share; attach "
            "a model with parameters"
        )
    return out


def _direct(t: torch.Tensor) -> bool:
    """The library can use this tensor's own memory."""
    return t.device.type == "cpu" and t.is_contiguous()


class Node:
    """A training program's attachment to its node (made by
    ``starling.attach``). After attach the model holds the parameters the
    node handed over; call ``step()`` after every optimizer step, and
    ``detach()`` (or leave the ``with`` block) at the end.

    Attributes: ``cluster_step``, the step the parameters handed over at
    attach (or at the last reconnect) belong to; ``step_count``, the step
    the program is at (cluster_step plus the steps since); ``names``, the
    registered tensors' names in order."""

    def __init__(self) -> None:
        # Filled by attach(); a Node is not made directly.
        self._c = ctypes.c_void_p()
        self._lib: Optional[ctypes.CDLL] = None
        self._keep: List[Any] = []  # what the library holds pointers into
        self._staged: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._wrapped: List[torch.optim.Optimizer] = []
        self.names: List[str] = []
        self.num_floats = 0
        self.cluster_step = 0
        self.step_count = 0

    # ---- attach ---------------------------------------------------------

    def _register(self, model: torch.nn.Module) -> "ctypes.Array[_lib.Tensor]":
        """Builds the library's tensor list, with a host copy for every
        tensor it cannot use directly (filled with the current values: the
        node takes them when this program is the first)."""
        pairs = model_tensors(model)
        arr = (_lib.Tensor * len(pairs))()
        pin = torch.cuda.is_available()
        for i, (name, t) in enumerate(pairs):
            if t.dim() > _lib.MAX_DIMS:
                raise StarlingError(
                    f"tensor '{name}' has {t.dim()} dimensions; starling "
                    f"takes at most {_lib.MAX_DIMS}: reshape it"
                )
            host = t
            if not _direct(t):
                host = torch.empty(
                    t.shape, dtype=torch.float32, pin_memory=pin and t.is_cuda
                )
                with torch.no_grad():
                    host.copy_(t)
                self._staged.append((t, host))
            bname = name.encode("utf-8")
            self._keep += [bname, t, host]
            arr[i].name = bname
            arr[i].dtype = _lib.F32
            arr[i].ndim = t.dim()
            for d, n in enumerate(t.shape):
                arr[i].shape[d] = n
            arr[i].data = host.data_ptr()
            self.names.append(name)
            self.num_floats += t.numel()
        self._keep.append(arr)
        return arr

    def _to_host(self) -> None:
        with torch.no_grad():
            for dev, host in self._staged:
                host.copy_(dev)

    def _to_device(self) -> None:
        with torch.no_grad():
            for dev, host in self._staged:
                dev.copy_(host)

    # ---- the step boundary ----------------------------------------------

    def step(self) -> int:
        """Marks the end of one optimizer step (step_count + 1) and serves
        what the node asked for since the last one: usually nothing (one
        shared-memory read). Returns the bitmask of what was done:
        starling.DID_APPLY (an averaging correction was added to the
        parameters), DID_SNAPSHOT (they were copied for the node),
        DID_STATE (they were replaced after a reconnect; step_count then
        follows cluster_step). Raises NonFiniteParameters (nothing was
        shared or applied), NodeUnavailable (the node went away)."""
        lib, c = self._lib, self._require()
        if self._staged and lib.st_client_pending(c) & (
            _lib.DID_APPLY | _lib.DID_SNAPSHOT
        ):
            self._to_host()
        self.step_count += 1
        rc = lib.st_client_step(c, self.step_count)
        if rc < 0:
            raise error_for(rc, self._error(), attaching=False)
        if rc & _lib.DID_STATE:
            self.cluster_step = int(lib.st_client_cluster_step(c))
            self.step_count = self.cluster_step
        if self._staged and rc & (_lib.DID_APPLY | _lib.DID_STATE):
            self._to_device()
        return rc

    def pending(self) -> int:
        """What the next step() will serve (the DID_* bits; 0: nothing)."""
        return int(self._lib.st_client_pending(self._require()))

    def report(
        self,
        loss: Optional[Union[float, torch.Tensor]] = None,
        accuracy: Optional[Union[float, torch.Tensor]] = None,
    ) -> None:
        """Shows the program's own figures in `starling status` (None: not
        known)."""
        lo = math.nan if loss is None else float(loss)
        ac = math.nan if accuracy is None else float(accuracy)
        self._lib.st_client_report(self._require(), lo, ac)

    def wrap(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Makes ``optimizer.step()`` call ``self.step()`` after its own step
        (while attached; after detach() it steps alone), and returns the same
        optimizer, so that LR schedulers still take it. Wrapping twice
        changes nothing."""
        if any(o is optimizer for o in self._wrapped):
            return optimizer
        inner = optimizer.step
        node = self

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            out = inner(*args, **kwargs)
            if node.attached:
                node.step()
            return out

        optimizer.step = types.MethodType(step, optimizer)
        self._wrapped.append(optimizer)
        return optimizer

    # ---- detach ---------------------------------------------------------

    @property
    def attached(self) -> bool:
        """The session is open (detach() not called yet)."""
        return bool(self._c.value)

    def detach(self) -> bool:
        """Ends the session; the node keeps the last parameters it has and
        serves them to peers and to the next program. Returns False when the
        node had already gone (no error: there is nothing left to end).
        Safe to call twice."""
        if not self.attached:
            return True
        if self._staged:  # the library hands the host buffers over
            self._to_host()
        rc = self._lib.st_client_detach(self._c)
        self._c = ctypes.c_void_p()
        self._keep, self._staged = [], []
        return rc == 0

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    def __del__(self) -> None:
        try:
            if self._lib is not None and self.attached:
                self.detach()
        except Exception:
            pass  # interpreter shutdown: the node sees the socket close

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return (
            f"<starling.Node {state}: {len(self.names)} tensors, "
            f"{self.num_floats} floats, step {self.step_count}>"
        )

    def _require(self) -> ctypes.c_void_p:
        if not self.attached:
            raise StarlingError("the node is detached; attach again first")
        return self._c

    def _error(self) -> str:
        msg = self._lib.st_client_error(self._c)
        return msg.decode("utf-8", "replace") if msg else ""


def attach(
    model: torch.nn.Module,
    socket: Union[str, "os.PathLike[str]"] = "state/control.sock",
    reconnect: bool = False,
    timeout: float = 300.0,
    reconnect_timeout: float = 60.0,
) -> Node:
    """Attaches ``model`` to the node whose control socket is ``socket``
    (DATA_DIR/control.sock of `starling node --attach`) and returns the
    Node. On return the model holds the parameters the node handed over:
    the cluster's, the node's checkpoint's, or the model's own when it is
    the first. Waits up to ``timeout`` seconds (0: no limit) for the node,
    which may synchronize from a peer first. With ``reconnect``, a step
    that finds the node gone waits up to ``reconnect_timeout`` seconds for
    it to come back and takes its parameters.

    Raises NodeUnavailable (no node at socket), NodeBusy (another program
    is attached), ModelMismatch (the node has another model: the message
    names the first differing tensor), StarlingError (a tensor that is not
    float32, a node that speaks another protocol, a time-out, no library).
    """
    node = Node()
    arr = node._register(model)  # the model's own checks come first
    lib = _lib.load()
    node._lib = lib
    opt = _lib.Options()
    lib.st_client_options_default(ctypes.byref(opt))
    path = os.fsencode(socket)
    node._keep.append(path)
    opt.socket_path = path
    opt.attach_timeout_s = float(timeout)
    opt.reconnect = 1 if reconnect else 0
    opt.reconnect_timeout_s = float(reconnect_timeout)
    err = ctypes.create_string_buffer(_ERR_LEN)
    rc = lib.st_client_attach(
        ctypes.byref(opt), arr, len(node.names), ctypes.byref(node._c), err, _ERR_LEN
    )
    if rc != 0:
        node._c = ctypes.c_void_p()
        raise error_for(rc, err.value.decode("utf-8", "replace"), attaching=True)
    node.cluster_step = int(lib.st_client_cluster_step(node._c))
    node.step_count = node.cluster_step
    node._to_device()
    return node
