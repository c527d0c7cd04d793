"""Every rank's NCCL calls, compared across ranks: same calls, same order, matching sends."""

from __future__ import annotations

import hashlib
from typing import Any

from mpi4py import MPI

from . import device as dev
from .nccl_core import MISMATCHED, STATE
from .runtime import FREED_EARLY

__all__ = ["COMMS", "GLOBAL_LOG", "RACES", "check_logs"]

#: every emulated communicator of this process, and its launches in order over all of them,
#: each the list of (uid, call) launched together (one call, or an NCCL group's calls).
COMMS: list[Any] = []
GLOBAL_LOG: list[list[tuple[bytes, tuple]]] = []
#: aborts that ran while another host thread was inside a call of a blocking communicator.
RACES: list[str] = []


def check_logs() -> None:
    """Compare every rank's NCCL calls (collective over COMM_WORLD); then start new logs.

    Per communicator, every member must have made the same collective calls (operation, count,
    dtype, op, root) in the same order, and the k-th send from a to b must match the k-th recv at
    b from a; across communicators, two ranks must have launched what they both take part in
    (the collectives of the communicators they share, the point-to-point calls between the
    two; the calls of one NCCL group as one launch) in the same order; no rank may have freed
    pinned host memory that a queued device-to-host copy writes (``runtime.empty_pinned``), nor
    aborted a blocking communicator while another thread was inside one of its calls. Raises
    EmulationError (on every rank) naming the first difference.
    """
    world = MPI.COMM_WORLD
    mine = {"comms": {c.uid: (c._rank, c.world_ranks, list(c.log)) for c in COMMS
                      if not c.aborted  # an aborted communicator's calls need not match
                      and c.world_ranks is not None},  # nor one whose init never finished
            "gone": {c.uid for c in COMMS if c.aborted or c.world_ranks is None},
            "global": list(GLOBAL_LOG),
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
            if theirs is None and uid in every[world_rank]["gone"]:
                continue  # that rank aborted it (its calls need not match)
            if theirs is None:
                raise dev.EmulationError(
                    f"communicator {_name(uid)} of world rank {me} (its rank {rank}) does not "
                    f"exist on world rank {world_rank}, its rank {r}: the ranks' inits or "
                    "splits differ (NCCL would hang)")
            other = [e for e in theirs[2] if e[0] not in ("send", "recv")]
            if other != coll:
                raise dev.EmulationError(_diff(f"collectives of communicator {_name(uid)}",
                                               me, coll, world_rank, other))
            sent = [e[2:] for e in theirs[2] if e[0] == "send" and e[1] == rank]
            got = [e[2:] for e in log if e[0] == "recv" and e[1] == r]
            if sent != got:
                raise dev.EmulationError(_diff(f"sends from rank {r} to rank {rank}",
                                               me, got, world_rank, sent))
    for r, theirs in enumerate(every):
        if r == me:
            continue
        both = [uid for uid in mine["comms"] if uid in theirs["comms"]]
        a = _between(mine["global"], {uid: mine["comms"][uid][1] for uid in both}, me, r)
        b = _between(theirs["global"], {uid: theirs["comms"][uid][1] for uid in both}, r, me)
        if a != b:
            raise dev.EmulationError(_diff("launch order of what two ranks share across "
                                           "communicators", me, a, r, b))


def _between(launches: list, members: dict[bytes, list[int]], me: int, other: int) -> list:
    """``me``'s launches that world rank ``other`` takes part in, in order, each the set of
    its calls that concern the two: collectives of the communicators in ``members`` (uid ->
    world ranks) and the point-to-point calls between the two, as (communicator, "p2p",
    sender, receiver, count, datatype) (a group's calls launch together: one set)."""
    out, names = [], {uid: _name(uid) for uid in members}
    for launch in launches:
        items = set()
        for uid, entry in launch:
            ranks = members.get(uid)
            if ranks is None:
                continue
            if entry[0] not in ("send", "recv"):
                items.add((names[uid], *entry))
            elif ranks[entry[1]] == other:
                pair = (me, other) if entry[0] == "send" else (other, me)
                items.add((names[uid], "p2p", *pair, *entry[2:]))
        if items:
            out.append(frozenset(items))
    return out


def _name(uid: bytes) -> str:
    """A communicator's short name (its unique id's digest: every rank's the same)."""
    return "comm " + hashlib.blake2b(uid, digest_size=4).hexdigest()


def _diff(what: str, me: int, mine: list, other: int, theirs: list) -> str:
    k = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine),
                                                                             len(theirs)))
    return (f"NCCL calls differ across ranks ({what}): at call {k}, world rank {me} has "
            f"{mine[k] if k < len(mine) else 'nothing'}, world rank {other} has "
            f"{theirs[k] if k < len(theirs) else 'nothing'} (NCCL would hang or mix data)")
