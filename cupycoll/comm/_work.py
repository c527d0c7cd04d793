"""Handles of operations in flight (:class:`Work`, with futures completed by one thread per
process) and :class:`Overlap`, the default of device work consuming finished transfers."""

from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ._base import Communicator

__all__ = ["Work", "Overlap"]


class Work:
    """Handle of an operation in flight: ``wait()``, ``is_completed()``, ``result()``.

    ``wait_fn`` blocks until the transfers are done, ``test_fn`` polls them, ``finalize`` runs once
    after completion (casts, divisions, copies back, user callbacks) and returns the result. If
    ``finalize`` raises, every later ``wait()`` raises the same exception without running it again.
    """

    def __init__(self, wait_fn: Callable[[], None] | None = None,
                 test_fn: Callable[[], bool] | None = None,
                 finalize: Callable[[], Any] | None = None, result: Any = None) -> None:
        self._wait_fn, self._test_fn, self._finalize = wait_fn, test_fn, finalize
        self._result = result
        self._error: BaseException | None = None
        self._done = wait_fn is None and finalize is None
        self._lock = threading.Lock()
        self._future: concurrent.futures.Future | None = None

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the operation is complete and return its result."""
        with self._lock:
            if not self._done:
                if self._wait_fn is not None:
                    self._wait_fn()
                try:
                    if self._finalize is not None:
                        self._result = self._finalize()
                except BaseException as exc:
                    self._error = exc
                    raise
                finally:
                    self._done = True
            if self._error is not None:
                raise self._error
        return self._result

    def is_completed(self) -> bool:
        """Return True when ``wait()`` would not block (it may still have to finalize)."""
        if self._done:
            return True
        return self._test_fn() if self._test_fn is not None else False

    def result(self) -> Any:
        """Wait and return the result (None for operations without one)."""
        return self.wait()

    def get_future(self) -> concurrent.futures.Future:
        """Return a ``concurrent.futures.Future`` that gets ``wait()``'s result or exception.

        The same Future on every call. A cupycoll thread waits for it (in the order futures
        were asked for), so finalizers and callbacks of a Work asked for its future run there.
        """
        with self._lock:
            if self._future is None:
                self._future = concurrent.futures.Future()
                _completer().put((self, self._future))
        return self._future

    def add_done_callback(self, fn: Callable[["Work"], Any]) -> None:
        """Call ``fn(self)`` once the operation is complete (at once if it already is)."""
        self.get_future().add_done_callback(lambda _: fn(self))

    @classmethod
    def completed(cls, result: Any = None) -> "Work":
        """Return a Work that is already done."""
        return cls(result=result)


def _complete_forever(pending: "queue.SimpleQueue[tuple[Work, concurrent.futures.Future]]") -> None:
    while True:
        work, future = pending.get()
        try:
            future.set_result(work.wait())
        except BaseException as exc:  # delivered to whoever holds the future
            future.set_exception(exc)


_COMPLETERS: dict[int, "queue.SimpleQueue"] = {}
_COMPLETERS_LOCK = threading.Lock()


def _completer() -> "queue.SimpleQueue[tuple[Work, concurrent.futures.Future]]":
    """The queue of this process's completer thread (a forked child starts its own)."""
    with _COMPLETERS_LOCK:
        pending = _COMPLETERS.get(os.getpid())
        if pending is None:
            pending = _COMPLETERS[os.getpid()] = queue.SimpleQueue()
            threading.Thread(target=_complete_forever, args=(pending,), daemon=True,
                             name="cupycoll-completer").start()
        return pending


class Overlap:
    """Device work that consumes finished transfers while later transfers are in flight.

    ``after(work, fn)`` runs ``fn`` (device work reading ``work``'s results; ``work`` may be
    None) once ``work`` is done; ``join()`` orders all of it before what the caller issues next.
    This default orders ``work`` with :meth:`Communicator.stream_order` and runs ``fn`` at once
    (MPI progresses the later transfers meanwhile); NCCL runs ``fn`` on a side stream that waits
    for ``work``'s event, so transfers and kernels overlap on the GPU. Every ``fn`` runs in call
    order.
    """

    def __init__(self, comm: "Communicator") -> None:
        self._comm = comm

    def after(self, work: Work | None, fn: Callable[[], None]) -> None:
        if work is not None:
            self._comm.stream_order(work)
        fn()

    def join(self) -> None:
        """Order everything run so far before the caller's next work (nothing to do here)."""
