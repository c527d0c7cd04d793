"""Background work in call order: one duplicate communicator and one worker thread per communicator.

Async ``sparse_allreduce`` and ``TopkCompressor.step(async_op=True)`` run here, so their
collectives never interleave with the caller's own on ``comm``: every rank submits in the same
order and the single worker runs them in that order.
"""

from __future__ import annotations

import concurrent.futures
# imported now: once the main thread has returned, its import fails (it registers an exit
# hook), and a thread of the program's may call on
import concurrent.futures.thread  # noqa: F401
import sys
import threading
import time
import weakref
from typing import Any, Callable

from .comm import Communicator, Work
from .comm._naps import helper_thread
from .comm._watchdog import late_ranks
from .comm._work import EXIT_WAIT
from .errors import BackendError, InvalidArgument

__all__ = ["runner", "run_async", "run_in_order", "in_call_order"]


class _Runner:
    """A duplicate of a communicator and one worker thread: async calls run in call order."""

    def __init__(self, comm: Communicator) -> None:
        if getattr(type(comm), "dup", None) in (None, Communicator.dup):  # none of its own
            raise InvalidArgument("async_op", True, f"the {comm.backend} communicator cannot be "
                                  "duplicated for background work", rank=comm.rank)
        # every rank here, under the communicator's timeout, before MPI_Comm_dup, which no
        # timeout bounds (a missing peer hung it), and no peer that gave up this barrier
        if getattr(comm, "mpi_comm", None) is not None:
            comm.host_arrival("the background worker's duplicate")
        elif getattr(comm, "barrier", None) is not None:
            comm.barrier()
        self.comm = comm.dup()
        self.comm.stats = comm.stats  # traffic is booked on the caller's communicator
        #: the worker's thread, once it runs
        self.thread: threading.Thread | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "cupycoll-background",
                                                           initializer=self._started)
        _leave_at_exit()
        self._last: concurrent.futures.Future | None = None
        on_close = getattr(comm, "on_close", None)
        if on_close is not None:
            on_close(self.close)

    def _started(self) -> None:
        self.thread = threading.current_thread()
        helper_thread()

    def close(self) -> None:
        """When its communicator closes: the calls queued so far run on, then the duplicate
        is closed and the thread ends (without waiting for them here)."""
        self._pool.submit(self.comm.close)
        self._pool.shutdown(wait=False)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any
               ) -> concurrent.futures.Future:
        """Queue ``fn(*args, **kwargs)`` behind everything submitted before it. Where the pool
        takes nothing more (the interpreter's exit shut it while a thread of the program's
        calls on), it runs here, once the calls before it are done."""
        try:
            self._last = self._pool.submit(fn, *args, **kwargs)
        except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
            if self._last is not None:
                concurrent.futures.wait([self._last])
            self._last = concurrent.futures.Future()
            try:
                self._last.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - the future carries it to wait()
                self._last.set_exception(exc)
        return self._last

    def idle(self) -> bool:
        """Whether everything submitted has run (then the submitting thread may use
        :attr:`comm` itself, in the same call order)."""
        return self._last is None or self._last.done()


_LEAVING: list[bool] = []


def _leave_at_exit() -> None:
    """At the interpreter's exit, before it joins the workers' threads (a hook registered
    after concurrent.futures' own runs before it), give the calls still queued
    :data:`~.comm._work.EXIT_WAIT` seconds, then end those still waiting for peers that never
    come (an unmatched call held the exit for its timeout, for ever without one): their
    communicators die, which ends their waits."""
    if not _LEAVING:
        _LEAVING.append(True)
        try:
            threading._register_atexit(_end_waiting)  # type: ignore[attr-defined]
        except RuntimeError:  # the exit is under way (a thread of the program's made the
            pass  # first runner after the main thread returned): its calls run in that thread


def _end_waiting() -> None:
    """(A forked child's workers, inherited, are dead: nothing to wait for there; while a
    thread of the program's own runs on, it may be waiting for the calls: they run on. Such a
    thread's calls after this, the pools shut, run in that thread: :meth:`_Runner.submit`.
    Waiting here for the thread itself could wait for ever: one may end only after the
    interpreter's later exit hooks, a process pool's manager or a thread joining the main one.)"""
    workers = [w for w in list(_RUNNERS.values()) if w.comm._fate.error is None]
    while any(not w.idle() for w in workers) and _own_threads_run():
        time.sleep(1e-3)
    deadline = time.monotonic() + EXIT_WAIT
    for worker in workers:
        while not worker.idle() and time.monotonic() < deadline:
            time.sleep(1e-3)
        if not worker.idle():
            worker.comm._die(BackendError(
                f"the interpreter exits on rank {worker.comm.rank} with an asynchronous call "
                "waiting for its peers"), "the interpreter's exit")


def _own_threads_run() -> bool:
    """Whether a non-daemon thread of the program's own (not the main one, not an executor's
    worker, which the interpreter ends after this) is still running."""
    executors = getattr(concurrent.futures.thread, "_threads_queues", {})
    return any(t.is_alive() and not t.daemon and t is not threading.main_thread()
               and t not in executors for t in threading.enumerate())


