"""numba loops of sums of sorted unique parts, added in part order (see :mod:`._numba`).

Re-exported by :mod:`cupycoll.primitives._numba`. A small call's merge (every rank's block,
read from the validation's entry slots, :mod:`cupycoll.sparse.small`) and ``merge_sorted``'s sums
below ``_numpy_few.LOOP_SUM`` elements cost more in numpy calls (a dozen of them) than in
arithmetic; one compiled pass over the parts does the same additions in the same order, so
the same bits. Sums of exactly two parts (allgather's at P = 2, every round of recursive
doubling) take :func:`sum_two` at any size: a two-way merge whose 1-D loop has no branch to
mispredict. :func:`sum_unsorted` coalesces unsorted entries (``coo_reduce``'s sums) through a
bitmap over the index span instead of a sort of every entry.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from numba import njit

from ._numba_cache import make_process_safe

__all__ = ["sum_parts", "sum_two", "sum_unsorted", "distinct_sorted", "fold_rows", "SUM_DTYPES"]

#: accumulate dtypes the loop adds in (float16 has no native numba arithmetic).
SUM_DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "int32", "int64"))


@njit(cache=True, nogil=True)
def _sum_parts(keys, rows, key_starts, row_starts, counts, width, zero, absent_zero,
               out_idx, out_val):  # type: ignore[no-untyped-def]
    """Merge the parts (part p: ``counts[p]`` ascending unique keys from ``key_starts[p]``,
    their rows of ``width`` from ``row_starts[p]``): each index's first row copied, later rows
    added in part order; ``absent_zero``: then ``+ zero`` where some part lacks the index
    (absent counts as +0: a -0 sum becomes +0, as ``fill_absent`` does). Returns the number
    of indices."""
    parts = counts.size
    cursor = np.zeros(parts, np.int64)
    found = 0
    while True:
        first = -1
        least = keys[0]
        for p in range(parts):
            if cursor[p] < counts[p]:
                key = keys[key_starts[p] + cursor[p]]
                if first < 0 or key < least:
                    first, least = p, key
        if first < 0:
            return found
        held = 0
        out = found * width
        for p in range(first, parts):
            c = cursor[p]
            if c < counts[p] and keys[key_starts[p] + c] == least:
                row = row_starts[p] + c * width
                if held == 0:
                    for j in range(width):
                        out_val[out + j] = rows[row + j]
                else:
                    for j in range(width):
                        out_val[out + j] = out_val[out + j] + rows[row + j]
                held += 1
                cursor[p] = c + 1
        if absent_zero and held < parts:
            for j in range(width):
                out_val[out + j] = out_val[out + j] + zero[0]
        out_idx[found] = least
        found += 1


def sum_parts(keys: np.ndarray, rows: np.ndarray, key_starts: Sequence[int],
              row_starts: Sequence[int], counts: Sequence[int], row: tuple,
              index_dtype: np.dtype, absent_zero: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Sum of parts laid out in two flat arrays (``keys``: indices, ``rows``: values in the
    accumulate dtype, one of :data:`SUM_DTYPES`; part p from ``key_starts[p]`` and
    ``row_starts[p]``, ``counts[p]`` entries of shape ``row``): the ascending union as
    ``index_dtype`` and its rows; ``absent_zero``: an entry absent from a part counts as +0
    there (``fill_absent``'s rule), else only the parts holding it are added."""
    total = int(sum(counts))
    width = math.prod(row)
    out_idx = np.empty(total, index_dtype)
    out_val = np.empty(total * width, rows.dtype)
    found = 0 if not total else _sum_parts(
        keys, rows, np.array(key_starts, np.int64), np.array(row_starts, np.int64),
        np.array(counts, np.int64), width, np.zeros(1, rows.dtype), absent_zero, out_idx,
        out_val)
    return out_idx[:found], out_val[:found * width].reshape((found,) + row)


@njit(cache=True, nogil=True)
def _two_1d(a, va, b, vb, zero, absent_zero, out_idx, out_val):  # type: ignore[no-untyped-def]
    i, j, k, na, nb = 0, 0, 0, a.size, b.size
    while i < na and j < nb:  # the smaller index out; a shared one's values added, a before b
        x, y = a[i], b[j]
        in_a, in_b = x <= y, y <= x
        both = va[i] + vb[j]
        out_val[k] = both if in_a and in_b else (va[i] if in_a else vb[j])
        out_idx[k] = x if in_a else y
        i, j, k = i + in_a, j + in_b, k + 1
    return _tails(a, va, b, vb, i, j, k, zero, absent_zero, out_idx, out_val)


