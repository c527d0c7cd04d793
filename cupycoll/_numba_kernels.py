"""numba loops of the hot numpy primitives: an optional accelerator, bitwise equal to the twins.

Imported lazily by :mod:`cupycoll.primitives` only when ``CUPYCOLL_NUMBA`` allows it and numba
imports. Only the core loops live here: validation, casts to the accumulation dtype and back,
output dtypes and trimming stay in the numpy code, so errors and dtypes cannot diverge.

Each loop does what the numpy twin does, element by element: the merge folds the values of one
index into the identity of the op in part order (``ufunc.at`` on an identity-filled output), with
numpy's max/min (``a > b or isnan(a) ? a : b``, likewise ``<``): NaN propagates (the first NaN
stays) and a tie such as ±0 takes the later value. The scans compare magnitudes exactly like
:func:`primitives._abs_ge_test`. Compiled on first use per signature and cached in
``__pycache__`` (numba recompiles silently when that directory is read-only).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numba import njit

from .primitives import _abs_threshold, _block_cuts, _identity

__all__ = ["merge", "select", "count"]

#: op codes of the merge loop, keyed by the numpy ufunc of primitives._UFUNCS.
OPS = {np.add: 0, np.multiply: 1, np.maximum: 2, np.minimum: 3}
#: dtypes the merge loop accumulates in (float16 has no native numba arithmetic).
MERGE_DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "int32", "int64"))
#: elements per scan block: a block without a hit costs one vectorised count.
_SCAN = 64


@njit(cache=True, nogil=True, inline="always")
def _fold(a, b, op):  # type: ignore[no-untyped-def]
    if op == 0:
        return a + b
    if op == 1:
        return a * b
    if op == 2:
        return a if (a > b or a != a) else b
    return a if (a < b or a != a) else b


@njit(cache=True, nogil=True)
def _merge2(src, lo, mid, hi, dst):  # type: ignore[no-untyped-def]
    """Branch-free merge of the sorted unique runs ``src[lo:mid]``, ``src[mid:hi]`` into dst."""
    i, j, k = lo, mid, lo
    while i < mid and j < hi:
        a, b = src[i], src[j]
        first = np.int64(a < b)
        dst[k] = b + (a - b) * first
        i += first
        j += 1 - first
        k += 1
    dst[k:k + mid - i] = src[i:mid]
    k += mid - i
    dst[k:k + hi - j] = src[j:hi]


@njit(cache=True, nogil=True)
def merge_into(idx, starts, cuts, shift, val, ident, op, out_idx, out_val):  # type: ignore
    """Merge the sorted unique runs ``idx[starts[p]:starts[p+1]]`` and fold their rows ``val``.

    Block by block (``cuts[p, b]``: offset of block b in part p; no index straddles two blocks),
    keys ``idx << shift | position`` are unique and ascending within a part; a tree of
    branch-free pairwise merges sorts a block's keys in cache-sized buffers, so equal indices
    meet in position (= part) order, and the last merge writes each index once with
    ``ident op v_p0 op v_p1 ...``. ``val``, ``out_val`` are 2-D; returns the number of outputs.
    """
    parts, blocks = cuts.shape[0], cuts.shape[1] - 1
    size = 0
    for b in range(blocks):
        size = max(size, (cuts[:, b + 1] - cuts[:, b]).sum())
    keys, spare = np.empty(size, np.int64), np.empty(size, np.int64)
    bounds = np.empty(parts + 1, np.int64)
    out, prev = 0, np.int64(-1)
    for b in range(blocks):
        bounds[0] = 0
        for p in range(parts):
            at = bounds[p]
            for q in range(starts[p] + cuts[p, b], starts[p] + cuts[p, b + 1]):
                keys[at] = (np.int64(idx[q]) << shift) | q
                at += 1
            bounds[p + 1] = at
        keys, spare, out, prev = _merge_fold(keys, spare, bounds, shift, val, ident, op,
                                             out_idx, out_val, out, prev)
    return out


@njit(cache=True, nogil=True)
def _merge_fold(keys, spare, bounds, shift, val, ident, op,  # type: ignore[no-untyped-def]
                out_idx, out_val, out, prev):
    """Merge-sort one block's runs of keys (bounds) and fold them into the outputs from ``out``."""
    while bounds.size > 3:
        runs = bounds.size - 1
        for r in range(0, runs - 1, 2):
            _merge2(keys, bounds[r], bounds[r + 1], bounds[r + 2], spare)
        if runs % 2:
            spare[bounds[runs - 1]:bounds[runs]] = keys[bounds[runs - 1]:bounds[runs]]
        keys, spare = spare, keys
        bounds = np.append(bounds[:-1:2], bounds[-1])
    total, low, width = bounds[-1], (np.int64(1) << shift) - 1, val.shape[1]
    i, mid = 0, bounds[1] if bounds.size == 3 else total
    j, last = mid, keys.dtype.type(np.iinfo(keys.dtype).max)
    for _ in range(total):  # the last merge, branch-free, fused with the fold
        a = keys[i] if i < mid else last
        b = keys[j] if j < total else last
        first = np.int64(a < b)
        key = b + (a - b) * first
        i += first
        j += 1 - first
        at, where = key >> shift, key & low
        if at != prev:
            out_idx[out] = at
            prev = at
            out += 1
            for c in range(width):
                out_val[out - 1, c] = _fold(ident[0], val[where, c], op)
        else:
            for c in range(width):
                out_val[out - 1, c] = _fold(out_val[out - 1, c], val[where, c], op)
    return keys, spare, out, prev


