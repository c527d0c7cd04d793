"""Helpers shared by the sparse algorithms: zero-filled merges and presence bitmaps.

Semantics every algorithm implements: an index absent on a rank counts as 0 there, for every op.
A merge of partial results over disjoint groups of ranks is therefore ``op(a or 0, b or 0)`` per
index: for sum that is the plain merge; for max, min and prod the entries missing from some part
are combined with 0 (``max(v, 0)``, ``min(v, 0)``, ``v * 0``), exactly as a dense reduction would.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._types import ReduceOp, array_namespace
from ..primitives import merge_sorted

__all__ = ["reduce_parts", "rank_slices", "allgatherv_entries", "fill_absent", "presence",
           "union_of_presence", "bitmap_or_allreduce", "bitmap_chunk", "UFUNC_NAMES"]

#: the array-library ufunc of each op (looked up on numpy or cupy by name).
UFUNC_NAMES = {ReduceOp.SUM: "add", ReduceOp.PROD: "multiply", ReduceOp.MAX: "maximum",
               ReduceOp.MIN: "minimum"}


def fill_absent(union: Any, values: Any, part_indices: Sequence[Any], op: ReduceOp) -> Any:
    """Combine with 0, in place, the entries of ``union`` missing from at least one part.

    ``union`` is sorted unique and contains every part's (sorted unique) indices. A no-op for sum.
    """
    if op is ReduceOp.SUM or union.shape[0] == 0:
        return values
    xp = array_namespace(union)
    present = xp.zeros(union.shape[0], dtype=np.int32)
    for idx in part_indices:
        present[xp.searchsorted(union, idx)] += 1
    missing = present < len(part_indices)
    if values.ndim > 1:
        missing = missing.reshape((-1,) + (1,) * (values.ndim - 1))
    ufunc = getattr(xp, UFUNC_NAMES[op])  # on every entry, kept where missing: no host read
    with np.errstate(invalid="ignore", over="ignore"):  # e.g. inf * 0 where it is not kept
        values[...] = xp.where(missing, ufunc(values, values.dtype.type(0)), values)
    return values


def reduce_parts(parts: Sequence[tuple[Any, Any]], op: ReduceOp,
                 accumulate_dtype: Any = None) -> tuple[Any, Any]:
    """Merge coalesced parts of disjoint rank groups in part order, absent entries counting as 0."""
    if len(parts) == 1:
        return parts[0]
    idx, val = merge_sorted(list(parts), op.value, accumulate_dtype, checked=False)
    return idx, fill_absent(idx, val, [p[0] for p in parts], op)


def rank_slices(counts: Sequence[int]) -> list[slice]:
    """The slice of each rank's block in an allgatherv result with these per-rank counts."""
    ends = np.cumsum(np.asarray(counts, dtype=np.int64)).tolist()
    return [slice(end - int(c), end) for end, c in zip(ends, counts)]


def allgatherv_entries(comm: Any, indices: Any, values: Any, op_name: str
                       ) -> tuple[Any, Any, np.ndarray]:
    """Allgatherv indices and rows together: counts first, then ONE exchange round.

    Every rank's block is received straight into its slice of the outputs (no staging copy,
    so the outputs are the only memory), indices and rows as two messages per peer, skipped
    when that peer has no entries. Returns (all indices, all rows, counts per rank).
    """
    xp, rank = comm.xp, comm.rank
    counts = comm.allgather_counts(int(indices.shape[0]), op_name + ".counts")
    total = int(counts.sum())
    all_idx = xp.empty(total, dtype=indices.dtype)
    all_val = xp.empty((total,) + tuple(values.shape[1:]), dtype=values.dtype)
    slices = rank_slices(counts)
    all_idx[slices[rank]], all_val[slices[rank]] = indices, values
    peers = [(rank + s) % comm.size for s in range(1, comm.size)]
    sends = [(r, a) for r in peers for a in (indices, values)] if indices.shape[0] else []
    recvs = [(r, out[slices[r]]) for r in peers if counts[r] for out in (all_idx, all_val)]
    comm.exchange(sends, recvs, op_name).wait()  # the one wait the result needs
    return all_idx, all_val, counts


def presence(indices: Any, n: int) -> Any:
    """Return a bool array of length ``n``, True at ``indices``."""
    xp = array_namespace(indices)
    mask = xp.zeros(n, dtype=bool)
    mask[indices] = True
    return mask


def union_of_presence(mask: Any, index_dtype: Any) -> Any:
    """Return the ascending indices where ``mask`` is True, as ``index_dtype``."""
    xp = array_namespace(mask)
    return xp.flatnonzero(mask).astype(index_dtype, copy=False)


def bitmap_chunk(n: int, size: int) -> int:
    """Bytes of the bitmap chunk each rank owns in :func:`bitmap_or_allreduce`."""
    return -(-((n + 7) // 8) // size)


def bitmap_or_allreduce(comm: Any, mask: Any, op_name: str) -> Any:
    """OR a bool mask over all ranks through packed bits (n/8 bytes, reduce-scatter + allgather).

    Each rank owns one chunk of the packed bitmap: chunks go to their owner by one exchange,
    the owner ORs them, and an allgather returns the whole bitmap. Booked under ``op_name``.
    """
    xp, p, n = comm.xp, comm.size, int(mask.shape[0])
    if p == 1:
        return mask
    chunk = bitmap_chunk(n, p)
    bits = xp.zeros(chunk * p, dtype=np.uint8)
    packed = xp.packbits(mask)
    bits[:packed.shape[0]] = packed
    blocks = bits.reshape(p, chunk)
    recv = xp.empty((p, chunk), dtype=np.uint8)
    recv[comm.rank] = blocks[comm.rank]
    peers = [(comm.rank + s) % p for s in range(1, p)]
    comm.stream_order(comm.exchange([(r, blocks[r]) for r in peers],
                                    [(r, recv[r]) for r in peers], op_name))
    mine = recv[0].copy()
    for r in range(1, p):
        mine |= recv[r]
    full = xp.empty(chunk * p, dtype=np.uint8)
    comm.allgather(mine, full, op_name).wait()
    return xp.unpackbits(full)[:n].view(bool)
