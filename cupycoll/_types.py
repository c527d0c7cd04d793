"""Reduction ops, supported dtypes and array-namespace helpers shared by every layer."""

from __future__ import annotations

import enum
import sys
import types
from typing import Any

import numpy as np

from .errors import CupycollError, InvalidArgument, InvalidType

__all__ = ["ReduceOp", "UFUNCS", "parse_op", "array_namespace", "as_array", "check_dtype",
           "check_native", "check_current_device", "device_of", "distinct", "DENSE_DTYPES",
           "to_host", "like_caller", "callers", "trunc_divide", "writable"]


class ReduceOp(str, enum.Enum):
    """Reduction operations, with NCCL's semantics (``avg`` = sum / P, integers truncate)."""

    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    AVG = "avg"


#: the numpy ufunc folding each op (avg has none: it is a sum, then a division by P).
UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum,
          ReduceOp.MIN: np.minimum}


#: dtypes every dense collective accepts (bfloat16 is added where the array library has it).
DENSE_DTYPES = tuple(
    np.dtype(t) for t in ("float16", "float32", "float64", "int8", "uint8", "int32", "int64",
                          "uint32", "uint64")
)
_ALLOWED_NAMES = frozenset(d.name for d in DENSE_DTYPES) | {"bfloat16"}
_ALLOWED_DTYPES = frozenset(DENSE_DTYPES)

_OPS_BY_NAME = {o.value: o for o in ReduceOp}
_MPI_OP_NAMES = {"SUM": ReduceOp.SUM, "PROD": ReduceOp.PROD, "MAX": ReduceOp.MAX, "MIN": ReduceOp.MIN}


def parse_op(op: Any, *, rank: int | None = None, argument: str = "op") -> ReduceOp:
    """Turn a string, :class:`ReduceOp` or mpi4py ``MPI.SUM``-style op into a :class:`ReduceOp`."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        known = _OPS_BY_NAME.get(op)  # one dict hit (calling the Enum costs more)
        if known is not None:
            return known
        try:
            return ReduceOp(op.lower())
        except ValueError:
            raise InvalidArgument(argument, op, f"unknown op; valid: {sorted(o.value for o in ReduceOp)}",
                                  rank=rank) from None
    mpi_name = _mpi_op_name(op, argument, rank)
    if mpi_name is not None:
        return mpi_name
    try:
        name = getattr(op, "name", None)  # e.g. torch.distributed.ReduceOp.SUM
    except Exception:  # noqa: BLE001 -- an object's own property: not an op
        name = None
    if isinstance(name, str) and name.lower() in {o.value for o in ReduceOp}:
        return ReduceOp(name.lower())
    raise InvalidType(argument, op, "a str, cupycoll.ReduceOp or mpi4py MPI op", rank=rank)


def _mpi_op_name(op: Any, argument: str, rank: int | None) -> ReduceOp | None:
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover - mpi4py is a dependency
        return None
    if not isinstance(op, MPI.Op):
        return None
    for name, value in _MPI_OP_NAMES.items():
        if op == getattr(MPI, name):
            return value
    raise InvalidArgument(argument, op, "only MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN are supported",
                          rank=rank)


def array_namespace(x: Any) -> types.ModuleType:
    """Return numpy or cupy, whichever owns ``x`` (or the namespace an emulated device array
    names in ``__cupycoll_namespace__``)."""
    own = getattr(x, "__cupycoll_namespace__", None)
    if own is not None:
        return own
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def as_array(x: Any, argument: str, *, rank: int | None = None) -> Any:
    """Accept a numpy/cupy array or anything with ``__dlpack__`` (zero-copy); reject the rest.
    A numpy subclass (memmap, matrix) is taken as a plain ndarray view of its memory (its own
    indexing and reshaping rules would reach the algorithms); a masked array with masked
    entries is refused (the mask would be ignored)."""
    if type(x) is np.ndarray or type(x).__module__.split(".")[0] == "cupy":
        return x
    if isinstance(x, np.ndarray):
        if array_namespace(x) is not np:  # a device array stand-in (cupycoll.testing's)
            return x
        if np.ma.is_masked(x):
            raise InvalidType(argument, "a masked array with masked entries", "a plain array "
                              "(the mask would be ignored: pass x.filled(0))", rank=rank)
        return x.view(np.ndarray)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        try:
            if int(x.__dlpack_device__()[0]) in (1, 3):  # kDLCPU, kDLCUDAHost
                return np.from_dlpack(x)
            import cupy

            return cupy.from_dlpack(x)
        except CupycollError:  # a stand-in raising the error its rank found (Refused)
            raise
        except ImportError as e:
            raise InvalidType(argument, f"{type(x).__name__} on a device ({e})", "a tensor "
                              "on the host, or CuPy installed for a GPU tensor (pip install "
                              "'cupycoll[gpu-cu12]')", rank=rank) from None
        except Exception as e:  # noqa: BLE001 -- the object's own DLPack methods may raise
            # anything; e.g. a bfloat16 tensor numpy cannot hold, a tensor that requires grad
            raise InvalidArgument(argument, f"{type(x).__name__} ({e})", "must be a tensor DLPack "
                                  "can share with numpy/cupy", rank=rank) from None
    raise InvalidType(argument, type(x).__name__, "a numpy/cupy array or an object with __dlpack__",
                      rank=rank)


def check_flag(value: Any, argument: str, rank: int | None = None) -> bool:
    """``value`` as a bool; InvalidType unless it is one (``"no"`` or 1 would be taken as
    true where ranks must agree on the flag)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidType(argument, type(value).__name__, "True or False", rank=rank)
    return bool(value)


