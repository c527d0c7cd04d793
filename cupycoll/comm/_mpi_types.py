"""The MPI backend's tables and buffer helpers: MPI ops and datatypes of each dtype, the
order-free float max/min and fold, the staging-buffer pool, raw-byte and typed buffer specs,
and the stand-in of a dead comm."""

from __future__ import annotations

import contextlib
import functools
import math

from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .._types import UFUNCS, ReduceOp, trunc_divide
from ..errors import BackendError, BackendUnavailable, InvalidArgument, InvalidType
from ..primitives import combine
from ..primitives._numpy_reduce import canonical_nan


_MPI_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.PROD: MPI.PROD,
            ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN}
#: MPI datatype of each dtype MPI reduces natively, keyed by the dtype itself (a dict hit per call;
#: byte-swapped or half-precision dtypes miss and take the general path).
_MPI_TYPES = {np.dtype(name): mpi_type for name, mpi_type in (
    ("float32", MPI.FLOAT), ("float64", MPI.DOUBLE), ("int8", MPI.SIGNED_CHAR),
    ("uint8", MPI.UNSIGNED_CHAR), ("int16", MPI.INT16_T), ("uint16", MPI.UINT16_T),
    ("int32", MPI.INT32_T), ("uint32", MPI.UINT32_T), ("int64", MPI.INT64_T),
    ("uint64", MPI.UINT64_T))}
_WIDENED = {"float16": np.float32, "bfloat16": np.float32}


@functools.lru_cache(maxsize=None)
def _widened(dtype: np.dtype) -> Any:
    """The dtype MPI reduces ``dtype`` in, or None when it reduces it natively (cached:
    ``dtype.name`` is computed in Python on every call)."""
    return _WIDENED.get(dtype.name)
_FLOAT_MINMAX: dict[ReduceOp, MPI.Op] = {}


def _minmax(op: ReduceOp):
    """A commutative float max/min for MPI: NaN propagates, and a +0/-0 tie has one answer.

    MPI's built-in MAX/MIN compare with ``<``, so a NaN survives or not depending on the order
    in which a rank combines the operands, and ranks end up with different results. Here the
    result does not depend on the order (:func:`_fold`'s rule).
    """
    def combine_buffers(inbuf: Any, inoutbuf: Any, datatype: MPI.Datatype) -> None:
        dtype = np.float32 if datatype == MPI.FLOAT else np.float64
        b = np.frombuffer(inoutbuf, dtype)
        _fold(op, np.frombuffer(inbuf, dtype), b, b)
    return combine_buffers


#: elements of a float max/min fold at a time (its temporaries: a few such blocks)
_FOLD_BLOCK = 1 << 18


