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
all ranks hold the same bits (with ``wire_values``, the node gathers round them: a rank alone on
its node rounds its own the same way). One node: it runs split itself (same traffic, same
names, same predicted time: ``auto`` keeps split on a tie). One rank per node: a count allgather
(``hierarchical.counts``), then split or allgather over all ranks with their native
collectives, booked under their own names (``split.*``, ``allgather``). Otherwise traffic is
booked as ``hierarchical.samples``,
``hierarchical.node.{counts,scatter,gather.counts,gather}`` (intra-node) and
``hierarchical.rail.{counts, allgather, split.*}`` (inter-node); :func:`link_costs` splits the
exact model the same way so the tuner prices each part on its link. Every phase sends one
packed block per peer on the call's ``wire`` (:mod:`cupycoll.wire`; compact codes a block's
indices over its regions).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Sequence

import numpy as np

from .._registry import register
from .._types import ReduceOp, distinct, to_host
from ..comm._group import Group
from ..comm._topology import Topology, topology
from ..wire import round_values
from ..wire._exchange import gather_entries
from ..wire._pack import COO, Wire
from . import allgather as _allgather
from . import split as _split
from ._common import allgatherv_entries, reduce_parts
from ._cost import Cost, Shape, validation_cost

__all__ = ["hierarchical", "cost", "work", "time", "link_costs", "rail_algorithm", "owned",
           "owner", "ALGORITHM"]

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


def rail_algorithm(counts: Sequence[int], span: int, like: Shape, profile: Any,
                   pricing: Any) -> str:
    """The rail's algorithm: least predicted time (``pricing.predict``) for these counts
    (uniform indices over the region's ``span``) on the inter-node link of ``profile``;
    ``like`` gives the entry sizes."""
    shape = Shape(len(counts), max(int(span), 1), like.width, like.index_bytes, like.value_bytes,
                  tuple(int(c) for c in counts), wire=like.wire, float_values=like.float_values)
    link = profile.link("inter")
    times = [pricing.predict(name, shape, link) for name in RAIL_ALGORITHMS]
    return RAIL_ALGORITHMS[times.index(min(times))]


def hierarchical(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
                 accumulate_dtype: Any = None, wire: Wire = COO, *, profile: Any, pricing: Any
                 ) -> tuple[Any, Any]:
    """Node reduce-scatter, per-region sparse allreduce between nodes, node allgatherv.

    Every phase moves packed blocks on ``wire`` (compact: each block's indices coded over its
    region, as split does). ``profile`` and ``pricing`` (the same on every rank) choose each
    rail's algorithm by its predicted time on the inter-node link."""
    topo = topology(comm)
    if topo.count == 1:  # one node: exactly split (its native collectives included)
        return _split.split(comm, indices, values, n, op, accumulate_dtype, wire,
                            profile=profile)
    prices = (profile, pricing)
    if topo.width == 1:  # one rank per node: one rail of every rank, on its native collectives
        return _rail(comm, indices, values, n, op, accumulate_dtype, np.array([0, n]), 0,
                     "hierarchical.", prices, wire)
    mine = topo.members[topo.nodes[comm.rank]]
    regions, local = topo.width, Group(comm, mine, "hierarchical.")
    bounds = _split._bounds(comm, indices, n, "hierarchical.samples", regions)
    own = owned(regions, local.size, local.rank)
    if local.size > 1:
        cut = [bounds[o.start] for o in (owned(regions, local.size, l) for l in range(local.size))]
        indices, values = _split.reduce_scatter(local, indices, values,
                                                np.array(cut + [n], dtype=np.int64), op,
                                                accumulate_dtype, "node", wire)
    indices, values = _between_nodes(comm, topo, own, bounds, indices, values, n, op,
                                     accumulate_dtype, prices, wire)
    if local.size > 1:
        indices, values, _ = allgatherv_entries(local, indices, values, "node.gather", wire,
                                                int(bounds[own.start]), int(bounds[own.stop]))
    elif wire.rounds(values.dtype):  # alone on its node: its regions as the other nodes'
        values = round_values(values, wire.values)[1]  # gathers round them
    return indices, values


def _between_nodes(comm: Any, topo: Topology, own: range, bounds: np.ndarray, indices: Any,
                   values: Any, n: int, op: ReduceOp, accumulate_dtype: Any,
                   prices: tuple[Any, Any], wire: Wire) -> tuple[Any, Any]:
    """Step 3 for every region this rank owns, in region order; returns their concatenation."""
    xp = comm.xp
    offsets = [0, int(indices.shape[0])]
    if len(own) > 1:  # one host read for the cuts between this rank's regions
        inner = xp.asarray(bounds[own.start + 1:own.stop]).astype(indices.dtype, copy=False)
        offsets[1:1] = to_host(xp.searchsorted(indices, inner)).tolist()
    out = [_rail(Group(comm, rail_members(topo, j), "hierarchical.rail."), indices[a:b],
                 values[a:b], n, op, accumulate_dtype, bounds, j, "", prices, wire)
           for j, a, b in zip(own, offsets, offsets[1:])]
    if len(out) == 1:
        return out[0]
    return xp.concatenate([i for i, _ in out]), xp.concatenate([v for _, v in out])


