"""Sums of a few entries over sorted unique parts, where a numpy call costs more than its
arithmetic: the paths :func:`~._numpy_reduce.merge_sorted` and the sparse folds take below
:data:`SMALL` value elements (docs/primitives.md)."""

from __future__ import annotations

import contextlib
import itertools
import math
from functools import partial
from typing import Any, Sequence

import numpy as np

from . import _accel

__all__ = ["few_enough", "few_summed", "two_summed", "chained_first"]

#: merges of at most this many entries fold a sum in Python (:func:`tiny_sum`): a numpy call
#: costs more than its arithmetic on a few elements and the general path makes ~40 of them
#: (docs/primitives.md).
TINY = 64
#: sums of fewer value elements (entries x row width) than this merge by one stable sort of the
#: concatenated parts (:func:`sorted_sum`): faster than the blocked integer-key path
#: everywhere below and at least as fast as numba's merge, which takes over from its own bound
#: (``_accel._FAST_FROM``, the same number; docs/primitives.md).
SMALL = 1 << 14
#: sums of fewer value elements than this, of parts that share a sum dtype numba adds in, run
#: as one numba pass where numba runs (``_numba_small.sum_parts``): below it the numpy sums'
#: dozen calls cost more than the pass; above, the pass's per-entry branches lose to one
#: stable sort (docs/primitives.md).
LOOP_SUM = 1 << 10
#: sums of two to ``CHAIN_PARTS`` parts (every round of recursive doubling; allgather's and
#: split's at P <= 4) take numba's two-way merge where numba runs (``_numba_small.sum_two``),
#: chained in part order, ((p0 + p1) + p2) + p3: the left fold, so the same bits. Which larger
#: sums take it: :func:`chained_first`.
TWO_WAY = True
CHAIN_PARTS = 4
#: parts of rows wider than one element the chain sums at most (:func:`chained_first`)
CHAIN_ROW_PARTS = 3


def few_enough(elements: int) -> bool:
    """Whether a sum of ``elements`` value elements takes :func:`few_summed`: below ``SMALL``
    and below numba's bound (tests lower that bound to run the loops on small inputs)."""
    return elements < SMALL and elements < _accel._FAST_FROM


