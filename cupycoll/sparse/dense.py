"""``dense``: densify to n, one dense allreduce, read the union back (sparse-as-dense fallback).

The union of indices cannot be read from the reduced values (entries can cancel or be explicit
zeros), so presence travels with them. For sum (and avg) it rides in the SAME allreduce: a tail
of ``ceil(n/F)`` extra elements after the n rows, each holding F presence fields of b bits
(b = bit length of P, so P ones never carry into the next field; F*b <= the dtype's exact
integer bits per item size: 11 for 2 bytes, 24 for 4, 53 for 8). Summing non-negative
integers below 2^(F*b) is exact in any order, so every rank decodes the same union; for
float32 at P <= 7 the tail is n/8 elements (+12.5% bytes for 1-D, +12.5%/width for rows) and
the separate bitmap rounds disappear. Folding is used while the tail stays within 1/8 of the
values (F * width >= 8: 1-D float32 up to P = 7, 1-D float64 up to P = 63, rows of 8 or more
at any P that fits); otherwise, and for max, min and prod (whose reductions cannot OR
bits), presence is a packed bitmap ORed over ranks (n/8 bytes: reduce-scatter by
one exchange, then an allgather). Values are reduced once by the native allreduce, which gives
the same bits on every rank.

Cost per rank (R = row bytes, V = value bytes, c = ceil(ceil(n/8)/P)): folded: allreduce of
n*R + ceil(n/F)*V bytes booked as floor(2(P-1)/P * bytes) in 2(P-1) messages. Bitmap:
allreduce of n*R bytes, plus bitmap (P-1)*c by exchange and floor((P-1)/P * P*c) by allgather,
2(P-1) messages. Local work O(n): zero fill, one scatter, one pass over the tail, one gather.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._registry import register
from .._types import ReduceOp
from ..primitives import gather
from ._common import bitmap_chunk, bitmap_or_allreduce, presence, union_of_presence
from ._cost import Cost, Shape

__all__ = ["dense", "cost", "presence_fields"]

#: exact integer bits of a sum per accumulate item size (the float's significand; integers of
#: the same size use the same, fields being built in float64).
_EXACT_BITS = {2: 11, 4: 24, 8: 53}


def presence_fields(size: int, itemsize: int, op: Any, width: int = 0) -> tuple[int, int]:
    """Return (F, b): presence fields per tail element and bits per field; F = 0: no folding.

    Folding is used when the tail adds at most 1/8 of the values' elements (F * width >= 8):
    beyond that (1-D float32 from P = 8 on), the separate bitmap's n/8 bytes are cheaper.
    """
    if str(getattr(op, "value", op)) not in ("sum", "avg") or itemsize not in _EXACT_BITS:
        return 0, 0
    bits = max(size, 1).bit_length()
    fields = _EXACT_BITS[itemsize] // bits
    return (fields, bits) if fields * max(width, 1) >= 8 else (0, 0)


def _lane(fields: int, bits: int) -> tuple[int, Any]:
    """Bits and unsigned dtype of the integer that carries one tail element's fields."""
    return (32, np.dtype("<u4")) if fields * bits <= 32 else (64, np.dtype("<u8"))


def _encode(xp: Any, indices: Any, tail: Any, fields: int, bits: int) -> None:
    """Write this rank's presence fields (value 1 at each index) into ``tail``: presence
    bytes placed at every b-th bit of a lane, packed little-endian (one pass each)."""
    m, (lane, utype) = tail.shape[0], _lane(fields, bits)
    present = xp.zeros(m * fields, dtype=np.uint8)
    present[indices] = 1
    lanes = xp.zeros((m, lane), dtype=np.uint8)
    lanes[:, 0:fields * bits:bits] = present.reshape(m, fields)
    tail[...] = xp.packbits(lanes.reshape(-1), bitorder="little").view(utype)  # flat: fast


def _decode(xp: Any, tail: Any, fields: int, bits: int, n: int, index_dtype: Any) -> Any:
    """Ascending indices whose summed presence field is non-zero (only non-zero lanes are
    unpacked; a field is non-zero iff the OR of its bits, folded onto its lowest bit, is 1)."""
    m, (lane, utype) = tail.shape[0], _lane(fields, bits)
    blocks = xp.flatnonzero(tail)
    codes = tail[blocks].astype(np.int64)
    folded = codes.copy()
    for shift in range(1, bits):
        folded |= codes >> shift
    packed = folded.astype(utype).view(np.uint8)
    lows = xp.unpackbits(packed, bitorder="little").reshape(-1, lane)[:, 0:fields * bits:bits]
    pos = xp.flatnonzero(xp.ascontiguousarray(lows).view(bool))  # bool: the fast nonzero
    union = pos if blocks.shape[0] == m else blocks[pos // fields] * fields + pos % fields
    return union[:int(xp.searchsorted(union, n))].astype(index_dtype, copy=False)


@register("sparse", "dense")
def dense(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
          accumulate_dtype: Any = None) -> tuple[Any, Any]:
    """Allreduce the densified input (and, for sum, its presence fields) in one buffer."""
    xp, row = comm.xp, tuple(values.shape[1:])
    width = int(np.prod(row, dtype=np.int64)) if row else 1
    fields, bits = presence_fields(comm.size, values.dtype.itemsize, op, width)
    tail_len = -(-n // fields) if fields else 0
    buf = xp.zeros(n * width + tail_len, dtype=values.dtype)
    full = buf[:n * width].reshape((n,) + row)
    full[indices] = values
    if fields:
        _encode(xp, indices, buf[n * width:], fields, bits)
        comm.stream_order(comm.allreduce(buf, buf, op, op_name="dense.allreduce"))
        union = _decode(xp, buf[n * width:], fields, bits, n, indices.dtype)
        return union, gather(full, union)
    work = comm.allreduce(buf, buf, op, op_name="dense.allreduce")
    present = bitmap_or_allreduce(comm, presence(indices, n), "dense.union")  # waited last
    comm.stream_order(work)
    union = union_of_presence(present, indices.dtype)
    return union, gather(full, union)


def cost(shape: Shape, rank: int) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce)."""
    fields, _ = presence_fields(shape.size, shape.value_bytes, shape.op, shape.width)
    tail = -(-shape.n // fields) * shape.value_bytes if fields else 0
    c = Cost().allreduce("dense.allreduce", shape.size, shape.n * shape.row_bytes + tail)
    if shape.size > 1 and not fields:
        chunk = bitmap_chunk(shape.n, shape.size)
        c.book("dense.union", (shape.size - 1) * chunk, shape.size - 1)
        c.allgather("dense.union", shape.size, chunk * shape.size)
    return c

