"""``dense``: densify to n, one dense allreduce, read the union back (sparse-as-dense fallback).

The union of indices cannot be read from reduced values alone (entries can cancel or be
explicit zeros), so presence travels with them, in the cheapest way the op and dtype allow:

- Float values (32 or 64 bits: ``Shape.float_values``) summed (sum/avg), any width, where
  the backend's native sum keeps -0 + -0 = -0 (MPI; not NCCL, whose in-switch NVLS reduction
  does not document it: :func:`._common.native_keeps_minus_zero`): absent entries are filled
  with -0, the identity of IEEE addition (-0 + x is x, bit for bit, for
  every x, +0 and NaN included). An index absent on every rank reduces to -0 in every element,
  and no sum of values that are not -0 is ever -0 (x + -x is +0 when rounding to nearest;
  additions near 0 are exact), so without -0 inputs the
  union is the rows with an element that is not -0, read with no extra traffic, and every value
  has the same bits as with +0 fills. The ONE extra element in the allreduce's tail counts the
  ranks that hold a -0 value; only then (an explicit -0 input, e.g. 0 times a negative) is a
  -0 result ambiguous, and only in the rows some rank holds with a -0 element: those rows are
  allgathered (``dense.signed_zeros``) and their holders counted by an allreduce of an int32
  per row (``dense.signed_zeros.held``; data-dependent, not in :func:`cost`, which sees
  indices only; :func:`settle_cost`): they are in the union, and a row held by some but not
  all ranks has its -0 elements made +0 (an absent entry counts as +0).
- Other values (integers, 16-bit floats, and on NCCL every float) summed in rows of width >=
  ``FOLD_WIDTH``: one presence count per row rides in the SAME allreduce, as an n-element tail
  (exact: P < 2^11).
- Otherwise (other 1-D sums; max, min, prod, whose reductions cannot count): a packed bitmap
  ORed over ranks (n/8 bytes: reduce-scatter by one exchange, then an allgather), overlapped
  with the values' allreduce.

Values are reduced once by the native allreduce, which gives the same bits on every rank; float
max/min where the native ones drop a NaN (NCCL) as integer order keys
(:func:`._common.allreduce_values`: 16-bit floats' keys travel as int32). No sparse entries
travel, so the wire format (``wire``) does not apply.

Cost per rank (R = row bytes, V = value bytes, c = ceil(ceil(n/8)/P)): signed zeros: allreduce
of n*R + V bytes booked as floor(2(P-1)/P * bytes) in 2(P-1) messages; folded counts: the same
with n*(R + V) bytes; bitmap: allreduce of n*R bytes, plus (P-1)*c by exchange and
floor((P-1)/P * P*c) by allgather, 2(P-1) messages. Local work O(n): one fill, one scatter, one
presence scan, one gather. On the host the -0-filled buffer is kept between calls and restored
after each (only the union's rows differ from -0 after the allreduce), so its fill is O(union)
from the second call on; the union of a large 1-D buffer is read by two numba passes (a count,
then a copy of exactly the union) that also restore it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .._registry import register
from .._types import ReduceOp, array_namespace, distinct
from ..primitives import gather
from ..primitives._accel import _fast, kept_filled, mark_filled
from ..primitives._unfolded import Unfolded
from ._common import (allreduce_values, bitmap_chunk, bitmap_or_allreduce, has_minus_zero,
                      members, minus_zero_rows, native_keeps_minus_zero, presence,
                      union_of_presence, value_row_bytes)
from ._cost import Cost, Shape, is_sum

__all__ = ["dense", "dense_result", "densify_into", "scatter_into", "add_into", "row_bits", "cost",
           "settle_cost", "folds_presence", "signed_zero_fill", "local_pass", "FOLD_WIDTH",
           "dense_output", "work", "ALGORITHM"]

#: integer rows at least this wide carry their presence count in the values' allreduce.
FOLD_WIDTH = 8

#: the operation name of settling -0 inputs (the bitmap; ``.counts``: the count allreduce).
SETTLE = "dense.signed_zeros"


def signed_zero_fill(op: Any, float_values: bool, keeps_minus_zero: bool = True) -> bool:
    """True when absent entries are filled with -0 and presence costs one tail element: float
    sums on a backend whose native sum ``keeps_minus_zero``."""
    return keeps_minus_zero and float_values and is_sum(op)


def folds_presence(size: int, itemsize: int, op: Any, width: int) -> bool:
    """True when (integer) rows carry a presence count each in the values' allreduce."""
    exact_bits = {2: 11, 4: 24, 8: 53}.get(itemsize, 0)
    return is_sum(op) and width >= FOLD_WIDTH and size < (1 << exact_bits)


