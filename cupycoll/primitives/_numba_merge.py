"""numba loops of the k-way merge of sorted unique parts (:func:`cupycoll.primitives._numba.merge`).

The merge sorts keys ``index << shift | position`` block by block with a tree of branch-free
pairwise merges, so equal indices meet in part order, then folds each index's values into the
identity of the op in that order (numpy's ``ufunc.at`` on an identity-filled output, with the
max/min and signed-zero rules of :mod:`cupycoll.primitives._numba`): either in the same pass
over the keys (rows concatenated) or, part after part, through the output row each entry was
placed in (:func:`fold_part`: no copy of the parts' rows).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._numba_cache import make_process_safe

__all__ = ["merge_blocks", "fold_part", "close_up"]


@njit(cache=True, nogil=True, inline="always")
def _fold(a, b, op):  # type: ignore[no-untyped-def]
    if op == 0:
        return a + b
    if op == 1:
        return a * b
    if op == 2:
        if a > b or a != a:
            return a
        return a + b if a == 0 and b == 0 else b  # +0 + -0 = +0
    if a < b or a != a:
        return a
    return -((-a) + (-b)) if a == 0 and b == 0 else b  # -(-0 + +0) = -0


@njit(cache=True, nogil=True, inline="always")
def _take(src, i, j, k, dst):  # type: ignore[no-untyped-def]
    """One branch-free merge step: the smaller of ``src[i]``, ``src[j]`` to ``dst[k]``."""
    a, b = src[i], src[j]
    first = np.int64(a < b)
    dst[k] = b + (a - b) * first
    return i + first, j + 1 - first


@njit(cache=True, nogil=True)
def _merge2(src, i, mid, j, hi, k, dst):  # type: ignore[no-untyped-def]
    """Merge the sorted unique runs ``src[i:mid]``, ``src[j:hi]`` into dst from k."""
    while i < mid and j < hi:
        i, j = _take(src, i, j, k, dst)
        k += 1
    dst[k:k + mid - i] = src[i:mid]
    k += mid - i
    dst[k:k + hi - j] = src[j:hi]


@njit(cache=True, nogil=True)
def _merge_pairs(src, bounds, dst):  # type: ignore[no-untyped-def]
    """Merge the runs (0, 1), (2, 3), ... of src (``bounds``) into dst; an odd last run is
    copied. Two merges share one loop: a merge step waits on its load, and two independent
    chains of steps run side by side in the core (docs/primitives.md)."""
    runs = bounds.size - 1
    for r in range(0, runs - 3, 4):
        i0, m0, j0, h0 = bounds[r], bounds[r + 1], bounds[r + 1], bounds[r + 2]
        i1, m1, j1, h1 = bounds[r + 2], bounds[r + 3], bounds[r + 3], bounds[r + 4]
        k0, k1 = i0, i1
        while i0 < m0 and j0 < h0 and i1 < m1 and j1 < h1:
            i0, j0 = _take(src, i0, j0, k0, dst)
            i1, j1 = _take(src, i1, j1, k1, dst)
            k0 += 1
            k1 += 1
        _merge2(src, i0, m0, j0, h0, k0, dst)
        _merge2(src, i1, m1, j1, h1, k1, dst)
    if runs % 4 >= 2:
        r = runs - runs % 4
        _merge2(src, bounds[r], bounds[r + 1], bounds[r + 1], bounds[r + 2], bounds[r], dst)
    if runs % 2:
        dst[bounds[runs - 1]:bounds[runs]] = src[bounds[runs - 1]:bounds[runs]]


@njit(cache=True, nogil=True)
def _merge_both_ends(src, mid, dst):  # type: ignore[no-untyped-def]
    """Merge the sorted unique runs ``src[:mid]``, ``src[mid:]`` (keys >= 0, < 2**62) into dst
    from both ends at once: two independent chains, as in :func:`_merge_pairs`."""
    total = src.size
    top, none = np.int64(1) << 62, np.int64(-1)
    i, j, ii, jj = 0, mid, mid - 1, total - 1
    for k in range(total // 2):
        a = src[i] if i < mid else top  # the smallest left, front to back
        b = src[j] if j < total else top
        first = np.int64(a < b)
        dst[k] = b + (a - b) * first
        i += first
        j += 1 - first
        a = src[ii] if ii >= 0 else none  # the largest left, back to front
        b = src[jj] if jj >= mid else none
        last = np.int64(a > b)
        dst[total - 1 - k] = b + (a - b) * last
        ii -= last
        jj -= 1 - last
    if total % 2:
        dst[total // 2] = src[i] if i <= ii else src[j]


@njit(cache=True, nogil=True)
def merge_blocks(idx, starts, cuts, shift, val, ident, op,  # type: ignore[no-untyped-def]
                 out_idx, out_val, slots, work, first, last, out):
    """Merge the sorted unique runs ``idx[starts[p]:starts[p+1]]`` and fold their rows ``val``.

    Block by block, blocks ``first..last-1`` (``cuts[p, b]``: offset of block b in part p; no
    index straddles two blocks), keys ``idx << shift | position`` are unique and ascending within
    a part; a tree of branch-free pairwise merges sorts a block's keys in cache-sized buffers, so
    equal indices meet in position (= part) order, and one pass over the sorted keys writes each
    index once with ``ident op v_p0 op v_p1 ...``. ``val``, ``out_val`` are 2-D; ``work``: two
    int64 rows as long as the largest block. Writes from ``out`` and returns the new end.
    With no rows in ``val`` nothing is folded: ``slots[position]`` gets the output row of each
    entry instead, ``~row`` for the first entry of its row (see :func:`fold_part`).
    """
    parts = cuts.shape[0]
    keys, spare = work[0], work[1]
    bounds = np.empty(parts + 1, np.int64)
    prev = np.int64(-1)
    for b in range(first, last):
        bounds[0] = 0
        for p in range(parts):
            at = bounds[p]
            for q in range(starts[p] + cuts[p, b], starts[p] + cuts[p, b + 1]):
                keys[at] = (np.int64(idx[q]) << shift) | q
                at += 1
            bounds[p + 1] = at
        keys, spare = _merge_runs(keys, spare, bounds)
        if val.shape[0] == 0:
            out, prev = _place(keys[:bounds[-1]], shift, out_idx, slots, out, prev)
        else:
            out, prev = _fold_keys(keys[:bounds[-1]], shift, val, ident, op, out_idx, out_val,
                                   out, prev)
    return out


@njit(cache=True, nogil=True)
def _place(keys, shift, out_idx, slots, out, prev):  # type: ignore[no-untyped-def]
    """Write each index of the sorted ``keys`` once from ``out``; ``slots[position]``: its
    row, ``~row`` where the entry is the row's first."""
    low = (np.int64(1) << shift) - 1
    for t in range(keys.size):
        at, where = keys[t] >> shift, keys[t] & low
        new = at != prev
        out += new
        out_idx[out - 1] = at
        prev = at
        slots[where] = ~(out - 1) if new else out - 1
    return out, prev


