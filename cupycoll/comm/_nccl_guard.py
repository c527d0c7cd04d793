"""What keeps an NCCL job from hanging: a watchdog for blocking enqueues, an agreed init.

Since NCCL 2.22 the first collective of a communicator and the first send/recv with each peer
connect inside the call, so a missing peer blocks the *host* before any wait could time out;
:class:`Watchdog` aborts the communicator when such a call outlives ``CUPYCOLL_TIMEOUT``, which
makes the blocked call return. ``ncclCommInitRank`` blocks until every rank has joined, so a
rank whose init fails would leave the others waiting forever; :func:`agreed_init` runs the init
in a helper thread and agrees on its outcome over MPI, with the timeout.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Iterator

from ..errors import BackendUnavailable, CollectiveTimeout

__all__ = ["Watchdog", "agreed_init"]

_log = logging.getLogger("cupycoll")
_INIT_TAG = 4711


class Watchdog:
    """One daemon thread per communicator: ``expire()`` runs if an armed call outlives its time."""

    def __init__(self, expire: Callable[[], None]) -> None:
        self._expire = expire
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._thread: threading.Thread | None = None
        self.fired = False

    @contextlib.contextmanager
    def armed(self, seconds: float | None) -> Iterator[None]:
        """Run the body; if it takes longer than ``seconds``, ``expire()`` runs (on the thread)."""
        if seconds is None:
            yield
            return
        with self._cond:
            self.fired = False
            self._deadline = time.monotonic() + seconds
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True,
                                                name="cupycoll-nccl-watchdog")
                self._thread.start()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._deadline = None

    def _serve(self) -> None:
        while True:
            with self._cond:
                while self._deadline is None:
                    self._cond.wait()
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline, self.fired = None, True
            self._expire()


def agreed_init(mpi_comm: Any, init: Callable[[], Any], timeout: float | None,
                describe: str) -> Any:
    """Run ``init()`` (a blocking ``ncclCommInitRank``) so that no rank waits forever (collective).

    Each rank runs its init in a helper thread and tells every other rank the outcome over MPI.
    Returns this rank's communicator once every rank reported success. Raises
    :class:`BackendUnavailable` on every rank as soon as any rank's init failed (naming it), and
    :class:`CollectiveTimeout` when ``timeout`` seconds pass first (naming the ranks that never
    reported). A helper thread still blocked then is left behind (NCCL cannot cancel an init).
    """
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["comm"] = init()
        except Exception as exc:  # reported to every rank below
            box["error"] = f"{type(exc).__name__}: {exc}"

    if size == 1:
        run()
        if "error" in box:
            raise BackendUnavailable(f"ncclCommInitRank failed on rank 0 of 1 ({describe}): "
                                     f"{box['error']}")
        return box["comm"]
    thread = threading.Thread(target=run, daemon=True, name="cupycoll-nccl-init")
    thread.start()
    peers = [r for r in range(size) if r != rank]
    inbox = {r: mpi_comm.irecv(source=r, tag=_INIT_TAG) for r in peers}
    outcome: dict[int, str | None] = {}
    sent: list = []
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 1e-4
    while True:
        if not sent and not thread.is_alive():
            outcome[rank] = box.get("error")
            sent = [mpi_comm.isend(outcome[rank], dest=r, tag=_INIT_TAG) for r in peers]
        for r in [r for r in inbox if r not in outcome]:
            done, message = inbox[r].test()
            if done:
                outcome[r] = message
        failed = sorted(r for r, error in outcome.items() if error)
        if failed:
            break
        if len(outcome) == size:
            for request in sent:
                request.wait()
            return box["comm"]
        if deadline is not None and time.monotonic() > deadline:
            missing = sorted(set(range(size)) - set(outcome))
            raise CollectiveTimeout(f"ncclCommInitRank did not complete within {timeout} s on "
                                    f"rank {rank} of {size} ({describe}): no outcome from "
                                    f"rank(s) {missing}")
        time.sleep(pause)
        pause = min(2 * pause, 1e-2)
    if "comm" in box:
        with contextlib.suppress(Exception):
            box["comm"].abort()
    _log.warning("cupycoll: rank %d gives up NCCL init (failed on ranks %s)", rank, failed)
    shown = rank if rank in failed else failed[0]
    raise BackendUnavailable(f"ncclCommInitRank failed on rank(s) {failed} of {size}; rank "
                             f"{shown} ({describe if shown == rank else 'see its own error'}): "
                             f"{outcome[shown]}")
