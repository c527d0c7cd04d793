"""The header of every validating allreduce: which verb each rank called, at which collective.

``sparse_allreduce``, ``topk_allreduce``, ``TopkCompressor.step`` and (with ``CUPYCOLL_DEBUG``)
the dense verbs agree on their arguments with one small int64 MAX-allreduce before any data
moves. All of them send a vector of the same length (:func:`length`) that starts with the same
header: +/- a code of the verb and +/- the communicator's collective count. So when ranks call
different verbs, their validation allreduces still match each other, and every rank sees that
max != -max(-x) for the verb (or for the count, when a rank skipped or added a collective) and
raises :class:`~cupycoll.errors.MismatchError` naming both sides, before anything has moved;
the communicator stays usable.

The payload ends with one slot of :func:`slot_words` words per rank (INT64_MIN, neutral for
MAX, except where its owner writes), so a MAX-allreduce is also an allgather of small blocks:
``sparse_allreduce`` ships the entries of a small call there (:mod:`cupycoll.sparse.small`).
The slots add at most :data:`SLOT_WORDS_TOTAL` words in all, none above 32 ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._types import ReduceOp, to_host
from .errors import MismatchError

__all__ = ["VERBS", "HEADER", "SLOT_WORDS_TOTAL", "length", "slot_words", "slot_start", "start",
           "settle"]

#: the verbs that validate collectively (codes are positions + 1).
VERBS = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "sparse_allreduce",
         "topk_allreduce", "TopkCompressor.step")
HEADER = 4
_CODES = {verb: code for code, verb in enumerate(VERBS, 1)}
#: size -> a payload of INT64_MIN that start() copies (a copy costs less than a fill)
_BLANK: dict[int, np.ndarray] = {}
_MIN = np.iinfo(np.int64).min
#: the longest payload is sparse_allreduce's: 20 fixed words and 3 per rank (sparse/_cost.py).
_FIXED, _PER_RANK = 20, 3
#: int64 words of the entry slots of all ranks together (2 KiB); a slot under _MIN_SLOT words
#: (P > 32) is dropped, so the slots never cost more than 2 KiB and nothing at large P.
SLOT_WORDS_TOTAL, _MIN_SLOT = 256, 8


def slot_words(size: int) -> int:
    """int64 words of each rank's entry slot on ``size`` ranks (0: no slots)."""
    words = SLOT_WORDS_TOTAL // size
    return words if words >= _MIN_SLOT else 0


def slot_start(size: int, rank: int) -> int:
    """Position in the agreement vector of the first word of ``rank``'s entry slot."""
    return HEADER + _FIXED + _PER_RANK * size + rank * slot_words(size)


def length(size: int) -> int:
    """Length of every agreement vector on ``size`` ranks (header + the longest payload, the
    entry slots included)."""
    return HEADER + _FIXED + (_PER_RANK + slot_words(size)) * size


def start(comm: Any, verb: str) -> np.ndarray:
    """A new agreement vector: the header filled in, the payload INT64_MIN (neutral for MAX).

    Callers fill ``vec[HEADER:]`` (at most ``length(P) - HEADER`` words) and pass it to
    :func:`settle`.
    """
    blank = _BLANK.get(comm.size)
    if blank is None:
        blank = _BLANK[comm.size] = np.full(length(comm.size), _MIN, dtype=np.int64)
    vec = blank.copy()
    code, seq = _CODES[verb], comm.sequence
    vec[0], vec[1], vec[2], vec[3] = code, -code, seq, -seq
    return vec


def settle(comm: Any, vec: np.ndarray, verb: str, op_name: str) -> np.ndarray:
    """Run the agreement allreduce (MAX); return the reduced payload (host).

    ``vec`` is the host vector of :func:`start`, or its copy on ``comm``'s device (where
    entries were written into the slots without a host round trip).

    Raises:
        MismatchError: (on every rank) the ranks called different verbs, or this call is not
            the same collective of the communicator on every rank.
    """
    dev = vec if comm.xp is np else comm.xp.asarray(vec)
    out = comm.run_fetch("allreduce", dev, dev, ReduceOp.MAX, result=dev, op_name=op_name)
    high, low, last, first = out[:HEADER].tolist()
    low, first = -low, -first
    if low != high:
        raise MismatchError(
            f"ranks called different collectives at the same point: {_verb(low)} and "
            f"{_verb(high)} (rank {comm.rank} called {verb}); nothing was moved, every rank "
            "raises this")
    if first != last:
        raise MismatchError(
            f"ranks reached {verb} at different points: after {first} collectives on some "
            f"ranks, {last} on others (rank {comm.rank}: {comm.sequence - 1}); a rank skipped "
            "or added a call (e.g. it raised between collectives); nothing was moved")
    return out[HEADER:]


def _verb(code: int) -> str:
    return VERBS[code - 1] if 1 <= code <= len(VERBS) else f"an unknown collective ({code})"