def few_summed(indices: Sequence[np.ndarray], values: Sequence[np.ndarray], acc: np.dtype,
               dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """A sum of fewer than :data:`SMALL` elements over sorted unique parts (two to
    :data:`CHAIN_PARTS` parts: :func:`two_summed`; else below :data:`LOOP_SUM` elements numba's
    one pass, :func:`loop_sum`; both where numba runs and adds in ``acc``; else a Python fold
    up to :data:`TINY` entries, :func:`tiny_sum`, else :func:`sorted_sum`), cast back to
    ``dtype`` once; integer sums wrap and floats overflow to
    inf without a warning, as in every reduction."""
    itype = np.result_type(*(i.dtype for i in indices))
    two = two_summed(indices, values, acc, itype)
    if two is not None:
        with np.errstate(all="ignore"):
            return two[0], two[1].astype(dtype, copy=False)
    entries = sum(i.shape[0] for i in indices)
    loops = _accel.loops() if entries * math.prod(values[0].shape[1:]) < LOOP_SUM else None
    if loops is not None and acc in loops.SUM_DTYPES:
        fold = partial(loop_sum, loops)
    else:
        fold = tiny_sum if entries <= TINY else sorted_sum
    with np.errstate(all="ignore"):
        idx, rows = fold(indices, values, acc, itype)
        return idx, rows.astype(dtype, copy=False)


def two_summed(indices: Sequence[np.ndarray], values: Sequence[np.ndarray], acc: np.dtype,
               itype: np.dtype, absent_zero: bool = False
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """The sum of two to :data:`CHAIN_PARTS` parts by numba's two-way merge, chained in part
    order (:data:`TWO_WAY`), in ``acc`` (one numba adds in), or None (another path sums them).
    ``absent_zero``: each merge adds +0 to the rows of one side, which makes the chain's result
    ``fill_absent``'s (a sum is -0 only where every part holds the index and adds -0)."""
    if not TWO_WAY or not 2 <= len(indices) <= CHAIN_PARTS or values[0].shape[1:] == (0,):
        return None  # (rows of no element: the numpy loops)
    loops = _accel.loops()
    if loops is None or acc not in loops.SUM_DTYPES:
        return None
    cast = any(v.dtype != acc for v in values)  # the cast into acc, as every path makes it
    with np.errstate(all="ignore") if cast else contextlib.nullcontext():
        idx, val = indices[0], values[0]
        for more, rows in zip(indices[1:], values[1:]):
            idx, val = loops.sum_two(idx, val, more, rows, acc, itype, absent_zero)
        return idx, val


def chained_first(parts: int, entries: int, row: tuple[int, ...]) -> bool:
    """Whether a sum of ``SMALL`` value elements or more takes the chained two-way merge
    (:func:`two_summed`) before numba's k-way loop: every sum of 1-D values or rows of one
    element, and up to :data:`CHAIN_ROW_PARTS` parts' wider rows while the k-way loop would
    run in one piece (one thread, or too few entries to cut). The k-way loop wins only by its
    threads up to three parts; the chain of four parts' rows moves the growing sum again per
    part and loses on narrow rows (docs/primitives.md)."""
    if math.prod(row) == 1:
        return True
    loops = _accel.loops()
    return parts <= CHAIN_ROW_PARTS and loops is not None and loops.piece_count(entries) == 1


def loop_sum(loops: Any, indices: Sequence[np.ndarray], values: Sequence[np.ndarray],
             acc: np.dtype, itype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Sum sorted unique parts in numba's one pass (``loops.sum_parts``) over their
    concatenation: the additions of :func:`sorted_sum` in the same order, so its bits."""
    counts = [i.shape[0] for i in indices]
    row = tuple(values[0].shape[1:])
    starts = list(itertools.accumulate(counts, initial=0))[:-1]
    width = math.prod(row)
    rows = np.concatenate(values).astype(acc, copy=False).reshape(-1)
    return loops.sum_parts(np.concatenate(indices), rows, starts, [s * width for s in starts],
                           counts, row, itype, absent_zero=False)


def sorted_sum(indices: Sequence[np.ndarray], values: Sequence[np.ndarray], acc: np.dtype,
               itype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Sum sorted unique parts by one stable sort of their concatenation (sorted runs: a merge):
    the entries of an index end up adjacent in part order; the first is copied, the later ones
    added in that order (``ufunc.at`` is sequential), so the same additions as
    :func:`_coalesce` (``-0.0 + v`` is ``v``: the fold may start at the first value)."""
    cat = np.concatenate(indices)
    order = np.argsort(cat, kind="stable")
    key = cat[order].astype(itype, copy=False)
    rows = np.concatenate(values)[order].astype(acc, copy=False)
    repeat = key[1:] == key[:-1]
    if not repeat.any():
        return key, rows
    heads = np.flatnonzero(np.concatenate(([True], ~repeat)))
    later = np.flatnonzero(repeat) + 1
    out = rows[heads]
    np.add.at(out, np.searchsorted(heads, later, side="right") - 1, rows[later])
    return key[heads], out


def tiny_sum(indices: Sequence[np.ndarray], values: Sequence[np.ndarray], acc: np.dtype,
              itype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Sum a few entries per index, left-folded in part order, with numpy scalars (rows) of
    ``acc``: the same additions in the same order as :func:`_coalesce`, so the same bits
    (``-0.0 + v`` is ``v``, so the fold may start at the first value)."""
    fold: dict[int, Any] = {}
    for idx, val in zip(indices, values):
        for i, v in zip(idx.tolist(), val.astype(acc, copy=False)):
            fold[i] = fold[i] + v if i in fold else v
    keys = sorted(fold)
    rows = np.array([fold[k] for k in keys], dtype=acc)
    return (np.array(keys, dtype=itype),
            rows.reshape((len(keys),) + tuple(values[0].shape[1:])))
