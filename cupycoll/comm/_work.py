"""Handles of operations in flight (:class:`Work`, with futures completed by one thread per
process) and :class:`Overlap`, the default of device work consuming finished transfers."""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import os
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from .._agreement import ranks_text
from ..errors import BackendError, CollectiveTimeout, InvalidArgument
from ._naps import helper_thread

if TYPE_CHECKING:
    from ._base import Communicator

__all__ = ["Work", "Overlap"]

_NOWHERE = contextlib.nullcontext()


def _seconds(timeout: Any) -> float:
    """``Work.wait``'s ``timeout`` as seconds: a number >= 0 (NaN waited forever)."""
    try:
        seconds = float("nan") if isinstance(timeout, (str, bytes)) else float(timeout)
    except OverflowError:  # an int past float's range: wait as long as inf
        seconds = float("inf") if timeout > 0 else float("nan")
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(timeout, bool) or not seconds >= 0:
        raise InvalidArgument("timeout", timeout, "must be a number of seconds >= 0 (or None)")
    return seconds


class Work:
    """Handle of an operation in flight: ``wait()``, ``synchronize()``, ``is_completed()``,
    ``result()``.

    ``wait_fn`` orders the operation before what the caller does next: on MPI it blocks until
    the transfers are done; on NCCL it makes the caller's current stream wait for the
    operation's completion event (no host wait, as ``torch.distributed``'s ``Work.wait()``).
    ``sync_fn`` blocks the host until the operation is done (default ``wait_fn``). ``test_fn``
    polls it; ``finalize`` runs once, after the first ``wait()`` or ``synchronize()`` (casts,
    divisions, copies back, user callbacks), and returns the result. If ``finalize`` raises,
    every later call raises the same exception without running it again. ``device``: a context
    in which the operation's CUDA device is current (``finalize`` runs in it, whichever thread
    completes the Work). ``stamp`` (a device wait's): called after ``finalize`` on its stream,
    returns what orders a caller's current stream after the finalizer's device work, which
    every later ``wait()`` then runs too (the finalizer ran on the first waiter's stream).
    ``on_drop``: called when the Work is garbage-collected before it completed (the backend
    then keeps what the operation still reads or writes: MPI's requests and buffers).
    ``late``: the ranks that have not started the operation yet (a ``wait(timeout)`` names
    them). ``interrupted``: called with the type of an exception that left a ``wait(timeout)``
    (Ctrl-C): the backend's own wait's rule for an operation left pending. ``wanted``: raises
    when the operation can no longer complete (``abort()`` from another thread, peers that
    gave the communicator up before it), which ends a ``wait(timeout)`` as the backend's own
    wait ends. ``op_name``: what the operation is, as a ``wait(timeout)``'s timeout names it.
    """

    def __init__(self, wait_fn: Callable[[], None] | None = None,
                 test_fn: Callable[[], bool] | None = None,
                 finalize: Callable[[], Any] | None = None, result: Any = None,
                 sync_fn: Callable[[], None] | None = None,
                 device: Callable[[], None] | None = None,
                 on_drop: Callable[[], None] | None = None,
                 stamp: Callable[[], Callable[[], None]] | None = None,
                 late: Callable[[], list[int]] | None = None,
                 interrupted: Callable[[type], None] | None = None,
                 wanted: Callable[[], None] | None = None, op_name: str | None = None) -> None:
        self._on_drop, self._late, self._interrupted = on_drop, late, interrupted
        self._op_name = op_name
        self._wanted = wanted
        self._stamp, self._after = stamp, None
        self._wait_fn, self._test_fn, self._finalize = wait_fn, test_fn, finalize
        self._sync_fn = sync_fn if sync_fn is not None else wait_fn
        self._result = result
        self._error: BaseException | None = None
        self._done = wait_fn is None and finalize is None
        self._synced = sync_fn is None and wait_fn is None
        self._host_waits = sync_fn is None  # wait() itself blocks the host (MPI)
        self._lock = threading.Lock()
        self._future: concurrent.futures.Future | None = None
        self._device = device
        self._finalizing: int | None = None  # the thread running ``finalize`` now

    def __del__(self) -> None:
        if self._on_drop is not None and not getattr(self, "_done", True):
            self._on_drop()

    def wait(self, timeout: float | None = None) -> Any:
        """Order the operation before the caller's next work and return its result (MPI: the
        host waits; NCCL: the current stream does, see the class docstring).

        ``timeout`` (seconds) bounds this wait in place of the communicator's own timeout:
        the host polls :meth:`is_completed` and raises CollectiveTimeout if it is not complete
        by then; the operation goes on, and a later wait can complete it. (On NCCL the
        communicator's timeout also bounds the operation itself: the watchdog aborts it
        there, so a longer ``timeout`` ends at the communicator's.)"""
        seconds = _seconds(timeout) if timeout is not None else None  # (checked done or not)
        self._not_finalizing()
        if seconds is not None and not self._done:
            deadline = time.monotonic() + seconds
            try:
                while not self.is_completed():
                    if time.monotonic() >= deadline:
                        missing = self._late() if self._late is not None else []
                        behind = f"; {ranks_text(missing)} had not started it" if missing \
                            else ""
                        what = self._op_name or "the operation"
                        raise CollectiveTimeout(
                            f"Work.wait(timeout={timeout}) expired before {what} completed"
                            f"{behind} (it goes on: wait again to complete it)",
                            missing_ranks=missing, op_name=self._op_name)
                    if self._wanted is not None:
                        self._wanted()
                    time.sleep(1e-4)
            except BaseException as exc:  # Ctrl-C: the operation is left pending
                if self._interrupted is not None:
                    self._interrupted(type(exc))  # (cupycoll's own errors: nothing to do)
                raise
        try:
            return self._complete(self._wait_fn)
        finally:
            if self._host_waits and self._done:
                self._synced = True

    def synchronize(self) -> Any:
        """Block the host until the operation is complete (under the communicator's timeout)
        and return its result."""
        if not self._host_waits or not (self._synced or self._done):  # a device wait: every
            if self._done:  # calling thread learns the completion itself (cheap once done)
                self._sync_fn()
            else:
                if not self._host_waits:
                    self._host_sync()
                self._complete(self._sync_fn)
                if self._after is not None:  # the finalizer queued device work (a copy into
                    self._sync_fn()  # alloc_fn's buffers): the host waits for it too
            self._synced = True
        return self.wait()

    def _host_sync(self) -> None:
        """Block the host until the device's operation is done, without the lock: a
        ``wait()`` meanwhile (another thread's, e.g. the caller's while the completer thread
        completes its future) orders its stream at once instead of waiting for this. A failure
        is the Work's error, as in :meth:`_completed`."""
        self._not_finalizing()
        try:
            self._sync_fn()
        except BackendError as exc:
            with self._lock:
                if not self._done:
                    self._error, self._done = exc, True
            raise

    def _not_finalizing(self) -> None:
        """Raise if the calling thread is running this Work's finalizer (it would wait for
        itself, on the lock the finalizer holds)."""
        if self._finalizing == threading.get_ident():
            raise InvalidArgument(
                "completion_fn", "a wait for its own Work", "a callback run as the Work "
                "completes (completion_fn, alloc_fn, a finalizer) cannot wait for that Work: it "
                "would wait for itself; it receives the result as its arguments")

    def _complete(self, wait_fn: Callable[[], None] | None) -> Any:
        self._not_finalizing()
        with self._lock:
            return self._completed(wait_fn)

    def _completed(self, wait_fn: Callable[[], None] | None) -> Any:
        """:meth:`_complete`'s work, under the lock. A device wait runs on every call: it
        orders the calling thread's current stream, which may not be the first caller's."""
        if not self._done or not self._host_waits:
            if wait_fn is not None:
                try:
                    wait_fn()
                except BackendError as exc:  # the transfer failed (MPI nulls its request: a
                    if not self._done:  # later wait would find it done): every wait raises it
                        self._error, self._done = exc, True
                    raise
            if self._after is not None:  # and after the finalizer's device work
                self._after()
        if not self._done:
            try:
                if self._finalize is not None:
                    device_wait = wait_fn is not None and not self._host_waits
                    with self._device() if self._device is not None else _NOWHERE:
                        if device_wait and self._device is not None:  # the finalizer's own
                            wait_fn()  # stream, on the operation's device (the caller's may
                        self._finalizing = threading.get_ident()  # be another device's)
                        self._result = self._finalize()
                        if device_wait and self._stamp is not None:
                            self._after = self._stamp()
                    if self._after is not None:
                        self._after()
            except BaseException as exc:
                self._error = exc
                raise
            finally:
                self._done, self._finalizing = True, None
        if self._error is not None:
            raise self._error
        return self._result

    def is_completed(self) -> bool:
        """Return True when the operation is done and its result is in place (``wait()``
        would not block). On a backend whose host waits (MPI), the first call that finds the
        transfers done finalizes the operation (casts, avg's division, copies back, callbacks;
        an error is raised by ``wait()``); on NCCL the device's work is all there is."""
        if self._test_fn is None:
            return self._done
        if self._synced or (self._done and self._host_waits):
            return True
        if not self._lock.acquire(blocking=False):
            return False  # another thread is completing it now (MPI: its requests are that
            # thread's to test until then; two threads completing one request is an error)
        try:
            if self._done and self._host_waits:
                return True
            try:
                if not self._test_fn():
                    return False
            except Exception as exc:  # a failed transfer is done: every wait() raises it
                self._error, self._done = exc, True
                return True
            if self._host_waits and not self._done:
                try:
                    self._completed(self._wait_fn)
                except BaseException:  # noqa: S110 - kept in _error, raised by wait()
                    pass
            return True
        finally:
            self._lock.release()

    def result(self) -> Any:
        """Wait and return the result (None for operations without one)."""
        return self.wait()

    def get_future(self) -> concurrent.futures.Future:
        """Return a ``concurrent.futures.Future`` that gets ``synchronize()``'s result or
        exception.

        The same Future on every call. A cupycoll thread waits for it (in the order futures
        were asked for), on the operation's device, so finalizers and callbacks of a Work asked
        for its future run there, after the operation completed on the device.
        """
        self._not_finalizing()
        with self._lock:
            if self._future is None:
                self._future = concurrent.futures.Future()
                _completer().put((self, self._future))
        return self._future

    def add_done_callback(self, fn: Callable[["Work"], Any]) -> None:
        """Call ``fn(self)`` once the operation is complete, on cupycoll's completer thread,
        like every callback of :meth:`get_future` (not in this thread, even when the
        operation is already complete)."""
        self.get_future().add_done_callback(lambda _: fn(self))

    @classmethod
    def then(cls, work: "Work", finalize: Callable[[], Any]) -> "Work":
        """A Work that completes with ``work`` (a Work, or anything with its ``wait`` and
        ``is_completed``) and whose result is ``finalize()``."""
        then = cls(work.wait, work.is_completed, finalize,
                   sync_fn=getattr(work, "synchronize", None),
                   device=getattr(work, "_device", None), stamp=getattr(work, "_stamp", None),
                   late=getattr(work, "_late", None),
                   interrupted=getattr(work, "_interrupted", None),
                   wanted=getattr(work, "_wanted", None), op_name=getattr(work, "_op_name", None))
        then._host_waits = getattr(work, "_host_waits", False)
        return then

    @classmethod
    def completed(cls, result: Any = None) -> "Work":
        """Return a Work that is already done."""
        return cls(result=result)