_RUNNERS: "weakref.WeakKeyDictionary[Communicator, _Runner]" = weakref.WeakKeyDictionary()
#: one lock per communicator, held while its runner is made (collective: a barrier and a dup);
#: the process-wide lock guards only the tables, so communicators used from threads of their
#: own make their runners in any order (one lock over all of them crossed ranks' orders)
_MAKING: "weakref.WeakKeyDictionary[Communicator, threading.Lock]" = weakref.WeakKeyDictionary()
_RUNNERS_LOCK = threading.Lock()


def runner(comm: Communicator) -> _Runner:
    """The cached runner of ``comm`` (created collectively on the first async call)."""
    with _RUNNERS_LOCK:
        found = _RUNNERS.get(comm)
        making = found or _MAKING.setdefault(comm, threading.Lock())
    if found is not None:
        return found
    with making:
        with _RUNNERS_LOCK:
            found = _RUNNERS.get(comm)
        if found is None:
            found = _Runner(comm)
            with _RUNNERS_LOCK:
                _RUNNERS[comm] = found
        return found


def run_async(comm: Communicator, fn: Callable[[Communicator], Any],
              finalize: Callable[[Any], Any] = lambda result: result,
              op_name: str = "async") -> Work:
    """Start ``fn(communicator)``; a Work whose result is ``finalize(fn's result)`` (finalize
    runs once, in the thread that waits).

    MPI: ``fn`` runs on ``comm``'s worker over its duplicate. NCCL (a communicator with
    ``stream_work``): ``fn`` runs here, on the caller's device and the communicator's stream,
    since NCCL needs one launch order on every rank, which a second host thread cannot keep;
    the Work's ``wait()`` orders the caller's stream after the device work ``fn`` queued,
    ``synchronize()`` waits for it on the host.
    """
    stream_work = getattr(comm, "stream_work", None)
    if stream_work is not None:
        with comm.in_stream(join=False):
            result = fn(comm)
            done = stream_work(op_name)
        return Work.then(done, lambda: finalize(result))
    device = _callers_device()
    worker = runner(comm)
    future = worker.submit(_on(device, fn), worker.comm)

    def wait() -> None:
        if threading.current_thread() is worker.thread and not future.done():
            raise InvalidArgument(  # (a call's callback: the worker waited for itself)
                "completion_fn", "a wait on the background worker's thread", "a callback "
                "run there (completion_fn, alloc_fn) cannot wait for an asynchronous call "
                "queued behind the one it belongs to; make the call synchronous there",
                rank=comm.rank)
        try:
            concurrent.futures.wait([future])
        except BaseException as exc:  # Ctrl-C: the call runs on in the worker, its peers wait
            comm._interrupted(op_name, type(exc))
            raise

    on = worker.comm  # the duplicate the call's collectives run on: its board names the late
    return Work(wait, future.done, lambda: finalize(future.result()), device=device,
                late=lambda: late_ranks(on.board, on.rank, on.sequence),
                interrupted=lambda kind: comm._interrupted(op_name, kind), op_name=op_name)


def run_in_order(comm: Communicator, fn: Callable[[Communicator], Any],
                 op_name: str = "async") -> Any:
    """``fn(communicator)``'s result, now, in call order with ``comm``'s asynchronous calls:
    on MPI over the worker's duplicate, here when the worker has nothing left to run or this
    is the worker's thread (a ``completion_fn`` of its call: no thread switch), else behind
    what it has (a KeyboardInterrupt of that wait aborts ``comm``, as one of the call's own
    waits does: the queued call then starts nothing; the call's own errors do not); on NCCL,
    or a communicator that has no duplicate of its own, on ``comm``. A call that ranks make
    asynchronously on some and synchronously on others so runs on one communicator in one
    order everywhere."""
    if getattr(comm, "stream_work", None) is not None or \
            getattr(type(comm), "dup", None) in (None, Communicator.dup):
        return fn(comm)
    worker = runner(comm)
    if worker.idle() or threading.current_thread() is worker.thread:
        return fn(worker.comm)
    try:
        return run_async(comm, fn).wait()
    except Exception:  # the call's own error: raised where it arose, as in this thread
        raise
    except BaseException as exc:  # Ctrl-C, a signal handler's exit: the call may be queued
        comm._interrupted(op_name, type(exc))
        raise


def in_call_order(verb: Callable[..., Any]) -> Callable[..., Any]:
    """``verb`` (a front door that takes ``comm=`` and ``async_op=``) run synchronously by
    :func:`run_in_order` on ``comm``, whatever ``async_op`` says."""
    def run(*args: Any, comm: Communicator, async_op: bool = False, **kwargs: Any) -> Any:
        return run_in_order(comm, lambda on: verb(*args, comm=on, **kwargs), verb.__name__)
    return run


def _callers_device() -> Callable[[], Any] | None:
    """What makes the calling thread's current CUDA device current (CuPy's current device is
    per thread: the worker's, and a waiting thread's, may be another), or None where CuPy is
    not in use here."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        number = cupy.cuda.runtime.getDevice()
    except Exception:  # noqa: BLE001 - CuPy without a device: host arrays only
        return None
    return lambda: cupy.cuda.Device(number)


def _on(device: Callable[[], Any] | None, fn: Callable[[Communicator], Any]
        ) -> Callable[[Communicator], Any]:
    """``fn`` run with ``device`` current (as it is)."""
    if device is None:
        return fn

    def run(on: Communicator) -> Any:
        with device():
            return fn(on)
    return run
