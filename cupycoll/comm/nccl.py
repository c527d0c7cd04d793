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

import collections
import contextlib
import logging
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from mpi4py import MPI

from .._config import setting
from .._types import ReduceOp
from ..errors import BackendError, BackendUnavailable, CollectiveTimeout, InvalidArgument
from ._base import Communicator
from ._cuda import CudaDevice, _SideStreamOverlap
from ._nccl_config import in_progress
from ._nccl_guard import WATCHDOG, spin
from ._nccl_setup import (_BYTES, NCCL_DTYPES, NCCL_OPS, _code_tables, agree, bootstrap,
                          broadcast_unique_id, device_for, load_nccl, nccl_types, new_nccl_comm,
                          node_local_rank)
from ._nccl_verbs import _NcclVerbs
from ._work import Overlap, Work

__all__ = ["NCCLCommunicator", "NCCL_DTYPES", "NCCL_OPS", "nccl_types", "load_nccl",
           "device_for", "node_local_rank", "broadcast_unique_id", "agree", "bootstrap",
           "CudaDevice"]

_log = logging.getLogger("cupycoll")
#: operations in flight beyond which a post queries the oldest ones' events to release them.
_INFLIGHT_QUERIED = 64
#: seconds between two polls of NCCL's asynchronous error in a host wait.
_ASYNC_POLL_S = 1e-3


class _Inflight:
    """An operation posted on the communicator's stream and not yet observed complete."""

    __slots__ = ("event", "keep", "deadline", "op_name", "sequence", "number")

    def __init__(self, event: Any, keep: Any, deadline: float | None, op_name: str,
                 sequence: int, number: int) -> None:
        self.event, self.keep, self.deadline = event, keep, deadline
        self.op_name, self.sequence, self.number = op_name, sequence, number


class _Handle:
    """The CuPy communicator and its lock, apart from the NCCLCommunicator so that garbage
    collection can abort it (``ncclCommDestroy``, which CuPy's destructor calls, blocks forever
    while a kernel waits for a peer)."""

    __slots__ = ("comm", "lock", "nonblocking", "__weakref__")

    def __init__(self, comm: Any, nonblocking: bool) -> None:
        self.comm, self.nonblocking = comm, nonblocking
        self.lock = threading.RLock()

    def abort(self) -> None:
        with self.lock:
            comm, self.comm = self.comm, None
            if comm is not None:
                comm.abort()