def _complete_forever(pending: "queue.SimpleQueue[tuple[Work, concurrent.futures.Future]]") -> None:
    helper_thread()
    while True:
        item = pending.get()
        if item is None:  # the interpreter exits: what was queued before has completed
            return
        work, future = item
        try:
            with work._device() if work._device is not None else _NOWHERE:
                future.set_result(work.synchronize())
        except BaseException as exc:  # delivered to whoever holds the future
            future.set_exception(exc)


_COMPLETERS: dict[int, "queue.SimpleQueue"] = {}
_COMPLETERS_LOCK = threading.Lock()


def _completer() -> "queue.SimpleQueue[tuple[Work, concurrent.futures.Future]]":
    """The queue of this process's completer thread (a forked child starts its own)."""
    server = None
    with _COMPLETERS_LOCK:
        pending = _COMPLETERS.get(os.getpid())
        if pending is None:
            pending = _COMPLETERS[os.getpid()] = queue.SimpleQueue()
            server = threading.Thread(target=_complete_forever, args=(pending,), daemon=True,
                                      name="cupycoll-completer")
    if server is not None:  # started without the lock (a finalizer run by the garbage
        server.start()  # collector in the new thread as it starts may take it)
        atexit.register(_drain, pending, server)
    return pending


#: seconds the interpreter's exit waits at most for the completer's queued callbacks, and for
#: each MPI communicator's operations left pending (:mod:`._mpi_exit`)
EXIT_WAIT = 5.0


