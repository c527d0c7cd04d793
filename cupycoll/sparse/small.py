"""``small``: a call whose entries fit in the validation allreduce is done in that one collective.

Every agreement vector (:mod:`cupycoll._agreement`) ends with one slot of
:func:`~cupycoll._agreement.slot_words` int64 words per rank, INT64_MIN (neutral for MAX) except
where its owner writes. ``sparse_allreduce`` with ``algorithm="auto"`` writes its coalesced
entries into its own slot when they fit: the index bytes, then the row bytes (values in the
accumulate dtype, rounded first where the wire rounds them), each padded to 8 bytes. The
MAX-allreduce of the validation then also allgathers every rank's entries bit for bit
(``max(x, INT64_MIN) = x``). After the checks pass, every rank knows every rank's nnz and the
agreed dtypes, so all decide alike whether every block fitted; if so each rank merges the P
parts in rank order exactly as ``allgather`` does (the same bits, NaN and +/-0 rules included).
Otherwise ``auto`` picks an algorithm as before and the slots were unused words.

Which collectives run never depends on local data: the vector has the same length on every
rank and every call, whatever fits. Cost: nothing beyond the validation allreduce, whose bytes
include the slots on every call (at most 2 KiB in all; none above 32 ranks).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import _agreement as agreement
from .._registry import register
from .._types import ReduceOp
from ..primitives import _accel
from ..primitives._unfolded import folded
from ..wire import round_values
from ._common import reduce_parts
from ._cost import Cost, Shape

__all__ = ["block_words", "fits_all", "fits", "cost", "pack", "blocks", "merge", "small",
           "MOST_ENTRIES", "ALGORITHM"]

#: no block of more entries fits a slot (the largest, P = 1; 4-byte indices, 1-byte rows): a
#: call with more skips its slot without sizing it
MOST_ENTRIES = agreement.slot_words(1) * 8 // 5


def _padded(nbytes: int) -> int:
    return -(-nbytes // 8) * 8


def block_words(nnz: int, index_bytes: int, row_bytes: int) -> int:
    """int64 words of one rank's block: indices, then rows, each padded to 8 bytes."""
    return (_padded(nnz * index_bytes) + _padded(nnz * row_bytes)) // 8


def fits_all(size: int, nnz: Sequence[int], index_bytes: int, row_bytes: int) -> bool:
    """Whether every rank's block (``nnz[r]`` entries) fits in its slot."""
    words = agreement.slot_words(size)  # a block's words grow with its nnz
    return words > 0 and block_words(max(nnz), index_bytes, row_bytes) <= words


def fits(shape: Shape) -> bool:
    """Whether every rank's entries fit in its slot (then ``auto`` runs ``small``)."""
    return fits_all(shape.size, shape.nnz, shape.index_bytes, shape.row_bytes)


def cost(shape: Shape, rank: int) -> Cost:
    """Traffic beyond the validation allreduce: none (the entries travel in its slots)."""
    return Cost()


def pack(comm: Any, vec: np.ndarray, at: int, idx: Any, val: Any,
         wire_values: str | None) -> Any:
    """Write this rank's entries into its slot at word ``at`` of ``vec`` when they fit.

    Returns the vector to settle: ``vec`` itself on the host; on a device, its copy with the
    entries written there (no host round trip). Values are rounded first when the wire rounds
    them (as ``allgather`` rounds every rank's part, P > 1 only).
    """
    p, nnz = comm.size, int(idx.shape[0])
    words = agreement.slot_words(p)
    row_bytes = val.dtype.itemsize * (int(val.shape[1]) if val.ndim == 2 else 1)
    if not words or block_words(nnz, idx.dtype.itemsize, row_bytes) > words:
        return vec
    xp = comm.xp
    if xp is not np:
        vec = xp.asarray(vec)
    val = folded(val)
    if nnz:
        if wire_values is not None and p > 1 and val.dtype.kind == "f" and val.dtype.itemsize >= 4:
            val = round_values(val, wire_values)[1].astype(val.dtype, copy=False)
        raw = vec.view(np.uint8)
        start, ni = at * 8, nnz * idx.dtype.itemsize
        raw[start:start + ni] = idx.view(np.uint8)
        start += _padded(ni)
        raw[start:start + nnz * row_bytes] = val.reshape(-1).view(np.uint8)
    return vec


def blocks(slots: np.ndarray, nnz: Sequence[int], index_dtype: np.dtype, value_dtype: np.dtype,
           width: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every rank's (indices, rows) block, in rank order, as views of the reduced ``slots``
    (host): the inverse of :func:`pack`."""
    words = slots.shape[0] // len(nnz)
    row = (width,) if width else ()
    row_bytes = value_dtype.itemsize * max(width, 1)
    parts = []
    for r, count in enumerate(nnz):
        raw = slots[r * words:(r + 1) * words].view(np.uint8)
        ni = count * index_dtype.itemsize
        start = _padded(ni)
        parts.append((raw[:ni].view(index_dtype),
                      raw[start:start + count * row_bytes].view(value_dtype)
                      .reshape((count,) + row)))
    return parts


def merge(xp: Any, slots: np.ndarray, nnz: Sequence[int], index_dtype: np.dtype,
          acc: np.dtype, width: int, op: Any) -> tuple[Any, Any]:
    """Merge every rank's block from the reduced ``slots`` (host) in rank order, as
    ``allgather`` merges its parts; the result on ``xp``'s device. A sum of several blocks
    is one numba pass over the slots where numba runs (the same additions: the same bits)."""
    loops = _accel.loops() if op is ReduceOp.SUM and len(nnz) > 1 else None
    if loops is not None and acc in loops.SUM_DTYPES:
        words = slots.shape[0] // len(nnz)
        index_bytes = [r * words * 8 for r in range(len(nnz))]  # where each block starts
        row_bytes = [at + _padded(count * index_dtype.itemsize)  # its rows, after the indices
                     for at, count in zip(index_bytes, nnz)]
        idx, val = loops.sum_parts(
            slots.view(index_dtype), slots.view(acc),
            [at // index_dtype.itemsize for at in index_bytes],
            [at // acc.itemsize for at in row_bytes], nnz, (width,) if width else (), index_dtype)
    else:
        idx, val = reduce_parts(blocks(slots, nnz, index_dtype, acc, width), op, acc)
    if xp is not np:
        idx, val = xp.asarray(idx), xp.asarray(val)
    return idx, val


def small(comm: Any, indices: Any, values: Any, n: int, op: Any, accumulate_dtype: Any,
          wire: Any = None, *, counts: Sequence[int], slots: np.ndarray) -> tuple[Any, Any]:
    """The algorithm: every rank's block merged from the agreed ``slots`` (``counts``: every
    rank's nnz), this rank's ``indices`` and ``values`` giving only the index dtype and the
    row width. No message: the entries came with the validation."""
    width = int(values.shape[1]) if values.ndim == 2 else 0
    return merge(comm.xp, slots, counts, np.dtype(indices.dtype), np.dtype(accumulate_dtype),
                 width, op)


ALGORITHM = register("sparse", "small", small, cost=cost, counts=True, rides=True,
                     coded=False)
