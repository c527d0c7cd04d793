"""MPI communicators settled at the interpreter's exit, before mpi4py finalizes MPI.

A rank that ends with a nonblocking operation it never waited for (``async_op=True`` and no
``wait()``) went into ``MPI_Finalize`` with it pending while a peer waited in the same
collective: both hung (or the peer timed out naming nobody). At exit every live MPI
communicator tests the operations this rank started (the dropped ones too) until they are
done, a peer on the node has given the communicator up, or :data:`~._work.EXIT_WAIT` seconds
(at most its timeout) pass: peers already waiting complete them in milliseconds, and a peer
that never comes (or an exit on an error) must not hold the exit.
"""

from __future__ import annotations

import atexit
import time
import weakref
from typing import Any

from ._work import EXIT_WAIT

__all__ = ["settle_at_exit"]

_COMMS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def settle_at_exit(comm: Any) -> None:
    """Settle ``comm`` at exit."""
    _COMMS.add(comm)


def _settle_all() -> None:
    for comm in list(_COMMS):
        if comm._fate.error is None:
            _settle(comm)


def _settle(comm: Any) -> None:
    wait = EXIT_WAIT if comm.timeout is None else min(comm.timeout, EXIT_WAIT)
    deadline = time.monotonic() + wait
    pending = [work.is_completed for work in list(comm._started)]
    pending += [done for done, _ in list(comm._orphaned)]
    try:
        while pending:
            pending = [test for test in pending if not test()]
            gave_up = comm.board is not None and comm.board.gave_up(comm.rank, comm.sequence)
            if not pending or gave_up or time.monotonic() > deadline:
                return
            time.sleep(1e-3)
    except Exception:  # noqa: BLE001  (a dead communicator's tests raise: nothing to wait for)
        return


atexit.register(_settle_all)  # imported after mpi4py.MPI (by comm/mpi.py): runs before its
# finalizer
