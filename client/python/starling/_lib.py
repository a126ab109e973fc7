"""starling._lib: finds and loads the C client library (libstarling.so) and
declares its functions for ctypes, mirroring client/starling/client.h.

The library is looked up when a program first attaches, not at import, so
that ``import starling`` works on a machine without it: $STARLING_LIB, then a
libstarling.so beside this package, then the library directory `cmake
--install` recorded (starling/_installed.py), then the system library path
(ctypes.util.find_library).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Optional

from .errors import StarlingError

# client.h's constants.
PROTOCOL_VERSION = 1
MAX_DIMS = 8
F32 = 0
DID_APPLY = 1
DID_SNAPSHOT = 2
DID_STATE = 4


class Tensor(ctypes.Structure):
    """st_client_tensor_t."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("data", ctypes.c_void_p),
    ]


class Options(ctypes.Structure):
    """st_client_options_t."""

    _fields_ = [
        ("socket_path", ctypes.c_char_p),
        ("attach_timeout_s", ctypes.c_double),
        ("reconnect", ctypes.c_int),
        ("reconnect_timeout_s", ctypes.c_double),
    ]


_lib: Optional[ctypes.CDLL] = None


def _candidates() -> list:
    env = os.environ.get("STARLING_LIB")
    if env:
        return [env]  # an explicit choice: no fallback that would hide it
    out = []
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libstarling.so")
    if os.path.exists(here):
        out.append(here)
    try:
        from ._installed import LIBDIR  # written by cmake --install

        installed = os.path.join(LIBDIR, "libstarling.so")
        if os.path.exists(installed):
            out.append(installed)
    except ImportError:
        pass
    found = ctypes.util.find_library("starling")
    if found:
        out.append(found)
    return out


def _declare(lib: ctypes.CDLL) -> None:
    c = ctypes.c_void_p
    lib.st_client_options_default.argtypes = [ctypes.POINTER(Options)]
    lib.st_client_options_default.restype = None
    lib.st_client_attach.argtypes = [
        ctypes.POINTER(Options),
        ctypes.POINTER(Tensor),
        ctypes.c_size_t,
        ctypes.POINTER(c),
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.st_client_attach.restype = ctypes.c_int
    lib.st_client_step.argtypes = [c, ctypes.c_uint64]
    lib.st_client_step.restype = ctypes.c_int
    lib.st_client_pending.argtypes = [c]
    lib.st_client_pending.restype = ctypes.c_uint
    lib.st_client_cluster_step.argtypes = [c]
    lib.st_client_cluster_step.restype = ctypes.c_uint64
    lib.st_client_report.argtypes = [c, ctypes.c_double, ctypes.c_double]
    lib.st_client_report.restype = None
    lib.st_client_error.argtypes = [c]
    lib.st_client_error.restype = ctypes.c_char_p
    lib.st_client_detach.argtypes = [c]
    lib.st_client_detach.restype = ctypes.c_int


def load() -> ctypes.CDLL:
    """The loaded library (loaded once). Raises StarlingError naming where
    it looked, and what to set, when it cannot be loaded."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            _declare(lib)
        except (OSError, AttributeError) as e:
            tried.append(f"{path}: {e}")
            continue
        _lib = lib
        return lib
    where = (
        "; ".join(tried)
        if tried
        else "no libstarling.so beside the package or on the library path"
    )
    raise StarlingError(
        f"cannot load the starling client library ({where}): build it "
        "(libstarling.so in the build directory) and set STARLING_LIB to "
        "its path"
    )