@njit(cache=True, nogil=True)
def _two_1d_zero(a, va, b, vb, zero, absent_zero, out_idx,
                 out_val):  # type: ignore[no-untyped-def]
    """:func:`_two_1d` with ``absent_zero``: a value of one part + ``zero``, as one add (a
    missing side counts ``zero``; ``0 + v`` is ``v + 0``, NaN payloads included). Both values
    are read before the selects, as :func:`_two_1d` reads them for its sum: a read inside a
    select compiles to a branch on the comparison, which new indices mispredict about every
    other entry (docs/primitives.md)."""
    i, j, k, na, nb = 0, 0, 0, a.size, b.size
    while i < na and j < nb:
        x, y, p, q = a[i], b[j], va[i], vb[j]
        in_a, in_b = x <= y, y <= x
        out_val[k] = (p if in_a else zero) + (q if in_b else zero)
        out_idx[k] = x if in_a else y
        i, j, k = i + in_a, j + in_b, k + 1
    return _tails(a, va, b, vb, i, j, k, zero, absent_zero, out_idx, out_val)


@njit(cache=True, nogil=True)
def _two_rows(a, va, b, vb, zero, absent_zero, out_idx, out_val):  # type: ignore[no-untyped-def]
    """Rows as 2-D arrays ``(entries, width)``, each element addressed by its two indices,
    which LLVM vectorizes; it does not vectorize a flat array addressed by ``entry * width + e``
    (docs/primitives.md)."""
    i, j, k, na, nb = 0, 0, 0, a.size, b.size
    width = va.shape[1]
    while i < na and j < nb:
        x, y = a[i], b[j]
        if x < y:
            out_idx[k] = x
            _one_row(va, i, zero, absent_zero, out_val, k)
            i += 1
        elif y < x:
            out_idx[k] = y
            _one_row(vb, j, zero, absent_zero, out_val, k)
            j += 1
        else:
            out_idx[k] = x
            for e in range(width):
                out_val[k, e] = va[i, e] + vb[j, e]
            i, j = i + 1, j + 1
        k += 1
    return _tails(a, va, b, vb, i, j, k, zero, absent_zero, out_idx, out_val)


@njit(cache=True, nogil=True, inline="always")
def _one_row(rows, at, zero, absent_zero, out_val, k):  # type: ignore[no-untyped-def]
    """Row ``at`` of one part into ``out_val[k]``, + ``zero`` where ``absent_zero``."""
    if absent_zero:
        for e in range(rows.shape[1]):
            out_val[k, e] = rows[at, e] + zero
    else:
        for e in range(rows.shape[1]):
            out_val[k, e] = rows[at, e]


@njit(cache=True, nogil=True)
def _tails(a, va, b, vb, i, j, k, zero, absent_zero, out_idx,
           out_val):  # type: ignore[no-untyped-def]
    """Copy what is left of either part (one of them is done) after entry ``k``, + ``zero``
    where ``absent_zero``; the count (values 1-D, or rows 2-D)."""
    rest_a, rest_b = a.size - i, b.size - j
    out_idx[k:k + rest_a] = a[i:]
    out_val[k:k + rest_a] = va[i:]
    if absent_zero:
        out_val[k:k + rest_a] += zero
    k += rest_a
    out_idx[k:k + rest_b] = b[j:]
    out_val[k:k + rest_b] = vb[j:]
    if absent_zero:
        out_val[k:k + rest_b] += zero
    return k + rest_b


