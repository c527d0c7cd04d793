"""The Communicator's own verbs check what a caller passes them (the front doors check their
arguments before any of this; an algorithm's calls are right by construction): a bad one is
the library's error naming the argument and the rank, raised before anything is posted, so
no message of a refused call is left to match the next call's."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import InvalidArgument

__all__ = ["rank_of", "check_peers", "check_counts", "check_sends"]


def rank_of(comm: Any, value: Any, argument: str) -> int:
    """``value`` (a peer or a root) as a rank of ``comm``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not 0 <= value < comm.size:
        raise InvalidArgument(argument, value, f"must be a rank in [0, {comm.size})",
                              rank=comm.rank)
    return int(value)


def check_peers(comm: Any, sends: Sequence[tuple[int, Any]],
                recvs: Sequence[tuple[int, Any]]) -> None:
    """Every peer of an ``exchange`` a rank of ``comm``."""
    for argument, pairs in (("sends", sends), ("recvs", recvs)):
        for peer, _ in pairs:
            rank_of(comm, peer, argument)


def check_counts(comm: Any, counts: Any, rows: int) -> np.ndarray:
    """An ``allgatherv``'s ``counts`` as int64: one per rank, none negative, this rank's its
    own ``rows``."""
    got = np.asarray(counts)
    if got.shape != (comm.size,) or got.dtype.kind not in "iu" or (got < 0).any() or \
            int(got[comm.rank]) != rows:
        raise InvalidArgument("counts", counts, f"one row count per rank ({comm.size}), none "
                              f"negative, this rank's its own ({rows})", rank=comm.rank)
    return got.astype(np.int64, copy=False)


def check_sends(comm: Any, sends: Sequence[Any]) -> None:
    """An ``alltoallv``'s ``sends``: one array per rank."""
    if len(sends) != comm.size:
        raise InvalidArgument("sends", f"{len(sends)} arrays", f"one array per rank "
                              f"({comm.size})", rank=comm.rank)