def _fold(op: ReduceOp, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a op b`` as the MPI backend reduces (``out`` may be ``b``; avg as a sum): float
    max/min by :func:`cupycoll.primitives.combine` (NaN wins, as numpy's NaN; a +0/-0 tie
    gives -0 for min and +0 for max), so the result does not depend on the order ranks'
    operands are combined in (x86 keeps the first operand's NaN)."""
    if out.dtype.kind == "f" and op in (ReduceOp.MAX, ReduceOp.MIN):
        if out.ndim == 1:  # a block at a time: combine's temporaries stay small
            for start in range(0, out.shape[0], _FOLD_BLOCK):
                part = slice(start, start + _FOLD_BLOCK)
                out[part] = combine(a[part], b[part], op)
        else:
            out[...] = combine(a, b, op)
        canonical_nan(out)  # MPI combines in per-rank orders: x86 keeps the first NaN
    else:
        UFUNCS[ReduceOp.SUM if op is ReduceOp.AVG else op](a, b, out=out)


def averaged(values: np.ndarray, size: int) -> None:
    """Divide a summed result by ``size`` (avg), in place, its NaNs numpy's (in the same pass
    on the host: every path of avg gives the same bits; integers truncate)."""
    if values.dtype.kind == "f":
        canonical_nan(values, size)
    else:
        trunc_divide(values, size)


def _mpi_op(op: ReduceOp, dtype: np.dtype) -> MPI.Op:
    """The MPI op of ``op`` on ``dtype``: built-in, except float max/min (see :func:`_minmax`)."""
    if dtype.kind != "f" or op not in (ReduceOp.MAX, ReduceOp.MIN):
        return _MPI_OPS[op]
    if op not in _FLOAT_MINMAX:
        _FLOAT_MINMAX[op] = MPI.Op.Create(_minmax(op), commute=True)
    return _FLOAT_MINMAX[op]


def _fold_blocks(blocks: np.ndarray, received: np.ndarray, recv: np.ndarray, rank: int,
                 op: ReduceOp, in_place: bool) -> None:
    """A pairwise reduce-scatter's fold into ``recv``: the P blocks in rank order, this rank's
    from ``blocks`` (its input), the others' from the rows of ``received`` (no avg division).
    In place, ``recv`` is this rank's block: the folds before it accumulate in received rows,
    so ``recv`` is first written when its own block is folded in."""
    parts = [blocks[r] if r == rank else received[r] for r in range(len(blocks))]
    acc = parts[0]
    with np.errstate(all="ignore"):
        for r in range(1, len(parts)):
            into = received[r] if in_place and r < rank else recv
            _fold(op, acc, parts[r], into)
            acc = into


#: ReduceOp -> dtype -> (MPI datatype, MPI op), filled on first use: the reductions MPI runs on a
#: dtype as it is (avg as a sum); half precision is absent (it is widened first).
_NATIVE: dict[ReduceOp, dict[np.dtype, tuple[MPI.Datatype, MPI.Op]]] = {op: {} for op in ReduceOp}


def _native(op: ReduceOp, dtype: np.dtype) -> tuple[MPI.Datatype, MPI.Op] | None:
    """(MPI datatype, MPI op) of reducing ``dtype`` with ``op`` natively, or None: two dict
    lookups per call once the pair has been seen."""
    spec = _NATIVE[op].get(dtype)
    if spec is None and dtype in _MPI_TYPES:
        spec = _NATIVE[op][dtype] = (_MPI_TYPES[dtype], _mpi_op(op, dtype))
    return spec


_SPARE_KEPT = 2  # staging buffers a communicator keeps for reuse (see _take)
_SPARE_FROM = 1 << 16  # bytes from which staging buffers are reused (below: page faults are few)


def _take(spare: list, shape: tuple, dtype: Any) -> np.ndarray:
    """A staging array: a view of a finished call's buffer in ``spare`` (a communicator's pool),
    the smallest large enough (its pages are mapped, where a fresh one costs a page fault per
    4 KiB on first touch), else of a new one. Out of the pool while in use,
    so an unfinished asynchronous call never shares it."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _SPARE_FROM:
        return np.empty(shape, dtype)
    for i in range(len(spare) - 1, -1, -1):  # the smallest that fits (spare: largest first)
        if spare[i].nbytes >= nbytes:
            buf = spare.pop(i)
            break
    else:
        buf = np.empty(nbytes, np.uint8)
    return buf[:nbytes].view(dtype).reshape(shape)


def _give(spare: list, array: np.ndarray) -> None:
    """Give the buffer under a finished call's staging array back to ``spare``, as bytes (the
    pool keeps the largest ``_SPARE_KEPT``)."""
    if array.nbytes < _SPARE_FROM:
        return
    while array.base is not None:
        array = array.base
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        return
    spare.append(array.reshape(-1).view(np.uint8))
    spare.sort(key=lambda b: -b.nbytes)
    del spare[_SPARE_KEPT:]


def _bytes(a: np.ndarray) -> list:
    """Buffer spec that moves ``a`` as raw bytes (any dtype, no pickling)."""
    return [a, MPI.BYTE]


def _address(a: np.ndarray) -> int:
    """Address of ``a``'s first element: through the buffer protocol when ``a`` is contiguous,
    else numpy's ``__array_interface__`` (slower: it builds a dict every time; docs/dense.md)."""
    try:
        return MPI.buffer.frombuffer(a, readonly=True).address
    except BufferError:
        return a.__array_interface__["data"][0]


def _typed(a: np.ndarray) -> list:
    """Buffer spec that moves ``a`` as its own MPI datatype (for reductions)."""
    return [a, _MPI_TYPES[a.dtype]]


def _separate(send: np.ndarray, recv: np.ndarray) -> bool:
    """True when two host buffers surely do not overlap: two arrays that own their memory
    (``base`` None: numpy allocated it for them), else a bounds check (no solving)."""
    return send is not recv and ((send.base is None and recv.base is None)
                                 or not np.may_share_memory(send, recv))


def _pending(requests: list, peers: Sequence[int] | None) -> list[int]:
    """The peers of the point-to-point requests still pending (none for a collective)."""
    if peers is None:
        return []
    return sorted({peer for request, peer in zip(requests, peers) if not request.Test()})


class _ClosedComm:
    """Stands in for the MPI communicator of a closed Communicator: any use (a verb, dup())
    raises BackendUnavailable."""

    def __init__(self, rank: int) -> None:
        self._rank = rank

    def __getattr__(self, name: str) -> Any:
        raise BackendUnavailable(f"rank {self._rank}: this communicator is closed (close() was "
                                 "called); make a new one with cupycoll.init()")


class _DeadComm:
    """Stands in for the MPI communicator of an aborted Communicator: any use raises why."""

    def __init__(self, fate: Any) -> None:
        self._fate = fate

    def __getattr__(self, name: str) -> Any:
        raise self._fate.dead_error()


def mpi_failure(comm: Any, op_name: str, reasons: set[str]) -> BackendError:
    """The error of MPI failing ``op_name`` on ``comm`` (a communicator) for ``reasons``."""
    return BackendError(
        f"MPI failed {op_name} on rank {comm.rank} of {comm.size} "
        f"({'; '.join(sorted(reasons))}); a common cause is ranks that disagree on a "
        "call's counts or dtype (CUPYCOLL_DEBUG=1 checks a dense collective's first)")


def out_of_communicators(exc: MPI.Exception, rank: int) -> BackendUnavailable:
    """The error of MPI refusing a new communicator (e.g. "Too many communicators")."""
    return BackendUnavailable(
        f"MPI could not make a communicator on rank {rank} "
        f"({str(exc).strip().splitlines()[-1].strip()}): each init() and dup() holds an MPI "
        "communicator and an arrival-board window until MPI finalizes (close() frees the "
        "communicator only); make communicators once and reuse them")


def usable(mpi_comm: Any) -> MPI.Intracomm:
    """``mpi_comm`` if it is an intracommunicator (the collectives' kind), else the library's
    error naming it (an intercommunicator, COMM_NULL, anything else)."""
    if isinstance(mpi_comm, (_ClosedComm, _DeadComm)):  # a dup of a closed or aborted
        return mpi_comm  # communicator: its Dup raises why
    rank = MPI.COMM_WORLD.Get_rank()  # the rank named: this process's in the world
    if not isinstance(mpi_comm, MPI.Intracomm):
        raise InvalidType("mpi_comm", type(mpi_comm).__name__, "an mpi4py intracommunicator "
                          "(MPI.COMM_WORLD, a Split or Dup of it)", rank=rank)
    if mpi_comm == MPI.COMM_NULL:
        raise InvalidArgument("mpi_comm", "MPI.COMM_NULL", "a communicator this process is in",
                              rank=rank)
    return mpi_comm


def duplicate(base: Any, wait: Any = None) -> MPI.Intracomm:
    """``base.Dup()``; with ``wait`` (a communicator's timed wait: :meth:`dup`) its nonblocking
    twin waited for under the timeout, so a rank whose peers never come times out, never
    hangs in MPI_Comm_dup."""
    if wait is None:
        return base.Dup()
    twin, request = base.Idup()
    wait(request, "a new communicator's duplicate")
    return twin


def copied_into(recv: Any, host: np.ndarray, xp: Any) -> None:
    """``recv[...] = host`` for a device array ``recv``, its device current: a Work's finalizer
    runs on whichever thread completes it (a future's on cupycoll's own), whose current device
    may be another."""
    device = getattr(recv, "device", None)
    with device if hasattr(device, "__enter__") else contextlib.nullcontext():
        recv[...] = xp.asarray(host)
