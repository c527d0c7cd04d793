"""NCCL backend setup: loading ``cupy.cuda.nccl``, its dtype and op tables, and the bootstrap.

Bootstrap (:func:`bootstrap`): rank 0 makes the NCCL unique id and broadcasts it over the mpi4py
communicator (128 bytes of metadata, never array data); each rank keeps the device the
application made current (any but 0), else picks node-local rank modulo the visible device count
(node-local rank from an MPI shared-memory split), and joins with ``ncclCommInitRank``, whose
outcome is agreed over MPI (:mod:`._nccl_guard`). Readiness is agreed over MPI first, so a rank
without CuPy, NCCL or a device makes every rank raise :class:`BackendUnavailable` instead of
leaving the others waiting in NCCL.
"""

from __future__ import annotations

import logging
import time
import types
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .._types import ReduceOp, parse_op
from ..errors import BackendUnavailable, InvalidArgument, InvalidType
from ._nccl_config import NonBlockingCommunicator, in_progress, nonblocking_config
from ._nccl_guard import agreed_init, spin

__all__ = ["NCCL_DTYPES", "NCCL_OPS", "nccl_types", "load_nccl", "device_for", "node_local_rank",
           "broadcast_unique_id", "agree", "bootstrap", "new_nccl_comm"]

_log = logging.getLogger("cupycoll")

#: numpy dtype name -> ``cupy.cuda.nccl`` constant (bfloat16 only where that NCCL defines it).
NCCL_DTYPES: dict[str, str] = {
    "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
    "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
    "int64": "NCCL_INT64", "uint64": "NCCL_UINT64", "bfloat16": "NCCL_BFLOAT16",
}
#: ReduceOp -> ``cupy.cuda.nccl`` constant; avg is NCCL's own (integers truncate toward zero).
NCCL_OPS: dict[ReduceOp, str] = {
    ReduceOp.SUM: "NCCL_SUM", ReduceOp.PROD: "NCCL_PROD", ReduceOp.MAX: "NCCL_MAX",
    ReduceOp.MIN: "NCCL_MIN", ReduceOp.AVG: "NCCL_AVG",
}
#: dtype of raw-byte transfers (broadcast, allgather, send/recv move bytes, whatever the dtype).
_BYTES = "NCCL_UINT8"
_NEEDS_DEVICE = "the NCCL backend needs a CUDA device"


def load_nccl() -> tuple[types.ModuleType, types.ModuleType]:
    """Return ``(cupy, cupy.cuda.nccl)``; raise :class:`BackendUnavailable` if either is missing."""
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as exc:
        raise BackendUnavailable(
            f"the NCCL backend needs CuPy with NCCL ({exc}); install it with pip install "
            "'cupycoll[gpu-cu12]' (CUDA 12) or 'cupycoll[gpu-cu13]' (CUDA 13)") from exc
    if not nccl.available:
        raise BackendUnavailable("CuPy cannot load libnccl: install nvidia-nccl-cu12 (or -cu13) "
                                 "matching your cupy-cuda wheel")
    return cupy, nccl


def _dtype_name(dtype: Any) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:  # e.g. "bfloat16" without ml_dtypes
        if isinstance(dtype, str):
            return dtype
        raise


def nccl_types(dtype: Any, op: Any = None, *, nccl: Any = None,
               rank: int | None = None) -> tuple[int, int | None]:
    """Map (dtype, op) to NCCL's (ncclDataType_t, ncclRedOp_t); op None gives (dtype, None).

    Raises:
        InvalidType: a dtype NCCL cannot reduce (int16, bool, complex, ...).
        InvalidArgument: an unknown op. BackendUnavailable: no CuPy/NCCL (when ``nccl`` is None).
    """
    nccl = load_nccl()[1] if nccl is None else nccl
    name = _dtype_name(dtype)
    const = getattr(nccl, NCCL_DTYPES.get(name, ""), None)
    if const is None:
        known = sorted(k for k, v in NCCL_DTYPES.items() if hasattr(nccl, v))
        raise InvalidType("dtype", name, f"one NCCL supports: {known}", rank=rank)
    if op is None:
        return int(const), None
    return int(const), int(getattr(nccl, NCCL_OPS[parse_op(op, rank=rank)]))


def _code_tables(nccl: Any) -> tuple[dict[np.dtype, int], dict[ReduceOp, int]]:
    """NCCL's dtype and op codes keyed by numpy dtype and ReduceOp (a dict hit per call)."""
    dtypes = {}
    for name, const in NCCL_DTYPES.items():
        try:
            dtype = np.dtype(name)
        except TypeError:  # bfloat16 without ml_dtypes: nccl_types handles it by name
            continue
        if hasattr(nccl, const):
            dtypes[dtype] = int(getattr(nccl, const))
    return dtypes, {op: int(getattr(nccl, const)) for op, const in NCCL_OPS.items()}


def device_for(local_rank: int, device_count: int) -> int:
    """Return the CUDA device of a rank: its node-local rank modulo the visible device count."""
    if device_count < 1:
        raise BackendUnavailable(f"{_NEEDS_DEVICE}: none is visible (check CUDA_VISIBLE_DEVICES)")
    if local_rank < 0:
        raise InvalidArgument("local_rank", local_rank, "must be >= 0")
    return local_rank % device_count


