"""``dense``: densify to n, one dense allreduce, read the union back (sparse-as-dense fallback).

The union of indices cannot be read from the reduced values (entries can cancel or be explicit
zeros), so presence travels with them:

- Rows (width >= ``FOLD_WIDTH``) reduced by sum/avg: one presence count per row rides in the
  SAME allreduce, as an n-element tail after the rows (1 where this rank has the row). The sum
  of P ones is exact in any order (P < 2^11 even in float16), so every rank reads the same
  union with one flatnonzero of the tail; the tail adds 1/width of the bytes and no round.
- Otherwise (1-D values, where a count per index would add a whole value per index, and max,
  min, prod, whose reductions cannot count): a packed bitmap ORed over ranks (n/8 bytes:
  reduce-scatter by one exchange, then an allgather), overlapped with the values' allreduce.

Values are reduced once by the native allreduce, which gives the same bits on every rank.
No sparse entries travel, so the wire format (``wire``) does not apply.
(Presence packed as bit fields into the values' own tail was tried for 1-D: its pack and unpack
passes cost more on the CPU than the two bitmap rounds they save; see docs/tuning.md.)

Cost per rank (R = row bytes, V = value bytes, c = ceil(ceil(n/8)/P)): folded: allreduce of
n*(R + V) bytes booked as floor(2(P-1)/P * bytes) in 2(P-1) messages. Bitmap: allreduce of
n*R bytes, plus (P-1)*c by exchange and floor((P-1)/P * P*c) by allgather, 2(P-1) messages.
Local work O(n): zero fill, one scatter, one presence scan, one gather.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._registry import register
from .._types import ReduceOp
from ..primitives import gather
from ._common import bitmap_chunk, bitmap_or_allreduce, presence, union_of_presence
from ._cost import Cost, Shape

__all__ = ["dense", "cost", "folds_presence", "FOLD_WIDTH"]

#: rows at least this wide carry their presence count in the values' allreduce (<= 1/8 more).
FOLD_WIDTH = 8


def folds_presence(size: int, itemsize: int, op: Any, width: int) -> bool:
    """True when presence rides in the values' allreduce as one count per row."""
    exact_bits = {2: 11, 4: 24, 8: 53}.get(itemsize, 0)
    return (str(getattr(op, "value", op)) in ("sum", "avg") and width >= FOLD_WIDTH
            and size < (1 << exact_bits))


@register("sparse", "dense")
def dense(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
          accumulate_dtype: Any = None, wire: Any = None) -> tuple[Any, Any]:
    """Allreduce the densified input with its presence (folded for wide rows, else a bitmap)."""
    xp, row = comm.xp, tuple(values.shape[1:])
    width = int(np.prod(row, dtype=np.int64)) if row else 0
    if folds_presence(comm.size, values.dtype.itemsize, op, width):
        buf = xp.zeros(n * (width + 1), dtype=values.dtype)
        full, counts = buf[:n * width].reshape((n,) + row), buf[n * width:]
        full[indices] = values
        counts[indices] = 1
        comm.stream_order(comm.allreduce(buf, buf, op, op_name="dense.allreduce"))
        union = xp.flatnonzero(counts).astype(indices.dtype, copy=False)
        return union, gather(full, union)
    full = xp.zeros((n,) + row, dtype=values.dtype)
    full[indices] = values
    work = comm.allreduce(full, full, op, op_name="dense.allreduce")
    present = bitmap_or_allreduce(comm, presence(indices, n), "dense.union")  # waited last
    comm.stream_order(work)
    union = union_of_presence(present, indices.dtype)
    return union, gather(full, union)


def cost(shape: Shape, rank: int) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce)."""
    if folds_presence(shape.size, shape.value_bytes, shape.op, shape.width):
        return Cost().allreduce("dense.allreduce", shape.size,
                                shape.n * (shape.row_bytes + shape.value_bytes))
    c = Cost().allreduce("dense.allreduce", shape.size, shape.n * shape.row_bytes)
    if shape.size > 1:
        chunk = bitmap_chunk(shape.n, shape.size)
        c.book("dense.union", (shape.size - 1) * chunk, shape.size - 1)
        c.allgather("dense.union", shape.size, chunk * shape.size)
    return c
