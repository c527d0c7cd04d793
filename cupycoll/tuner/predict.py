"""Time of one ``sparse_allreduce`` call predicted from the cost models and a :class:`Profile`.

Per rank: ``fixed[algorithm]`` + alpha x rounds + alpha_msg x point-to-point messages + beta x
bytes (point-to-point and native collectives priced apart, from the exact per-op traffic of each
algorithm's ``cost``) + gamma x local work. The call takes as long as its slowest rank (the ranks with the fewest and the most
entries are evaluated: the first receives the most, the second merges and sends the most).

Local work, in the units ``gamma`` prices (N = total nnz, U = union, W = max(width, 1)):

- ``merge``: entries entering a k-way merge (allgather: N; split: its region's N/P);
- ``merge2``: entries entering a two-way merge (recursive doubling: both partners' partial
  results every sparse round);
- ``row``: value elements copied or scattered besides the merge (received rows, result rows);
- ``dense``: value elements of an n-long dense pass (the ``dense`` algorithm's union scan;
  recursive doubling's dense rounds: fill, scatter, gather);
- ``dense_row``: value elements the ``dense`` algorithm writes into its n-long buffer (the
  rank's rows) or reads back from it (the union's);
- ``scan``: dense positions scanned for presence (bitmap, presence fields, flatnonzero).
- ``code`` (compact wire only): indices encoded or decoded, about two per entry received.
- ``fold``: value elements of merged rows beyond the first of each row (a merge of wide rows
  folds every element; ``merge`` prices the entry and its first element);
- ``union``: indices entering mask's union of index sets (and its lookup of its own);
- ``fill``: elements of an n-long output zeroed with its rows written (``output="dense"``:
  the ``dense`` algorithm's input before its in-place allreduce, every other one's result;
  mask: the U rows its allreduce reduces).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..comm._topology import Topology
from ..sparse import auto as _auto
from ..sparse import hierarchical as _hier
from ..sparse import split as _split_mod
from ..sparse._cost import Cost, Shape, estimate_union, validation_cost
from ..sparse.recursive_doubling import prefer_dense
from ..wire._choice import DEFAULT_CODE_COST
from .profile import Profile

__all__ = ["work", "predict", "comm_time", "WORK_MODELS"]


def _allgather(shape: Shape, rank: int) -> dict[str, float]:
    w = max(shape.width, 1)
    return {"merge": shape.total_nnz, "row": shape.total_nnz * w,
            "fold": shape.total_nnz * (w - 1)}


def _split(shape: Shape, rank: int, profile: Profile | None = None) -> dict[str, float]:
    """A dense output: the region variant (:func:`cupycoll.sparse.split.gathers_dense`) writes
    the owner's region (accumulating its rows instead of merging them) or the whole output. A
    sparse output gathered as dense regions: the owner's region filled, and every rank scans
    the n presence bits before it takes the union's rows."""
    if shape.size == 1:
        return {"fill": shape.n * max(shape.width, 1)} if shape.output == "dense" else {}
    w, region = max(shape.width, 1), shape.total_nnz / shape.size
    dense_regions = _split_mod.gathers_dense(shape, profile)
    if shape.output == "dense" and dense_regions:
        return {"row": region * w, "fill": shape.n * w / shape.size}
    out = {"merge": region, "row": (region + shape.union) * w, "fold": region * (w - 1)}
    if shape.output == "dense":
        return {**out, "fill": shape.n * w}
    return {**out, "fill": shape.n * w / shape.size, "scan": shape.n} if dense_regions else out


def _mask(shape: Shape, rank: int) -> dict[str, float]:
    """The union of every rank's indices (no values: its own unit), the union's rows zeroed
    (a fill: the allreduce's buffer, handed back as the result) and this rank's rows written.
    (The union's rows are priced as a fill, not at the gather rate, which over-prices wide
    rows: docs/tuning.md.)"""
    w = max(shape.width, 1)
    return {"union": shape.total_nnz, "row": shape.nnz[rank] * w, "fill": shape.union * w}


