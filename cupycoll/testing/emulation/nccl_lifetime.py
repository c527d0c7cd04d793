"""The emulated NCCL communicator's lifetime: non-blocking calls in progress, asynchronous
errors, ``abort()`` (with the race NCCL forbids on a blocking communicator), a peer's abort seen
as a remote error, and ``destroy()``.

:class:`_Lifetime` is mixed into :class:`.nccl.NcclCommunicator`. ``abort()`` from any thread
makes a blocked call or task fail with NcclError, and cancels the communicator's pending
operations: an operation completes only when every partner's live operation confirmed it
arrived, so nothing matches across an aborted communicator (``nccl_core.waitall_confirmed``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ...comm._nccl_config import IN_PROGRESS, blocking_of
from . import device as dev
from .logs import RACES
from .nccl_core import INTERNAL, INVALID_ARGUMENT, REMOTE, STATE, error

__all__: list[str] = []

_ABORT_TAG = 11


class _Lifetime:
    """Progress, errors, abort and destroy of :class:`.nccl.NcclCommunicator` (a mixin)."""

    # ---------------------------------------------------------------- non-blocking calls
    def _in_background(self, what: str, work: Callable[[], Any],
                       then: Callable[[Any], None]) -> None:
        """Run ``work()`` in a thread, ``then(result)`` when ``check_async_error`` sees it done;
        raise ncclInProgress now (what a non-blocking call returns)."""
        box: dict = {}

        def run() -> None:
            try:
                box["result"] = work()
            except BaseException as exc:  # becomes the asynchronous error
                box["error"] = exc

        thread = threading.Thread(target=run, daemon=True, name=f"emulated {what}")
        thread.start()

        def finished() -> bool:
            if thread.is_alive():
                return False
            if "error" in box:
                self.async_error = getattr(box["error"], "status", INTERNAL)
            else:
                then(box["result"])
            return True

        self.in_progress = finished
        raise error(IN_PROGRESS)

    def _settled(self) -> bool:
        """Has the non-blocking call in progress finished (then its effect is applied)?"""
        if self.in_progress is not None and self.in_progress():
            self.in_progress = None
        return self.in_progress is None

    def _inside(self, method: str) -> Any:
        """Mark the calling host thread as inside ``method`` (abort's race check)."""
        return _Inside(self, method)

    # ---------------------------------------------------------------- lifetime
    def _null_after_free(self, method: str) -> None:
        """After destroy/abort CuPy's handle is NULL: NCCL answers ncclInvalidArgument."""
        if self.aborted or self.destroyed:
            getattr(self._real, method)()  # the real binding's NcclError on a NULL comm
            raise error(INVALID_ARGUMENT)

    def check_async_error(self) -> None:
        self._check_real("check_async_error")
        self._null_after_free("check_async_error")
        if not self.aborted and not self._settled():
            raise error(IN_PROGRESS)
        if self.async_error is not None:
            raise error(self.async_error)

    def _check_real(self, method: str) -> None:
        try:
            getattr(self._real, method)()
        except STATE["real"].NcclError:
            pass

    def abort(self) -> None:
        """From any thread: blocked calls and tasks of this communicator fail; peers on other
        nodes see a remote error (their calls fail, their kernels spin until they abort too),
        peers on this node see nothing.

        NCCL frees the communicator in ``ncclCommAbort``; it allows that at any point only for
        a non-blocking communicator. An abort while another host thread is inside a call of a
        blocking one is a use after free on a GPU: recorded, and raised by ``check_logs()``.
        """
        inside = self.calling
        if inside is not None and inside[0] != threading.get_ident() and not self.nonblocking:
            RACES.append(f"ncclCommAbort on rank {self._rank} from thread "
                         f"{threading.current_thread().name} while another thread is inside "
                         f"{inside[1]} on this blocking communicator (NCCL frees the "
                         "communicator under that call)")
        if not self.aborted:
            worlds = self.world_ranks or []  # remote errors reach other nodes only
            self.notices = [self.handshake.Isend(np.zeros(1, np.uint8), dest=r, tag=_ABORT_TAG)
                            for r, world in enumerate(worlds) if r != self._rank and
                            dev.node_of(world) != dev.node_of(worlds[self._rank])]
        self.aborted = True
        if self.async_error is None:
            self.async_error = INTERNAL

    def peer_aborted(self) -> bool:
        """Has a peer on another node aborted (NCCL's remote error, ncclRemoteError)?

        NCCL learns of a dead peer only through its socket-based proxies and bootstrap, i.e.
        across nodes: within a node (NVLink, P2P, SHM) a peer that aborted leaves this rank's
        kernels spinning with no asynchronous error, so only an own timeout gets it out. The
        abort notices go to the peers on other nodes only (``device.node_of``)."""
        if self.async_error is None and self.world_ranks is not None and \
                self.handshake.Iprobe(MPI.ANY_SOURCE, _ABORT_TAG):
            self.async_error = REMOTE
        return self.async_error == REMOTE

    def destroy(self) -> None:
        """``ncclCommDestroy``: wait for this communicator's queued operations (unless aborted),
        then free it. Like NCCL it never returns while a kernel waits for a peer that does not
        come, and raises nothing (a peer's abort does not end the wait; ``abort()`` or
        :func:`release_blocked` does)."""
        if not self.aborted:
            for task in list(self.tasks):
                while not task.finished.wait(0.05) and not self.aborted:
                    pass
        self.destroyed = True


class _Inside:
    """``with comm._inside(method):`` the thread is inside an NCCL call of ``comm``."""

    __slots__ = ("comm", "method", "outer")

    def __init__(self, comm: Any, method: str) -> None:
        self.comm, self.method, self.outer = comm, method, None

    def __enter__(self) -> None:
        self.outer, self.comm.calling = self.comm.calling, (threading.get_ident(), self.method)

    def __exit__(self, *exc: Any) -> None:
        self.comm.calling = self.outer


def _nonblocking(config: Any) -> bool:
    """Whether CuPy's ``NcclConfig`` ``config`` asks for a non-blocking communicator."""
    if config is None:
        return False
    real = getattr(STATE["real"], "NcclConfig", None)
    if real is None or not isinstance(config, real):
        raise TypeError(f"config must be cupy.cuda.nccl.NcclConfig, not {type(config).__name__}")
    return blocking_of(config) == 0
