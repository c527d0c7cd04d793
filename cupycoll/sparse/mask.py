"""``mask``: allgatherv of indices only, union, then a dense allreduce over the union rows.

oneCCL's mask algorithm with correct zero fill: every rank scatters its rows into a zero buffer
over the union (absent = 0 for every op, not the op's identity, so max/min/prod come out as a
dense reduction would) and one native allreduce reduces it. Values never travel as sparse
entries, so it suits wide embedding rows; each value is reduced once by the allreduce, which
gives the same bits on every rank.

Cost per rank (U = union size, R = row bytes, I = index bytes): the other ranks' indices (sum
of others' nnz) * I in P-1 messages, their counts known from the validation (``counts``;
without them a counts allgather of (P-1)*8 bytes first; compact wire: (count, bytes) pairs,
then the encoded streams; values never travel sparse, so rounding does not apply); allreduce
of U*R bytes booked as floor(2(P-1)/P * U*R) in 2(P-1) messages. Local work: a union of P*nnz
indices, one scatter. Float max/min on a backend whose native ones drop a NaN (NCCL) reduce
integer order keys instead (:func:`._common.allreduce_values`): the same bytes, but 16-bit
floats' keys travel as int32 (R doubles).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._registry import register
from .._types import ReduceOp
from ..wire._exchange import gather_entries
from ..wire._model import block_nbytes
from ..wire._pack import COO, Wire
from ._common import allreduce_values, positions_in, rank_slices, union_of, value_row_bytes
from ._cost import Cost, Shape
from .dense import scatter_into

__all__ = ["mask", "cost", "work", "ALGORITHM"]


def mask(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
         accumulate_dtype: Any = None, wire: Wire = COO,
         counts: Sequence[int] | None = None) -> tuple[Any, Any]:
    """Allgatherv the indices, zero-fill the union rows with local values, allreduce them.

    ``values``: this rank's coalesced rows, or its
    :class:`cupycoll.primitives._unfolded.Unfolded` rows (a host input with duplicates), then
    summed straight into the union rows. ``counts``: every rank's nnz when the caller knows
    them (then no size round on coo)."""
    xp = comm.xp
    if wire.compact:  # encoded index streams (blocks without values)
        nothing = xp.empty((indices.shape[0], 0), dtype=np.int32)
        parts, _ = gather_entries(comm, indices, nothing, "mask.indices", wire, 0, n)
        sets = [a for a, _ in parts]
    else:
        all_idx, counts = comm.allgatherv(indices, counts, op_name="mask.indices")
        sets = [all_idx[s] for s in rank_slices(counts)]
    union = union_of(sets, indices.dtype)  # coalesced inputs
    rows = xp.zeros((union.shape[0],) + tuple(values.shape[1:]), dtype=values.dtype)
    scatter_into(rows, positions_in(union, indices), values)
    allreduce_values(comm, rows, op, "mask.allreduce").wait()
    return union, rows


def cost(shape: Shape, rank: int, profile: Any = None) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce), the counts
    known (as ``sparse_allreduce`` calls it)."""
    c = Cost()
    if shape.wire.compact:
        inputs = shape.inputs or [None] * shape.size
        blocks = [block_nbytes(shape.wire, k, 0, shape.index_bytes, a, 0, shape.n)
                  for k, a in zip(shape.nnz, inputs)]
        c.allgatherv_entries("mask.indices", shape.size, rank, blocks, shape.size_words)
    else:
        c.allgatherv("mask.indices", shape.size, rank, shape.nnz, shape.index_bytes,
                     with_counts=False)
    return c.allreduce("mask.allreduce", shape.size, shape.union * value_row_bytes(shape))


def work(shape: Shape, rank: int, profile: Any = None) -> dict[str, float]:
    """The union of every rank's indices (no values: its own unit), the union's rows zeroed
    (a fill: the allreduce's buffer, handed back as the result) and this rank's rows written.
    (The union's rows are priced as a fill, not at the gather rate, which over-prices wide
    rows: docs/tuning.md.)"""
    w = max(shape.width, 1)
    return {"union": shape.total_nnz, "row": shape.nnz[rank] * w, "fill": shape.union * w}


ALGORITHM = register("sparse", "mask", mask, cost=cost, work=work, counts=True, unfolded=True)