def _dense(shape: Shape, rank: int) -> dict[str, float]:
    """Passes over n, and the rank's rows scattered and the union's read back (``dense_row``:
    a sorted write or copy, cheaper than a ``row`` gather). Presence scanned apart only on the
    bitmap path (-0 fills and count tails are read by the same flatnonzero the ``dense`` unit
    already prices); a dense output has no pass over n (its rows are written into the zeroed
    output, which is then reduced in place)."""
    w = max(shape.width, 1)
    if shape.output == "dense":
        return {"fill": shape.n * w}
    bitmap = "dense.union" in _auto.MODELS["dense"](shape, rank).received
    return {"dense": shape.n * w, "dense_row": (shape.nnz[rank] + shape.union) * w,
            "scan": shape.n if bitmap else 0}


def _recursive_doubling(shape: Shape, rank: int) -> dict[str, float]:
    """Rounds of a homogeneous estimate: group unions of 2^j ranks' mean nnz."""
    w, p = max(shape.width, 1), shape.size
    mean = shape.total_nnz / max(p, 1)
    out = {"merge2": 0.0, "row": 0.0, "dense": 0.0, "scan": 0.0, "fold": 0.0}
    rounds = max(p.bit_length() - 1, 0) + (1 if p & (p - 1) else 0)
    for j in range(rounds):
        group = estimate_union(shape.n, [mean] * min(2 ** j, p))
        if prefer_dense(group, shape.n, shape.index_bytes, shape.row_bytes):
            out["dense"] += 2 * shape.n * w
            out["scan"] += shape.n
        else:
            out["merge2"] += 2 * group
            out["row"] += 2 * group * w
            out["fold"] += 2 * group * (w - 1)
    return out


def _hierarchical(shape: Shape, rank: int) -> dict[str, float]:
    """The node phases (the rails' work is their algorithm's, added by rank_time)."""
    if shape.size == 1:
        return {}
    topo = Topology.of(shape.nodes or (0,) * shape.size)
    if topo.width == 1:  # no node phases: one rail of every rank
        return {}
    mine = topo.members[topo.nodes[rank]]
    share = len(_hier.owned(topo.width, len(mine), mine.index(rank))) / topo.width
    w, region = max(shape.width, 1), sum(shape.nnz[m] for m in mine) * share
    return {"merge": region, "row": (region + shape.union) * w, "fold": region * (w - 1)}


#: local work of every algorithm (units priced by Profile.gamma).
WORK_MODELS: dict[str, Callable[[Shape, int], dict[str, float]]] = {
    "allgather": _allgather, "split": _split, "mask": _mask, "dense": _dense,
    "recursive_doubling": _recursive_doubling, "hierarchical": _hierarchical}


def work(algorithm: str, shape: Shape, rank: int, profile: Profile | None = None
         ) -> dict[str, float]:
    """Units of local work ``rank`` does in ``algorithm`` (see the module docstring); split's
    dense output depends on ``profile`` (default: the shipped one)."""
    if algorithm == "split":
        return _split(shape, rank, profile)
    return WORK_MODELS[algorithm](shape, rank)


def comm_time(cost: Cost, profile: Profile) -> float:
    """alpha x rounds + alpha_msg x messages + beta x bytes point-to-point; native collectives
    each by the profile's measured curve (:meth:`Profile.native_time`), else alpha + beta x
    bytes."""
    p2p_bytes = cost.bytes_received - cost.native_bytes
    p2p_messages = cost.messages_received - cost.native_messages
    p2p = (profile.alpha_p2p * (cost.rounds - cost.native_rounds)
           + profile.alpha_msg * p2p_messages + profile.beta_p2p * p2p_bytes)
    if profile.native_curve and len(cost.native_volumes) == cost.native_rounds:
        return p2p + sum(profile.native_time(v) for v in cost.native_volumes)
    return (p2p + profile.alpha_native * cost.native_rounds
            + profile.beta_native * cost.native_bytes)


def _local(units: dict[str, float], profile: Profile) -> float:
    return sum(profile.price(k) * v for k, v in units.items())


