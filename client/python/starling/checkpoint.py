"""Reading a node's checkpoint (DATA_DIR/checkpoint.safetensors) back into
PyTorch, with nothing but the standard library, NumPy and torch.

An attached node writes its checkpoints in the safetensors format with the
program's own tensor names (float32 parameters and floating-point buffers;
integer buffers such as BatchNorm's num_batches_tracked are not averaged
and not written), so::

    state, meta = starling.load_checkpoint("state/checkpoint.safetensors")
    model.load_state_dict(state, strict=False)
    print(meta["step"])
"""

import json
import struct
from typing import Dict, Tuple

import numpy as np
import torch

from .errors import StarlingError

# The format's own reference implementation caps headers at 100 MB.
_HEADER_MAX = 100 * 1024 * 1024
_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16,
           "I64": np.int64, "I32": np.int32}


def load_checkpoint(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Reads a safetensors file: returns (tensors by name, metadata).

    Raises StarlingError naming the file and what is wrong for a file that
    is not valid safetensors (truncated, a header beyond the file, offsets
    that do not match the shape, an unknown dtype)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise StarlingError(f"cannot read checkpoint {path}: {e.strerror}", e.errno)
    if len(raw) < 8:
        raise StarlingError(f"checkpoint {path}: shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > _HEADER_MAX or 8 + n > len(raw):
        raise StarlingError(f"checkpoint {path}: header of {n} bytes does not fit the file")
    try:
        header = json.loads(raw[8 : 8 + n])
    except ValueError as e:
        raise StarlingError(f"checkpoint {path}: header is not JSON ({e})")
    if not isinstance(header, dict):
        raise StarlingError(f"checkpoint {path}: header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    data = memoryview(raw)[8 + n :]
    out: Dict[str, torch.Tensor] = {}
    for name, e in header.items():
        try:
            dtype = _DTYPES[e["dtype"]]
            shape = [int(d) for d in e["shape"]]
            begin, end = (int(x) for x in e["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise StarlingError(f"checkpoint {path}: tensor '{name}' has a malformed entry")
        count = int(np.prod(shape)) if shape else 1
        if not 0 <= begin <= end <= len(data) or end - begin != count * np.dtype(dtype).itemsize:
            raise StarlingError(
                f"checkpoint {path}: tensor '{name}' offsets [{begin}, {end}) "
                f"do not match its shape {shape}"
            )
        arr = np.frombuffer(data[begin:end], dtype=np.dtype(dtype).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.astype(dtype).reshape(shape).copy())
    return out, {str(k): str(v) for k, v in meta.items()}
