"""NCCL backend: ``cupy.cuda.nccl`` over cupy arrays, bootstrapped by mpi4py.

The bootstrap and the dtype/op tables live in :mod:`._nccl_setup` (re-exported here: they are
this module's public names), the CUDA plumbing in :mod:`._cuda`, the verbs in
:mod:`._nccl_verbs`.

Every verb enqueues on the current CuPy stream (NCCL semantics: the call returns at once, later
work on that stream sees the result) and records a CUDA event behind it; ``Work.wait()`` goes
through :meth:`NCCLCommunicator.wait`, which polls the events and NCCL's asynchronous error,
with or without a timeout. A call blocked in NCCL's lazy connection to a missing peer is aborted
by a watchdog when the timeout passes. A timeout or an NCCL error aborts the NCCL communicator
(``ncclCommAbort``) before raising, so no kernel is left spinning on a peer that never comes.

Point-to-point (``exchange``, ``alltoallv``) is one ``groupStart/groupEnd`` of ``send``/``recv``
on raw bytes. NCCL has no allgatherv: it is one group of broadcasts, one per rank with rows (each
block is pipelined from its owner through NCCL's ring, so a large block costs its owner one send,
not P-1). Traffic is booked exactly as the MPI backend books it (see :class:`~._stats.Stats`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from mpi4py import MPI

from .._types import ReduceOp
from ..errors import BackendError, BackendUnavailable, CollectiveTimeout, InvalidArgument
from ._base import Communicator
from ._cuda import CudaDevice, _SideStreamOverlap
from ._nccl_guard import Watchdog
from ._nccl_setup import (_BYTES, NCCL_DTYPES, NCCL_OPS, _code_tables, agree, bootstrap,
                          broadcast_unique_id, device_for, load_nccl, nccl_types, new_nccl_comm,
                          node_local_rank)
from ._nccl_verbs import _NcclVerbs
from ._work import Overlap, Work

__all__ = ["NCCLCommunicator", "NCCL_DTYPES", "NCCL_OPS", "nccl_types", "load_nccl",
           "device_for", "node_local_rank", "broadcast_unique_id", "agree", "bootstrap",
           "CudaDevice"]

_log = logging.getLogger("cupycoll")


class NCCLCommunicator(_NcclVerbs, Communicator):
    """Communicator over an NCCL communicator of cupy arrays (one CUDA device per rank).

    Example::

        comm = NCCLCommunicator()           # under mpiexec; device = node-local rank % #devices
        x = cupy.full(4, comm.rank + 1.0, cupy.float32)
        comm.allreduce(x, x, ReduceOp.SUM).wait()   # rank 0 and rank 1 (P=2): [3., 3., 3., 3.]
    """

    backend = "nccl"

    def __init__(self, mpi_comm: MPI.Comm | None = None, *, timeout: float | None = None) -> None:
        super().__init__(timeout)
        self.mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        nccl_comm = bootstrap(self.mpi_comm, timeout=timeout)  # every rank raises or none does
        cupy, nccl = load_nccl()
        self._attach(nccl_comm, nccl, CudaDevice(cupy), cupy)

    @classmethod
    def wrap(cls, nccl_comm: Any, *, timeout: float | None = None, nccl: Any = None,
             device: Any = None, xp: Any = None) -> "NCCLCommunicator":
        """Use an existing ``cupy.cuda.nccl.NcclCommunicator`` (rank and size come from it).

        ``nccl``, ``device`` and ``xp`` default to ``cupy.cuda.nccl``, :class:`CudaDevice` and
        cupy; the tests pass host stand-ins to exercise the logic without a GPU.
        """
        self = cls.__new__(cls)
        Communicator.__init__(self, timeout)
        self.mpi_comm = None
        if nccl is None or device is None or xp is None:
            cupy, cupy_nccl = load_nccl()
            nccl = cupy_nccl if nccl is None else nccl
            device = CudaDevice(cupy) if device is None else device
            xp = cupy if xp is None else xp
        self._attach(nccl_comm, nccl, device, xp)
        return self

    def dup(self) -> "NCCLCommunicator":
        """Return a communicator over the same ranks with its own NCCL channels (collective).

        Uses ``ncclCommSplit`` (NCCL >= 2.18, CuPy >= 14) with one color, keeping the rank order;
        with an older CuPy, a new ``ncclCommInitRank`` bootstrapped over ``mpi_comm``.

        Raises:
            BackendError: NCCL failed (the NcclError is the cause).
            BackendUnavailable: no ``commSplit`` and no MPI communicator to bootstrap over.
        """
        comm = self._live("dup")
        split = getattr(comm, "commSplit", None)
        if split is None and self.mpi_comm is None:
            raise BackendUnavailable(f"dup on rank {self.rank}: this CuPy's NCCL binding has no "
                                     "commSplit (CuPy < 14) and the communicator was wrapped "
                                     "without an MPI communicator to bootstrap a new one")
        try:
            with self._watchdog.armed(self.timeout):
                if split is not None:
                    twin_comm = split(0, self.rank)
                else:
                    uid = broadcast_unique_id(self.mpi_comm, self._nccl.get_unique_id)
                    twin_comm = new_nccl_comm(self.mpi_comm, uid, self.device_id, self.timeout,
                                              f"dup of the communicator on {self.device_id}")
        except self._errors as exc:
            raise self._failed("dup", exc) from exc
        twin = self.wrap(twin_comm, timeout=self.timeout, nccl=self._nccl, device=self._device,
                         xp=self.xp)
        twin.mpi_comm = self.mpi_comm
        return twin

    def _attach(self, nccl_comm: Any, nccl: Any, device: Any, xp: Any) -> None:
        self._comm, self._nccl, self._device, self.xp = nccl_comm, nccl, device, xp
        self.rank, self.size = int(nccl_comm.rank_id()), int(nccl_comm.size())
        self.device_id = int(nccl_comm.device_id())
        self._errors = (nccl.NcclError,) + tuple(device.errors)
        self._side: Any = None  # the side stream of overlap(), made on first use
        self._bytes = int(getattr(nccl, _BYTES))
        self._dtype_codes, self._op_codes = _code_tables(nccl)
        self._posters = {"allreduce": self._allreduce, "broadcast": self._broadcast,
                         "reduce": self._reduce, "allgather": self._allgather,
                         "reduce_scatter": self._reduce_scatter}
        self._watchdog = Watchdog(self.abort)

    # enqueueing and the one blocking wait
    def _live(self, op_name: str) -> Any:
        if self._comm is None:
            raise BackendUnavailable(f"{op_name} on rank {self.rank}: the NCCL communicator is "
                                     "closed or was aborted")
        return self._comm

    def _post(self, op_name: str, launch: Callable[[Any, int], Any], active: bool = True) -> Any:
        """Run ``launch(nccl_comm, stream)`` and return an event recorded behind its work.

        ``active=False`` (zero elements, the same on every rank) skips the NCCL call.
        """
        comm = self._live(op_name)
        try:
            if active:  # the watchdog aborts a call blocked connecting to a missing peer
                with self._watchdog.armed(self.timeout):
                    launch(comm, self._device.stream())
        except self._errors as exc:
            if self._watchdog.fired:
                raise self._timed_out(op_name) from exc
            raise self._failed(op_name, exc) from exc
        if self._watchdog.fired:  # it fired just as the call returned: the comm is aborted
            raise self._timed_out(op_name)
        return self._device.record()

    def _timed_out(self, op_name: str, sequence: int | None = None,
                   pending: Sequence[int] = ()) -> CollectiveTimeout:
        """Abort the NCCL communicator (so a call blocked inside NCCL returns), then name the
        late ranks like every backend (arrival board)."""
        self.abort()
        return super()._timed_out(op_name, sequence, pending)

    def stream_work(self, op_name: str) -> Work:
        """A Work that completes when what is queued on the current stream so far has run."""
        return self._work(self._device.record(), None, op_name)

    def _failed(self, op_name: str, exc: BaseException) -> BackendError:
        """Abort after an NCCL or CUDA error and describe it (the error becomes the cause)."""
        self.abort()
        return BackendError(f"NCCL failed {op_name} on rank {self.rank} of {self.size} "
                            f"({type(exc).__name__}: {exc}); the communicator was aborted")

    @contextlib.contextmanager
    def _group(self) -> Iterator[None]:
        self._nccl.groupStart()
        try:
            yield
        finally:
            self._nccl.groupEnd()

    def _work(self, event: Any, keep: Any, op_name: str) -> Work:
        """Work over ``event``; ``keep`` (temporaries the transfers use) lives until the wait."""
        def wait() -> None:
            nonlocal keep
            self.wait([event], op_name)
            keep = None
        work = Work(wait, lambda: event.done)
        work.events = [event]  # type: ignore[attr-defined]  # for stream-side waits (overlap)
        return work

    def wait(self, handles: Sequence[Any], op_name: str) -> None:
        """Block until every event in ``handles`` is done, under ``self.timeout``.

        Raises:
            CollectiveTimeout: not done in time (the NCCL communicator is aborted first).
            BackendError: an asynchronous NCCL or CUDA failure (after aborting; the NcclError
                or CUDA error is its ``__cause__``).
        """
        events = list(handles)
        if not events:
            return
        try:  # polled even without a timeout: a failed peer leaves NCCL's kernels spinning
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            pause = 1e-5
            while not all(e.done for e in events):
                self._check_async()
                if deadline is not None and time.monotonic() > deadline:
                    raise self._timed_out(op_name)  # aborts; names the late ranks
                time.sleep(pause)
                pause = min(2 * pause, 1e-3)
            self._check_async()
        except self._errors as exc:
            raise self._failed(op_name, exc) from exc

    def fetch(self, work: Work, array: Any) -> np.ndarray:
        """ONE host synchronisation: the copy is queued behind ``work`` on the current stream
        and only the copy's event is waited for (under the timeout).

        A wait that fails (timeout, NCCL error, interrupt) leaves the copy queued: after the
        abort the stream runs on and the copy writes the pinned buffer, so the buffer is kept
        for good with the communicator's fate (freed, CuPy's pinned pool would hand it to the
        next allocation, e.g. the next call's fetch, and the late copy would overwrite that).
        """
        host, event = self._device.download(array)
        try:
            self.wait([event], "fetch")
        except BaseException:
            self._fate.abandon(host, event)
            raise
        return host

    def stream_order(self, work: Work) -> None:
        """No host wait: ``work`` is on the current stream, which orders everything after it."""

    def overlap(self) -> Overlap:
        """Consumers run on a side stream after their transfers' events (see :class:`Overlap`)."""
        if self._side is None:
            self._side = self._device.side_stream()
        return _SideStreamOverlap(self, self._side)

    def _check_async(self) -> None:
        if self._comm is not None:
            self._comm.check_async_error()

    def _ptr(self, a: Any) -> int:
        return self._device.pointer(a)

    def _contiguous(self, a: Any) -> Any:
        return a if a.flags.c_contiguous else self.xp.ascontiguousarray(a)

    def _buffer(self, a: Any, argument: str) -> Any:
        if not a.flags.c_contiguous:
            raise InvalidArgument(argument, "non-contiguous array", "must be C-contiguous",
                                  rank=self.rank)
        return a

    def barrier(self) -> None:
        """Allreduce one int32 on the device and wait for it (not booked in ``stats``)."""
        token = self.xp.zeros(1, dtype=np.int32)
        dtype, red = nccl_types(token.dtype, ReduceOp.SUM, nccl=self._nccl, rank=self.rank)
        self.wait([self._post("barrier", lambda c, s: c.allReduce(
            self._ptr(token), self._ptr(token), 1, dtype, red, s))], "barrier")

    def close(self) -> None:
        """Destroy the NCCL communicator (idempotent; pending operations are flushed first)."""
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.destroy()

    def abort(self) -> None:
        """Abort the NCCL communicator: its kernels stop, later calls raise BackendUnavailable.

        Unlike the MPI backend this ends only this communicator, not the MPI job.
        """
        comm, self._comm = self._comm, None
        if comm is not None:
            _log.warning("cupycoll: rank %d aborts its NCCL communicator", self.rank)
            comm.abort()