@njit(cache=True, nogil=True)
def fold_part(slots, delta, val, ident, op, out_val):  # type: ignore[no-untyped-def]
    """Fold the rows ``val`` of one part into their output rows ``slots + delta`` (the first
    entry of a row, ``slots < 0``, starts from ``ident``): called part after part, this is
    merge_blocks' fold, ``ident op v_p0 op v_p1 ...``, without the parts' rows in one array."""
    width = val.shape[1]
    for i in range(slots.size):
        s = slots[i]
        new = s < 0
        row = (~s if new else s) + delta
        for c in range(width):
            base = ident[0] if new else out_val[row, c]
            out_val[row, c] = _fold(base, val[i, c], op)

@njit(cache=True, nogil=True)
def close_up(out_idx, out_val, begins, ends):  # type: ignore[no-untyped-def]
    """Move the stretches ``[begins[p], ends[p])`` of the outputs (rows of 2-D ``out_val``)
    down to follow each other, in place; return the total."""
    at = 0
    for p in range(begins.size):
        if at == begins[p]:
            at = ends[p]
            continue
        for i in range(begins[p], ends[p]):
            out_idx[at] = out_idx[i]
            for c in range(out_val.shape[1]):
                out_val[at, c] = out_val[i, c]
            at += 1
    return at


@njit(cache=True, nogil=True)
def _merge_runs(keys, spare, bounds):  # type: ignore[no-untyped-def]
    """Merge-sort one block's runs of keys (bounds); return (sorted keys, spare buffer)."""
    while bounds.size > 3:
        _merge_pairs(keys, bounds, spare)
        keys, spare = spare, keys
        bounds = np.append(bounds[:-1:2], bounds[-1])
    if bounds.size == 3:
        _merge_both_ends(keys[:bounds[-1]], bounds[1], spare)
        keys, spare = spare, keys
    return keys, spare


@njit(cache=True, nogil=True)
def _fold_keys(keys, shift, val, ident, op,  # type: ignore[no-untyped-def]
               out_idx, out_val, out, prev):
    """Fold the sorted ``keys``' rows of ``val`` into the outputs from ``out``."""
    low, width = (np.int64(1) << shift) - 1, val.shape[1]
    # the fold, branch-free: faster on mostly distinct indices, a little slower when most
    # indices repeat
    for t in range(keys.size):
        at, where = keys[t] >> shift, keys[t] & low
        new = at != prev
        out += new
        out_idx[out - 1] = at
        prev = at
        for c in range(width):
            base = ident[0] if new else out_val[out - 1, c]
            out_val[out - 1, c] = _fold(base, val[where, c], op)
    return out, prev


make_process_safe(globals())  # ranks compiling at once: see _numba_cache
