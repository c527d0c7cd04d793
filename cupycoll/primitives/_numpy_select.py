"""numpy twins of the threshold scans and top-k: ``count_abs_ge``, ``select_abs_ge``,
``kth_abs``, ``topk_abs`` (semantics in :mod:`cupycoll.primitives`)."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import numpy as np

from ._accel import _fast
from ._checks import _index_dtype, _k, _real, _values
from ._common import _abs_threshold, smallest_positive


#: elements per block of the threshold scans: the block's |x| and mask stay in cache.
_BLOCK = 1 << 16
#: arrays at least this long find the top-k threshold from a sample (see _kth_candidates).
_SAMPLE_FROM = 1 << 16
_SAMPLE_SIZE = 1 << 14
_Fill = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def _abs_ge_test(dtype: np.dtype, t: Any) -> bool | _Fill:
    """Return ``fill(block, mask, scratch)`` setting mask = |block| >= t exactly, or a uniform bool.

    Floats compare |block| with :func:`_abs_threshold`; integers compare block with it on both
    sides, which has no |INT_MIN| overflow.
    """
    tt = _abs_threshold(dtype, t)
    if isinstance(tt, bool):
        return tt
    if dtype.kind == "f":

        def fill(block: np.ndarray, mask: np.ndarray, scratch: np.ndarray) -> None:
            np.greater_equal(np.abs(block, out=scratch), tt, out=mask)

        return fill
    info = np.iinfo(dtype)
    if tt == info.max + 1:
        return lambda block, mask, scratch: np.equal(block, info.min, out=mask)
    lo, hi = dtype.type(-tt), dtype.type(tt)

    def fill_int(block: np.ndarray, mask: np.ndarray, scratch: np.ndarray) -> None:
        np.greater_equal(block, hi, out=mask)
        low = np.less_equal(block, lo, out=scratch.view(bool)[: block.size])
        np.logical_or(mask, low, out=mask)

    return fill_int


def _abs_ge_blocks(x: np.ndarray, t: Any) -> Iterator[tuple[int, np.ndarray | bool]]:
    """Yield ``(start, mask)`` per block of x, mask = |block| >= t; mask is a bool if uniform."""
    test = _abs_ge_test(x.dtype, t)
    if isinstance(test, bool):
        yield 0, test
        return
    size = max(1, min(_BLOCK, x.size))
    mask, scratch = np.empty(size, bool), np.empty(size, x.dtype)
    for start in range(0, x.size, size):
        block = x[start:start + size]
        test(block, mask[: block.size], scratch[: block.size])
        yield start, mask[: block.size]


def count_abs_ge(x: Any, t: Any) -> int:
    """Return the number of entries with ``|x_i| >= t`` (NaN never counts).

    Args:
        x: 1-D array of a value dtype.
        t: real threshold, compared exactly (not rounded to ``x.dtype``).
    """
    x, t = _values(x, "x", (1,)), _real(t)
    fast = _fast(x.size)
    total = None if fast is None else fast.count(x, t)
    if total is not None:
        return total
    total = 0
    for _, mask in _abs_ge_blocks(x, t):
        total += (x.size if mask else 0) if isinstance(mask, bool) else int(np.count_nonzero(mask))
    return total


def select_abs_ge(x: Any, t: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(indices, values)`` of the entries with ``|x_i| >= t``, indices ascending.

    One pass over x in cache-sized blocks. Indices are int32 when ``len(x) < 2**31``, else
    int64; values are copies of ``x[indices]``. NaN is never selected.
    """
    x, t = _values(x, "x", (1,)), _real(t)
    itype = _index_dtype(x.size)
    fast = _fast(x.size)
    found = None if fast is None else fast.select(x, t, itype)
    if found is not None:
        return found
    found, values = [], []
    for start, mask in _abs_ge_blocks(x, t):
        if isinstance(mask, bool):
            found.append(np.arange(x.size if mask else 0))
            values.append(x[: found[-1].size].copy())  # a copy, as the gathers are
        else:
            hits = np.flatnonzero(mask)
            values.append(x[start:start + mask.size][hits])  # gathered while the block is cached
            hits += start
            found.append(hits)
    if len(found) == 1:  # one block (small x): nothing to join
        return found[0].astype(itype), values[0]
    return (np.concatenate([np.empty(0, np.intp)] + found).astype(itype),
            np.concatenate([x[:0]] + values))


def _magnitudes(x: np.ndarray) -> np.ndarray:
    """|x| exactly: floats keep their dtype, integers become the unsigned type of their width."""
    mag = np.abs(x)
    if x.dtype.kind == "i":
        mag = mag.view(np.dtype(f"u{x.dtype.itemsize}"))
    return mag


def _kth_of(mag: np.ndarray, k: int) -> Any:
    """k-th largest of ``mag`` with NaN ranked lowest (NaN if fewer than k numbers)."""
    part = np.partition(mag, mag.size - k)
    if mag.dtype.kind != "f" or not np.isnan(part[mag.size - k:]).any():
        return part[mag.size - k]
    # NaN sorts last: the top k positions hold one iff x has one (checked in O(k), not O(n))
    valid = mag.size - int(np.count_nonzero(np.isnan(mag)))
    if k > valid:
        return mag.dtype.type(np.nan)
    return np.partition(mag, valid - k)[valid - k]