def dense(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
          accumulate_dtype: Any = None, wire: Any = None) -> tuple[Any, Any]:
    """Allreduce the densified input with its presence (-0 fills, a count tail or a bitmap)."""
    xp, row = comm.xp, tuple(values.shape[1:])
    width = math.prod(row) if row else 0
    dtype = np.dtype(values.dtype)
    if signed_zero_fill(op, dtype.kind == "f" and dtype.itemsize >= 4,
                        native_keeps_minus_zero(comm)):
        return _signed_zeros(comm, indices, values, n, op, row)
    if folds_presence(comm.size, values.dtype.itemsize, op, width):
        buf = xp.zeros(n * (width + 1), dtype=values.dtype)
        full, counts = buf[:n * width].reshape((n,) + row), buf[n * width:]
        scatter_into(full, indices, values)
        counts[indices] = 1
        comm.stream_order(comm.allreduce(buf, buf, op, op_name="dense.allreduce"))
        union = xp.flatnonzero(counts).astype(indices.dtype, copy=False)
        return union, gather(full, union)
    full = scatter_into(xp.zeros((n,) + row, dtype=values.dtype), indices, values)
    work = allreduce_values(comm, full, op, "dense.allreduce")
    present = bitmap_or_allreduce(comm, presence(indices, n), "dense.union")  # waited last
    comm.stream_order(work)
    union = union_of_presence(present, indices.dtype)
    return union, gather(full, union)


def dense_result(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp, out: Any = None
                 ) -> Any:
    """The reduced n-vector itself (``output="dense"``): no presence is needed, since an index
    absent on a rank counts as 0 there for every op. The input is scattered into the zeroed
    result (``out`` or a new array), which is then reduced in place: one fill and one scatter
    besides the allreduce. (Scattering into a kept zero buffer and reducing out of place costs
    more on MPI, whose out-of-place allreduce copies its input first, and one more scatter to
    zero the buffer again.)"""
    row = tuple(values.shape[1:])
    if out is None:
        out = comm.xp.empty((n,) + row, dtype=values.dtype)
    densify_into(out, indices, values)
    comm.stream_order(allreduce_values(comm, out, op, "dense.allreduce"))
    return out


def densify_into(out: Any, indices: Any, values: Any) -> Any:
    """``out`` zero except at the (sorted, unique) ``indices``, which get ``values``: on the
    host one numba pass (as fast as the fill alone), else a fill and a scatter."""
    fast = _fast(out.size) if isinstance(out, np.ndarray) else None
    if fast is not None:
        fast.densify_sorted(out, indices, values)
    else:
        out.fill(0)
        out[indices] = values
    return out


def scatter_into(out: Any, indices: Any, values: Any) -> Any:
    """``out[indices] = values`` for unique ``indices`` in range: one numba loop on the host
    (``values`` :class:`Unfolded`: each row the sum of its entries, folded there)."""
    if isinstance(values, Unfolded):
        return values.into(out, indices)
    fast = _fast(values.size) if isinstance(out, np.ndarray) else None
    if fast is not None and values.dtype == out.dtype:
        fast.scatter_rows(out, indices, values)
    else:
        out[indices] = values
    return out


def add_into(out: Any, indices: Any, lo: int, values: Any) -> None:
    """``out[indices - lo] += values`` for unique ``indices``: one numba loop on the host."""
    fast = _fast(values.size) if isinstance(out, np.ndarray) else None
    if fast is None or not fast.add_rows(out, indices, lo, values):
        with np.errstate(all="ignore"):  # inf - inf is NaN on every rank, never a raise on one
            out[indices - lo] += values


def _signed_zeros(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp, row: tuple
                  ) -> tuple[Any, Any]:
    """One allreduce of the -0-filled values and a tail counting ranks holding a -0 value."""
    buf, full = _densified(comm.xp, indices, values, n, row)
    size = full.size
    xp = comm.xp  # on a device: no host read; on the host one min over the bits
    buf[size:] = (has_minus_zero(np, values) if xp is np
                  else ((values == 0) & xp.signbit(values)).any())
    comm.stream_order(comm.allreduce(buf, buf, op, op_name="dense.allreduce"))
    bits, minus_zero = row_bits(full)
    if not bool(buf[size] > 0):  # nobody holds a -0: the common case, no more traffic
        union, rows, reset = _not_minus_zero(bits, full, minus_zero, indices.dtype)
    else:
        union, rows, reset = _settle_signed_zeros(comm, indices, values, full, bits,
                                                  minus_zero)
    _restore(buf, full, union, reset)
    return union, rows