def node_local_rank(mpi_comm: MPI.Comm) -> tuple[int, int]:
    """Return (rank, size) of this process among ``mpi_comm``'s ranks on its node (collective)."""
    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=mpi_comm.Get_rank())
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def agree(mpi_comm: MPI.Comm, error: str | None, what: str) -> None:
    """Raise :class:`BackendUnavailable` on every rank if any rank has an ``error`` (collective).

    Lets a failure on one rank (no device, no NCCL) stop all ranks before any of them enters a
    blocking NCCL call the failed one would never join.
    """
    errors = mpi_comm.allgather(error)
    failed = [r for r, e in enumerate(errors) if e]
    if failed:
        rank = mpi_comm.Get_rank()
        shown = rank if error else failed[0]
        raise BackendUnavailable(f"{what} failed on rank(s) {failed} of {len(errors)}; rank "
                                 f"{shown}: {errors[shown]}")


def broadcast_unique_id(mpi_comm: MPI.Comm, make_id: Callable[[], Any] | None = None,
                        root: int = 0) -> Any:
    """Make the NCCL unique id on ``root`` and return it on every rank (collective).

    The id is 128 bytes of metadata (bytes since CuPy 14, a tuple before), so mpi4py's pickling
    ``bcast`` carries it. A failure on root is broadcast too and raised on every rank.
    """
    uid = error = None
    if mpi_comm.Get_rank() == root:
        try:
            uid = (make_id or (lambda: load_nccl()[1].get_unique_id()))()
        except Exception as exc:  # any failure must reach the other ranks, not hang them
            error = f"{type(exc).__name__}: {exc}"
    uid, error = mpi_comm.bcast((uid, error), root=root)
    if error is not None:
        raise BackendUnavailable(f"making the NCCL unique id on rank {root} failed: {error}")
    return uid


def _device_count(cupy: types.ModuleType) -> int:
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise BackendUnavailable(f"{_NEEDS_DEVICE}: {exc}") from exc


def bootstrap(mpi_comm: MPI.Comm, make_id: Callable[[], Any] | None = None,
              timeout: float | None = None) -> tuple[Any, bool]:
    """Create this rank's ``NcclCommunicator`` over the ranks of ``mpi_comm`` (collective);
    return it and whether it is non-blocking (see :func:`new_nccl_comm`).

    Device: the one the application already made current (any but 0), else node-local rank %
    device count. Agrees on readiness, broadcasts the unique id from rank 0 and runs
    ``ncclCommInitRank`` under :func:`~._nccl_guard.agreed_init`: if any rank's init fails, every
    rank raises BackendUnavailable; if ``timeout`` passes first, CollectiveTimeout.
    """
    local_rank, local_size = node_local_rank(mpi_comm)
    error, count, device = None, 0, -1
    try:
        cupy, nccl = load_nccl()
        count = _device_count(cupy)
        device = _chosen_device(cupy) or device_for(local_rank, count)
    except BackendUnavailable as exc:
        error = str(exc)
    agree(mpi_comm, error, "starting the NCCL backend")
    if local_size > count:
        _log.warning("cupycoll: %d ranks on this node share %d CUDA devices; NCCL may reject two "
                     "ranks of one communicator on one device", local_size, count)
    uid = broadcast_unique_id(mpi_comm, make_id or nccl.get_unique_id)
    cupy.cuda.Device(device).use()
    return new_nccl_comm(mpi_comm, uid, device, timeout, f"device {device}; node-local rank "
                         f"{local_rank} of {local_size}; {count} devices visible")


def _chosen_device(cupy: types.ModuleType) -> int | None:
    """The device the application made current before init (None for the default device 0)."""
    return int(cupy.cuda.runtime.getDevice()) or None


def new_nccl_comm(mpi_comm: MPI.Comm, uid: Any, device: int, timeout: float | None,
                  describe: str) -> tuple[Any, bool]:
    """``ncclCommInitRank`` on ``device`` for every rank of ``mpi_comm``, agreed (collective);
    return the communicator and whether it is non-blocking.

    Non-blocking (``ncclCommInitRankConfig`` with ``blocking = 0``) wherever this CuPy can make
    the config (:func:`~._nccl_config.nonblocking_config`); its init returns
    ``ncclInProgress`` and is polled until done (aborted if ``timeout`` passes first).
    """
    cupy, nccl = load_nccl()
    status = mpi_comm.Dup()  # the outcomes travel apart from the application's messages
    config = nonblocking_config(nccl)
    size, rank = mpi_comm.Get_size(), mpi_comm.Get_rank()

    def init() -> Any:
        cupy.cuda.Device(device).use()  # the device is per host thread
        if config is None:
            return nccl.NcclCommunicator(size, uid, rank)
        comm = NonBlockingCommunicator(nccl)(size, uid, rank, config)
        _await_init(comm, nccl, timeout)
        return comm

    comm = agreed_init(status, init, timeout, describe)
    status.Free()
    return comm, config is not None


def _await_init(comm: Any, nccl: Any, timeout: float | None) -> None:
    """Poll a non-blocking communicator's init until done; abort it when ``timeout`` passes."""
    deadline = None if timeout is None else time.monotonic() + timeout

    def done() -> bool:
        try:
            comm.check_async_error()
        except (nccl.NcclError, KeyError) as exc:
            if not in_progress(exc):
                comm.abort()
                raise
            if deadline is not None and time.monotonic() > deadline:
                comm.abort()
                raise
            return False
        return True

    spin(done)