def _sample_threshold(x: np.ndarray, k: int) -> Any:
    """A threshold that at least k magnitudes reach with overwhelming probability, or None.

    The r-th largest of a fixed pseudo-random sample, r set 4 standard deviations (+8) above
    the sample's expected count of top-k entries; the caller checks and falls back if unlucky.
    """
    where = np.sort(np.random.default_rng(0x5EED).integers(0, x.size, _SAMPLE_SIZE))
    sample = _magnitudes(x[where])
    if sample.dtype.kind == "f":
        sample = sample[~np.isnan(sample)]
    mean = k / x.size * _SAMPLE_SIZE
    r = int(mean + 4.0 * math.sqrt(mean) + 8)
    if r > sample.size:
        return None
    return np.partition(sample, sample.size - r)[sample.size - r]


def _kth_candidates(x: np.ndarray, k: int) -> tuple[Any, np.ndarray | None, np.ndarray]:
    """Return ``(kth, idx, val)``: the k-th magnitude and ascending candidates containing top-k.

    Large arrays: one blocked select at a sampled threshold a little below the k-th magnitude,
    then an exact partition of the ~k candidates (falls back to the full array if the sample was
    unlucky). The candidates are then exactly the entries with |x| >= some t <= kth; after the
    fallback they are all of x (``idx`` None).
    """
    if x.size >= _SAMPLE_FROM and 4 * k <= x.size:
        t = _sample_threshold(x, k)
        if t == 0:  # the sample mostly zeros: not every entry a candidate (a mostly-zero x)
            found = _mostly_zero_candidates(x, k)
            if found is not None:
                return found
        elif t is not None:
            idx, val = select_abs_ge(x, t)
            if idx.size >= k:
                return _kth_of(_magnitudes(val), k), idx, val
    return _kth_of(_magnitudes(x), k), None, x


def _mostly_zero_candidates(x: np.ndarray, k: int) -> tuple[Any, np.ndarray, np.ndarray] | None:
    """:func:`_kth_candidates` of an x whose entries are mostly zero: its nonzero numbers and,
    where fewer than k, the first zeros (ties go to the lower indices; NaN ranks below 0);
    None where zeros run out (the full array decides)."""
    idx, val = select_abs_ge(x, smallest_positive(x.dtype))
    if idx.size >= k:
        return _kth_of(_magnitudes(val), k), idx, val
    wanted, start, step, zeros = k - idx.size, 0, max(4 * (k - idx.size), 1 << 16), []
    while wanted > 0 and start < x.size:  # the first zeros lie early in a mostly-zero x
        found = np.flatnonzero(x[start:start + step] == 0)[:wanted] + start
        zeros.append(found)
        wanted, start, step = wanted - found.size, start + step, 2 * step
    if wanted > 0:
        return None
    both = np.sort(np.concatenate([idx, *zeros]).astype(idx.dtype, copy=False))
    return _magnitudes(x[:0]).dtype.type(0), both, x[both]


def abs_ge_kth(x: np.ndarray, k: int, floor: float) -> tuple[np.ndarray, np.ndarray, float]:
    """``(indices, values, t)`` of the entries with ``|x_i| >= t``, t = the exact k-th
    magnitude of float x (NaN ranked lowest), or ``floor`` where that is below it, NaN, or k
    exceeds len(x): :func:`kth_abs` then :func:`select_abs_ge` over one ``|x|`` (a short host
    vector's threshold selection, where the two calls' checks cost more than the work)."""
    mag = np.abs(x)
    t = _kth_of(mag, k) if k <= x.size else floor
    t = float(t) if t >= floor else floor  # NaN fails the comparison too
    keep = np.flatnonzero(mag >= t)
    return keep.astype(_index_dtype(x.size), copy=False), x[keep], t


def kth_abs(x: Any, k: int) -> Any:
    """Return the exact k-th largest ``|x_i|`` (k = 1 is the largest), the threshold of top-k.

    NaN ranks below every number: the result is NaN only when fewer than k entries are numbers.
    Float inputs give a scalar of ``x.dtype``; int32/int64 give uint32/uint64 (``|INT_MIN|`` fits).
    """
    x = _values(x, "x", (1,))
    return _kth_candidates(x, _k(k, x.size))[0]


def topk_abs(x: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(indices, values)`` of the k entries of largest magnitude, indices ascending.

    Exact; ties at the k-th magnitude go to the lower indices; NaN ranks below every number.
    Index dtype as in :func:`select_abs_ge`.
    """
    x = _values(x, "x", (1,))
    k = _k(k, x.size)
    kth, idx, val = _kth_candidates(x, k)
    mag = _magnitudes(val)
    if mag.dtype.kind == "f" and np.isnan(kth):
        above, tied = ~np.isnan(mag), np.isnan(mag)
    else:
        above, tied = mag > kth, mag == kth
    above[np.flatnonzero(tied)[: k - int(np.count_nonzero(above))]] = True
    keep = np.flatnonzero(above)
    if idx is None:
        keep = keep.astype(_index_dtype(x.size), copy=False)
        return keep, x[keep]
    return idx[keep], val[keep]
