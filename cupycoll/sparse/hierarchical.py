"""``hierarchical``: reduce inside each node, allreduce between nodes per region, share in the node.

Node-aware split (the two-level structure of NCCL's tree/ring-over-nodes and of SparCML across
nodes). Nodes come from :mod:`cupycoll.comm._topology` (MPI's shared-memory split, or
``CUPYCOLL_RANKS_PER_NODE``); R = the ranks on the largest node.

1. Balance: every rank allgathers split's samples (one native allgather)
   and computes the same R regions ``[b_j, b_{j+1})``, each about 1/R of all entries.
2. Node reduce-scatter: on a node of L ranks, local rank l owns regions
   ``[l*R//L, (l+1)*R//L)`` (one region on a full node, several on a short one) and gets them
   reduced over the node: split's reduce-scatter among the node's ranks (point-to-point).
3. Between nodes, per region j: the owners of j on every node (a "rail", one rank per node, in
   node order) allgather their counts, then run an exact sparse allreduce of their node-reduced
   entries of region j: ``split`` or ``allgather``, whichever the time model predicts faster for
   those counts on the inter-node link (every member computes the same choice). A rank owning
   several regions runs their rails one after the other, in region order (no deadlock: the
   lowest unfinished rail always has all its members).
4. Node allgatherv of the owners' final regions: in local-rank order they are the sorted result.

Every value is reduced once per region by the same rail in the same order and then copied, so
all ranks hold the same bits. One node: it runs split itself (same traffic, same names, same
predicted time: ``auto`` keeps split on a tie). One rank per node: a count allgather
(``hierarchical.counts``), then split or allgather over all ranks with their native
collectives. Traffic is booked as ``hierarchical.samples``,
``hierarchical.node.{counts,scatter,gather.counts,gather}`` (intra-node) and
``hierarchical.rail.{counts, allgather, split.*}`` (inter-node); :func:`link_costs` splits the
exact model the same way so the tuner prices each part on its link.
"""

from __future__ import annotations

import bisect
from typing import Any, Sequence

import numpy as np

from .._registry import register
from .._types import ReduceOp, to_host
from ..comm._group import Group
from ..comm._topology import Topology, topology
from . import allgather as _allgather
from . import split as _split
from ._common import allgatherv_entries
from ._cost import Cost, Shape

__all__ = ["hierarchical", "cost", "link_costs", "rail_algorithm", "owned", "owner"]

#: sparse allreduce algorithms a rail may run (ties: the first).
RAIL_ALGORITHMS = ("allgather", "split")