def check_device(x: Any, comm: Any, argument: str) -> None:
    """On an NCCL communicator: raise InvalidType when ``x`` is not of its array library (a
    host array), InvalidArgument when it lives on another GPU than ``device_id`` (its
    collectives would read or write it there) or the calling thread's current device is
    another (:func:`check_current_device`)."""
    if getattr(comm, "backend", None) == "nccl" and array_namespace(x) is not comm.xp:
        raise InvalidType(argument, type(x).__name__, "a cupy array (or CUDA DLPack tensor) on "
                          "the nccl backend", rank=comm.rank)
    device = getattr(comm, "device_id", None)
    if device is None or isinstance(x, np.ndarray):  # (host stand-ins: the tests' wrap)
        return
    got = device_of(x, device)
    if got != device:
        raise InvalidArgument(argument, f"an array on device {got}", "must be on the "
                              f"communicator's device {device}", rank=comm.rank)
    check_current_device(comm.xp.cuda.runtime.getDevice(), device, comm.rank)


def device_of(a: Any, default: int) -> int:
    """The CUDA device ``a`` lives on (a CuPy array's ``device.id``), ``default`` for what has
    none (a numpy array's ``device`` is the string "cpu")."""
    return getattr(getattr(a, "device", None), "id", default)


def check_current_device(current: int, device: int, rank: int) -> None:
    """Raise InvalidArgument unless the calling thread's ``current`` CUDA device is an NCCL
    communicator's ``device`` (it is per host thread: a new thread starts on device 0)."""
    if current != device:
        raise InvalidArgument("device", f"device {current} current in this thread", "the "
                              f"calling thread's current CUDA device must be the communicator's "
                              f"({device}): cupy.cuda.Device({device}).use() in this thread",
                              rank=rank)


def check_native(dtype: np.dtype, argument: str, rank: int | None) -> None:
    """Raise InvalidType for a dtype of the other byte order: its name matches a supported one
    ('>f4' is "float32"), its bytes do not."""
    if not dtype.isnative:
        raise InvalidType(argument, dtype, "an array in the machine's byte order", rank=rank)


def check_dtype(x: Any, argument: str, *, rank: int | None = None, allowed=None) -> np.dtype:
    """Return the dtype of ``x`` or raise :class:`InvalidType` if it is not supported."""
    dtype = np.dtype(x.dtype)
    if allowed is None and dtype in _ALLOWED_DTYPES:
        return dtype  # without ``dtype.name``, which numpy computes in Python
    check_native(dtype, argument, rank)
    names = _ALLOWED_NAMES if allowed is None else {np.dtype(a).name for a in allowed}
    if dtype.name not in names:
        raise InvalidType(argument, dtype, f"an array of one of {sorted(names)}", rank=rank)
    return dtype


def writable(a: Any) -> bool:
    """Whether ``a`` may be written (numpy's flag; a CuPy array has none and always may)."""
    return bool(getattr(getattr(a, "flags", None), "writeable", True))


def to_host(x: Any) -> np.ndarray:
    """Return a numpy copy/view of a numpy or cupy (or emulated device) array."""
    return x.get() if type(x) is not np.ndarray and hasattr(x, "get") else np.asarray(x)


def like_caller(result: Any, original: Any) -> Any:
    """Return ``result`` as the caller's array type (e.g. a torch tensor via DLPack)."""
    if result is None or type(original).__module__.split(".")[0] in ("numpy", "cupy"):
        return result
    module = sys.modules.get(type(original).__module__.split(".")[0])
    from_dlpack = getattr(module, "from_dlpack", None)
    return from_dlpack(result) if from_dlpack is not None else result


def trunc_divide(total: Any, size: int) -> Any:
    """Divide in place by ``size``: floats exactly, integers truncating toward zero like NCCL."""
    if total.dtype.kind == "f":
        with np.errstate(all="ignore"):  # a subnormal's quotient: 0, never a raise on one rank
            total /= size
        return total
    floor = total // size
    floor += ((total % size) != 0) & (total < 0)
    total[...] = floor
    return total


def distinct(xp: Any, parts: Any) -> Any:
    """The ascending distinct values of a 1-D integer array, or of the concatenation of a list
    of them. numpy: one sort and a mask of the changes (numpy 2's ``unique`` hashes first,
    which is several times slower on integer keys); cupy: its own ``unique``."""
    a = xp.concatenate(parts) if isinstance(parts, (list, tuple)) else parts
    if xp is not np:
        return xp.unique(a)
    if a.size < 2:
        return a.copy()
    a = np.sort(a)
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def callers(result: Any, original: Any) -> Any:
    """``result`` in the array library (or DLPack type) of ``original``."""
    if result is None or type(result) is type(original):
        return result
    xp = array_namespace(as_array(original, "values"))
    if array_namespace(result) is not xp:
        result = to_host(result) if xp is np else xp.asarray(result)
    return like_caller(result, original)