def _drain(pending: "queue.SimpleQueue", server: threading.Thread) -> None:
    """At exit: the completer is a daemon thread, which the interpreter would end with
    ``add_done_callback`` callbacks still queued: let it finish them (up to EXIT_WAIT s;
    registered after mpi4py.MPI's finalizer, so it runs before MPI finalizes)."""
    if _COMPLETERS.get(os.getpid()) is pending:  # (not in a forked child)
        pending.put(None)
        server.join(EXIT_WAIT)


class Overlap:
    """Device work that consumes finished transfers while later transfers are in flight.

    ``after(work, fn)`` runs ``fn`` (device work reading ``work``'s results; ``work`` may be
    None) once ``work`` is done; ``join()`` orders all of it before what the caller issues next.
    This default orders ``work`` with :meth:`Communicator.stream_order` and runs ``fn`` at once
    (MPI progresses the later transfers meanwhile); NCCL runs ``fn`` on a side stream that waits
    for ``work``'s event, so transfers and kernels overlap on the GPU. Every ``fn`` runs in call
    order.

    Every ``work`` and ``fn`` (with the buffers its closure reads) stays referenced here until
    ``join()``: device memory freed while a kernel queued on another stream still reads it goes
    back to CuPy's pool at once, and the pool hands it to the caller's next allocation (it knows
    no other stream), so it must outlive the side stream's join.
    """

    def __init__(self, comm: "Communicator") -> None:
        self._comm = comm
        self._held: list[tuple[Work | None, Callable[[], None]]] = []

    def after(self, work: Work | None, fn: Callable[[], None]) -> None:
        self._held.append((work, fn))
        self._run(work, fn)

    def _run(self, work: Work | None, fn: Callable[[], None]) -> None:
        if work is not None:
            self._comm.stream_order(work)
        fn()

    def join(self) -> None:
        """Order everything run so far before the caller's next work; then let go of it."""
        self._held.clear()
