"""Helpers shared by the sparse algorithms: zero-filled merges, presence bitmaps, and the
native allreduce of values (:func:`allreduce_values`: float max/min through order keys where
the backend's own drop a NaN).

Semantics every algorithm implements: an index absent on a rank counts as 0 there, for every op.
A merge of partial results over disjoint groups of ranks is therefore ``op(a or 0, b or 0)`` per
index: for sum that is the plain merge; for max, min and prod the entries missing from some part
are combined with 0 (``max(v, 0)``, ``min(v, 0)``, ``v * 0``), exactly as a dense reduction would.
The 0 of an absent entry is +0 and every combination follows ``primitives.combine`` (a +0/-0 tie
gives +0 for max, -0 for min), so a -0 survives a sum or max only where every rank holds it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .._types import UFUNCS, ReduceOp, array_namespace
from ..primitives import _accel, _numpy_few, _numpy_reduce, combine, merge_sorted
from ..primitives._numpy_reduce import canonical_nan
from ..wire._exchange import gather_entries
from ..wire._pack import COO, Wire

__all__ = ["reduce_parts", "rank_slices", "allgatherv_entries", "fill_absent", "members",
           "held_by", "minus_zero_rows", "union_of",
           "positions_in", "presence", "union_of_presence", "bitmap_or_allreduce", "bitmap_chunk",
           "canonical_nan", "has_minus_zero", "allreduce_values", "native_drops_nan",
           "native_keeps_minus_zero", "keyed_minmax", "order_keys", "from_order_keys",
           "value_row_bytes"]


def fill_absent(union: Any, values: Any, part_indices: Sequence[Any], op: ReduceOp) -> Any:
    """Combine with +0, in place, the entries of ``union`` missing from at least one part.

    ``union`` is sorted unique and contains every part's (sorted unique) indices. For sum only a
    -0 changes (to +0), so a sum looks up only its rows that hold one (none: it returns after
    one pass over the values).
    """
    if union.shape[0] == 0:
        return values
    xp = array_namespace(union)
    if op is ReduceOp.SUM:
        if values.dtype.kind != "f" or not has_minus_zero(xp, values):
            return values
        rows = minus_zero_rows(xp, values)
        missing = rows[held_by(union[rows], part_indices) < len(part_indices)]
        with np.errstate(invalid="ignore"):
            values[missing] = combine(values[missing], values.dtype.type(0), op)
        return values
    missing = held_by(union, part_indices) < len(part_indices)
    if values.ndim > 1:
        missing = missing.reshape((-1,) + (1,) * (values.ndim - 1))
    # on every entry, kept where missing: no host read (the ±0 tie rule of combine applies)
    with np.errstate(invalid="ignore", over="ignore"):  # e.g. inf * 0 where it is not kept
        values[...] = xp.where(missing, combine(values, values.dtype.type(0), op), values)
    return values


def members(sorted_unique: Any, wanted: Any) -> Any:
    """Whether each of ``wanted`` is in the sorted unique array (a bool per element)."""
    xp = array_namespace(wanted)
    if sorted_unique.shape[0] == 0:
        return xp.zeros(wanted.shape[0], dtype=bool)
    at = xp.minimum(xp.searchsorted(sorted_unique, wanted), sorted_unique.shape[0] - 1)
    return sorted_unique[at] == wanted


def held_by(wanted: Any, part_indices: Sequence[Any]) -> Any:
    """How many of the sorted unique ``part_indices`` hold each of ``wanted`` (int32)."""
    return sum(members(part, wanted).astype(np.int32) for part in part_indices)


def minus_zero_rows(xp: Any, values: Any) -> Any:
    """Positions of the entries (rows) of float ``values`` that hold a -0."""
    flat = values.reshape(values.shape[0], math.prod(values.shape[1:]))
    if xp is np and flat.flags.c_contiguous:
        found = flat.view(_SIGNED_BITS[values.dtype.itemsize]) == _LEAST[values.dtype.itemsize]
    else:
        found = (flat == 0) & xp.signbit(flat)
    return xp.flatnonzero(found.any(axis=1))


def has_minus_zero(xp: Any, values: Any) -> bool:
    """Whether float ``values`` hold a -0: on the host, one min over the bits (-0's pattern is
    the least signed integer of the width), else a compare and a sign test."""
    if values.size == 0:
        return False
    if xp is np and values.flags.c_contiguous:
        bits = values.view(_SIGNED_BITS[values.dtype.itemsize])
        return int(bits.min()) == _LEAST[values.dtype.itemsize]
    return bool(((values == 0) & xp.signbit(values)).any())


#: itemsize -> the signed integer type of that width, and its least value (-0's bits)
_SIGNED_BITS = {2: np.int16, 4: np.int32, 8: np.int64}
_LEAST = {size: int(np.iinfo(t).min) for size, t in _SIGNED_BITS.items()}


def native_drops_nan(on: Any) -> bool:
    """Whether the native float max/min of ``on`` (a Communicator, or a cost model's Shape)
    drop a NaN: NCCL's kernels (``fmaxf``/``fminf``/``__hmax``) return the other operand.

    Read from the ``native_minmax_drops_nan`` attribute, else True on the NCCL backend; a
    Shape without the attribute prices the MPI backend (False).
    """
    return bool(getattr(on, "native_minmax_drops_nan", getattr(on, "backend", None) == "nccl"))


def native_keeps_minus_zero(on: Any) -> bool:
    """Whether the native sum of ``on`` (a Communicator, or a cost model's Shape) keeps
    -0 + -0 = -0, which NCCL does not document for an in-switch (NVLS) reduction.

    Read from the ``native_sum_keeps_minus_zero`` attribute, else False on the NCCL backend;
    a Shape without the attribute prices the MPI backend (True).
    """
    return bool(getattr(on, "native_sum_keeps_minus_zero", getattr(on, "backend", None)
                        != "nccl"))


def keyed_minmax(on: Any, floats: bool, op: Any) -> bool:
    """Whether :func:`allreduce_values` reduces values (``floats``: float ones) with ``op``
    through order keys on ``on`` (a Communicator or a Shape)."""
    return floats and str(getattr(op, "value", op)) in ("max", "min") and native_drops_nan(on)


#: value itemsize -> the integer type its order keys travel in (NCCL has no int16: 16-bit
#: floats' keys go widened to int32, twice the bytes)
_KEY_TYPES = {2: np.int32, 4: np.int32, 8: np.int64}


def value_row_bytes(shape: Any) -> int:
    """Bytes one row of values moves in a native allreduce of a cost model's ``shape``
    (:class:`cupycoll.sparse._cost.Shape`): the row, or its order keys where they replace
    float max/min (16-bit values are float16: the sparse path takes no int16)."""
    floats = shape.float_values or shape.value_bytes == 2
    if keyed_minmax(shape, floats, shape.op):
        return np.dtype(_KEY_TYPES[shape.value_bytes]).itemsize * max(shape.width, 1)
    return shape.row_bytes


def _flip_negatives(bits: Any) -> None:
    """``i ^ 0x7F..F`` where the signed integer ``i`` is negative, in place (its own inverse):
    the arithmetic shift makes -1 of a negative and 0 of the rest, no branch, no host read."""
    flip = bits >> (8 * bits.dtype.itemsize - 1)
    flip &= bits.dtype.type(np.iinfo(bits.dtype).max)
    bits ^= flip


def order_keys(values: Any, op: ReduceOp) -> Any:
    """Integer keys of float ``values`` ordered as the floats are, -0 below +0; for ``op`` max
    every NaN first becomes the greatest key (a positive NaN), for min the least (a negative
    one). 32- and 64-bit values become their keys in place (the returned array is a view of
    their bits); 16-bit ones are turned in place, then widened to int32 (a new array).

    A float's bits as a signed integer i already order the non-negative floats; flipping
    every bit but the sign of a negative i reverses the negative ones below them. So an
    integer max (min) of keys is the float max (min) with NaN winning and a +0/-0 tie giving
    +0 (-0): :func:`cupycoll.primitives.combine`'s rule, whatever the order of the operands.
    """
    xp = array_namespace(values)
    nan = math.copysign(math.nan, 1.0 if op is ReduceOp.MAX else -1.0)
    xp.copyto(values, values.dtype.type(nan), where=xp.isnan(values))
    bits = values.view(_SIGNED_BITS[values.dtype.itemsize])
    _flip_negatives(bits)
    key_type = _KEY_TYPES[values.dtype.itemsize]
    return bits if bits.dtype == key_type else bits.astype(key_type)


def from_order_keys(keys: Any, values: Any) -> Any:
    """Write the floats of reduced ``keys`` (:func:`order_keys` of floats of ``values``'
    dtype; in place where they are ``values``' own bits) into ``values``, every NaN with
    numpy's bits, and return ``values``."""
    bits = values.view(_SIGNED_BITS[values.dtype.itemsize])
    if keys.dtype != bits.dtype or not array_namespace(keys).may_share_memory(keys, bits):
        bits[...] = keys  # widened keys: every one came from a key of this width
    _flip_negatives(bits)
    return canonical_nan(values)


def allreduce_values(comm: Any, buf: Any, op: ReduceOp, op_name: str) -> Any:
    """Start the in-place native allreduce of the values ``buf`` and return its Work, with the
    sparse contract's float max/min on every backend.

    Where the native float max/min drop a NaN (:func:`native_drops_nan`), the values travel
    as :func:`order_keys` in an integer MAX/MIN allreduce (exact and NaN-free on every
    transport; no more bytes, but 16-bit floats' keys go as int32) and come back by
    :func:`from_order_keys`, queued behind the allreduce in stream order (no host wait on a
    GPU): NaN wins, a +0/-0 tie gives +0 for max and -0 for min, NaN bits are numpy's.
    """
    if comm.size == 1 or not keyed_minmax(comm, buf.dtype.kind == "f", op):
        return comm.allreduce(buf, buf, op, op_name=op_name)
    keys = order_keys(buf, op)
    work = comm.allreduce(keys, keys, op, op_name=op_name)
    comm.stream_order(work)
    from_order_keys(keys, buf)
    return work


def reduce_parts(parts: Sequence[tuple[Any, Any]], op: ReduceOp,
                 accumulate_dtype: Any = None) -> tuple[Any, Any]:
    """Merge coalesced parts of disjoint rank groups in part order, absent entries counting as 0.

    A host merge takes ``merge_sorted``'s own paths directly, without its checks and dispatch
    (the parts are known sorted and unique here; a sum of fewer than ``SMALL`` value elements
    its few-entry path): the same operations, so the same bits. A float sum's absent entries
    get their +0 in the two-way merge's own pass where it runs, else by :func:`fill_absent`.
    """
    if len(parts) == 1:
        return parts[0]
    indices = [p[0] for p in parts]
    dtype = parts[0][1].dtype
    acc = dtype if accumulate_dtype is None else np.dtype(accumulate_dtype)
    if type(indices[0]) is not np.ndarray:  # a device's merge
        idx, val = merge_sorted(list(parts), op.value, accumulate_dtype, checked=False)
    elif (op is ReduceOp.SUM and _numpy_few.few_enough(sum(i.shape[0] for i in indices)
                                                      * math.prod(parts[0][1].shape[1:]))):
        idx, val = _numpy_few.few_summed(indices, [p[1] for p in parts], acc, dtype)
    else:
        idx, val, settled = _numpy_reduce.merged_pairs(parts, UFUNCS[op], acc,
                                                       absent_zero=op is ReduceOp.SUM)
        if settled:
            return idx, val
    return idx, fill_absent(idx, val, indices, op)


def rank_slices(counts: Sequence[int]) -> list[slice]:
    """The slice of each rank's block in an allgatherv result with these per-rank counts."""
    ends = np.cumsum(np.asarray(counts, dtype=np.int64)).tolist()
    return [slice(end - int(c), end) for end, c in zip(ends, counts)]


def allgatherv_entries(comm: Any, indices: Any, values: Any, op_name: str, wire: Wire = COO,
                       lo: int = 0, hi: int = 0) -> tuple[Any, Any, np.ndarray]:
    """Allgatherv indices and rows together: sizes first, then ONE exchange round.

    Each peer's entries arrive as one packed block (:mod:`cupycoll.wire`), skipped when that
    peer has none; the blocks are copied into the result in rank order, each peer's buffer let
    go once copied (the result's pages are written as the blocks' are freed: the resident
    peak is about the result and one block, not every block and the result).
    Returns (all indices, all rows, counts per rank).
    """
    parts, counts = gather_entries(comm, indices, values, op_name, wire, lo, hi)
    if len(parts) == 1:
        return parts[0][0], parts[0][1], counts
    xp, total = comm.xp, sum(int(a.shape[0]) for a, _ in parts)
    all_idx = xp.empty(total, dtype=parts[0][0].dtype)
    all_val = xp.empty((total,) + tuple(parts[0][1].shape[1:]), dtype=parts[0][1].dtype)
    start = 0
    for r in range(len(parts)):
        idx, val = parts[r]
        parts[r] = None  # the last reference to a peer's buffer: freed once copied
        all_idx[start:start + idx.shape[0]], all_val[start:start + idx.shape[0]] = idx, val
        start += int(idx.shape[0])
    return all_idx, all_val, counts


#: entries from which host index sets are joined and searched by numba's linear loops.
WALK_FROM = 64


def _host_loops(first: Any, entries: int) -> Any:
    """numba's loops for host arrays of at least ``WALK_FROM`` entries, else None."""
    return _accel.loops() if isinstance(first, np.ndarray) and entries >= WALK_FROM else None


def union_of(sets: Sequence[Any], dtype: Any) -> Any:
    """The union (sorted, unique, as ``dtype``) of sorted unique index sets: on the host a
    tree of branch-free two-way unions (:func:`cupycoll.primitives._numba_dense.union_sorted`),
    elsewhere a merge of the sets with throwaway values."""
    loops = _host_loops(sets[0], sum(int(a.shape[0]) for a in sets))
    if loops is not None:
        return loops.union_sorted(sets, np.dtype(dtype))
    xp = array_namespace(sets[0])
    marks = xp.zeros(max(int(a.shape[0]) for a in sets), dtype=np.int32)  # merge needs values
    union, _ = merge_sorted([(a, marks[:a.shape[0]]) for a in sets], checked=False)
    return union.astype(dtype, copy=False)


def positions_in(union: Any, wanted: Any) -> Any:
    """Where each of ``wanted`` (sorted, every one in the sorted unique ``union``) sits in
    ``union``: on the host one linear walk over both
    (:func:`cupycoll.primitives._numba_dense.positions_in`), else ``searchsorted``."""
    loops = _host_loops(union, int(union.shape[0]))
    if loops is not None:
        return loops.positions_in(union, wanted)
    return array_namespace(union).searchsorted(union, wanted)


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