def _densified(xp: Any, indices: Any, values: Any, n: int, row: tuple) -> tuple[Any, Any]:
    """The -0-filled buffer (one element more, for the tail) and its ``(n,) + row`` view with
    ``values`` scattered at ``indices``."""
    size = n * math.prod(row)
    if xp is np:  # kept between calls, all -0 again after each (O(union), not O(n), to fill)
        buf = kept_filled(size + 1, values.dtype, -0.0)
    else:  # cupy's pool keeps device memory; a device fill is cheap
        buf = xp.empty(size + 1, dtype=values.dtype)
        buf[:size] = -0.0
    return buf, scatter_into(buf[:size].reshape((n,) + row), indices, values)


def row_bits(full: Any) -> tuple[Any, Any]:
    """``full``'s rows as unsigned integers of the same width, and -0's bits."""
    width = math.prod(full.shape[1:])
    bits = full.reshape(full.shape[0], width).view(f"u{full.dtype.itemsize}")
    return bits, bits.dtype.type(1 << (8 * bits.dtype.itemsize - 1))


#: the union share of the rows up to which the numpy path (device arrays, numba off, rows)
#: restores the kept host buffer (the union's rows set to -0) instead of leaving the next call
#: to fill it (above, the scatter costs more than the fill it saves).
RESTORE_SHARE = 1 / 8


def _restore(buf: Any, full: Any, union: Any, reset: bool) -> None:
    """Make the kept host buffer all -0 again: after the allreduce, only the union's rows and
    the tail differ from it (absent on every rank reduced to -0); ``reset``: the union scan has
    already put -0 back there."""
    if isinstance(buf, np.ndarray) and (reset or union.shape[0] <= RESTORE_SHARE * full.shape[0]):
        if not reset:
            full[union] = -0.0
        buf[full.size:] = -0.0
        mark_filled(buf, -0.0)


