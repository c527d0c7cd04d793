"""``dense``: densify to n, one dense allreduce, read the union back (sparse-as-dense fallback).

The union of indices cannot be read from the reduced values (entries can cancel or be explicit
zeros), so presence travels separately as a packed bitmap ORed over ranks (n/8 bytes:
reduce-scatter by one exchange, then an allgather). Values are reduced once by the native
allreduce, which gives the same bits on every rank.

Cost per rank (R = row bytes, c = ceil(ceil(n/8)/P) bitmap chunk bytes): allreduce of n*R bytes
booked as floor(2(P-1)/P * n*R) in 2(P-1) messages; bitmap (P-1)*c by exchange plus
floor((P-1)/P * P*c) by allgather, 2(P-1) messages. Local work O(n). Wins when the union is dense.
"""

from __future__ import annotations

from typing import Any

from .._registry import register
from .._types import ReduceOp
from ..primitives import densify, gather
from ._common import bitmap_chunk, bitmap_or_allreduce, presence, union_of_presence
from ._cost import Cost, Shape

__all__ = ["dense", "cost"]


@register("sparse", "dense")
def dense(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
          accumulate_dtype: Any = None) -> tuple[Any, Any]:
    """Allreduce the densified input and an OR of presence bitmaps; gather the union."""
    full = densify(indices, values, n)
    work = comm.allreduce(full, full, op, op_name="dense.allreduce")
    present = bitmap_or_allreduce(comm, presence(indices, n), "dense.union")  # waited last
    comm.stream_order(work)
    union = union_of_presence(present, indices.dtype)
    return union, gather(full, union)


def cost(shape: Shape, rank: int) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce)."""
    c = Cost().allreduce("dense.allreduce", shape.size, shape.n * shape.row_bytes)
    if shape.size > 1:
        chunk = bitmap_chunk(shape.n, shape.size)
        c.book("dense.union", (shape.size - 1) * chunk, shape.size - 1)
        c.allgather("dense.union", shape.size, chunk * shape.size)
    return c