class NCCLCommunicator(_NcclVerbs, Communicator):
    """Communicator over an NCCL communicator of cupy arrays (one CUDA device per rank).

    Example::

        comm = NCCLCommunicator()           # under mpiexec; device = node-local rank % #devices
        x = cupy.full(4, comm.rank + 1.0, cupy.float32)
        comm.allreduce(x, x, ReduceOp.SUM).synchronize()  # rank 0 and 1 (P=2): [3., 3., 3., 3.]
    """

    backend = "nccl"
    #: NCCL's float max/min (fmaxf/fminf) return the non-NaN operand.
    native_minmax_drops_nan = True

    def __init__(self, mpi_comm: MPI.Comm | None = None, *, timeout: float | None = None) -> None:
        super().__init__(timeout)
        self.mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        nccl_comm, nonblocking = bootstrap(self.mpi_comm, timeout=timeout)  # all raise or none
        cupy, nccl = load_nccl()
        self._attach(nccl_comm, nccl, CudaDevice(cupy), cupy, nonblocking)

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
        self._attach(nccl_comm, nccl, device, xp, nonblocking)
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
        twin.mpi_comm = self.mpi_comm
        return twin

    def _attach(self, nccl_comm: Any, nccl: Any, device: Any, xp: Any,
                nonblocking: bool) -> None:
        self._handle = _Handle(nccl_comm, nonblocking)
        self._nccl, self._device, self.xp = nccl, device, xp
        self.rank, self.size = int(nccl_comm.rank_id()), int(nccl_comm.size())
        self.device_id = int(nccl_comm.device_id())
        self._errors = (nccl.NcclError,) + tuple(device.errors)
        self._device.activate(self.device_id)
        self._stream = device.new_stream()  # the communicator's own stream on its device
        self._side: Any = None  # the side stream of overlap(), made on first use
        self._inflight: collections.deque[_Inflight] = collections.deque()
        self._posted = 0  # operations posted so far (numbers the in-flight entries)
        self._bytes = int(getattr(nccl, _BYTES))
        self._dtype_codes, self._op_codes = _code_tables(nccl)
        self._posters = {"allreduce": self._allreduce, "broadcast": self._broadcast,
                         "reduce": self._reduce, "allgather": self._allgather,
                         "reduce_scatter": self._reduce_scatter}
        self.connect_timeout = setting("CUPYCOLL_CONNECT_TIMEOUT")
        weakref.finalize(self, _Handle.abort, self._handle)  # never a blocking destroy
        WATCHDOG.watch(self)

    @property
    def _comm(self) -> Any:
        return self._handle.comm

    # the communicator's stream
    def in_stream(self, join: bool = True) -> "_InStream":
        """Run the body's device work on this communicator's stream (a context manager).

        The stream first waits for the work queued so far on the caller's current stream; on
        exit, with ``join``, the caller's stream waits for the body's work (stream order, no
        host wait: what NCCL's own calls promise). Nested, it does nothing.
        """
        return _InStream(self, join)

    def _order(self, event: Any) -> None:
        """Make the caller's current stream wait for ``event`` (nothing if it is ours)."""
        self._check_alive()
        current = self._device.current()
        if current is not self._stream:
            self._device.wait_event(current, event)

    # enqueueing and the one blocking wait
    def _live(self, op_name: str) -> Any:
        comm = self._handle.comm
        if comm is None:
            self._check_alive()
            raise BackendUnavailable(f"{op_name} on rank {self.rank}: the NCCL communicator is "
                                     "closed or was aborted")
        return comm

    def _post(self, op_name: str, launch: Callable[[Any, int], Any], keep: Any = None,
              active: bool = True, then: Callable[[], None] | None = None) -> Any:
        """Run ``launch(nccl_comm, stream)`` on the communicator's stream after the caller's
        current stream's work, then ``then()`` (device work that reads the results, with that
        stream current, once NCCL has issued the launch); return an event recorded behind it.
        ``keep`` (every array the operation reads or writes) stays referenced until that event
        is observed complete.

        ``active=False`` (zero elements, the same on every rank) skips the NCCL call.
        """
        self._live(op_name)
        device, stream = self._device, self._stream
        current = device.current()
        if current is not stream:
            device.wait_event(stream, device.record(current))
        if active:
            self._call(op_name, lambda comm: launch(comm, device.handle(stream)))
        if then is not None:
            if current is stream:
                then()
            else:
                with device.using(stream):
                    then()
        event = device.record(stream)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        inflight = self._inflight
        self._posted += 1
        inflight.append(_Inflight(event, keep, deadline, op_name, self.sequence, self._posted))
        if len(inflight) > _INFLIGHT_QUERIED:  # a loop that never waits on the host
            while len(inflight) > 1 and inflight[0].event.done:
                inflight.popleft()
        return event

    def _call(self, op_name: str, call: Callable[[Any], Any]) -> Any:
        """One NCCL call under the communicator's lock; a non-blocking call that returns
        ``ncclInProgress`` (connecting to peers) is polled until it is issued, within
        ``connect_timeout``. An NCCL or CUDA error aborts and raises BackendError."""
        handle = self._handle
        try:
            with handle.lock:
                comm = self._live(op_name)
                try:
                    return call(comm)
                except (self._nccl.NcclError, KeyError) as exc:
                    if not in_progress(exc):
                        raise
                self._settle(comm, op_name)
        except self._errors as exc:
            raise self._failed(op_name, exc) from exc

    def _settle(self, comm: Any, op_name: str) -> None:
        """Poll ``ncclCommGetAsyncError`` until a non-blocking call is issued (lock held)."""
        limit = self.connect_timeout
        deadline = None if limit is None else time.monotonic() + limit

        def issued() -> bool:
            try:
                comm.check_async_error()
            except (self._nccl.NcclError, KeyError) as exc:
                if not in_progress(exc):
                    raise
                if deadline is not None and time.monotonic() > deadline:
                    raise self._timed_out(op_name, connecting=True) from None
                return False
            return True

        spin(issued)

    def _timed_out(self, op_name: str, sequence: int | None = None,
                   pending: Sequence[int] = (), connecting: bool = False) -> CollectiveTimeout:
        """Abort the NCCL communicator (its kernels stop), then name the late ranks like every
        backend (arrival board)."""
        self._handle.abort()
        error = super()._timed_out(op_name, sequence, pending)
        if connecting:
            error.args = (f"{error.args[0]} (still connecting to peers after "
                          f"CUPYCOLL_CONNECT_TIMEOUT = {self.connect_timeout} s)",)
        return error

    def _record_collective(self, name: str, nbytes: int, root: int | None = None,
                           op_name: str | None = None) -> None:
        """Book the collective just posted and number its in-flight entry with it (a timeout
        of that entry names the ranks that never started it)."""
        super()._record_collective(name, nbytes, root, op_name)
        if self._inflight:
            self._inflight[-1].sequence = self.sequence

    def stream_work(self, op_name: str) -> Work:
        """A Work that completes when what is queued on the current stream so far has run."""
        return self._work(self._device.record(), None, op_name, self._behind())

    def _behind(self) -> int:
        """The operations an event recorded now on the current stream comes after: all posted
        so far if the current stream is ours, else none known."""
        return self._posted if self._device.current() is self._stream else 0

    def _failed(self, op_name: str, exc: BaseException) -> BackendError:
        """Abort after an NCCL or CUDA error and describe it (the error becomes the cause)."""
        self._handle.abort()
        return BackendError(f"NCCL failed {op_name} on rank {self.rank} of {self.size} "
                            f"({type(exc).__name__}: {exc}); the communicator was aborted")

    def _disable(self) -> None:
        super()._disable()
        self._handle.abort()

    @contextlib.contextmanager
    def _group(self) -> Iterator[None]:
        self._nccl.groupStart()
        try:
            yield
        finally:
            self._nccl.groupEnd()

    def _work(self, event: Any, keep: Any, op_name: str, behind: int = 0) -> Work:
        """Work over ``event``: ``wait()`` orders the caller's stream after it, ``synchronize()``
        blocks the host (``keep`` is referenced by the in-flight list until then; ``behind``:
        the operations posted before ``event`` on our stream, complete with it)."""
        def synchronize() -> None:
            self.wait([event], op_name)
            self._observed_upto(behind)

        work = Work(lambda: self._order(event), lambda: self._query(event),
                    sync_fn=synchronize, device=lambda: self._device.activate(self.device_id))
        work.events = [event]  # type: ignore[attr-defined]  # for stream-side waits (overlap)
        return work

    def _query(self, event: Any) -> bool:
        done = bool(event.done)
        if done:
            self._observed(event)
        return done

    def _observed(self, event: Any) -> None:
        """``event`` completed: so did every operation posted before it on our stream."""
        for entry in self._inflight:
            if entry.event is event:
                self._observed_upto(entry.number)
                return

    def _observed_upto(self, number: int) -> None:
        """Operations 1..``number`` are complete: release what they kept."""
        inflight = self._inflight
        while inflight and inflight[0].number <= number:
            inflight.popleft()

    def wait(self, handles: Sequence[Any], op_name: str) -> None:
        """Block the host until every event in ``handles`` is done, under ``self.timeout``.

        Polls the events (a spin that yields the GIL, then short sleeps past a few
        milliseconds) and NCCL's asynchronous error (a failed peer leaves NCCL's kernels
        spinning).

        Raises:
            CollectiveTimeout: not done in time (the NCCL communicator is aborted first).
            BackendError: an asynchronous NCCL or CUDA failure (after aborting; the NcclError
                or CUDA error is its ``__cause__``).
        """
        events = list(handles)
        if not events:
            return
        start = time.monotonic()
        deadline = None if self.timeout is None else start + self.timeout
        pending, polled = list(events), [start]

        def done() -> bool:
            while pending and pending[-1].done:
                pending.pop()
            if not pending:
                return True
            now = time.monotonic()
            if now - polled[0] > _ASYNC_POLL_S:
                polled[0] = now
                self._check_async(op_name or "synchronize")
            if deadline is not None and now > deadline:
                raise self._timed_out(*self._late(op_name))  # aborts; names the late ranks
            return False

        try:
            spin(done)
        except KeyboardInterrupt:
            self._interrupted(op_name or "synchronize")
            raise
        self._check_async(op_name or "synchronize")
        for event in events:
            self._observed(event)

    def synchronize(self) -> None:
        """Block the host until every operation posted on this communicator has completed
        (a timeout names the oldest one that did not)."""
        if self._inflight:
            self.wait([self._inflight[-1].event], "")

    def _late(self, op_name: str) -> tuple[str, int | None]:
        """The operation a timed-out wait names: ``op_name``, or (empty) the oldest operation
        in flight that has not completed, with its collective number."""
        if op_name:
            return op_name, None
        for entry in self._inflight:
            if not entry.event.done:
                return entry.op_name, entry.sequence
        return "synchronize", None

    def fetch(self, work: Work, array: Any) -> np.ndarray:
        """ONE host synchronisation: the copy is queued behind ``work`` on the current stream
        and only the copy's event is waited for (under the timeout).

        A wait that fails (timeout, NCCL error, interrupt) leaves the copy queued: after the
        abort the stream runs on and the copy writes the pinned buffer, so the buffer is kept
        for good with the communicator's fate (freed, CuPy's pinned pool would hand it to the
        next allocation, e.g. the next call's fetch, and the late copy would overwrite that).
        """
        work.wait()
        behind = self._behind()
        host, event = self._device.download(array)
        try:
            self.wait([event], "fetch")
        except BaseException:
            self._fate.abandon(host, event)
            raise
        self._observed_upto(behind)
        return host

    def stream_order(self, work: Work) -> None:
        """No host wait: the current stream waits for ``work``'s events."""
        work.wait()

    def overlap(self) -> Overlap:
        """Consumers run on a side stream after their transfers' events (see :class:`Overlap`)."""
        if self._side is None:
            self._side = self._device.side_stream()
        return _SideStreamOverlap(self, self._side)

    def _check_async(self, op_name: str = "wait") -> None:
        """Raise (after aborting) if NCCL reports an asynchronous error, or if the
        communicator died meanwhile (the watchdog timed it out)."""
        handle = self._handle
        try:
            with handle.lock:
                comm = handle.comm
                if comm is not None:
                    comm.check_async_error()
        except self._errors as exc:
            raise self._failed(op_name, exc) from exc
        self._check_alive()

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
            self._ptr(token), self._ptr(token), 1, dtype, red, s), token)], "barrier")

    def close(self) -> None:
        """Wait for the operations in flight, then destroy the NCCL communicator (idempotent).

        A communicator that died (timeout, error) or whose operations do not complete within
        the timeout is aborted instead: ``ncclCommDestroy`` blocks forever while a kernel
        waits for a peer that never comes.
        """
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

    def _expire(self) -> None:
        """Watchdog: abort if the oldest operation in flight outlived the timeout or NCCL
        reports an asynchronous error (called from the watchdog thread; skips this round if
        an NCCL call holds the lock)."""
        handle = self._handle
        if not self._inflight or handle.comm is None:
            return
        if not handle.lock.acquire(blocking=False):
            return
        try:
            entry = self._inflight[0]
            if entry.deadline is None or time.monotonic() <= entry.deadline:
                return
            if entry.event.done:
                self._observed(entry.event)
                return
            self._timed_out(entry.op_name, entry.sequence)
        except CollectiveTimeout:
            pass
        finally:
            handle.lock.release()


class _InStream:
    """:meth:`NCCLCommunicator.in_stream`'s context (a class: it is entered on every call)."""

    __slots__ = ("comm", "join", "outer", "scope")

    def __init__(self, comm: NCCLCommunicator, join: bool) -> None:
        self.comm, self.join, self.outer, self.scope = comm, join, None, None

    def __enter__(self) -> None:
        comm = self.comm
        device, stream = comm._device, comm._stream
        current = device.current()
        if current is stream:
            return
        self.outer = current
        device.wait_event(stream, device.record(current))
        self.scope = device.using(stream)
        self.scope.__enter__()

    def __exit__(self, *exc: Any) -> None:
        outer, self.outer = self.outer, None
        if outer is None:
            return
        device, stream = self.comm._device, self.comm._stream
        scope, self.scope = self.scope, None
        scope.__exit__(*exc)
        if self.join:
            device.wait_event(outer, device.record(stream))