def _rail(rail: Any, indices: Any, values: Any, n: int, op: ReduceOp, accumulate_dtype: Any,
          bounds: np.ndarray, region: int, prefix: str, prices: tuple[Any, Any], wire: Wire
          ) -> tuple[Any, Any]:
    """Counts, then split or allgather (the model's choice with ``prices``: profile, pricing)
    among the rail's ranks, on the inter-node link's prices; allgather reuses the counts (coo;
    compact exchanges its (count, bytes) pairs as usual)."""
    profile, pricing = prices
    like = Shape(rail.size, n, int(values.shape[1]) if values.ndim == 2 else 0,
                 indices.dtype.itemsize, values.dtype.itemsize, (), wire=wire,
                 float_values=values.dtype.kind == "f")
    counts = rail.allgather_counts(int(indices.shape[0]), prefix + "counts")
    lo, hi = int(bounds[region]), int(bounds[region + 1])
    name = rail_algorithm(counts, hi - lo, like, profile, pricing)
    if name == "split":
        return _split.split(rail, indices, values, n, op, accumulate_dtype, wire,
                            profile=profile.link("inter"))
    parts, _ = gather_entries(rail, indices, values, "allgather", wire, lo, hi, counts)
    return reduce_parts(parts, op, accumulate_dtype)


# ------------------------------------------------------------------------------ cost model
class _Counter:
    """Entries of ranks / node unions in a range of regions: exact with inputs, else uniform."""

    def __init__(self, shape: Shape, topo: Topology, bounds: np.ndarray | None) -> None:
        self.shape, self.topo, self.bounds, self.regions = shape, topo, bounds, topo.width

    def _within(self, ranks: Sequence[int], lo: int, hi: int) -> np.ndarray:
        a, b = self.bounds[lo], self.bounds[hi]
        return distinct(np, [x[(x >= a) & (x < b)] for x in
                             (self.shape.inputs[r] for r in ranks)])

    def union(self, ranks: Sequence[int], lo: int, hi: int) -> int:
        if self.bounds is None:
            return self.shape.union_of(ranks) * (hi - lo) // self.regions
        return int(self._within(ranks, lo, hi).size)

    def block(self, ranks: Sequence[int], lo: int, hi: int) -> int:
        """Packed bytes of the union of ``ranks``' entries in regions ``[lo, hi)``, coded over
        those regions (the algorithm's block)."""
        if self.bounds is None:
            span = self.shape.n // self.regions * (hi - lo)
            return self.shape.block_bytes(self.union(ranks, lo, hi), None, 0, span)
        a = self._within(ranks, lo, hi)
        return self.shape.block_bytes(a.size, a, int(self.bounds[lo]), int(self.bounds[hi]))

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


def _gather(size: int, rank: int, blocks: Sequence[int], words: int, op: str) -> Cost:
    """A group's allgatherv_entries (its size allgather is point-to-point too)."""
    return _p2p(Cost().allgatherv_entries(op, size, rank, blocks, words), "")


