"""A sub-group of a communicator's ranks, seen as a communicator, over the parent's ``exchange``.

The hierarchical algorithms run existing algorithms (split's reduce-scatter, split, allgather)
among the ranks of one node or one rail. :class:`Group` gives them what those algorithms call
(``rank``, ``size``, ``xp``, ``exchange``, ``allgather``, the count verbs,
``_allgatherv_into``, ``run``, ``fetch``, ``stream_order``, the parent's send buffers) for a
subset of the parent's ranks: group rank i is parent rank ``members[i]``, every transfer is a
point-to-point ``exchange`` of the parent (so only the members take part, and other groups run
at the same time), and traffic is booked in the parent's ``stats`` under ``prefix + op_name``.
Its ``allgather`` sends the block to each peer: the same bytes and messages per rank as the
ring a native allgather is booked by, but priced as point-to-point (see
:func:`cupycoll.sparse.hierarchical.cost`).
"""

from __future__ import annotations

from typing import Any, Sequence

from ._base import Communicator, Work

__all__ = ["Group"]


class Group:
    """Parent ranks ``members`` (ascending order is not required) as ranks 0..len-1."""

    native_allgatherv = False

    def __init__(self, parent: Any, members: Sequence[int], prefix: str) -> None:
        self.parent, self.members, self.prefix = parent, tuple(int(m) for m in members), prefix
        self.xp, self.backend = parent.xp, parent.backend
        self.size, self.rank = len(self.members), self.members.index(parent.rank)

    def exchange(self, sends: Sequence[tuple[int, Any]], recvs: Sequence[tuple[int, Any]],
                 op_name: str = "exchange") -> Work:
        """The parent's exchange with group peers mapped to parent ranks."""
        m = self.members
        return self.parent.exchange([(m[r], a) for r, a in sends], [(m[r], b) for r, b in recvs],
                                    self.prefix + op_name)

    def allgather(self, send: Any, recv: Any, op_name: str = "allgather") -> Work:
        """recv = every member's send in group order: one exchange, the block to every peer."""
        blocks = recv.reshape((self.size, -1) + tuple(recv.shape[1:]))
        blocks[self.rank] = send.reshape(blocks.shape[1:])
        peers = [(self.rank + s) % self.size for s in range(1, self.size)]
        return self.exchange([(r, send) for r in peers], [(r, blocks[r]) for r in peers],
                             op_name)

    def fetch(self, work: Work, array: Any) -> Any:
        return self.parent.fetch(work, array)

    def stream_order(self, work: Work) -> None:
        self.parent.stream_order(work)

    def run_fetch(self, verb: str, *args: Any, result: Any, op_name: str) -> Any:
        return self.fetch(getattr(self, verb)(*args, op_name=op_name), result)

    def calling(self, verb: str) -> Any:
        return self.parent.calling(verb)

    def send_buffer(self, nbytes: int) -> Any:
        return self.parent.send_buffer(nbytes)

    def release_send_buffer(self, buffer: Any) -> None:
        self.parent.release_send_buffer(buffer)

    # the derived verbs, as every communicator has them (written over the methods above)
    run = Communicator.run
    _allgatherv_into = Communicator._allgatherv_into
    allgather_counts = Communicator.allgather_counts
    alltoall_device_counts = Communicator.alltoall_device_counts
