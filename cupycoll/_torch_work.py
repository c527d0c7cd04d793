"""torch Works of the ``cupycoll`` process group, and cupycoll's errors as torch's DistErrors.

A :class:`TorchWork` wraps one cupycoll :class:`~cupycoll.comm.Work`: it asks for the Work's
future at once, so cupycoll's completer thread completes the operation (MPI: tests its
requests under the communicator's timeout; NCCL: waits for its event) while the caller goes on
(an operation run whole on a background worker completes there), and a settler thread then
completes the torch Future that DDP's reducer and ``work.get_future()`` read. A
failure reaches the caller as a class that is both torch's ``DistBackendError`` (or
``DistNetworkError``) and cupycoll's own error, so ``except dist.DistError`` and
``except cupycoll.errors.CollectiveTimeout`` both catch it.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import datetime
import functools
import os
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from .comm._naps import helper_thread
from .comm._work import EXIT_WAIT, _completer
from .errors import BackendError, BackendUnavailable, CollectiveTimeout, MismatchError

__all__ = ["TorchWork", "dist_error", "network_error", "torch_settlers"]

#: cupycoll's errors of a collective (timeouts, ranks that disagree, a backend that failed or
#: is missing) reach torch's callers as DistBackendErrors, as ProcessGroupNCCL raises them.
_BACKEND_ERRORS = (CollectiveTimeout, MismatchError, BackendUnavailable, BackendError)


@functools.lru_cache(maxsize=None)
def _both(dist_class: type, cupycoll_class: type) -> type:
    """The class that is both ``dist_class`` and ``cupycoll_class`` (made once per pair)."""
    name = dist_class.__name__.removesuffix("Error") + cupycoll_class.__name__
    return type(name, (dist_class, cupycoll_class),
                {"__module__": __name__, "__doc__": f"{cupycoll_class.__name__}, raised "
                 f"through torch.distributed as a {dist_class.__name__}."})


def _recast(exc: BaseException, dist_class: type) -> BaseException:
    """``exc`` as an instance of both ``dist_class`` and its own class: same message and
    attributes (``missing_ranks``, ``op_name``...), ``exc`` as its cause."""
    both = _both(dist_class, type(exc))
    new = both(*exc.args)  # the mapped classes all take their message first
    new.__dict__.update(exc.__dict__)
    new.__cause__ = exc
    return new.with_traceback(exc.__traceback__)


def dist_error(exc: BaseException) -> BaseException:
    """Return ``exc`` as a ``DistBackendError`` too where it is one of ``_BACKEND_ERRORS``;
    other exceptions (bad arguments: cupycoll's InvalidArgument / InvalidType, which are
    ValueError / TypeError as torch raises them) come back unchanged."""
    if isinstance(exc, dist.DistError) or not isinstance(exc, _BACKEND_ERRORS):
        return exc
    try:
        return _recast(exc, dist.DistBackendError)
    except Exception:  # a subclass that cannot be remade: raised as it is
        return exc


def network_error(exc: BackendUnavailable) -> BaseException:
    """``exc`` (ranks that could not be connected) as a ``DistNetworkError``, unless it is
    a DistError already."""
    return exc if isinstance(exc, dist.DistError) else _recast(exc, dist.DistNetworkError)


class _Settlers:
    """The threads that complete torch Futures (their ``then`` and ``add_done_callback``
    callbacks run there), one at a time in the order the operations completed; while every
    one running has gone :attr:`STALL` seconds without finishing and more wait (a callback that
    waits for another operation's Future, as torch's PowerSGD hook does), one more may start,
    so no callback waits for a thread it holds. Threads beyond the first end after
    :attr:`IDLE` seconds idle."""

    STALL = 1e-3
    IDLE = 5.0

    def __init__(self) -> None:
        self._pending: collections.deque[Callable[[], None]] = collections.deque()
        self._cv = threading.Condition()
        self._threads = self._idle = self._running = self._finished = 0
        self._expected = 0  # operations started whose settle is not submitted yet
        self._slots = 1  # how many may run at once (one more per stall)
        self._watcher: threading.Thread | None = None

    def expect(self) -> None:
        """An operation started: its settle will be submitted (the exit's drain waits)."""
        with self._cv:
            self._expected += 1

    def settled(self) -> None:
        """An expected settle completed where its operation did (nothing to run here)."""
        with self._cv:
            self._expected -= 1
            self._cv.notify_all()

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` after what was submitted before it (one expected settle)."""
        with self._cv:
            self._expected -= 1
            self._pending.append(fn)
            if self._watcher is None:
                self._watcher = self._thread(self._watch, "cupycoll-torch-futures-watch")
            if self._idle == 0 and self._threads < self._slots:
                self._threads += 1
                self._thread(self._serve, "cupycoll-torch-futures")
            self._cv.notify_all()

    @staticmethod
    def _thread(target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, daemon=True, name=name)
        thread.start()
        return thread

    def _serve(self) -> None:
        helper_thread()
        while True:
            with self._cv:
                while not (self._pending and self._running < self._slots):
                    self._idle += 1
                    woke = self._cv.wait(self.IDLE)
                    self._idle -= 1
                    if not woke and not self._pending and self._threads > 1:
                        self._threads -= 1
                        return
                fn = self._pending.popleft()
                self._running += 1
                if self._pending:  # the watcher waits for exactly this: all slots taken
                    self._cv.notify_all()
            try:
                fn()
            except BaseException:  # noqa: S110 - a settle delivers its own errors
                pass
            with self._cv:
                self._running -= 1
                self._finished += 1
                self._slots = max(1, self._slots - 1)
                self._cv.notify_all()

    def _watch(self) -> None:
        """While something waits for a slot: one more slot (and thread) when nothing running
        finished for STALL seconds."""
        while True:
            with self._cv:
                while not (self._pending and self._running >= self._slots):
                    self._cv.wait()
                seen = self._finished
            time.sleep(self.STALL)
            with self._cv:
                if (self._pending and self._running >= self._slots
                        and self._finished == seen):
                    self._slots += 1
                    if self._idle == 0:
                        self._threads += 1
                        self._thread(self._serve, "cupycoll-torch-futures")
                    self._cv.notify_all()

    def drain(self, seconds: float) -> None:
        """Wait up to ``seconds`` until no operation started is unsettled and no callback is
        waiting or running."""
        deadline = time.monotonic() + seconds
        with self._cv:
            while self._expected or self._pending or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cv.wait(left)


_SETTLERS: dict[int, _Settlers] = {}


def torch_settlers() -> _Settlers:
    """This process's settlers (a forked child makes its own). The first registers their
    drain at exit after making the completer (an operation of the background worker makes
    none), so the drain runs before the completer's: it waits for every operation started to
    be settled and its callbacks to end, while the completer still completes the operations
    those callbacks start."""
    found = _SETTLERS.get(os.getpid())
    if found is None:
        _completer()  # its drain registered first, so it runs after this one
        found = _SETTLERS.setdefault(os.getpid(), _Settlers())
        atexit.register(_drain)
    return found


def _drain() -> None:
    """At exit: let the torch callbacks under way finish (as long as the completer's drain)."""
    found = _SETTLERS.get(os.getpid())
    if found is not None:
        found.drain(EXIT_WAIT)


class TorchWork(dist._Work):
    """torch's Work of one cupycoll operation, completed asynchronously.

    Args:
        work: the cupycoll Work, or a future of the operation's result (completed by the
            thread that ran it), or None (the operation is already complete).
        finish: called with the operation's result once it is complete (copies back, casts,
            the sparse result); returns the list of tensors ``result()`` and the future give.
        devices: the CUDA devices of the tensors (the torch Future records an event on them,
            so a wait on the Future orders the waiting stream after the value), or None.
        verb: the process-group verb, named by a timeout of ``wait(timeout)``.
    """

    def __init__(self, work: Any, finish: Callable[[Any], list[torch.Tensor]],
                 devices: list[torch.device] | None = None, verb: str = "") -> None:
        super().__init__()
        self._future: torch.futures.Future = torch.futures.Future(devices=devices)
        # what get_future() gives: a failure made in a callback is an error of the C++ future
        # (set_exception would make the exception its value, which DDP's reducer reads as
        # tensors)
        self._public = self._future.then(self._unwrap)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._shared = self._inline = False  # get_future() called; completed where it ended
        self._error: BaseException | None = None
        self._value: list[torch.Tensor] = []
        self._finish, self._verb = finish, verb
        if work is None:
            self._settle(None)
        else:
            future = work if isinstance(work, concurrent.futures.Future) else work.get_future()
            self._settlers = torch_settlers()  # made here, in the caller's thread (not at exit)
            self._settlers.expect()
            future.add_done_callback(self._settle)

    def _settle(self, future: concurrent.futures.Future | None) -> None:
        """Take the operation's result (in the thread that completed it: cupycoll's
        completer, the background worker, or the caller of a blocking verb), then complete the
        torch Futures: in a settler thread once the future was handed out (its callbacks run
        there: one that waits for another operation must not hold the thread that completes
        it), else at once, here (no callback can run: the settler's thread hop is spared)."""
        try:
            self._value = self._finish(None if future is None else future.result())
        except BaseException as exc:  # delivered to whoever waits
            self._error = dist_error(exc)
        with self._lock:
            self._inline = future is None or not self._shared
        if not self._inline:
            self._settlers.submit(self._complete)
            return
        if future is not None:
            self._settlers.settled()
        self._complete()

    def _complete(self) -> None:
        try:  # the public future completes inside (its callback runs in set_result)
            self._future.set_result(self._value)
        finally:  # so a wait() or is_completed() that sees this finds both futures done
            self._done.set()

    def _unwrap(self, future: torch.futures.Future) -> list[torch.Tensor]:
        """The public future's value: the operation's tensors, or its error raised (torch
        holds it as a RuntimeError naming it: a Python callback's error crosses C++ so)."""
        if self._error is not None:
            raise self._error
        return future.value()

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        """Block until the operation is complete and raise its error if it failed.

        ``timeout`` (torch's; zero: none) bounds this wait only; the communicator's own
        timeout (the group's, or ``CUPYCOLL_TIMEOUT``) bounds the operation itself. On CUDA
        the current stream is then ordered after the result (the Future's event).
        """
        seconds = timeout.total_seconds() if timeout else 0.0
        if not self._done.wait(seconds if seconds > 0 else None):
            raise dist_error(CollectiveTimeout(
                f"{self._verb}: Work.wait(timeout={timeout}) expired before the operation "
                "completed (the operation itself goes on)", op_name=self._verb))
        if self._error is not None:
            raise self._error
        self._future.wait()
        return True

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        """The Future DDP and callbacks read; asked for before the operation completed, it is
        completed in a settler thread (where its callbacks run), else this waits for the
        completion under way (no callback of anyone's runs in it: it is short)."""
        with self._lock:
            self._shared = True
            inline = self._inline
        if inline:
            self._done.wait()
        return self._public

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._value