def link_costs(shape: Shape, rank: int, profile: Any = None, pricing: Any = None
               ) -> tuple[Cost, Cost, list[tuple[str, Shape, int]]]:
    """(intra-node traffic, inter-node traffic, rails run as (algorithm, rail shape, rank)) of
    ``rank``; exact with ``shape.inputs``. ``profile`` and ``pricing`` decide the rails'
    algorithm as the call does (default: the shipped profile and :mod:`cupycoll.tuner.predict`,
    for the tuner's own calls)."""
    intra, inter, rails = Cost(), Cost(), []
    p = shape.size
    topo = Topology.of(shape.nodes or (0,) * p)
    if topo.count == 1:  # split's sparse result (a dense output: densified from it)
        sparse = dataclasses.replace(shape, output="sparse")
        return intra.add(_split.cost(sparse, rank, profile)), inter, rails
    if profile is None or pricing is None:
        from ..tuner import predict
        from ..tuner.profile import load_profile

        profile, pricing = profile or load_profile(size=p), pricing or predict
    inter_link = profile.link("inter")
    if topo.width == 1:  # the rail's sparse result (a dense output: densified from it)
        rail = dataclasses.replace(shape, output="sparse")
        inter.allgather("hierarchical.counts", p, 8 * p)
        name = rail_algorithm(rail.nnz, rail.n, rail, profile, pricing)
        inter.add(_split.cost(rail, rank, inter_link) if name == "split"
                  else _allgather.cost(rail, rank))
        return intra, inter, [(name, rail, rank)]
    regions, node = topo.width, topo.nodes[rank]
    mine = topo.members[node]
    size, local, words = len(mine), mine.index(rank), shape.size_words
    intra.allgather("hierarchical.samples", p, p * (_split.SAMPLES + 1) * 8)
    bounds = None
    if shape.inputs is not None:
        bounds = _split.region_bounds(np.stack([_split.local_samples(a) for a in shape.inputs]),
                                      shape.n, regions)
    count = _Counter(shape, topo, bounds)
    own = owned(regions, size, local)
    if size > 1:
        got = [count.block([m], own.start, own.stop) for m in mine if m != rank]
        intra.alltoall_counts("hierarchical.node.counts", size, words)
        intra.book("hierarchical.node.scatter", sum(got), sum(1 for g in got if g))
    for j in own:
        nnz = [count.union(m, j, j + 1) for m in topo.members]
        span = bounds[j + 1] - bounds[j] if bounds is not None else shape.n // regions
        name = rail_algorithm(nnz, span, shape, profile, pricing)
        q = len(nnz)
        inter.add(_p2p(Cost().allgather("counts", q, 8 * q), "hierarchical.rail."))
        rail = Shape(q, shape.n if bounds is not None else max(span, 1), shape.width,
                     shape.index_bytes, shape.value_bytes, tuple(nnz), count.node_inputs(j),
                     wire=shape.wire, float_values=shape.float_values)
        lo, hi = (int(bounds[j]), int(bounds[j + 1])) if bounds is not None else (0, rail.n)
        sub = (_split.cost(rail, node, inter_link) if name == "split"
               else _allgather.cost_over(rail, node, lo, hi))
        inter.add(_p2p(sub, "hierarchical.rail."))
        rails.append((name, rail, node))
    if size > 1:
        blocks = [count.block(range(p), o.start, o.stop)
                  for o in (owned(regions, size, l) for l in range(size))]
        intra.add(_gather(size, local, blocks, words, "hierarchical.node.gather"))
    return intra, inter, rails


def cost(shape: Shape, rank: int, profile: Any = None) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce)."""
    intra, inter, _ = link_costs(shape, rank, profile)
    return intra.add(inter)


def work(shape: Shape, rank: int, profile: Any = None) -> dict[str, float]:
    """The node phases (the rails' work is their algorithm's, added by :func:`time`)."""
    if shape.size == 1:
        return {}
    topo = Topology.of(shape.nodes or (0,) * shape.size)
    if topo.width == 1:  # no node phases: one rail of every rank
        return {}
    mine = topo.members[topo.nodes[rank]]
    share = len(owned(topo.width, len(mine), mine.index(rank))) / topo.width
    w, region = max(shape.width, 1), sum(shape.nnz[m] for m in mine) * share
    return {"merge": region, "row": (region + shape.union) * w, "fold": region * (w - 1)}


def time(shape: Shape, rank: int, profile: Any, pricing: Any) -> float:
    """Seconds of ``rank``: the node phases on ``profile.link("intra")``, the rails on
    ``link("inter")`` (native collectives at the profile's native prices), plus every rail's
    own work and fixed cost; without a measured ``fixed["hierarchical"]`` the node phases cost
    split's. One node: split. One rank per node: the rail's algorithm on the inter-node link
    (allgather reuses the counts; split pays one more count round). ``pricing``:
    :mod:`cupycoll.tuner.predict`."""
    if shape.nodes is None or len(set(shape.nodes)) == 1:  # one node: split's sparse result
        return (pricing.rank_time("split", dataclasses.replace(shape, output="sparse"), rank,
                                  profile) + pricing.densified_output("hierarchical", shape,
                                                                      profile))
    intra, inter, rails = link_costs(shape, rank, profile, pricing)
    densified = pricing.densified_output("hierarchical", shape, profile)
    if len(set(shape.nodes)) == shape.size:  # one rank per node: the rail alone (+ its counts)
        name = rails[0][0]
        counts = Cost().allgather("hierarchical.counts", shape.size, 8 * shape.size)
        rail = dataclasses.replace(shape, output="sparse")  # the rail's result is densified
        return (pricing.rank_time(name, rail, rank, profile.link("inter"))
                + (pricing.comm_time(counts, profile) if name == "split" else 0.0) + densified)
    fixed = profile.fixed.get("hierarchical", profile.fixed.get("split", 0.0))
    seconds = (fixed + pricing.local_time(work(shape, rank), profile) + densified
               + pricing.coding_time(Cost().add(intra).add(inter), shape, profile)
               + pricing.comm_time(validation_cost(shape.size).add(intra), profile.link("intra"))
               + pricing.comm_time(inter, profile.link("inter")))
    for name, rail, r in rails:
        seconds += profile.fixed.get(name, 0.0) + pricing.local_time(
            pricing.work(name, rail, r, profile.link("inter")), profile)
    return seconds


ALGORITHM = register("sparse", "hierarchical", hierarchical, cost=cost, work=work, time=time,
                     tie=1, prices=("profile", "pricing"))
