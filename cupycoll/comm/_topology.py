"""Which node every rank of a communicator runs on, for the node-aware (hierarchical) algorithms.

Nodes come from MPI's shared-memory split (``Split_type(COMM_TYPE_SHARED)``) of the
communicator's host MPI communicator (the MPI backend's own, the NCCL backend's bootstrap one),
plus one allgather of each rank's node leader (its lowest world rank): done once per
communicator, outside ``comm.stats`` (it moves no data of any collective), and cached. A
communicator without a host MPI communicator (an NCCL one made by ``wrap``) counts as one node.
``CUPYCOLL_RANKS_PER_NODE`` overrides the detection (rank // ranks_per_node, the last node
possibly shorter), which emulates several nodes on one machine; it is read at every call.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Sequence

from .._config import setting
from ..errors import InvalidArgument

__all__ = ["Topology", "topology", "node_ids"]

_DETECTED: "weakref.WeakKeyDictionary[Any, tuple[int, ...]]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class Topology:
    """Node of every rank (ids 0.. in the order of each node's lowest rank) and its members."""

    nodes: tuple[int, ...]

    @classmethod
    def of(cls, nodes: Sequence[int]) -> "Topology":
        """Renumber any node labels by first appearance (so node 0 holds rank 0)."""
        first: dict[int, int] = {}
        return cls(tuple(first.setdefault(int(x), len(first)) for x in nodes))

    @property
    def count(self) -> int:
        """Number of nodes."""
        return max(self.nodes) + 1 if self.nodes else 0

    @property
    def members(self) -> list[tuple[int, ...]]:
        """Ranks of every node, ascending, in node order."""
        out: list[list[int]] = [[] for _ in range(self.count)]
        for rank, node in enumerate(self.nodes):
            out[node].append(rank)
        return [tuple(m) for m in out]

    @property
    def width(self) -> int:
        """Ranks on the largest node (the number of regions of the hierarchical algorithm)."""
        return max((len(m) for m in self.members), default=0)


def _detect(comm: Any, per_node: int | None) -> tuple[int, ...]:
    """Node labels (each node's lowest rank) from the host MPI communicator (collective), and
    every rank's ``CUPYCOLL_RANKS_PER_NODE`` compared: one set on some ranks only, or to
    different values, raises InvalidArgument on every rank (node-aware algorithms would run
    different collectives on different ranks)."""
    mpi_comm = getattr(comm, "mpi_comm", None)
    if mpi_comm is None or comm.size == 1:
        return (0,) * comm.size
    from mpi4py import MPI

    comm.host_arrival("node detection")  # MPI's split and allgather below wait forever
    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=mpi_comm.Get_rank())
    try:
        leader = local.bcast(mpi_comm.Get_rank(), root=0)
    finally:
        local.Free()
    gathered = mpi_comm.allgather((leader, per_node))
    settings = [setting for _, setting in gathered]
    if len(set(settings)) > 1:
        usual = max(settings, key=settings.count)  # the value most ranks hold (ties: first)
        odd = next(r for r, value in enumerate(settings) if value != usual)
        raise InvalidArgument("CUPYCOLL_RANKS_PER_NODE", settings[odd], "must be set alike on "
                              f"every rank (ranks 0..{comm.size - 1} hold {settings}; None: "
                              "unset)", rank=odd)
    return tuple(int(label) for label, _ in gathered)


def node_ids(comm: Any) -> tuple[int, ...]:
    """Node label of every rank of ``comm``: ``CUPYCOLL_RANKS_PER_NODE`` if set, else the
    detected nodes. Detection (which also checks that the setting is alike on every rank) is
    collective on first use, set or not: every rank must ask at the same point; it is cached."""
    per_node = setting("CUPYCOLL_RANKS_PER_NODE")
    labels = _DETECTED.get(comm)
    if labels is None:
        labels = _DETECTED[comm] = _detect(comm, per_node)
    if per_node is not None:
        return tuple(r // per_node for r in range(comm.size))
    return labels


def topology(comm: Any) -> Topology:
    """The :class:`Topology` of ``comm`` (see :func:`node_ids`)."""
    return Topology.of(node_ids(comm))
