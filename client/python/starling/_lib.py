"""starling._lib: finds and loads the C client library (libstarling.so) and
declares its functions for ctypes, mirroring client/starling/client.h.

The library is looked up when a program first attaches or opens a
communicator, not at import, so that ``import starling`` works on a machine
without it: $STARLING_LIB, then a libstarling.so beside this package, then
the library directory `cmake --install` recorded (starling/_installed.py),
then the system library path (ctypes.util.find_library).
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
# st_comm_dtype_t and st_comm_op_t.
COMM_F32 = 0
COMM_F64 = 1
COMM_BF16 = 2
COMM_OPS = {"sum": 0, "mean": 1, "min": 2, "max": 3}
ID_HEX = 33  # a member id: 32 hex digits and a NUL


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


class KmeansIter(ctypes.Structure):
    """st_comm_kmeans_iter_t."""

    _fields_ = [
        ("iteration", ctypes.c_uint32),
        ("objective", ctypes.c_double),
        ("moved", ctypes.c_double),
        ("empty", ctypes.c_size_t),
    ]


KMEANS_PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(KmeansIter))


class KmeansOpts(ctypes.Structure):
    """st_comm_kmeans_opts_t."""

    _fields_ = [
        ("k", ctypes.c_size_t),
        ("max_iter", ctypes.c_uint32),
        ("tol", ctypes.c_double),
        ("seed", ctypes.c_uint64),
        ("progress", KMEANS_PROGRESS),
        ("progress_arg", ctypes.c_void_p),
    ]


class KmeansInfo(ctypes.Structure):
    """st_comm_kmeans_info_t."""

    _fields_ = [
        ("points", ctypes.c_uint64),
        ("iterations", ctypes.c_uint32),
        ("converged", ctypes.c_int),
        ("objective", ctypes.c_double),
        ("moved", ctypes.c_double),
        ("rank", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("same_data", ctypes.c_int),
    ]


class LstsqIter(ctypes.Structure):
    """st_comm_lstsq_iter_t."""

    _fields_ = [
        ("iteration", ctypes.c_uint32),
        ("objective", ctypes.c_double),
        ("grad_norm", ctypes.c_double),
    ]


LSTSQ_PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(LstsqIter))
LSTSQ_METHODS = {"normal": 0, "gd": 1}


class LstsqOpts(ctypes.Structure):
    """st_comm_lstsq_opts_t."""

    _fields_ = [
        ("method", ctypes.c_int),
        ("intercept", ctypes.c_int),
        ("ridge", ctypes.c_double),
        ("max_iter", ctypes.c_uint32),
        ("tol", ctypes.c_double),
        ("alpha", ctypes.c_double),
        ("progress", LSTSQ_PROGRESS),
        ("progress_arg", ctypes.c_void_p),
    ]


class LstsqInfo(ctypes.Structure):
    """st_comm_lstsq_info_t."""

    _fields_ = [
        ("bias", ctypes.c_double),
        ("points", ctypes.c_uint64),
        ("qr", ctypes.c_int),
        ("positive_definite", ctypes.c_int),
        ("rcond", ctypes.c_double),
        ("solve_rank", ctypes.c_size_t),
        ("rss", ctypes.c_double),
        ("objective", ctypes.c_double),
        ("rmse", ctypes.c_double),
        ("iterations", ctypes.c_uint32),
        ("converged", ctypes.c_int),
        ("grad_norm", ctypes.c_double),
        ("alpha", ctypes.c_double),
        ("rank", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("same_data", ctypes.c_int),
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
    _declare_comm(lib)


def _declare_comm(lib: ctypes.CDLL) -> None:
    """The collectives (client.h, "Collectives")."""
    c, i, u32, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
    f64, sz, s = ctypes.c_double, ctypes.c_size_t, ctypes.c_char_p
    lib.st_comm_open.argtypes = [s, ctypes.POINTER(c), s, sz]
    lib.st_comm_open.restype = i
    lib.st_comm_close.argtypes = [c]
    lib.st_comm_close.restype = None
    lib.st_comm_error.argtypes = [c]
    lib.st_comm_error.restype = s
    # ids is a char (*)[33]: an array of ID_HEX-byte rows, or NULL.
    lib.st_comm_members.argtypes = [
        c,
        c,
        sz,
        ctypes.POINTER(sz),
        ctypes.POINTER(sz),
    ]
    lib.st_comm_members.restype = i
    lib.st_comm_all_reduce.argtypes = [c, s, c, u64, i, i, f64]
    lib.st_comm_all_reduce.restype = i
    lib.st_comm_reduce.argtypes = [c, s, u32, c, u64, i, i, f64]
    lib.st_comm_reduce.restype = i
    lib.st_comm_broadcast.argtypes = [c, s, u32, c, u64, i, f64]
    lib.st_comm_broadcast.restype = i
    lib.st_comm_barrier.argtypes = [c, s, f64]
    lib.st_comm_barrier.restype = i
    lib.st_comm_push.argtypes = [c, s, s, c, u64, i, f64]
    lib.st_comm_push.restype = i
    lib.st_comm_pull.argtypes = [c, s, s, c, u64, i, f64]
    lib.st_comm_pull.restype = i
    lib.st_comm_publish.argtypes = [c, s, c, u64, i]
    lib.st_comm_publish.restype = i
    lib.st_comm_unpublish.argtypes = [c, s]
    lib.st_comm_unpublish.restype = i
    lib.st_comm_fetch.argtypes = [c, s, s, c, u64, i, f64]
    lib.st_comm_fetch.restype = i
    lib.st_comm_notify.argtypes = [c, s, s, f64]
    lib.st_comm_notify.restype = i
    lib.st_comm_wait.argtypes = [c, s, s, f64]
    lib.st_comm_wait.restype = i
    lib.st_comm_last_group.argtypes = [
        c,
        ctypes.POINTER(u32),
        ctypes.POINTER(u32),
    ]
    lib.st_comm_last_group.restype = None
    _declare_algos(lib)


def _declare_algos(lib: ctypes.CDLL) -> None:
    """The algorithms (client.h, "Algorithms over a group")."""
    c, i, f64, sz, s = (
        ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_size_t, ctypes.c_char_p
    )
    dp = ctypes.POINTER(ctypes.c_double)
    fp = ctypes.POINTER(ctypes.c_float)
    lib.st_comm_kmeans_opts_default.argtypes = [ctypes.POINTER(KmeansOpts)]
    lib.st_comm_kmeans_opts_default.restype = None
    lib.st_comm_kmeans.argtypes = [
        c, s, fp, sz, sz, ctypes.POINTER(KmeansOpts), f64, dp, dp,
        ctypes.POINTER(KmeansInfo),
    ]
    lib.st_comm_kmeans.restype = i
    lib.st_comm_lstsq_opts_default.argtypes = [ctypes.POINTER(LstsqOpts)]
    lib.st_comm_lstsq_opts_default.restype = None
    lib.st_comm_lstsq.argtypes = [
        c, s, fp, fp, sz, sz, ctypes.POINTER(LstsqOpts), f64, dp,
        ctypes.POINTER(LstsqInfo),
    ]
    lib.st_comm_lstsq.restype = i


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