def sum_two(a: np.ndarray, va: np.ndarray, b: np.ndarray, vb: np.ndarray, acc: np.dtype,
            itype: np.dtype, absent_zero: bool = False,
            out: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The sum of two sorted unique parts (values in ``acc``, one of ``SUM_DTYPES``): every
    index once, ascending, as ``itype``; a shared index's rows added a's first (a left fold
    in part order, the bits of ``merge_sorted``'s other paths), faster than the one-sort path
    (docs/primitives.md). ``absent_zero``: a row of one part gets + 0 (an absent entry counts
    as +0: a -0 becomes +0, as ``fill_absent`` makes it) in the same pass. ``out``: the
    indices and rows written there (C-contiguous, as many entries as the union holds: a
    packed block's parts), else into new arrays."""
    row = tuple(va.shape[1:])
    width = math.prod(row)
    shape = (-1,) if width == 1 else (-1, width)
    va = np.ascontiguousarray(va, acc).reshape(shape)
    vb = np.ascontiguousarray(vb, acc).reshape(shape)
    total = a.shape[0] + b.shape[0]
    out_idx, out_val = (np.empty(total, itype), np.empty((total,) + shape[1:], acc)) \
        if out is None else (out[0], out[1].reshape(shape))
    absent_zero = absent_zero and acc.kind == "f"
    loop = _two_rows if width != 1 else _two_1d_zero if absent_zero else _two_1d
    found = loop(a, va, b, vb, acc.type(0), absent_zero, out_idx, out_val)
    return out_idx[:found], out_val[:found].reshape((found,) + row)


@njit(cache=True, nogil=True, inline="always")
def _popcount(word):  # type: ignore[no-untyped-def]
    """The set bits of a uint64, as int64 (LLVM makes this one ``popcnt``)."""
    word = word - ((word >> np.uint64(1)) & np.uint64(0x5555555555555555))
    word = (word & np.uint64(0x3333333333333333)) + \
        ((word >> np.uint64(2)) & np.uint64(0x3333333333333333))
    word = (word + (word >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((word * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(cache=True, nogil=True, inline="always")
def _bit(at):  # type: ignore[no-untyped-def]
    """Index offset ``at``'s bit in its word (word ``at >> 6``)."""
    return np.uint64(1) << np.uint64(at & 63)


@njit(cache=True, nogil=True)
def distinct_sorted(idx, lo, marks):  # type: ignore[no-untyped-def]
    """The ascending distinct values of ``idx`` (all in [lo, lo + 64 * marks.size)).
    ``marks``: uint64, a bit an index from ``lo``, all clear, as it is again on return. Each
    index sets its bit, then the set bits are read in index order, each word cleared once
    read: no sort, and the random writes go to 1/32 of the bytes an int32 slot each takes."""
    for j in range(idx.size):
        marks[(idx[j] - lo) >> 6] |= _bit(idx[j] - lo)
    found = 0
    for w in range(marks.size):
        found += _popcount(marks[w])
    keys, k = np.empty(found, idx.dtype), 0
    for w in range(marks.size):
        word, first = marks[w], lo + (w << 6)
        marks[w] = 0
        while word:
            low = word & (~word + np.uint64(1))
            keys[k] = first + _popcount(low - np.uint64(1))
            k, word = k + 1, word ^ low
    return keys


@njit(cache=True, nogil=True)
def fold_rows(idx, lo, marks, keys, slots, rows, out):  # type: ignore[no-untyped-def]
    """Sum the rows of the entries of each index into ``out[slots[i]]`` for ``keys[i]``
    (:func:`distinct_sorted` of ``idx``), left-folded in input order, the first copied (so -0
    and every bit as ``coo_reduce``). ``rows``: 2-D, ``out``: C-contiguous 2-D of their dtype,
    one of ``SUM_DTYPES``; ``marks`` as :func:`distinct_sorted` takes it: the keys' bits are
    set again, so an entry's key is the first key of its word plus the set bits below its
    own (all in cache, where a slot an index is not)."""
    firsts = np.empty(marks.size, np.int32)
    for i in range(keys.size):
        word = (keys[i] - lo) >> 6
        if marks[word] == 0:
            firsts[word] = i
        marks[word] |= _bit(keys[i] - lo)
    ats = np.empty(idx.size, np.int32)  # each entry's slot first, in a pass of its own: the
    for j in range(idx.size):  # reads overlap there, not stalled behind the branch below
        word, below = (idx[j] - lo) >> 6, _bit(idx[j] - lo) - np.uint64(1)  # (docs/primitives.md)
        ats[j] = slots[firsts[word] + _popcount(marks[word] & below)]
    seen, width = np.zeros(out.shape[0], np.bool_), rows.shape[1]
    for j in range(idx.size):
        at = ats[j]
        if seen[at]:
            for e in range(width):
                out[at, e] += rows[j, e]
        else:
            seen[at] = True
            for e in range(width):
                out[at, e] = rows[j, e]
    for i in range(keys.size):
        marks[(keys[i] - lo) >> 6] = 0


def sum_unsorted(idx: np.ndarray, val: np.ndarray, acc: np.dtype, lo: int,
                 marks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``coo_reduce``'s sum of unsorted entries (indices in [lo, hi]) in ``acc`` (one of
    ``SUM_DTYPES``): the ascending unique indices and, for each, its rows left-folded in input
    order, so the same bits as the sort path. ``marks``: as :func:`distinct_sorted` takes it;
    it lists the distinct indices in order, so nothing is sorted and the rows are read once,
    in input order (docs/primitives.md)."""
    keys = distinct_sorted(idx, lo, marks)
    row = tuple(val.shape[1:])
    rows = np.ascontiguousarray(val, acc).reshape(idx.size, math.prod(row))
    out_val = np.empty((keys.size, rows.shape[1]), acc)
    fold_rows(idx, lo, marks, keys, np.arange(keys.size, dtype=np.int32), rows, out_val)
    return keys, out_val.reshape((keys.size,) + row)


make_process_safe(globals())  # ranks compiling at once: see _numba_cache