@njit(cache=True, nogil=True)
def select_into(x, lo, hi, out_idx, out_val):  # type: ignore[no-untyped-def]
    """Write the positions and values of the hits of x in ascending order; return their number.

    A hit is ``x <= lo or x >= hi``. Whole blocks of ``_SCAN`` are first counted by a
    fixed-length (vectorised) loop, so a block without a hit costs two compares per element.
    """
    found = 0
    full = x.size - x.size % _SCAN
    for start in range(0, full, _SCAN):
        hits = 0
        for j in range(_SCAN):
            hits += (x[start + j] >= hi) | (x[start + j] <= lo)
        if hits:
            found = _select_run(x, start, start + _SCAN, lo, hi, out_idx, out_val, found)
    return _select_run(x, full, x.size, lo, hi, out_idx, out_val, found)


@njit(cache=True, nogil=True, inline="always")
def _select_run(x, start, stop, lo, hi, out_idx, out_val, found):  # type: ignore[no-untyped-def]
    for i in range(start, stop):
        if x[i] >= hi or x[i] <= lo:
            out_idx[found] = i
            out_val[found] = x[i]
            found += 1
    return found


@njit(cache=True, nogil=True)
def count_hits(x, lo, hi):  # type: ignore[no-untyped-def]
    """Number of hits of :func:`select_into`."""
    hits = 0
    for i in range(x.size):
        hits += (x[i] >= hi) | (x[i] <= lo)
    return hits

def merge(indices: Sequence[np.ndarray], values: Sequence[np.ndarray], ufunc: np.ufunc,
          acc: np.dtype, itype: np.dtype) -> tuple[np.ndarray, np.ndarray, int] | None:
    """merge_sorted's core on validated parts: ``(out_idx, out_val, count)``, None if unsupported.

    Values are cast to ``acc`` by numpy (as the twin does) before the loop folds them.
    """
    if acc not in MERGE_DTYPES or not any(i.size for i in indices):
        return None
    counts = np.fromiter((i.size for i in indices), np.int64, len(indices))
    starts = np.zeros(len(indices) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    total = int(starts[-1])
    shift = max(1, (total - 1).bit_length())
    if max((int(i[-1]) for i in indices if i.size), default=0).bit_length() + shift > 63:
        return None
    idx = np.concatenate(indices, dtype=itype, casting="unsafe")
    with np.errstate(all="ignore"):  # the twin's cast to acc, under the twin's errstate
        val = np.concatenate(values, dtype=acc, casting="unsafe").reshape(total, -1)
    ident = np.full(1, _identity(ufunc, acc), acc)
    out_idx, out_val = np.empty(total, itype), np.empty((total,) + values[0].shape[1:], acc)
    cuts = np.array(_block_cuts(list(indices), total), np.int64)
    done = merge_into(idx, starts, cuts, shift, val, ident, OPS[ufunc], out_idx,
                      out_val.reshape(total, -1))
    return out_idx, out_val, done


def _scan_bounds(x: np.ndarray, t: Any) -> tuple[Any, Any] | None:
    """``(lo, hi)`` of x's dtype with ``|x| >= t`` exactly ``x <= lo or x >= hi``, or None.

    ``lo = -tt``, ``hi = tt`` for the exact threshold tt of :func:`primitives._abs_threshold`
    (NaN fails both tests). None for the cases numpy keeps: float16 (no numba arithmetic), a
    uniform answer, and ``tt = |INT_MIN|``.
    """
    if x.dtype == np.float16:
        return None
    tt = _abs_threshold(x.dtype, t)
    if isinstance(tt, bool) or (x.dtype.kind == "i" and tt > np.iinfo(x.dtype).max):
        return None
    return x.dtype.type(-tt), x.dtype.type(tt)


def select(x: np.ndarray, t: Any, itype: np.dtype) -> tuple[np.ndarray, np.ndarray] | None:
    """select_abs_ge's core on a validated 1-D x: ``(indices as itype, values)``, or None.

    One pass into output buffers of len(x) (pages never written are never touched), then the
    hits are copied out. None when the case is not covered.
    """
    bounds = _scan_bounds(x, t)
    if bounds is None:
        return None
    out_idx, out_val = np.empty(x.size, itype), np.empty(x.size, x.dtype)
    found = select_into(x, *bounds, out_idx, out_val)
    return out_idx[:found].copy(), out_val[:found].copy()


def count(x: np.ndarray, t: Any) -> int | None:
    """count_abs_ge's core on a validated 1-D x; None when the case is not covered."""
    bounds = _scan_bounds(x, t)
    return None if bounds is None else int(count_hits(x, *bounds))