def local_pass(indices: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """The host work of one ``dense`` call without its allreduce (the tuner times it: gamma's
    ``dense`` unit): densify into the kept buffer, read the union back, restore; the union."""
    buf, full = _densified(np, indices, values, n, tuple(values.shape[1:]))
    bits, minus_zero = row_bits(full)
    union, _, reset = _not_minus_zero(bits, full, minus_zero, indices.dtype)
    _restore(buf, full, union, reset)
    return union


def _not_minus_zero(bits: Any, full: Any, minus_zero: Any, index_dtype: Any
                    ) -> tuple[Any, Any, bool]:
    """The rows of ``full`` with an element that is not -0, their values, and whether ``full``
    was reset to -0: for large 1-D host arrays the numba loops (a count, then a copy per hit
    or per element, then a reset: docs/sparse.md), else a
    comparison, ``flatnonzero`` and ``take``."""
    xp = array_namespace(full)
    fast = _fast(bits.size) if xp is np else None
    if fast is not None:
        itype = np.dtype(index_dtype)
        union, raw = (fast.select_unequal(bits.reshape(-1), minus_zero, itype, reset=True)
                      if bits.shape[1] == 1 else
                      fast.select_unequal_rows(bits, minus_zero, itype, reset=True))
        return union, raw.view(full.dtype).reshape((-1,) + full.shape[1:]), True
    kept = bits[:, 0] != minus_zero if bits.shape[1] == 1 else (bits != minus_zero).any(axis=1)
    union = xp.flatnonzero(kept).astype(index_dtype, copy=False)
    return union, xp.take(full, union, axis=0), False  # in range by construction


def _settle_signed_zeros(comm: Any, indices: Any, values: Any, full: Any, bits: Any,
                         minus_zero: Any) -> tuple[Any, Any, bool]:
    """Some rank holds a -0. Only the rows some rank holds with a -0 element can be in the
    union and read as absent (every holder's element -0), or keep a -0 they should lose (a
    rank without the row counts +0): allgather those rows, count their holders, read the
    union as without -0 inputs (:func:`_not_minus_zero`, the rows reduced to all -0 marked +0
    for it and -0 again after), and make +0 the -0 elements of those some rank lacks. Returns
    what :func:`_not_minus_zero` does."""
    xp, p = comm.xp, comm.size
    mine = indices[minus_zero_rows(xp, values)].astype(np.int64)
    gathered, _ = comm.allgatherv(mine, op_name=SETTLE)
    # the same on every rank; in the index dtype (a wider key makes searchsorted convert the
    # whole sorted array on each call)
    doubtful = distinct(xp, gathered).astype(indices.dtype, copy=False)
    held = members(indices, doubtful).astype(np.int32)
    if doubtful.shape[0]:
        comm.stream_order(comm.allreduce(held, held, ReduceOp.SUM, op_name=SETTLE + ".held"))
    hidden = doubtful[(bits[doubtful] == minus_zero).all(axis=1)]  # held, reduced to all -0
    bits[hidden] = 0  # +0 for the union read, -0 again in its result below
    union, rows, reset = _not_minus_zero(bits, full, minus_zero, indices.dtype)
    rows[xp.searchsorted(union, hidden)] = full.dtype.type(-0.0)
    partial = xp.searchsorted(union, doubtful[held < p])
    if partial.shape[0]:
        part = rows[partial]
        rows[partial] = xp.where((part == 0) & xp.signbit(part), full.dtype.type(0), part)
    return union, rows, reset


def settle_cost(size: int, rank: int, candidates: Sequence[int], doubtful: int,
                index_bytes: int = 8) -> Cost:
    """Traffic of settling -0 inputs (not in :func:`cost`, which sees no values): the
    allgatherv of every rank's rows with a -0 element (``candidates[r]`` of them, int64) and
    one int32 holder count per distinct such row (``doubtful``)."""
    c = Cost().allgatherv(SETTLE, size, rank, candidates, index_bytes)
    return c.allreduce(SETTLE + ".held", size, 4 * doubtful) if doubtful else c


def _bitmap(c: Cost, n: int, size: int, op: str) -> Cost:
    """:func:`bitmap_or_allreduce`'s traffic: one exchange of chunks, one allgather."""
    if size > 1:
        chunk = bitmap_chunk(n, size)
        c.book(op, (size - 1) * chunk, size - 1)
        c.allgather(op, size, chunk * size)
    return c


def cost(shape: Shape, rank: int, profile: Any = None) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce; inputs without
    -0 values: see the module docstring); a dense output moves the values alone."""
    if shape.output == "dense":
        return Cost().allreduce("dense.allreduce", shape.size, shape.n * value_row_bytes(shape))
    if signed_zero_fill(shape.op, shape.float_values, native_keeps_minus_zero(shape)):
        return Cost().allreduce("dense.allreduce", shape.size,
                                shape.n * shape.row_bytes + shape.value_bytes)
    if folds_presence(shape.size, shape.value_bytes, shape.op, shape.width):
        return Cost().allreduce("dense.allreduce", shape.size,
                                shape.n * (shape.row_bytes + shape.value_bytes))
    c = Cost().allreduce("dense.allreduce", shape.size, shape.n * value_row_bytes(shape))
    return _bitmap(c, shape.n, shape.size, "dense.union")


def dense_output(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp, out: Any,
                 finish: Any, minus_zero: bool = False, wire: Any = None) -> Any:
    """``output="dense"`` into ``out`` (the caller's dtype): :func:`dense_result` reduces
    straight into it when the values accumulate in its dtype, else into a buffer that
    ``finish`` (avg, the cast, NaN bits) turns into the caller's before it is copied over."""
    same = out.dtype == values.dtype
    dense = finish(dense_result(comm, indices, values, n, op, out if same else None))
    if dense is not out:
        out[...] = dense
    return out


def work(shape: Shape, rank: int, profile: Any = None) -> dict[str, float]:
    """Passes over n (1-D: ``dense`` per element; rows: ``dense_rows`` per row and
    ``dense_wide`` per element), and the rank's rows scattered and the union's read back
    (``dense_row``: a sorted write or copy, cheaper than a ``row`` gather). Presence is
    scanned apart only on the bitmap path (-0 fills and count tails are read by the same
    flatnonzero the pass over n already prices); a dense output has no pass over n (its rows
    are written into the zeroed output, which is then reduced in place)."""
    w = max(shape.width, 1)
    if shape.output == "dense":
        return {"fill": shape.n * w}
    bitmap = "dense.union" in cost(shape, rank).received
    passes = ({"dense": shape.n} if w == 1 else
              {"dense_rows": shape.n, "dense_wide": shape.n * w})  # rows: a test per row
    return {**passes, "dense_row": (shape.nnz[rank] + shape.union) * w,
            "scan": shape.n if bitmap else 0}


ALGORITHM = register("sparse", "dense", dense, cost=cost, work=work, dense_output=dense_output,
                     coded=False)
