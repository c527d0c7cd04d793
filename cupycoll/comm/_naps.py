"""How long a host wait sleeps between two polls once it has stopped spinning: in proportion
to the time it has waited, so a long wait (a late peer, a timeout) wakes ever more rarely and
leaves its core to others, while its result is noticed at most a fixed share of that time late.
Both backends' waits sleep this way (``comm.mpi``'s ``_poll``, ``_nccl_guard.spin``)."""

from __future__ import annotations

import threading

__all__ = ["nap", "NAP_MIN", "NAP_MAX", "NAP_SHARE", "CROWDED_SPIN", "helper_thread",
           "in_helper_thread"]

#: the shortest and the longest sleep between two polls (seconds)
NAP_MIN, NAP_MAX = 1e-4, 1e-3
#: a sleep is at most this share of the time waited so far (unless NAP_MIN is more)
NAP_SHARE = 0.02
#: the seconds an MPI wait spins before it naps where its node's ranks outnumber the cores
#: they may run on (unless ``CUPYCOLL_SPIN`` is set), except a caller's own wait while every
#: rank of the node is inside the collective (``Board.arrived``): it covers a small call's wait
#: for peers that are communicating too, and leaves the core soon to a peer that computes
#: (docs/failures.md)
CROWDED_SPIN = 1e-3
_HELPER = threading.local()  # .on: this thread is one of cupycoll's own (see helper_thread)


def nap(waited: float) -> float:
    """Seconds to sleep before the next poll of a wait that has lasted ``waited`` seconds."""
    return min(NAP_MAX, max(NAP_MIN, NAP_SHARE * waited))


def helper_thread() -> None:
    """Mark the calling thread as one of cupycoll's own (the completer, a background worker):
    its waits finish calls beside the thread that made them, which may be computing."""
    _HELPER.on = True


def in_helper_thread() -> bool:
    """Whether :func:`helper_thread` marked the calling thread."""
    return getattr(_HELPER, "on", False)
