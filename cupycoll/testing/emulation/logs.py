"""Every rank's NCCL calls, compared across ranks: same calls, same order, matching sends."""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from . import device as dev
from .nccl_core import MISMATCHED, STATE
from .runtime import FREED_EARLY

__all__ = ["COMMS", "GLOBAL_LOG", "RACES", "check_logs"]

#: every emulated communicator of this process, and (uid, call) in launch order over all of them.
COMMS: list[Any] = []
GLOBAL_LOG: list[tuple[bytes, tuple]] = []
#: aborts that ran while another host thread was inside a call of a blocking communicator.
RACES: list[str] = []


def check_logs() -> None:
    """Compare every rank's NCCL calls (collective over COMM_WORLD); then start new logs.

    Per communicator, every member must have made the same collective calls (operation, count,
    dtype, op, root) in the same order, and the k-th send from a to b must match the k-th recv at
    b from a; across communicators, two ranks must have launched the collectives of the
    communicators they share in the same global order; no rank may have freed pinned host
    memory that a queued device-to-host copy writes (``runtime.empty_pinned``), nor aborted a
    blocking communicator while another thread was inside one of its calls. Raises
    EmulationError (on every rank) naming the first difference.
    """
    world = MPI.COMM_WORLD
    mine = {"comms": {c.uid: (c._rank, c.world_ranks, list(c.log)) for c in COMMS
                      if not c.aborted  # an aborted communicator's calls need not match
                      and c.world_ranks is not None},  # nor one whose init never finished
            "global": [(uid, e) for uid, e in GLOBAL_LOG if e[0] not in ("send", "recv")],
            "freed_early": list(FREED_EARLY) + list(RACES) + list(MISMATCHED)}
    every = STATE["boot"].allgather(mine)
    for c in COMMS:
        c.log = []
    GLOBAL_LOG.clear()
    FREED_EARLY.clear()
    RACES.clear()
    MISMATCHED.clear()
    freed = [(r, text) for r, theirs in enumerate(every) for text in theirs["freed_early"]]
    if freed:
        raise dev.EmulationError(f"world rank {freed[0][0]}: {freed[0][1]} ({len(freed)} such "
                                 "findings in all)")
    me = world.Get_rank()
    for uid, (rank, members, log) in mine["comms"].items():
        coll = [e for e in log if e[0] not in ("send", "recv")]
        for r, world_rank in enumerate(members):
            theirs = every[world_rank]["comms"].get(uid)
            if theirs is None:
                continue  # that rank already destroyed it (its log went with it)
            other = [e for e in theirs[2] if e[0] not in ("send", "recv")]
            if other != coll:
                raise dev.EmulationError(_diff(f"collectives of communicator {uid[:12].hex()}",
                                               me, coll, world_rank, other))
            sent = [e[2:] for e in theirs[2] if e[0] == "send" and e[1] == rank]
            got = [e[2:] for e in log if e[0] == "recv" and e[1] == r]
            if sent != got:
                raise dev.EmulationError(_diff(f"sends from rank {r} to rank {rank}",
                                               me, got, world_rank, sent))
    shared = set(mine["comms"])
    for r, theirs in enumerate(every):
        both = shared & set(theirs["comms"])
        a = [x for x in mine["global"] if x[0] in both]
        b = [x for x in theirs["global"] if x[0] in both]
        if a != b:
            raise dev.EmulationError(_diff("global launch order of shared communicators",
                                           me, a, r, b))


def _diff(what: str, me: int, mine: list, other: int, theirs: list) -> str:
    k = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine),
                                                                             len(theirs)))
    return (f"NCCL calls differ across ranks ({what}): at call {k}, world rank {me} has "
            f"{mine[k] if k < len(mine) else 'nothing'}, world rank {other} has "
            f"{theirs[k] if k < len(theirs) else 'nothing'} (NCCL would hang or mix data)")
