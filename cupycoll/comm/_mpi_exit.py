"""MPI communicators settled at the interpreter's exit, before mpi4py finalizes MPI.

A rank that ends with a nonblocking operation it never waited for (``async_op=True`` and no
``wait()``) went into ``MPI_Finalize`` with it pending while a peer waited in the same
collective: both hung (or the peer timed out naming nobody). At exit every live MPI
communicator waits for the operations this rank started (the dropped ones too) under its
timeout; a failure there is left to the peers' timeouts.
"""

from __future__ import annotations

import atexit
import time
import weakref
from typing import Any

from ..errors import CupycollError

__all__ = ["settle_at_exit"]

_COMMS: "weakref.WeakSet[Any]" = weakref.WeakSet()
_REGISTERED: list[bool] = []


def settle_at_exit(comm: Any) -> None:
    """Settle ``comm`` at exit (the hook is registered with the first communicator, after
    mpi4py.MPI's own, so it runs before MPI finalizes)."""
    if not _REGISTERED:
        atexit.register(_settle_all)
        _REGISTERED.append(True)
    _COMMS.add(comm)


def _settle_all() -> None:
    for comm in list(_COMMS):
        if comm._fate.error is None:
            _settle(comm)


def _settle(comm: Any) -> None:
    deadline = None if comm.timeout is None else time.monotonic() + comm.timeout
    try:
        for work in list(comm._started):
            work.wait()
        for done, _ in list(comm._orphaned):
            while not done():
                if deadline is not None and time.monotonic() > deadline:
                    return
                time.sleep(1e-3)
    except CupycollError:
        return