def coded_indices(cost: Cost, shape: Shape) -> float:
    """Indices a rank encodes or decodes on the compact wire: about two per entry received."""
    if not shape.wire.compact:
        return 0.0
    return 2.0 * cost.bytes_received / max(shape.entry_bytes, 1)


def rank_time(algorithm: str, shape: Shape, rank: int, profile: Profile) -> float:
    if algorithm == "hierarchical":
        return _hierarchical_time(shape, rank, profile)
    model = _auto.MODELS[algorithm]
    cost = validation_cost(shape.size).add(model(shape, rank, profile) if algorithm == "split"
                                           else model(shape, rank))
    local = _local(work(algorithm, shape, rank, profile), profile)
    coding = profile.gamma.get("code", DEFAULT_CODE_COST) * coded_indices(cost, shape)
    return (profile.fixed.get(algorithm, 0.0) + comm_time(cost, profile) + local + coding
            + densified_output(algorithm, shape, profile))


def densified_output(algorithm: str, shape: Shape, profile: Profile) -> float:
    """Seconds of writing a sparse result into the n-vector of ``output="dense"``."""
    if shape.output != "dense" or algorithm in ("dense", "split"):  # theirs are in work()
        return 0.0
    return profile.price("fill") * shape.n * max(shape.width, 1)


def _hierarchical_time(shape: Shape, rank: int, profile: Profile) -> float:
    """Intra-node phases on ``profile.link("intra")``, the rails on ``link("inter")`` (native
    collectives at the profile's native prices), plus every rail's own work and fixed cost;
    without a measured ``fixed["hierarchical"]`` the node phases cost split's. One rank per
    node: the rail's algorithm on the inter-node link (allgather reuses the counts; split
    pays one more count round)."""
    if shape.nodes is None or len(set(shape.nodes)) == 1:  # one node: it runs split
        return rank_time("split", shape, rank, profile)
    intra, inter, rails = _hier.link_costs(shape, rank, profile)
    if len(set(shape.nodes)) == shape.size:  # one rank per node: the rail alone (+ its counts)
        name = rails[0][0]
        counts = Cost().allgather("hierarchical.counts", shape.size, 8 * shape.size)
        rail = dataclasses.replace(shape, output="sparse")  # the rail's result is densified
        return (rank_time(name, rail, rank, profile.link("inter"))
                + (comm_time(counts, profile) if name == "split" else 0.0)
                + densified_output("hierarchical", shape, profile))
    fixed = profile.fixed.get("hierarchical", profile.fixed.get("split", 0.0))
    coded = coded_indices(Cost().add(intra).add(inter), shape)
    seconds = (fixed + _local(work("hierarchical", shape, rank), profile)
               + densified_output("hierarchical", shape, profile)
               + profile.gamma.get("code", DEFAULT_CODE_COST) * coded
               + comm_time(validation_cost(shape.size).add(intra), profile.link("intra"))
               + comm_time(inter, profile.link("inter")))
    for name, rail, r in rails:
        seconds += profile.fixed.get(name, 0.0) + _local(work(name, rail, r), profile)
    return seconds


def predict(algorithm: str, shape: Shape, profile: Profile) -> float:
    """Predicted seconds of one call (its slowest rank); estimated shapes (no inputs) use the
    uniform-random union estimates of the cost models."""
    shape = dataclasses.replace(shape, inputs=None) if shape.inputs is not None else shape
    if shape.size == 1:
        return rank_time(algorithm, shape, 0, profile)
    ranks = {min(range(shape.size), key=shape.nnz.__getitem__),
             max(range(shape.size), key=shape.nnz.__getitem__)}
    if algorithm == "hierarchical":  # a short last node's ranks run several rails
        ranks.add(shape.size - 1)
    return max(rank_time(algorithm, shape, r, profile) for r in sorted(ranks))


def dense_allreduce_time(size: int, nbytes: int, profile: Profile) -> float:
    """Predicted seconds of a plain native allreduce of ``nbytes`` (the baseline of auto)."""
    cost = Cost().allreduce("dense", size, nbytes)
    return profile.fixed.get("allreduce", 0.0) + comm_time(cost, profile)

