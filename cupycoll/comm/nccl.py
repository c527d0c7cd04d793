"""NCCL backend: ``cupy.cuda.nccl`` over cupy arrays, bootstrapped by mpi4py.

The bootstrap and the dtype/op tables live in :mod:`._nccl_setup` (re-exported here: they are
this module's public names), the CUDA plumbing in :mod:`._cuda`, the verbs in
:mod:`._nccl_verbs`, the timeout watchdog in :mod:`._nccl_guard`.

Streams and events (the discipline of ``torch``'s ProcessGroupNCCL): each communicator owns a
non-blocking stream on its device. An operation first makes that stream wait for an event
recorded on the caller's current stream, runs NCCL (and, inside :meth:`in_stream`, cupycoll's
kernels) there, and records a completion event behind it. ``Work.wait()`` makes the caller's
current stream wait for that event, without blocking the host; ``Work.synchronize()``,
:meth:`fetch` and :meth:`synchronize` block the host, polling the event and NCCL's
asynchronous error without sleeping. Every array an operation reads or writes stays
referenced until its completion event is observed complete (CuPy has no ``recordStream``).

Communicators are created non-blocking where CuPy allows it (:mod:`._nccl_config`): a call
then never blocks the host inside NCCL (a connection to a peer returns ``ncclInProgress`` and
is polled under ``CUPYCOLL_CONNECT_TIMEOUT``), and every NCCL call and ``ncclCommAbort`` on a
communicator is serialised by its lock, so an abort (a timeout in the watchdog thread, an error,
``close()`` on an error path, garbage collection) never runs concurrently with a call. A timeout
or an NCCL error aborts the communicator and kills its fate: every later call raises the error.

Point-to-point (``exchange``, ``alltoallv``) is one ``groupStart/groupEnd`` of ``send``/``recv``
on raw bytes. NCCL has no allgatherv: it is one group of broadcasts, one per rank with rows (each
block is pipelined from its owner through NCCL's ring, so a large block costs its owner one send,
not P-1). Traffic is booked exactly as the MPI backend books it (see :class:`~._stats.Stats`).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any, Iterator, Sequence

import numpy as np
from mpi4py import MPI

from .._config import setting
from .._types import ReduceOp
from ..errors import BackendError, BackendUnavailable, CollectiveTimeout, InvalidArgument
from ._base import Communicator
from ._checks import agreed_settings, before_barrier
from ._cuda import CudaDevice, _SideStreamOverlap
from ._nccl_guard import WATCHDOG
from ._nccl_readers import Readers
from ._nccl_setup import (_BYTES, NCCL_DTYPES, NCCL_OPS, _code_tables, agree, bootstrap,
                          broadcast_unique_id, device_for, load_nccl, nccl_types, new_nccl_comm,
                          node_local_rank)
from ._nccl_inflight import Inflight
from ._nccl_stream import _Handle, _StreamOrder
from ._nccl_verbs import _NcclVerbs
from ._work import Overlap

__all__ = ["NCCLCommunicator", "NCCL_DTYPES", "NCCL_OPS", "nccl_types", "load_nccl",
           "device_for", "node_local_rank", "broadcast_unique_id", "agree", "bootstrap",
           "CudaDevice"]

_log = logging.getLogger("cupycoll")


class NCCLCommunicator(_StreamOrder, _NcclVerbs, Communicator):
    """Communicator over an NCCL communicator of cupy arrays (one CUDA device per rank).

    Example::

        comm = NCCLCommunicator()           # under mpiexec; device = node-local rank % #devices
        x = cupy.full(4, comm.rank + 1.0, cupy.float32)
        comm.allreduce(x, x, ReduceOp.SUM).synchronize()  # rank 0 and 1 (P=2): [3., 3., 3., 3.]
    """

    backend = "nccl"
    #: NCCL's float max/min (fmaxf/fminf) return the non-NaN operand.
    native_minmax_drops_nan = True
    #: NCCL does not document -0 + -0 = -0 for every transport (NVLS reduces in the switch).
    native_sum_keeps_minus_zero = False

    def __init__(self, mpi_comm: MPI.Comm | None = None, *, timeout: float | None = None) -> None:
        super().__init__(timeout)
        self.mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        connect = _connect_timeout(self.mpi_comm)
        nccl_comm, nonblocking = bootstrap(self.mpi_comm, timeout=self.timeout)  # all raise or none
        cupy, nccl = load_nccl()
        self._attach(nccl_comm, nccl, CudaDevice(cupy), cupy, nonblocking, connect)
        self._watch(self.mpi_comm)  # the arrival board: a timeout names the late ranks

    @classmethod
    def wrap(cls, nccl_comm: Any, *, timeout: float | None = None, nccl: Any = None,
             device: Any = None, xp: Any = None, nonblocking: bool = False) -> "NCCLCommunicator":
        """Use an existing ``cupy.cuda.nccl.NcclCommunicator`` (rank and size come from it).

        ``nccl``, ``device`` and ``xp`` default to ``cupy.cuda.nccl``, :class:`CudaDevice` and
        cupy; the tests pass host stand-ins to exercise the logic without a GPU.
        ``nonblocking``: the communicator was created with ``ncclConfig_t.blocking = 0``.
        """
        self = cls.__new__(cls)
        Communicator.__init__(self, timeout)
        self.mpi_comm = None
        if nccl is None or device is None or xp is None:
            cupy, cupy_nccl = load_nccl()
            nccl = cupy_nccl if nccl is None else nccl
            device = CudaDevice(cupy) if device is None else device
            xp = cupy if xp is None else xp
        self._attach(nccl_comm, nccl, device, xp, nonblocking, _connect_timeout(None))
        return self

    def dup(self) -> "NCCLCommunicator":
        """Return a communicator over the same ranks with its own NCCL channels (collective).

        Non-blocking communicators get a new ``ncclCommInitRankConfig`` bootstrapped over
        ``mpi_comm`` (CuPy's ``commSplit`` loses a split that returns ``ncclInProgress``);
        others ``ncclCommSplit`` (NCCL >= 2.18, CuPy >= 14) with one color, keeping the rank
        order, or a new ``ncclCommInitRank`` over ``mpi_comm`` where CuPy (13) has no split.

        Raises:
            BackendError: NCCL failed (the NcclError is the cause).
            BackendUnavailable: no way to make a twin (see above) on this communicator.
        """
        comm = self._live("dup")
        connect = _connect_timeout(self.mpi_comm)
        split = None if self._handle.nonblocking else getattr(comm, "commSplit", None)
        if split is None and self.mpi_comm is None:
            raise BackendUnavailable(f"dup on rank {self.rank}: this communicator cannot be "
                                     "split (CuPy < 14, or non-blocking) and was wrapped without "
                                     "an MPI communicator to bootstrap a new one")
        nonblocking = False
        try:
            if split is not None:
                with self._handle.lock:
                    twin_comm = split(0, self.rank)
            else:
                uid = broadcast_unique_id(self.mpi_comm, self._nccl.get_unique_id)
                twin_comm, nonblocking = new_nccl_comm(
                    self.mpi_comm, uid, self.device_id, self.timeout,
                    f"dup of the communicator on {self.device_id}")
        except self._errors as exc:
            raise self._failed("dup", exc) from exc
        twin = self.wrap(twin_comm, timeout=self.timeout, nccl=self._nccl, device=self._device,
                         xp=self.xp, nonblocking=nonblocking)
        twin.connect_timeout = connect
        twin.mpi_comm = self.mpi_comm
        if self.mpi_comm is not None:  # a board of its own (collective); one fate with this
            twin._watch(self.mpi_comm)
        twin._share_fate(self)
        return twin

    def _attach(self, nccl_comm: Any, nccl: Any, device: Any, xp: Any,
                nonblocking: bool, connect_timeout: float | None) -> None:
        self._handle = _Handle(nccl_comm, nonblocking)
        self._nccl, self._device, self.xp = nccl, device, xp
        self.rank, self.size = int(nccl_comm.rank_id()), int(nccl_comm.size())
        self.device_id = int(nccl_comm.device_id())
        self._errors = (nccl.NcclError,) + tuple(device.errors)
        self._device.activate(self.device_id)
        self._stream = device.new_stream()  # the communicator's own stream on its device
        self._readers = Readers(device, self._stream)  # streams it handed results to
        self._side: Any = None  # the side stream of overlap(), made on first use
        self._inflight = Inflight()
        self._posted = 0  # operations posted so far (numbers the in-flight entries)
        self._bytes = int(getattr(nccl, _BYTES))
        self._dtype_codes, self._op_codes = _code_tables(nccl)
        self.connect_timeout = connect_timeout
        weakref.finalize(self, self._handle.release, self._inflight)  # no blocking destroy
        WATCHDOG.watch(self)

    @property
    def _comm(self) -> Any:
        return self._handle.comm

    # enqueueing and the one blocking wait
    def _live(self, op_name: str) -> Any:
        comm = self._handle.comm
        if comm is None:
            self._check_alive()
            raise BackendUnavailable(f"{op_name} on rank {self.rank}: the NCCL communicator is "
                                     "closed or was aborted")
        return comm

    def _timed_out(self, op_name: str, sequence: int | None = None,
                   pending: Sequence[int] = (), connecting: bool = False) -> CollectiveTimeout:
        """Abort the NCCL communicator (its kernels stop), then name the late ranks like every
        backend (arrival board); ``connecting``: a call still connecting to its peers after
        ``connect_timeout``, on the collective it was posting."""
        self._handle.abort()
        if not connecting:
            return super()._timed_out(op_name, sequence, pending)
        error = super()._timed_out(op_name, self._slot[0] if sequence is None else sequence,
                                   pending, self.connect_timeout)
        error.args = (f"{error.args[0]} (still connecting to peers: CUPYCOLL_CONNECT_TIMEOUT)",)
        return error

    def _failed(self, op_name: str, exc: BaseException) -> BackendError:
        """Abort after an NCCL or CUDA error and describe it (the error becomes the cause):
        the communicator and its duplicates die of it (every later call raises it)."""
        self._handle.abort()
        error = BackendError(f"NCCL failed {op_name} on rank {self.rank} of {self.size} "
                             f"({type(exc).__name__}: {exc}); the communicator was aborted")
        self._die(error, f"{op_name} (collective #{self.sequence}, an NCCL error)")
        return error

    def _disable(self) -> None:
        """Dead (a timeout, an error, an abort, an interrupt): abort the NCCL communicator and
        keep what the unfinished operations touch for good (the stream runs on after it)."""
        super()._disable()
        self._handle.abort()
        running = self._inflight.running()
        if running:
            self._fate.abandon(running)

    @contextlib.contextmanager
    def _group(self) -> Iterator[None]:
        self._nccl.groupStart()
        try:
            yield
        finally:
            self._nccl.groupEnd()

    def overlap(self) -> Overlap:
        """Consumers run on a side stream after their transfers' events (see :class:`Overlap`)."""
        if self._side is None:
            self._side = self._device.side_stream()
        return _SideStreamOverlap(self, self._side)

    def _ptr(self, a: Any) -> int:
        return self._device.pointer(a)

    def _contiguous(self, a: Any) -> Any:
        return a if a.flags.c_contiguous else self._on_stream(
            lambda: self.xp.ascontiguousarray(a))

    def _on_stream(self, make: Any) -> Any:
        """``make()`` (device work an operation reads: a copy of the caller's input, a token)
        on the communicator's stream, after what the caller's current stream has queued: never
        on the caller's stream (by default the legacy NULL stream, which serialises with every
        blocking stream of the device)."""
        with self.in_stream(join=False):
            return make()

    def _buffer(self, a: Any, argument: str) -> Any:
        if not a.flags.c_contiguous:
            raise InvalidArgument(argument, "non-contiguous array", "must be C-contiguous",
                                  rank=self.rank)
        return a

    def barrier(self) -> None:
        """Allreduce one int32 on the device and wait for it (not booked in ``stats``; a
        collective on the arrival board: a timeout names the ranks that never came)."""
        before_barrier(self)
        token = self._on_stream(lambda: self.xp.zeros(1, dtype=np.int32))
        dtype, red = nccl_types(token.dtype, ReduceOp.SUM, nccl=self._nccl, rank=self.rank)
        event = self._post("barrier", lambda c, s: c.allReduce(
            self._ptr(token), self._ptr(token), 1, dtype, red, s), token, arrival=True)
        self._arrived()
        self.wait([event], "barrier")

    def close(self) -> None:
        """Wait for the operations in flight, then destroy the NCCL communicator (idempotent).

        A communicator that died (timeout, error) or whose operations do not complete within
        the timeout is aborted instead: ``ncclCommDestroy`` blocks forever while a kernel
        waits for a peer that never comes.
        """
        self._release_all()
        self._closed()
        if self._handle.comm is None:
            return
        try:
            self._check_alive()
            self.synchronize()
        except Exception:  # noqa: BLE001  the communicator is unusable: abort it
            self.abort()
            return
        handle = self._handle
        with handle.lock:
            comm, handle.comm = handle.comm, None
            if comm is not None:
                comm.destroy()

    def __exit__(self, *exc: object) -> None:
        """``close()``, or an abort when the block raised (its operations may never complete)."""
        if exc and exc[0] is not None:
            self.abort()
        else:
            self.close()

    def abort(self) -> None:
        """Abort the NCCL communicator: its kernels stop, later calls raise.

        Unlike the MPI backend this ends only this communicator, not the MPI job.
        """
        if self._handle.comm is not None:
            _log.warning("cupycoll: rank %d aborts its NCCL communicator", self.rank)
        self._handle.abort()
        if self._fate.error is None:
            super().abort()


def _connect_timeout(group: MPI.Comm | None) -> float | None:
    """``CUPYCOLL_CONNECT_TIMEOUT``, agreed over ``group`` where there is one (a bad value on
    one rank raises on every rank before any NCCL communicator is made), else this rank's."""
    if group is None:
        return setting("CUPYCOLL_CONNECT_TIMEOUT")
    return agreed_settings(group, lambda: setting("CUPYCOLL_CONNECT_TIMEOUT"))
