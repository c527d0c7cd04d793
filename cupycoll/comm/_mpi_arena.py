"""Blocks a rank's peers on its node read in place: the exchange arena of an MPI communicator.

MPICH moves a large message between two ranks of a node with one copy, made by the receiver
(the kernel's ``process_vm_readv``); the receiver then reads its copy once more to merge it.
An algorithm whose ranks all share one node can instead write each block it sends into its
segment of one MPI shared-memory window and send its peer only where the block lies: the peer
merges straight from that memory. No byte is copied; the traffic booked in ``comm.stats`` is
the same as a copied block's (the bytes and the one message it stands for).

A block must stay as written until every peer that reads it is done. The window is in two
halves, taken in turn by consecutive calls that use the arena: call c writes half c mod 2, so
half c mod 2 is written again in call c + 2, and between the two every peer that read it in
call c has sent this rank a message of call c + 1 (recursive doubling's partners are the same
in every call), which it does only once it finished call c. The window is made, and remade
larger, by the calls that use it: a collective step every rank takes at the same call, from
sizes every rank knows alike (the call's agreed counts). It lives until MPI finalizes, as the
arrival board's does.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Sequence

import numpy as np

from ._checks import check_peers
from ._mpi_pairwise import earlier_first
from .mpi import _TAG, MPICommunicator

__all__ = ["Arena", "arena_for", "shares_node", "fits", "FROM", "MOST"]

_ALIGN = 64  # bytes: each block starts on a cache line
#: the fewest bytes a half of the window holds (a smaller first call's window grows less often)
_LEAST = 1 << 20
#: the most bytes a half of the window holds; a call that needs more copies its blocks
MOST = 1 << 30
#: the fewest bytes (a call's bound, :func:`~cupycoll.sparse.recursive_doubling.arena_bytes`)
#: for which a call uses the arena: its own steps cost a call some tens of microseconds, what
#: MPI's copy of some tens of KiB costs (bench/dev/bench_arena.py, docs/sparse.md)
FROM = 64 << 10
#: where MPICH maps shared-memory windows from (tmpfs, often small in containers)
SHARED_FS = "/dev/shm"
_ARENAS: "weakref.WeakKeyDictionary[Any, Arena]" = weakref.WeakKeyDictionary()
_REFUSED: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # sizes past room


class Arena:
    """The shared window of one communicator: ``half`` bytes for each of two halves a rank."""

    def __init__(self, mpi_comm: Any, half: int) -> None:
        from mpi4py import MPI

        self.half = half
        self._window = MPI.Win.Allocate_shared(2 * half, 1, comm=mpi_comm)
        self._window.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch, for Sync (memory order)
        self.segments = [np.frombuffer(self._window.Shared_query(r)[0], np.uint8)
                         for r in range(mpi_comm.Get_size())]
        self.mine = self.segments[mpi_comm.Get_rank()]
        self._base = self.mine.ctypes.data  # the address blocks' offsets count from
        self.calls, self._used = 0, 0

    def free(self) -> None:
        """Free the window (collective)."""
        self._window.Unlock_all()
        self._window.Free()

    def begin(self) -> None:
        """A call that uses the arena starts: its blocks go into the next half."""
        self.calls += 1
        self._used = 0

    def block(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of this call's half, after the blocks taken before it in the call."""
        if self._used + nbytes > self.half:  # the call's bound (arena_for) keeps it in
            raise AssertionError(f"exchange arena: {nbytes} bytes past a half of {self.half}")
        start = (self.calls % 2) * self.half + self._used
        self._used += -(-nbytes // _ALIGN) * _ALIGN
        return self.mine[start:start + nbytes]

    def holds(self, array: Any) -> bool:
        """Whether ``array`` is memory of the window (this rank's or a peer's segment)."""
        return isinstance(array, np.ndarray) and any(
            np.may_share_memory(array, segment) for segment in self.segments)

    def exchange(self, comm: Any, sends: Sequence[tuple[int, Any]],
                 recvs: Sequence[tuple[int, Any]], op_name: str) -> list[Any]:
        """``comm.exchange`` of blocks where a block of this rank's segment travels as where
        it lies, and a receive given as a byte count (not a buffer) is answered with the
        peer's block in place; other blocks travel as bytes (an empty block, which has no
        place, as no bytes). Books what ``exchange`` books. Returns the received blocks, in
        ``recvs``' order."""
        check_peers(comm, sends, recvs)
        earlier_first(comm)
        comm.stats.record(op_name)
        mpi, requests, peers, landed = comm.mpi_comm, [], [], []
        for peer, want in recvs:
            into = np.empty(2, np.int64) if isinstance(want, int) else want
            landed.append(into)
            requests.append(mpi.Irecv(into.reshape(-1).view(np.uint8), source=peer, tag=_TAG))
            peers.append(peer)
            comm.stats.record(op_name, received=want if isinstance(want, int) else want.nbytes,
                              msgs_received=1)
        self._window.Sync()  # the blocks written before their places are sent
        for peer, block in sends:
            data = block.reshape(-1).view(np.uint8)
            if np.may_share_memory(block, self.mine):
                offset = data.ctypes.data - self._base
                data = np.array([offset, block.nbytes], np.int64)
            landed.append(data)  # (kept alive until sent)
            requests.append(mpi.Isend(data, dest=peer, tag=_TAG))
            peers.append(peer)
            comm.stats.record(op_name, sent=block.nbytes, msgs_sent=1)
        comm._work(requests, op_name, None, tuple(landed), peers).wait()
        self._window.Sync()
        return [into if not isinstance(want, int) else self.mine[:0] if want == 0 else
                self.segments[peer][int(into[0]):int(into[0]) + want]
                for (peer, want), into in zip(recvs, landed)]


def arena_for(comm: Any, half: int) -> Arena | None:
    """``comm``'s arena with at least ``half`` bytes a half (made or remade so: collective, at
    the same call on every rank), or None where ``comm`` has none for this call: not an MPI
    communicator of host arrays, its ranks on more than one node, the call below
    :data:`FROM` bytes, or the window too large
    (more than :data:`MOST` a half, or more than half the free space of the shared-memory file
    system on some rank: a window past the free space faults, SIGBUS, when written)."""
    if not (shares_node(comm) and fits(comm, half)):
        return None
    found = _ARENAS.get(comm)
    if found is not None and found.half >= half:
        return found
    size = _rounded(half)
    from mpi4py import MPI

    comm.host_arrival("the exchange arena")  # MPI's calls below have no timeout of their own
    if not comm.mpi_comm.allreduce(_room(2 * size * comm.size), op=MPI.LAND):
        _REFUSED[comm] = size  # (every rank alike: none asks again at this size or more)
        return None
    if found is not None:  # every rank is past the calls that read it (see above)
        found.free()
    found = _ARENAS[comm] = Arena(comm.mpi_comm, size)
    return found


def shares_node(comm: Any) -> bool:
    """Whether ``comm`` may have an arena: an MPI communicator of host arrays, two ranks or
    more, all on one node (every rank alike)."""
    return (type(comm) is MPICommunicator and comm.size > 1 and comm.xp is np
            and comm.board is not None and comm.board.one_node)


def fits(comm: Any, half: int) -> bool:
    """Whether a call of ``half`` bytes takes ``comm``'s arena (:func:`shares_node`): from
    :data:`FROM` bytes, within :data:`MOST` and below a size refused for room (every rank
    alike)."""
    size = _rounded(half)
    return half >= FROM and size <= MOST and size < _REFUSED.get(comm, size + 1)


def _rounded(half: int) -> int:
    """The half a window is made with for ``half`` bytes: a power of two, :data:`_LEAST` at
    least."""
    size = _LEAST
    while size < half:
        size *= 2
    return size


def _room(nbytes: int) -> bool:
    """Whether the shared-memory file system has ``nbytes`` free, twice over."""
    try:
        fs = os.statvfs(SHARED_FS)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize >= 2 * nbytes
