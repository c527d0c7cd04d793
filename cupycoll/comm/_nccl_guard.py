"""What keeps an NCCL job from hanging: host waits that notice completion at once, a watchdog
for operations nobody waits on, an agreed init.

:func:`spin` is the one host wait of the NCCL backend: it polls, yielding the GIL between polls
(a completed event is noticed within a poll, where even a short sleep lasts the kernel's timer
slack), and sleeps short slices only once a wait has lasted a few milliseconds (a long wait does
not burn a core). :data:`WATCHDOG` is one daemon thread per process: every few milliseconds it
asks each live NCCL communicator to abort if its oldest operation in flight outlived the
timeout, so a stream-ordered call whose peer never comes ends in CollectiveTimeout at the next
call instead of a hang (the communicator serialises the abort with its own NCCL calls).
``ncclCommInitRank`` blocks until every rank has joined, so a rank whose init fails would leave
the others waiting forever; :func:`agreed_init` runs the init in a helper thread and agrees on
its outcome over MPI, with the timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable

from ..errors import BackendUnavailable, CollectiveTimeout
from ._naps import nap

__all__ = ["spin", "WATCHDOG", "agreed_init"]

_log = logging.getLogger("cupycoll")
_INIT_TAG = 4711
#: a host wait polls back to back for BUSY_S seconds, yields between polls up to SPIN_S,
#: then sleeps between polls (:func:`._naps.nap`).
BUSY_S = 2e-5
SPIN_S = 5e-3
#: seconds between two rounds of the watchdog.
WATCH_S = 0.02


def spin(ready: Callable[[], bool]) -> None:
    """Return once ``ready()`` is True: back-to-back polls for the first ``BUSY_S`` seconds,
    then polls that yield the CPU and the GIL (``sched_yield``, under a microsecond;
    ``time.sleep(0)`` would sleep the kernel's timer slack, ~50 us) up to ``SPIN_S`` seconds,
    then sleeps between polls, longer as the wait goes on (:func:`._naps.nap`). ``ready`` may
    raise (a timeout, an error) to end the wait."""
    start = time.monotonic()
    while not ready():
        waited = time.monotonic() - start
        if waited < BUSY_S:
            continue
        if waited < SPIN_S:
            _yield()
        else:
            time.sleep(nap(waited))


_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: time.sleep(0))


class Watchdog:
    """One daemon thread per process that calls ``_expire()`` of every watched communicator
    every ``WATCH_S`` seconds (started with the first communicator)."""

    def __init__(self) -> None:
        self._watched: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, comm: Any) -> None:
        server = None
        with self._lock:
            self._watched.add(comm)
            if self._thread is None or not self._thread.is_alive():
                self._thread = server = threading.Thread(target=self._serve, daemon=True,
                                                         name="cupycoll-nccl-watchdog")
        if server is not None:  # started without the lock, which a finalizer the garbage
            server.start()  # collector runs in the new thread as it starts may take

    def _serve(self) -> None:
        while True:
            time.sleep(WATCH_S)
            with self._lock:
                comms = list(self._watched)
            while comms:  # no reference kept between rounds: a dropped communicator is freed
                comm = comms.pop()
                try:
                    comm._expire()
                except Exception:  # noqa: BLE001  a watchdog never dies of one communicator
                    _log.exception("cupycoll: the NCCL watchdog failed on rank %s",
                                   getattr(comm, "rank", "?"))
                del comm


#: the process's watchdog (see :class:`Watchdog`).
WATCHDOG = Watchdog()


def _give_up(box: dict[str, Any], lock: threading.Lock) -> None:
    """This rank raises instead of returning its communicator: abort it, now if its init has
    made it, else as the init thread makes it (NCCL cannot cancel an init)."""
    with lock:
        box["given_up"] = True
        comm = box.pop("comm", None)
    if comm is not None:
        with contextlib.suppress(Exception):
            comm.abort()


def agreed_init(mpi_comm: Any, init: Callable[[], Any], timeout: float | None,
                describe: str) -> Any:
    """Run ``init()`` (a blocking ``ncclCommInitRank``) so that no rank waits forever (collective).

    Each rank runs its init in a helper thread and tells every other rank the outcome over MPI.
    Returns this rank's communicator once every rank reported success. Raises
    :class:`BackendUnavailable` on every rank as soon as any rank's init failed (naming it), and
    :class:`CollectiveTimeout` when ``timeout`` seconds pass first (naming the ranks that never
    reported). Raising, it aborts this rank's communicator, or leaves that to a helper thread
    still blocked in its init (NCCL cannot cancel an init), which aborts it once made.
    """
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    box: dict[str, Any] = {}
    lock = threading.Lock()

    def run() -> None:
        try:
            comm = init()
        except Exception as exc:  # reported to every rank below
            box["error"] = f"{type(exc).__name__}: {exc}"
            return
        with lock:
            late = box.get("given_up", False)  # made after this rank raised: nobody uses it
            if not late:
                box["comm"] = comm
        if late:
            with contextlib.suppress(Exception):
                comm.abort()

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
            _give_up(box, lock)
            missing = sorted(set(range(size)) - set(outcome))
            raise CollectiveTimeout(f"ncclCommInitRank did not complete within {timeout} s on "
                                    f"rank {rank} of {size} ({describe}): no outcome from "
                                    f"rank(s) {missing}")
        time.sleep(pause)
        pause = min(2 * pause, 1e-2)
    _give_up(box, lock)
    _log.warning("cupycoll: rank %d gives up NCCL init (failed on ranks %s)", rank, failed)
    shown = rank if rank in failed else failed[0]
    raise BackendUnavailable(f"ncclCommInitRank failed on rank(s) {failed} of {size}; rank "
                             f"{shown} ({describe if shown == rank else 'see its own error'}): "
                             f"{outcome[shown]}")
