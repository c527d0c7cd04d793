"""numba loops of dense outputs and of the validation's index read (see :mod:`._numba`).

Re-exported by :mod:`cupycoll.primitives._numba` (what ``_accel._fast`` returns): the densify
pass of ``output="dense"``, the row accumulation of split's region variant, the value flags
(NaN/inf, -0), the (min, max, increasing) read of indices, the union of index sets and the
positions of a rank's indices in it (``mask``), and the bit-mask scans of the ``dense``
algorithm's union and of the threshold selection. Each moves or compares bits or adds like
numpy's loop, so results equal the numpy twins'.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from ._numba_cache import make_process_safe

__all__ = ["densify_sorted", "scatter_rows", "add_rows", "special_values",
           "divide_finding_specials", "index_stats",
           "union_sorted", "positions_in", "hit_masks", "copy_hits", "copy_unequal",
           "row_hits", "copy_hit_rows", "BITS_UP_TO", "UNEQUAL", "MAGNITUDE", "OUTSIDE"]

#: bytes of ``out`` zeroed at a time by densify_sorted (L1-sized: its rows land in cache).
_DENSIFY_BLOCK = 1 << 14


@njit(cache=True, nogil=True)
def _densify_bits(out, idx, val, width, block):  # type: ignore[no-untyped-def]
    k, rows = 0, out.size // width
    for lo in range(0, rows, block):
        hi = min(lo + block, rows)
        out[lo * width:hi * width] = 0
        end = k + np.searchsorted(idx[k:], hi)  # this block's rows: no test per row
        for i in range(k, end):
            start = idx[i] * width
            for j in range(width):
                out[start + j] = val[i * width + j]
        k = end


@njit(cache=True, nogil=True)
def _densify_bits_1d(out, idx, val, block):  # type: ignore[no-untyped-def]
    k, n = 0, out.size  # one value per row: no inner loop
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        out[lo:hi] = 0
        end = k + np.searchsorted(idx[k:], hi)  # this block's rows: no test per row
        rows, vals = idx[k:end], val[k:end]  # views indexed from 0 (see hit_masks)
        for i in range(rows.size):
            out[rows[i]] = vals[i]
        k = end


def densify_sorted(out: np.ndarray, idx: np.ndarray, val: np.ndarray) -> None:
    """``out`` (C-contiguous, n rows) all zero bits except rows ``idx`` (strictly increasing)
    = ``val``, block by block (a block of ~16 KiB zeroed, then its rows written while it is in
    cache): one pass over memory, where a fill and then a scatter make two. Each block's rows
    are found by one binary search, so the copy has no data-dependent test per row
    (docs/primitives.md). Moves bits (unsigned integers of the element size), so every dtype
    takes one of three loops."""
    bits = f"u{out.dtype.itemsize}"
    width = max(out.size // max(out.shape[0], 1), 1)
    block = max(_DENSIFY_BLOCK // (width * out.dtype.itemsize), 1)
    flat, rows = out.reshape(-1).view(bits), np.ascontiguousarray(val).reshape(-1).view(bits)
    if width == 1:
        _densify_bits_1d(flat, idx, rows, block)
    else:
        _densify_bits(flat, idx, rows, width, block)


@njit(cache=True, nogil=True)
def _scatter_bits(out, idx, val, width):  # type: ignore[no-untyped-def]
    if width == 1:  # no inner loop
        for k in range(idx.size):
            out[idx[k]] = val[k]
        return
    for k in range(idx.size):
        start = idx[k] * width
        for j in range(width):
            out[start + j] = val[k * width + j]


def scatter_rows(out: np.ndarray, idx: np.ndarray, val: np.ndarray) -> None:
    """``out[idx] = val`` (C-contiguous ``out``, rows of ``val`` in ``out``'s dtype, ``idx``
    in range and unique): one loop moving bits, cheaper than numpy's fancy assignment."""
    bits = f"u{out.dtype.itemsize}"
    width = max(out.size // max(out.shape[0], 1), 1)
    _scatter_bits(out.reshape(-1).view(bits), idx,
                  np.ascontiguousarray(val).reshape(-1).view(bits), width)


@njit(cache=True, nogil=True)
def _add_rows(out, idx, lo, val, width):  # type: ignore[no-untyped-def]
    for i in range(idx.size):
        start = (idx[i] - lo) * width
        for j in range(width):
            out[start + j] += val[i * width + j]


def add_rows(out: np.ndarray, idx: np.ndarray, lo: int, val: np.ndarray) -> bool:
    """``out[idx - lo] += val`` for unique ``idx`` (C-contiguous ``out``, rows), in one loop;
    False (nothing done) for a dtype numba does not add (float16: numpy's loop then)."""
    if out.dtype.kind not in "fi" or out.dtype.itemsize < 4:  # float16: numpy's loop
        return False
    width = max(out.size // max(out.shape[0], 1), 1)
    _add_rows(out.reshape(-1), idx, lo, np.ascontiguousarray(val, out.dtype).reshape(-1), width)
    return True


@njit(cache=True, nogil=True)
def _specials(bits, exponent, limit, minus_zero):  # type: ignore[no-untyped-def]
    large, negative_zero = False, False
    for i in range(bits.size):
        large |= (bits[i] & exponent) >= limit
        negative_zero |= bits[i] == minus_zero
    return large, negative_zero


@njit(cache=True, nogil=True)
def _large(bits, exponent, limit):  # type: ignore[no-untyped-def]
    large = False
    for i in range(bits.size):
        large |= (bits[i] & exponent) >= limit
    return large


def special_values(values: np.ndarray, limit: float = np.inf,
                   minus_zero: bool = True) -> tuple[bool, bool]:
    """(any NaN or any magnitude at or above ``limit``, a power of two or inf: by default any
    NaN or infinity; any -0) of float ``values``, from their bits in one pass. Without
    ``minus_zero`` the second item is False and the pass looks for the first alone, in about
    half the time."""
    size = values.dtype.itemsize
    bits = np.ascontiguousarray(values).reshape(-1).view(f"u{size}")
    mantissa = np.finfo(values.dtype).nmant
    exponent = bits.dtype.type(((1 << (8 * size - 1)) - 1) >> mantissa << mantissa)
    # ``limit``, a power of two: its bits are its exponent's
    at = bits.dtype.type(int(np.array(limit, values.dtype).view(bits.dtype)))
    if not minus_zero:
        return bool(_large(bits, exponent, at)), False
    large, negative_zero = _specials(bits, exponent, at, bits.dtype.type(1 << (8 * size - 1)))
    return bool(large), bool(negative_zero)


@njit(cache=True, nogil=True)
def _divided_specials(flat, by, inverse):  # type: ignore[no-untyped-def]
    """``flat /= by``, or ``flat *= by`` where ``inverse`` (``by`` is then 1 / P)."""
    nonfinite = False
    for i in range(flat.size):
        x = flat[i] * by if inverse else flat[i] / by
        flat[i] = x
        nonfinite |= not np.isfinite(x)
    return nonfinite


def divide_finding_specials(values: np.ndarray, size: int) -> bool:
    """Divide the C-contiguous float ``values`` by ``size`` in place, in their dtype (the bits
    of numpy's ``values /= size``), and tell whether any quotient is a NaN or an infinity:
    one pass. A power of two multiplies by its inverse, which is exact: ``x * 2**-k`` and
    ``x / 2**k`` are the same real number, rounded once alike (subnormals included), and a
    multiply costs a fraction of a divide."""
    flat = values.reshape(-1)
    inverse = size & (size - 1) == 0
    by = flat.dtype.type(1.0 / size if inverse else size)
    return bool(_divided_specials(flat, by, inverse))


@njit(cache=True, nogil=True)
def _increasing(idx):  # type: ignore[no-untyped-def]
    bad = False  # no early exit: the loop vectorises (an early return keeps it scalar)
    for i in range(1, idx.size):
        bad |= idx[i] <= idx[i - 1]
    return not bad


def index_stats(idx: np.ndarray) -> tuple[int, int, bool]:
    """``(min, max, strictly increasing)`` of non-empty host indices: one pass with no
    temporary for sorted ones (the usual input), whose ends are the min and max."""
    if _increasing(idx):
        return int(idx[0]), int(idx[-1]), True
    return int(idx.min()), int(idx.max()), False


@njit(cache=True, nogil=True)
def _union2(a, b, out):  # type: ignore[no-untyped-def]
    i, j, k, na, nb = 0, 0, 0, a.size, b.size
    while i < na and j < nb:  # branch-free: the smaller head out, the cursors at it advance
        x, y = a[i], b[j]
        out[k] = x if x < y else y
        i += x <= y
        j += y <= x
        k += 1
    out[k:k + na - i] = a[i:]  # the rest of one side (the other is done)
    k += na - i
    out[k:k + nb - j] = b[j:]
    return k + nb - j


def union_sorted(parts: Sequence[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """The union (sorted, unique, as ``dtype``) of sorted unique index arrays: a tree of
    branch-free two-way unions, O(N log P) for N indices in P arrays. No values: a k-way
    merge that sums marks only to drop them costs several times more (docs/sparse.md)."""
    level = [np.asarray(part, dtype) for part in parts]
    while len(level) > 1:
        joined = []
        for a, b in zip(level[::2], level[1::2]):
            out = np.empty(a.size + b.size, dtype)
            joined.append(out[:_union2(a, b, out)])
        level = joined + level[len(joined) * 2:]
    return level[0].copy() if level else np.empty(0, dtype)


@njit(cache=True, nogil=True)
def _walk(union, wanted, out):  # type: ignore[no-untyped-def]
    """One step per union entry, branch-free: the wanted head's position is written at every
    step and kept by the step that finds it (a loop per wanted entry that steps while the
    union is below it branches on each step, mispredicted at every stop)."""
    i, count = 0, wanted.size
    for j in range(union.size):
        if i == count:
            break
        out[i] = j
        i += union[j] == wanted[i]


def positions_in(union: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The position in ``union`` (sorted, unique) of each of ``wanted`` (sorted, each in
    ``union``): one walk over both, O(len(union)), where ``searchsorted``'s
    binary searches cost a cache miss and a mispredicted branch per level (docs/sparse.md).
    The same int64 positions as ``searchsorted``."""
    out = np.empty(wanted.size, np.int64)
    if union.size:
        _walk(union, wanted, out)
    return out


#: the share of hits up to which :func:`copy_unequal` stores per hit (the set bits of each
#: block's mask in order, each hit reset alone, x read at the hits only) rather than per
#: element (branch-free, then a fill): about where the two copies of uint32 cost the same
#: (uint64's cross a little higher).
BITS_UP_TO = 0.55


#: :func:`hit_masks`' tests, by code: the ``dense`` union's ``v != lo`` (the -0 sentinel's
#: bits), the threshold of floats ``|v| >= hi`` (NaN fails), the threshold of integers, whose
#: ``|INT_MIN|`` wraps, ``v >= hi or v <= lo``. Codes, not numba functions passed as arguments:
#: numba's cache cannot key a function argument across processes (every process misses the
#: cache and compiles again, appending to the index, and a save can fail with
#: "underlying object has vanished": docs/primitives.md).
UNEQUAL, MAGNITUDE, OUTSIDE = 0, 1, 2


@njit(cache=True, nogil=True, inline="always")
def _bits(xs, base, count, lo, hi, test):  # type: ignore[no-untyped-def]
    """The hits of ``xs[base:base + count]`` under ``test`` as the low bits of a word (one
    branch per block on the test; each loop branch-free and vectorised)."""
    bits = np.uint64(0)
    if test == UNEQUAL:
        for j in range(count):
            bits |= np.uint64(xs[base + j] != lo) << np.uint64(j)
    elif test == MAGNITUDE:
        for j in range(count):
            bits |= np.uint64(abs(xs[base + j]) >= hi) << np.uint64(j)
    else:
        for j in range(count):
            v = xs[base + j]
            bits |= np.uint64((v >= hi) | (v <= lo)) << np.uint64(j)
    return bits


@njit(cache=True, nogil=True)
def hit_masks(x, lo, hi, test, first, last, masks):  # type: ignore[no-untyped-def]
    """Bit j of ``masks[b]`` set where ``x[64 b + j]`` passes ``test`` (:data:`UNEQUAL`,
    :data:`MAGNITUDE`, :data:`OUTSIDE`), for the blocks ``first..last-1`` of 64 elements (x's
    last block may be shorter); the number of such elements. The loops here index views from
    0, which the compiler knows is never negative: indexed from ``first * 64``, a wraparound
    test per element keeps a loop scalar (docs/primitives.md)."""
    xs, ms, hits = x[first * 64:min(last * 64, x.size)], masks[first:last], 0
    for block in range(ms.size):
        base = block * 64
        if base + 64 <= xs.size:
            bits = _bits(xs, base, 64, lo, hi, test)
        else:  # the last, shorter block
            bits = _bits(xs, base, xs.size - base, lo, hi, test)
        ms[block] = bits
        hits += _popcount(bits)
    return hits


@njit(cache=True, nogil=True)
def copy_hits(x, first, last, masks, out_idx, out_val):  # type: ignore[no-untyped-def]
    """The positions and elements of x's blocks ``first..last-1`` whose bits are set in
    ``masks`` (:func:`hit_masks`), in order, into ``out_idx`` and ``out_val`` (exactly as
    long): one store per hit, x read at the hits only, never written (x may be read-only)."""
    start = first * 64
    xs, ms, k = x[start:min(last * 64, x.size)], masks[first:last], 0
    for block in range(ms.size):
        base, bits = block * 64, ms[block]
        while bits:  # the set bits in order
            i = base + np.int64(trailing_zeros(bits))
            out_idx[k] = start + i
            out_val[k] = xs[i]
            k += 1
            bits &= bits - np.uint64(1)


@njit(cache=True, nogil=True, inline="always")
def _popcount(m):  # type: ignore[no-untyped-def]
    m = m - ((m >> np.uint64(1)) & np.uint64(0x5555555555555555))
    m = (m & np.uint64(0x3333333333333333)) + ((m >> np.uint64(2)) & np.uint64(0x3333333333333333))
    m = (m + (m >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((m * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(cache=True, nogil=True)
def copy_unequal(x, sentinel, first, last, masks, reset,  # type: ignore[no-untyped-def]
                 out_idx, out_val):
    """The positions and elements of x's blocks ``first..last-1`` that are not ``sentinel``,
    in order, into ``out_idx`` and ``out_val`` (exactly as long as there are such elements),
    from :func:`hit_masks`' bits (:data:`UNEQUAL`); ``reset``: those blocks are all
    ``sentinel`` after."""
    start = first * 64
    xs, hits = x[start:min(last * 64, x.size)], out_idx.size
    if hits <= BITS_UP_TO * xs.size:  # a store per hit (and its reset); x read at hits only
        copy_hits(x, first, last, masks, out_idx, out_val)
        if reset:
            for k in range(hits):
                x[out_idx[k]] = sentinel
        return
    if hits:
        last_hit = xs.size - 1
        while xs[last_hit] == sentinel:  # the stores stop at the last hit: none past the end
            last_hit -= 1
        k = 0
        for i in range(last_hit + 1):
            v = xs[i]
            out_idx[k] = start + i
            out_val[k] = v
            k += v != sentinel
    if reset:  # a fill: cheaper than a store per element in the loop
        xs[:] = sentinel


@njit(cache=True, nogil=True)
def row_hits(bits, sentinel, first, last, hits):  # type: ignore[no-untyped-def]
    """``hits[r]`` = whether row r of the 2-D ``bits`` has an element that is not
    ``sentinel``, for the rows ``first..last-1`` (each row's test one branch-free OR of XORs,
    vectorised); the number of such rows."""
    rows, marks, count, width = bits[first:last], hits[first:last], 0, bits.shape[1]
    for r in range(rows.shape[0]):
        differ = 0
        for j in range(width):
            differ |= rows[r, j] ^ sentinel
        hit = differ != 0
        marks[r] = hit
        count += hit
    return count


@njit(cache=True, nogil=True)
def copy_hit_rows(bits, sentinel, first, last, hits, reset,  # type: ignore[no-untyped-def]
                  out_idx, out_rows):
    """The positions and rows of ``bits``' rows ``first..last-1`` marked in ``hits``
    (:func:`row_hits`), in order, into ``out_idx`` and ``out_rows`` (exactly as long); only
    those rows are read; ``reset``: each is then all ``sentinel``."""
    rows, marks, k, width = bits[first:last], hits[first:last], 0, bits.shape[1]
    for r in range(rows.shape[0]):
        if marks[r]:  # element loops: a row slice per row costs more at 16 wide
            out_idx[k] = first + r
            for j in range(width):
                out_rows[k, j] = rows[r, j]
            if reset:
                for j in range(width):
                    rows[r, j] = sentinel
            k += 1


make_process_safe(globals())  # ranks compiling at once: see _numba_cache
