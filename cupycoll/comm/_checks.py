"""The Communicator's own verbs check what a caller passes them (the front doors check their
arguments before any of this; an algorithm's calls are right by construction): a bad one is
the library's error naming the argument and the rank, raised before anything is posted, so
no message of a refused call is left to match the next call's."""

from __future__ import annotations

import zlib
from typing import Any, Callable, Sequence

import numpy as np

from .._agreement import ranks_text
from ..errors import ELSEWHERE, CupycollError, InvalidArgument, MismatchError

__all__ = ["rank_of", "check_peers", "check_counts", "check_sends", "agreed_settings",
           "BARRIER_CHECKS", "before_barrier"]

#: what a Communicator's ``barrier()`` runs first: cupycoll.collectives adds its CUPYCOLL_DEBUG
#: agreement (a barrier crossed with another verb then raises MismatchError on every rank)
BARRIER_CHECKS: list[Callable[[Any], None]] = []


def before_barrier(comm: Any) -> None:
    for check in BARRIER_CHECKS:
        check(comm)


def agreed_settings(group: Any, parse: Callable[[], Any],
                    wait: Callable[[Any, str], None] | None = None,
                    same: Callable[[Any], dict[str, Any]] | None = None) -> Any:
    """``parse()``'s value (settings read as a communicator is made), its failure agreed over
    the mpi4py ``group`` (one allgather, in the collective making): a CupycollError on any
    rank raises on every rank (that rank its own, naming it; the others InvalidArgument naming
    that rank and its message), never on one rank while the others wait in the next
    collective, and before any communicator is duplicated (none is left behind).
    ``wait(request, op_name)``: how the ranks' flags are waited for (a communicator's timed
    host wait; default MPI's blocking allgather). ``same(value)``: settings every rank must
    share (by name), compared in the same allgather (with ``wait``: their digest):
    MismatchError naming each rank's where they differ."""
    rank = group.Get_rank()
    try:
        value, error = parse(), None
    except CupycollError as exc:
        value, error = None, exc
    mine = None if error is None else (getattr(error, "argument", None), str(error))
    shared = same(value) if same is not None and error is None else None
    if wait is not None:  # flags and a digest under the timeout; the rest only if one differs
        flags = np.zeros((group.Get_size(), 2), np.int64)
        digest = zlib.crc32(repr(shared).encode())
        wait(group.Iallgather(np.array([error is not None, digest], np.int64), flags),
             "a new communicator's settings")
        if not flags[:, 0].any() and len(set(flags[:, 1].tolist())) == 1:
            return value
    gathered = group.allgather((mine, shared))
    failed = [(r, f) for r, (f, _) in enumerate(gathered) if f is not None]
    if isinstance(error, InvalidArgument):
        raise InvalidArgument(error.argument, error.value, error.reason, rank=rank) from None
    if error is not None:
        raise error
    if failed:
        bad, (argument, message) = failed[0]
        raise InvalidArgument(argument or "settings", ELSEWHERE, f"rank {bad} refused "
                              f"its settings ({message}); every rank raises", rank=bad)
    if same is not None:
        _same_everywhere([shared for _, shared in gathered])
    return value


def _same_everywhere(shared: list[dict[str, Any]]) -> None:
    """Raise MismatchError naming each setting whose value differs between ranks."""
    differ = []
    for name in shared[0]:
        passed: dict[Any, list[int]] = {}
        for rank, values in enumerate(shared):
            passed.setdefault(values[name], []).append(rank)
        if len(passed) > 1:
            differ.append(f"{name} (" + "; ".join(f"{value!r} on {ranks_text(ranks)}" for
                                                   value, ranks in passed.items()) + ")")
    if differ:
        raise MismatchError(f"ranks made a communicator with different settings: "
                            f"{', '.join(differ)}")


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
