"""``split``: regions balanced by the indices, rotated reduce-scatter to owners, allgatherv.

SparCML's split-allgather and Ok-Topk's phase 1, exact:

1. Balance: every rank allgathers ``SAMPLES`` evenly spaced samples of its sorted indices plus
   its nnz (fixed size, one native allgather); every rank computes the same P regions
   ``[b_r, b_{r+1})`` from the weighted quantiles of the samples, so each region holds about
   1/P of all entries whatever the indices' distribution (clustered or skewed).
2. Reduce-scatter: rank r owns region r. Counts go first (one int64 per peer), then every rank
   posts its slice of region r+s to rank r+s for s = 1..P-1 (rotated destinations, one batch).
   The owner merges the P slices in rank order (absent counting as 0).
3. Allgatherv of the reduced regions (counts, then indices and rows in one exchange round,
   straight into the output): concatenated in rank order they are the sorted result, and each
   value was computed once, by its owner, so every rank has the same bits.

Cost per rank (E = index + row bytes): samples (P-1)*(SAMPLES+1)*8; counts (P-1)*8; the other
ranks' slices of this rank's region * E (two messages per non-empty slice); the allgatherv
counts (P-1)*8 and (union - own region's union) * E (two messages per non-empty region).
Balanced, that is about (N/P + U)(P-1)/P * E for N total entries: less than allgather as soon
as indices overlap, with a P-times smaller local merge.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._registry import register
from .._types import ReduceOp
from ._common import allgatherv_entries, reduce_parts
from ._cost import Cost, Shape

__all__ = ["split", "cost", "SAMPLES", "local_samples", "region_bounds", "reduce_scatter"]

#: index samples per rank that balance the regions (the region loads are within ~1/SAMPLES).
SAMPLES = 128


def local_samples(indices: Any, xp: Any = np) -> Any:
    """Return ``[nnz, SAMPLES evenly spaced indices]`` (int64) of sorted local ``indices``."""
    nnz = int(indices.shape[0])
    out = xp.zeros(SAMPLES + 1, dtype=np.int64)
    out[0] = nnz
    if nnz:
        pos = (xp.arange(SAMPLES, dtype=np.int64) * nnz) // SAMPLES
        out[1:] = indices[pos]
    return out


def region_bounds(samples: np.ndarray, n: int, parts: int | None = None) -> np.ndarray:
    """Return P+1 region bounds ``0 = b_0 <= ... <= b_P = n`` from every rank's samples.

    ``samples`` is (P, SAMPLES+1) as made by :func:`local_samples`. A sample of rank r stands
    for nnz_r / SAMPLES entries; bound b_j is the first sample value where the cumulative weight
    reaches j/P of the total (integer arithmetic: the same on every rank). ``parts`` regions
    instead of P if given (the hierarchical algorithm's regions).
    """
    p = samples.shape[0] if parts is None else parts
    weights = np.repeat(samples[:, 0], SAMPLES)
    values = samples[:, 1:].reshape(-1)
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order])
    total = int(cumulative[-1]) if cumulative.size else 0
    bounds = np.empty(p + 1, dtype=np.int64)
    bounds[0], bounds[p] = 0, n
    if total == 0:
        bounds[1:p] = (np.arange(1, p, dtype=np.int64) * n) // p
        return bounds
    targets = -(-(np.arange(1, p, dtype=np.int64) * total) // p)  # ceil(j * total / P)
    bounds[1:p] = values[np.searchsorted(cumulative, targets, side="left")]
    return np.maximum.accumulate(bounds)


def _bounds(comm: Any, indices: Any, n: int, op_name: str = "split.samples",
            parts: int | None = None) -> np.ndarray:
    send = local_samples(indices, comm.xp)
    recv = comm.xp.empty(comm.size * (SAMPLES + 1), dtype=np.int64)
    samples = comm.fetch(comm.allgather(send, recv, op_name), recv)
    return region_bounds(samples.reshape(comm.size, SAMPLES + 1), n, parts)


def _counts(comm: Any, indices: Any, bounds: np.ndarray, op_name: str = "split.counts"
            ) -> tuple[list[int], np.ndarray]:
    """Offsets of the P regions in sorted ``indices`` (P+1 host ints, first 0, last nnz) and
    the number of entries every rank sends this one: one host read for both."""
    xp = comm.xp
    inner = xp.asarray(bounds[1:-1]).astype(indices.dtype, copy=False)  # sample values: fit
    cuts = xp.zeros(comm.size + 1, dtype=np.int64)
    cuts[1:-1] = xp.searchsorted(indices, inner)
    cuts[-1] = indices.shape[0]
    sent, received = comm.alltoall_device_counts(xp.diff(cuts), op_name)
    return [0] + np.cumsum(sent).tolist(), received


@register("sparse", "split")
def split(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
          accumulate_dtype: Any = None) -> tuple[Any, Any]:
    """Reduce-scatter balanced index regions to their owners, then allgatherv the regions."""
    if comm.size == 1:
        return indices, values
    own_idx, own_val = reduce_scatter(comm, indices, values, _bounds(comm, indices, n), op,
                                      accumulate_dtype)
    all_idx, all_val, _ = allgatherv_entries(comm, own_idx, own_val, "split.gather")
    return all_idx, all_val


def reduce_scatter(comm: Any, indices: Any, values: Any, bounds: np.ndarray, op: ReduceOp,
                   accumulate_dtype: Any = None, name: str = "split") -> tuple[Any, Any]:
    """Phase 2: rank r gets region ``[bounds[r], bounds[r+1])`` reduced over all ranks.

    Booked as ``<name>.counts`` and ``<name>.scatter``; the hierarchical algorithm runs it
    among the ranks of a node.
    """
    p, rank, xp = comm.size, comm.rank, comm.xp
    cuts, recv_counts = _counts(comm, indices, bounds, name + ".counts")
    send_counts = [cuts[r + 1] - cuts[r] for r in range(p)]
    row = tuple(values.shape[1:])
    parts: list[tuple[Any, Any]] = [None] * p  # type: ignore[list-item]
    parts[rank] = (indices[cuts[rank]:cuts[rank + 1]], values[cuts[rank]:cuts[rank + 1]])
    sends, recvs = [], []
    for s in range(1, p):
        dst, src = (rank + s) % p, (rank - s) % p
        if send_counts[dst]:
            a, b = cuts[dst], cuts[dst + 1]
            sends += [(dst, indices[a:b]), (dst, values[a:b])]
        count = int(recv_counts[src])
        parts[src] = (xp.empty(count, dtype=indices.dtype), xp.empty((count,) + row, values.dtype))
        if count:
            recvs += [(src, parts[src][0]), (src, parts[src][1])]
    comm.stream_order(comm.exchange(sends, recvs, name + ".scatter"))
    return reduce_parts(parts, op, accumulate_dtype)


def cost(shape: Shape, rank: int) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce).

    Exact when ``shape.inputs`` is given (regions computed as the algorithm does), otherwise
    with perfectly balanced regions of independent uniformly random indices.
    """
    p, c = shape.size, Cost()
    if p == 1:
        return c
    c.allgather("split.samples", p, p * (SAMPLES + 1) * 8)
    c.alltoall_counts("split.counts", p)
    if shape.inputs is not None:
        samples = np.stack([local_samples(a) for a in shape.inputs])
        bounds = region_bounds(samples, shape.n)
        slices = [a[(a >= bounds[rank]) & (a < bounds[rank + 1])] for a in shape.inputs]
        got = [s.size for r, s in enumerate(slices) if r != rank]
        c.book("split.scatter", sum(got) * shape.entry_bytes, 2 * sum(1 for g in got if g))
        region_union = [np.unique(np.concatenate(
            [a[(a >= bounds[q]) & (a < bounds[q + 1])] for a in shape.inputs])).size
            for q in range(p)]
    else:
        share = [k // p for k in shape.nnz]
        got = [share[r] for r in range(p) if r != rank]
        c.book("split.scatter", sum(got) * shape.entry_bytes, 2 * sum(1 for g in got if g))
        region_union = [shape.union // p] * p
    return c.allgatherv_entries("split.gather", p, rank, region_union, shape.entry_bytes)
