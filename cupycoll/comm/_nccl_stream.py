"""The NCCL backend's stream order: posting on the communicator's stream, the events that
order the caller's stream after it, host waits, the in-flight list and the watchdog's check.

:class:`_StreamOrder` is mixed into :class:`~.nccl.NCCLCommunicator` (see its module docstring
for the model); it has no state of its own beyond what ``_attach`` sets up.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from .._types import check_current_device
from ..errors import BackendError, CollectiveTimeout
from ._nccl_config import in_progress
from ._nccl_guard import spin
from ._nccl_inflight import Entry, Inflight
from ._watchdog import _ABANDONED
from ._work import Work

__all__: list[str] = []

#: operations in flight beyond which a post queries the oldest ones' events to release them.
_INFLIGHT_QUERIED = 64
#: seconds between two polls of NCCL's asynchronous error in a host wait.
_ASYNC_POLL_S = 1e-3


class _Handle:
    """The CuPy communicator and its lock, apart from the NCCLCommunicator so that garbage
    collection can abort it (``ncclCommDestroy``, which CuPy's destructor calls, blocks forever
    while a kernel waits for a peer)."""

    __slots__ = ("comm", "lock", "nonblocking", "aborting", "connecting", "__weakref__")

    def __init__(self, comm: Any, nonblocking: bool) -> None:
        self.comm, self.nonblocking = comm, nonblocking
        self.lock = threading.RLock()
        self.aborting = False  # set before the lock is taken: a call connecting under it stops
        self.connecting = False  # a call holds the lock until its peers connect (_settle)

    def abort(self) -> None:
        self.aborting = True
        with self.lock:
            comm, self.comm = self.comm, None
            if comm is not None:
                comm.abort()

    def release(self, inflight: Inflight) -> None:
        """The communicator is garbage: abort it, and keep what its unfinished operations
        still touch for the life of the process (its stream may run on after the abort)."""
        self.abort()
        running = inflight.running()
        if running:
            _ABANDONED.append(running)


class _StreamOrder:
    """Posting, ordering and waiting of :class:`~.nccl.NCCLCommunicator` (a mixin)."""

    # the communicator's stream
    def in_stream(self, join: bool = True) -> "_InStream":
        """Run the body's device work on this communicator's stream (a context manager).

        The stream first waits for the work queued so far on the caller's current stream; on
        exit, with ``join``, the caller's stream waits for the body's work (stream order, no
        host wait: what NCCL's own calls promise). Nested, it does nothing.
        """
        return _InStream(self, join)

    def _order(self, event: Any, seen: Sequence[int] = (0,)) -> None:
        """Make the caller's current stream wait for ``event`` (nothing if it is ours); then
        raise if the communicator died meanwhile, unless the host has seen the operation
        complete before (``seen[0]``: its synchronize() returned, so its result stands). The
        order comes first even then: what the caller frees next on its stream must not be
        handed to new work while our stream may still read it."""
        device = self._device
        current = device.current()
        if current is not self._stream:
            device.wait_event(current, event)
            if device.current_device() == self.device_id:
                self._readers.add(current)  # the caller reads the result there
        if not seen[0]:
            self._check_alive()

    def _post(self, op_name: str, launch: Callable[[Any, int], Any], keep: Any = None,
              active: bool = True, then: Callable[[], None] | None = None,
              arrival: bool = False, peers: tuple[int, ...] = ()) -> Any:
        """Run ``launch(nccl_comm, stream)`` on the communicator's stream after the caller's
        current stream's work, then ``then()`` (device work that reads the results, with that
        stream current, once NCCL has issued the launch); return an event recorded behind it.
        ``keep`` (every array the operation reads or writes) stays referenced until that event
        is observed complete.

        ``active=False`` (zero elements, the same on every rank) skips the NCCL call.
        ``arrival``: a collective, published on the arrival board before its NCCL call (which
        may wait for peers to connect: a timeout there names the ranks that never came).
        ``peers``: the ranks an exchange receives from (a timeout names them).
        """
        self._live(op_name)
        device, stream = self._device, self._stream
        check_current_device(device.current_device(), self.device_id, self.rank)
        current = device.current()
        if current is not stream:
            self._readers.order(current)
        if arrival:
            self._slot[0] = self.sequence + 1  # _arrived counts it after the post
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
        self._posted += 1
        self._inflight.add(Entry(event, keep, deadline, op_name, self.sequence, self._posted,
                                 peers), _INFLIGHT_QUERIED)
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
                if self._handle.aborting:  # abort() from another thread waits for the lock
                    self._check_alive()
                    raise BackendError(f"{op_name} on rank {self.rank}: the NCCL communicator "
                                       "was aborted while connecting") from None
                if deadline is not None and time.monotonic() > deadline:
                    raise self._timed_out(op_name, connecting=True) from None
                return False
            return True

        self._handle.connecting = True  # (host waits of other threads skip the lock meanwhile)
        try:
            spin(issued)
        finally:
            self._handle.connecting = False

    def _arrived(self) -> None:
        """Count the collective just posted and number its in-flight entry with it (a timeout
        of that entry names the ranks that never started it)."""
        super()._arrived()
        self._inflight.number_last(self.sequence)

    def stream_work(self, op_name: str) -> Work:
        """A Work that completes when what is queued on the current stream so far has run."""
        return self._work(self._device.record(), None, op_name, self._behind())

    def time_mark(self) -> Any:
        """A timing event on the current stream: where a timed call's device work starts or
        ends (read later by :meth:`seconds_between`; no host wait here)."""
        return self._device.record(timing=True)

    def seconds_between(self, start: Any, end: Any) -> float:
        """Seconds the stream took from ``start`` to ``end`` (:meth:`time_mark` events); the
        host waits for ``end`` only if it has not run yet."""
        return self._device.elapsed(start, end)

    def _behind(self) -> int:
        """The operations an event recorded now on the current stream comes after: all posted
        so far if the current stream is ours, else none known."""
        return self._posted if self._device.current() is self._stream else 0

    def _work(self, event: Any, keep: Any, op_name: str, behind: int = 0) -> Work:
        """Work over ``event``: ``wait()`` orders the caller's stream after it, ``synchronize()``
        blocks the host (``keep`` is referenced by the in-flight list until then; ``behind``:
        the operations posted before ``event`` on our stream, complete with it)."""
        events = [event]  # and the finalizer's device work, once it ran (stamp)
        seen = [0]  # how many of them the host saw complete, the communicator alive

        def synchronize() -> None:
            if seen[0] < len(events):
                self.wait(events[seen[0]:], op_name)
                self._inflight.release_upto(behind)
                seen[0] = len(events)

        def stamp() -> Callable[[], None]:
            events.append(self._device.record())
            return functools.partial(self._order, events[-1], seen)

        work = Work(lambda: self._order(event, seen), lambda: self._query(event),
                    sync_fn=synchronize, device=lambda: self._readers.handing(self.device_id),
                    stamp=stamp, op_name=op_name)
        work.events = [event]  # type: ignore[attr-defined]  # for stream-side waits (overlap)
        return work

    def _query(self, event: Any) -> bool:
        done = bool(event.done)
        if done:
            self._inflight.observed(event)
        return done

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
            if deadline is not None and now > deadline:  # aborts; names the late ranks
                raise self._timed_out(*self._late(op_name, pending[-1]))
            return False

        try:
            spin(done)
        except BaseException as exc:  # Ctrl-C, a signal handler's exception: still pending
            self._interrupted(op_name or "synchronize", type(exc))
            raise
        self._check_async(op_name or "synchronize")
        for event in events:
            self._inflight.observed(event)

    def synchronize(self) -> None:
        """Block the host until every operation posted on this communicator has completed
        (a timeout names the oldest one that did not)."""
        newest = self._inflight.newest()
        if newest is not None:
            self.wait([newest.event], "")

    def _late(self, op_name: str, event: Any) -> tuple[str, int | None, tuple[int, ...]]:
        """The operation a timed-out wait on ``event`` names and the peers it receives from
        (an exchange's): ``op_name`` and ``event``'s, or (no ``op_name``, or an event that is
        no operation's: a fetch's copy) the oldest operation in flight that has not
        completed, with its collective number."""
        entry = self._inflight.of(event) if op_name else None
        if entry is not None:
            return op_name, None, entry.peers
        entry = self._inflight.oldest_running()  # (a fetch's copy: the operation it follows)
        return (entry.op_name, entry.sequence, entry.peers) if entry is not None else (
            op_name or "synchronize", None, ())

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
        self._inflight.release_upto(behind)
        return host

    def stream_order(self, work: Work) -> None:
        """No host wait: the current stream waits for ``work``'s events."""
        work.wait()

    def _check_async(self, op_name: str = "wait") -> None:
        """Raise (after aborting) if NCCL reports an asynchronous error, or if the
        communicator died meanwhile (the watchdog timed it out)."""
        handle = self._handle
        while not handle.lock.acquire(timeout=_ASYNC_POLL_S):
            if handle.connecting:  # that call polls the asynchronous error itself until its
                self._check_alive()  # peers connect (up to connect_timeout) and aborts on one:
                return  # this wait, its operation complete, does not wait for them
        try:
            comm = handle.comm
            if comm is not None:
                comm.check_async_error()
        except self._errors as exc:
            raise self._failed(op_name, exc) from exc
        finally:
            handle.lock.release()
        self._check_alive()

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
            entry = self._inflight.oldest()
            if entry is None or entry.deadline is None or time.monotonic() <= entry.deadline:
                return
            if entry.event.done:
                self._inflight.observed(entry.event)
                return
            self._timed_out(entry.op_name, entry.sequence, entry.peers)
        except CollectiveTimeout:
            pass
        finally:
            handle.lock.release()


class _InStream:
    """:meth:`NCCLCommunicator.in_stream`'s context (a class: it is entered on every call)."""

    __slots__ = ("comm", "join", "outer", "scope")

    def __init__(self, comm: Any, join: bool) -> None:
        self.comm, self.join, self.outer, self.scope = comm, join, None, None

    def __enter__(self) -> None:
        comm = self.comm
        device, stream = comm._device, comm._stream
        current = device.current()
        if current is stream or device.current_device() != comm.device_id:
            return  # another device's thread: the call's checks refuse it, on every rank
        self.outer = current
        comm._readers.order(current)
        self.scope = device.using(stream)
        self.scope.__enter__()

    def __exit__(self, *exc: Any) -> None:
        outer, self.outer = self.outer, None
        if outer is None:
            return
        device, stream = self.comm._device, self.comm._stream
        scope, self.scope = self.scope, None
        scope.__exit__(*exc)
        if self.join or exc[0] is not None:  # a failed call: nothing waits on it later
            device.wait_event(outer, device.record(stream))
            if exc[0] is None:
                self.comm._readers.add(outer)  # the caller reads the results there