def owned(regions: int, local_size: int, local_rank: int) -> range:
    """Regions a rank owns on a node of ``local_size`` ranks (contiguous, at least one)."""
    return range(local_rank * regions // local_size, (local_rank + 1) * regions // local_size)


def owner(regions: int, local_size: int, region: int) -> int:
    """Local rank that owns ``region`` on a node of ``local_size`` ranks."""
    starts = [l * regions // local_size for l in range(local_size)]
    return bisect.bisect_right(starts, region) - 1


def rail_members(topo: Topology, region: int) -> list[int]:
    """Ranks (one per node, in node order) that reduce ``region`` between nodes."""
    width = topo.width
    return [m[owner(width, len(m), region)] for m in topo.members]


def rail_algorithm(counts: Sequence[int], span: int, like: Shape, profile: Any) -> str:
    """The rail's algorithm: least predicted time for these counts (uniform indices over the
    region's ``span``) on the inter-node link of ``profile``; ``like`` gives the entry sizes."""
    from ..tuner.predict import predict

    shape = Shape(len(counts), max(int(span), 1), like.width, like.index_bytes, like.value_bytes,
                  tuple(int(c) for c in counts))
    link = profile.link("inter")
    times = [predict(name, shape, link) for name in RAIL_ALGORITHMS]
    return RAIL_ALGORITHMS[times.index(min(times))]


@register("sparse", "hierarchical")
def hierarchical(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
                 accumulate_dtype: Any = None) -> tuple[Any, Any]:
    """Node reduce-scatter, per-region sparse allreduce between nodes, node allgatherv."""
    topo = topology(comm)
    if topo.count == 1:  # one node: exactly split (its native collectives included)
        return _split.split(comm, indices, values, n, op, accumulate_dtype)
    from ..tuner.profile import profile_for

    profile = profile_for(comm)  # collective on first use: before any rail starts
    if topo.width == 1:  # one rank per node: one rail of every rank, on its native collectives
        return _rail(comm, indices, values, n, op, accumulate_dtype, np.array([0, n]), 0,
                     "hierarchical.", profile)
    mine = topo.members[topo.nodes[comm.rank]]
    regions, local = topo.width, Group(comm, mine, "hierarchical.")
    bounds = _split._bounds(comm, indices, n, "hierarchical.samples", regions)
    own = owned(regions, local.size, local.rank)
    if local.size > 1:
        cut = [bounds[o.start] for o in (owned(regions, local.size, l) for l in range(local.size))]
        indices, values = _split.reduce_scatter(local, indices, values,
                                                np.array(cut + [n], dtype=np.int64), op,
                                                accumulate_dtype, "node")
    indices, values = _between_nodes(comm, topo, own, bounds, indices, values, n, op,
                                     accumulate_dtype, profile)
    if local.size > 1:
        indices, values, _ = allgatherv_entries(local, indices, values, "node.gather")
    return indices, values


def _between_nodes(comm: Any, topo: Topology, own: range, bounds: np.ndarray, indices: Any,
                   values: Any, n: int, op: ReduceOp, accumulate_dtype: Any, profile: Any
                   ) -> tuple[Any, Any]:
    """Step 3 for every region this rank owns, in region order; returns their concatenation."""
    xp = comm.xp
    offsets = [0, int(indices.shape[0])]
    if len(own) > 1:  # one host read for the cuts between this rank's regions
        inner = xp.asarray(bounds[own.start + 1:own.stop]).astype(indices.dtype, copy=False)
        offsets[1:1] = to_host(xp.searchsorted(indices, inner)).tolist()
    out = [_rail(Group(comm, rail_members(topo, j), "hierarchical.rail."), indices[a:b],
                 values[a:b], n, op, accumulate_dtype, bounds, j, "", profile)
           for j, a, b in zip(own, offsets, offsets[1:])]
    if len(out) == 1:
        return out[0]
    return xp.concatenate([i for i, _ in out]), xp.concatenate([v for _, v in out])


def _rail(rail: Any, indices: Any, values: Any, n: int, op: ReduceOp, accumulate_dtype: Any,
          bounds: np.ndarray, region: int, prefix: str, profile: Any) -> tuple[Any, Any]:
    """Counts, then split or allgather (the model's choice) among the rail's ranks."""
    like = Shape(rail.size, n, int(values.shape[1]) if values.ndim == 2 else 0,
                 indices.dtype.itemsize, values.dtype.itemsize, ())
    counts = rail.allgather_counts(int(indices.shape[0]), prefix + "counts")
    name = rail_algorithm(counts, bounds[region + 1] - bounds[region], like, profile)
    if name == "split":
        return _split.split(rail, indices, values, n, op, accumulate_dtype)
    return _allgather.allgather(rail, indices, values, n, op, accumulate_dtype, counts)


# ------------------------------------------------------------------------------ cost model
class _Counter:
    """Entries of ranks / node unions in a range of regions: exact with inputs, else uniform."""

    def __init__(self, shape: Shape, topo: Topology, bounds: np.ndarray | None) -> None:
        self.shape, self.topo, self.bounds, self.regions = shape, topo, bounds, topo.width

    def _within(self, ranks: Sequence[int], lo: int, hi: int) -> np.ndarray:
        a, b = self.bounds[lo], self.bounds[hi]
        return np.unique(np.concatenate([x[(x >= a) & (x < b)] for x in
                                         (self.shape.inputs[r] for r in ranks)]))

    def rank(self, r: int, lo: int, hi: int) -> int:
        if self.bounds is None:
            return self.shape.nnz[r] * (hi - lo) // self.regions
        return int(self._within([r], lo, hi).size)

    def union(self, ranks: Sequence[int], lo: int, hi: int) -> int:
        if self.bounds is None:
            return self.shape.union_of(ranks) * (hi - lo) // self.regions
        return int(self._within(ranks, lo, hi).size)

    def node_inputs(self, region: int) -> tuple[np.ndarray, ...] | None:
        if self.bounds is None:
            return None
        return tuple(self._within(m, region, region + 1) for m in self.topo.members)


def _p2p(sub: Cost, prefix: str) -> Cost:
    """``sub`` booked under ``prefix + op``, its native collectives as group point-to-point."""
    out = Cost(rounds=sub.rounds)
    out.received = {prefix + k: v for k, v in sub.received.items()}
    out.messages = {prefix + k: v for k, v in sub.messages.items()}
    return out


def _gather(size: int, rank: int, counts: Sequence[int], entry_bytes: int, op: str) -> Cost:
    """A group's allgatherv_entries (its counts allgather is point-to-point too)."""
    return _p2p(Cost().allgatherv_entries(op, size, rank, counts, entry_bytes), "")


def link_costs(shape: Shape, rank: int, profile: Any = None
               ) -> tuple[Cost, Cost, list[tuple[str, Shape, int]]]:
    """(intra-node traffic, inter-node traffic, rails run as (algorithm, rail shape, rank)) of
    ``rank``; exact with ``shape.inputs``. ``profile`` decides the rails' algorithm as the call
    does (default: :func:`cupycoll.tuner.profile.load_profile`)."""
    intra, inter, rails = Cost(), Cost(), []
    p = shape.size
    topo = Topology.of(shape.nodes or (0,) * p)
    if topo.count == 1:
        return intra.add(_split.cost(shape, rank)), inter, rails
    if profile is None:
        from ..tuner.profile import load_profile

        profile = load_profile()
    if topo.width == 1:
        inter.allgather("hierarchical.counts", p, 8 * p)
        name = rail_algorithm(shape.nnz, shape.n, shape, profile)
        inter.add(_split.cost(shape, rank) if name == "split"
                  else _allgather_cost(shape.nnz, rank, shape.entry_bytes))
        return intra, inter, [(name, shape, rank)]
    regions, node = topo.width, topo.nodes[rank]
    mine = topo.members[node]
    size, local, e = len(mine), mine.index(rank), shape.entry_bytes
    intra.allgather("hierarchical.samples", p, p * (_split.SAMPLES + 1) * 8)
    bounds = None
    if shape.inputs is not None:
        bounds = _split.region_bounds(np.stack([_split.local_samples(a) for a in shape.inputs]),
                                      shape.n, regions)
    count = _Counter(shape, topo, bounds)
    own = owned(regions, size, local)
    if size > 1:
        got = [count.rank(m, own.start, own.stop) for m in mine if m != rank]
        intra.alltoall_counts("hierarchical.node.counts", size)
        intra.book("hierarchical.node.scatter", sum(got) * e, 2 * sum(1 for g in got if g))
    for j in own:
        nnz = [count.union(m, j, j + 1) for m in topo.members]
        span = bounds[j + 1] - bounds[j] if bounds is not None else shape.n // regions
        name = rail_algorithm(nnz, span, shape, profile)
        q = len(nnz)
        inter.add(_p2p(Cost().allgather("counts", q, 8 * q), "hierarchical.rail."))
        rail = Shape(q, shape.n if bounds is not None else max(span, 1), shape.width,
                     shape.index_bytes, shape.value_bytes, tuple(nnz), count.node_inputs(j))
        sub = _split.cost(rail, node) if name == "split" else _allgather_cost(nnz, node, e)
        inter.add(_p2p(sub, "hierarchical.rail."))
        rails.append((name, rail, node))
    if size > 1:
        unions = [count.union(range(p), o.start, o.stop)
                  for o in (owned(regions, size, l) for l in range(size))]
        intra.add(_gather(size, local, unions, e, "hierarchical.node.gather"))
    return intra, inter, rails


def _allgather_cost(nnz: Sequence[int], rank: int, entry_bytes: int) -> Cost:
    """allgather with the counts already known (no count round)."""
    others = [int(c) for k, c in enumerate(nnz) if k != rank]
    return Cost().book("allgather", sum(others) * entry_bytes, 2 * sum(1 for c in others if c))


def cost(shape: Shape, rank: int, profile: Any = None) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce)."""
    intra, inter, _ = link_costs(shape, rank, profile)
    return intra.add(inter)
