"""Ok-Topk's global threshold on every step, from an allreduced log-scale histogram (issue 11).

After split-and-reduce, rank r holds the sums of its region; the global selection is
``|sum| >= t`` over all regions. Instead of reusing the last refresh's t with slow count feedback,
each step picks t from a histogram of the reduced magnitudes summed over ranks:

1. Bins: ``BINS`` log-spaced edges over ``[c / 2^OCTAVES, c * 2^OCTAVES]`` around the last
   threshold c (16 bins per octave, each about 4.4% wide), plus one bin below and one above:
   ``BINS + 2`` counts (int32; int64 when P*n >= 2^31), allreduced (sum) under
   ``oktopk.threshold``: 136 bytes.
2. The global count of ``|sum| >= e`` is then known exactly at every edge e. If some edge's count
   lies in ``[0.9k, 1.1k]`` (COUNT_RANGE), the edge whose count is closest to k is the threshold.
3. Otherwise the bin holding the k-th magnitude (or the tail below / above the window) is binned
   again, finer, in another round -- the correction within the step: its dtype values split in
   BINS runs of equal length (positive floats order as their bit patterns, so the split is
   nearly log-spaced and exact to the last value, where float64 log-spaced edges round by as
   much as a bin), so a round leaves at most a 32nd of them and any bin of a float64 narrows
   to one value within :func:`max_rounds`; it stops when the bin holds
   no two distinct values (ties): then the threshold is the tied value, whose count is >= k, and
   Ok-Topk keeps, of the entries tied at it, the lowest indices up to k in all
   (:func:`cupycoll.topk.oktopk.cut_ties`). After the last round, the closest edge seen that
   selects something (an edge that selects nothing loses to any that does).

Every rank computes the edges on the host from the same shared value and reads the same summed
counts, so the threshold is identical on every rank. Counting is ``|v| >= e`` exactly as
``select_abs_ge`` compares, so the count the histogram promises is the count selected.
Cost: O(candidates) per round to bin this rank's reduced nonzeros, and a (BINS + 2)-word
allreduce per round: usually one (the threshold moved less than an octave and the edges' counts
step over the range in no single bin; docs/topk.md has the digits demo's average).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._types import ReduceOp
from .selectors import smallest_positive

__all__ = ["histogram_threshold", "BINS", "OCTAVES", "COUNT_RANGE", "MAX_ROUNDS", "max_rounds"]

#: bins per round (the first log-spaced, 16 per octave), the window's half-width in octaves
#: around the last threshold, the accepted count range as fractions of k, and the least of the
#: most rounds per step (:func:`max_rounds`).
BINS = 32
OCTAVES = 1
COUNT_RANGE = (0.9, 1.1)
MAX_ROUNDS = 8


def max_rounds(dtype: Any) -> int:
    """The most rounds of a step's search in ``dtype``: the first (the window), then enough
    32-fold splits of the dtype's positive values (2^(bits - 1) of them) for any bin to narrow
    to one value, a tie; at least :data:`MAX_ROUNDS` (float32: 8, float64: 14)."""
    values_bits = 8 * np.dtype(dtype).itemsize - 1
    return max(MAX_ROUNDS, 1 + -(-values_bits // 5))


_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits_up(value: float, dtype: np.dtype) -> int:
    """The bit pattern of the least ``dtype`` value >= ``value`` (> 0)."""
    first = np.asarray(value, dtype=np.float64).astype(dtype)
    if float(first) < value:
        first = np.nextafter(first, dtype.type(np.inf))
    return int(np.asarray(first, dtype=dtype).view(_BITS[dtype.itemsize]))


def _value_edges(lo: float, hi: float, dtype: np.dtype) -> np.ndarray:
    """Edges (float64, ascending, each a ``dtype`` value) splitting the ``dtype`` values of
    ``[lo, hi)`` into :data:`BINS` runs of equal length (exact integer arithmetic on the bit
    patterns; fewer edges where fewer values)."""
    a, b = _bits_up(lo, dtype), _bits_up(hi, dtype)
    bits = np.unique(np.array([a + (b - a) * i // BINS for i in range(BINS + 1)], np.uint64))
    return bits.astype(_BITS[dtype.itemsize]).view(dtype).astype(np.float64)


def _counts_at_edges(comm: Any, mags: Any, edges: np.ndarray, wide: bool) -> np.ndarray:
    """Global count of ``mags >= e`` for every edge e (sum over ranks), host int64."""
    xp = comm.xp
    bins = xp.searchsorted(xp.asarray(edges), mags.astype(np.float64), side="right")
    local = xp.bincount(bins, minlength=edges.shape[0] + 1).astype(np.int64 if wide else np.int32)
    total = xp.empty_like(local)
    total = comm.run_fetch("allreduce", local, total, ReduceOp.SUM, result=total,
                           op_name="oktopk.threshold")  # one host sync: wait and read
    # above[b] = count in bins b, b+1, ...; a magnitude m is in bin b when b edges are <= m
    above = np.cumsum(total[::-1].astype(np.int64))[::-1]
    return above[1:]  # mags >= e_j  <=>  bin >= j + 1


def _distinct(lo: float, hi: float, dtype: Any) -> bool:
    """True when ``[lo, hi)`` holds at least two values of ``dtype`` (a finer bin can split it)."""
    first = np.asarray(lo, dtype=np.float64).astype(dtype)
    if float(first) < lo:
        first = np.nextafter(first, dtype.type(np.inf))
    return float(np.nextafter(first, dtype.type(np.inf))) < hi


def histogram_threshold(comm: Any, mags: Any, k: int, n: int, center: float, dtype: Any
                        ) -> tuple[float, int]:
    """Return (t, T): a magnitude threshold, identical on every rank, and the global count T of
    ``mags >= t`` (summed over ranks), T in ``[0.9k, 1.1k]`` unless ties make that impossible
    (then the tied value, T >= k, or the edge closest to k of those with T > 0).

    Args:
        mags: this rank's candidate magnitudes (the nonzero ``|sum|`` of its region).
        k, n: the count asked for and the vector length.
        center: a value identical on every rank near the expected threshold (the last one).
        dtype: the value dtype (edges stay above its least positive value: zeros never count).
    """
    with np.errstate(all="ignore"):  # edges at the dtype's extremes: a caller's raising
        return _search(comm, mags, k, n, center, np.dtype(dtype))  # state must not stop one rank


def _search(comm: Any, mags: Any, k: int, n: int, center: float, dtype: np.dtype
            ) -> tuple[float, int]:
    """:func:`histogram_threshold`'s rounds."""
    floor = smallest_positive(dtype)
    top = float(np.finfo(dtype).max)
    center = min(center, top)  # the window stays finite (float64: 2 * top is inf)
    lo = max(center * 2.0 ** -OCTAVES, floor)
    hi = min(max(center * 2.0 ** OCTAVES, floor * 4), top)
    best_t, best_count = floor, -1
    for round_ in range(max_rounds(dtype)):
        edges = np.geomspace(lo, hi, BINS + 1) if round_ == 0 else _value_edges(lo, hi, dtype)
        counts = _counts_at_edges(comm, mags, edges, comm.size * n >= 2**31)
        near = int(np.argmin(np.where(counts > 0, np.abs(counts - k), np.inf)))
        if best_count < 0 or _closer(int(counts[near]), best_count, k):
            best_t, best_count = float(edges[near]), int(counts[near])
        if COUNT_RANGE[0] * k <= best_count <= COUNT_RANGE[1] * k:
            break
        lo_count = -1  # the count at lo, where known
        if counts[0] < k:  # the k-th magnitude is below the window
            lo, hi = floor, float(edges[0])
        elif counts[-1] >= k:  # above the window
            lo, hi, lo_count = float(edges[-1]), top, int(counts[-1])
        else:  # inside the bin [e_j, e_j+1) with counts[j] >= k > counts[j+1]
            j = int(np.flatnonzero(counts >= k)[-1])
            lo, hi, lo_count = float(edges[j]), float(edges[j + 1]), int(counts[j])
        if not _distinct(lo, hi, dtype):
            if lo_count >= k:  # the k-th magnitude is one value, tied: select from it on
                best_t, best_count = lo, lo_count  # (Ok-Topk cuts the ties to k)
            break
    return best_t, best_count


def _closer(count: int, best: int, k: int) -> bool:
    """Whether an edge selecting ``count`` beats the best so far: closer to k, a count of 0
    losing to any other (all entries tied: none selected would send nothing)."""
    if (count == 0) != (best == 0):
        return best == 0
    return abs(count - k) < abs(best - k)
