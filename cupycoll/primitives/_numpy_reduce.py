"""numpy twins of the sparse reductions and dense <-> sparse moves: ``combine``, ``coo_reduce``,
``merge_sorted``, ``scatter_reduce``, ``gather``, ``densify`` (semantics in
:mod:`cupycoll.primitives`)."""

from __future__ import annotations

import contextlib
import itertools
import math
from functools import partial
from typing import Any, Iterator, Sequence

import numpy as np

from .._types import array_namespace
from . import _accel
from ._accel import _fast
from ._checks import (_accumulate, _check_range, _increasing, _indices, _length, _pair,
                      _reduce_op, _scatter_operands, _sorted_parts, _values)
from ._common import _block_cuts, _identity


#: the zero each op returns on a +0/-0 tie (the sign bit's value).
_ZERO_TIE = {np.maximum: False, np.minimum: True}

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
#: chained in part order, ((p0 + p1) + p2) + p3: the left fold, so the same bits. Every 1-D sum
#: and the few-entry sums of rows take it; wide rows beyond those merge faster in numba's k-way
#: loop, and so do more parts (the chain moves the growing sum again per part;
#: docs/primitives.md).
TWO_WAY = True
CHAIN_PARTS = 4
#: unsorted sums (``coo_reduce``) take numba's table (``sum_unsorted``) over an index span
#: (max - min + 1) of at most ``TABLE_SPAN`` slots and ``TABLE_PER_ENTRY`` slots an entry for
#: rows (the sort path's ``ufunc.at`` on rows costs 1.3-14x the table: docs/primitives.md), of
#: at most ``TABLE_SPAN_1D`` and ``TABLE_PER_ENTRY_1D`` for one value an index (the integer
#: sort is as fast or faster once the table outgrows the cache or most slots stay empty). 4
#: bytes a slot, kept per thread: 64 MiB at most.
TABLE_SPAN, TABLE_PER_ENTRY = 1 << 24, 256
TABLE_SPAN_1D, TABLE_PER_ENTRY_1D = 1 << 18, 2


def few_enough(elements: int) -> bool:
    """Whether a sum of ``elements`` value elements takes :func:`few_summed`: below ``SMALL``
    and below numba's bound (tests lower that bound to run the loops on small inputs)."""
    return elements < SMALL and elements < _accel._FAST_FROM


def combine(a: Any, b: Any, op: Any) -> Any:
    """Return ``a op b`` elementwise (numpy or cupy), with the order-free ±0 rule of max/min.

    ``op`` is sum, prod, max or min; ``b`` may be a scalar. A +0/-0 tie gives +0 for max and -0
    for min (numpy's ufuncs would return ``b``); NaN propagates as in numpy.
    """
    xp, ufunc = array_namespace(a), _reduce_op(op)
    with np.errstate(all="ignore"):
        out = getattr(xp, ufunc.__name__)(a, b)
        if ufunc in _ZERO_TIE and out.dtype.kind == "f":
            tie = (a == 0) & (b == 0)
            # zeros: +0 + -0 = +0 and -(-0 + +0) = -0: the sum picks +0, the negated one -0
            out = xp.where(tie, a + b if ufunc is np.maximum else -((-a) + (-b)), out)
    return out


def _fix_zero_ties(out: np.ndarray, rows: np.ndarray, contrib: np.ndarray,
                   ufunc: np.ufunc) -> None:
    """Apply :func:`combine`'s ±0 rule to a ``ufunc.at(out, rows, contrib)`` fold, in place.

    A folded max (min) of 0 is +0 (-0) when any zero folded into it was +0 (-0); otherwise all
    its zeros had the other sign and ``ufunc.at`` already returned one of them.
    """
    if ufunc not in _ZERO_TIE or out.dtype.kind != "f":
        return
    win = contrib == 0
    win &= np.signbit(contrib) == _ZERO_TIE[ufunc]
    if not win.any():
        return
    hit = np.nonzero(win)
    at = (rows[hit[0]],) + hit[1:]
    zero = out[at] == 0
    out[tuple(a[zero] for a in at)] = -0.0 if _ZERO_TIE[ufunc] else 0.0


def _key_dtype(span: int, tag_bits: int) -> np.dtype | None:
    """Narrowest signed integer type holding ``offset << tag_bits | tag`` for offset <= span."""
    bits = span.bit_length() + tag_bits
    return np.dtype(np.int32) if bits <= 31 else np.dtype(np.int64) if bits <= 63 else None


def _coalesce(pieces: Sequence[np.ndarray], lo: int, hi: int, val: np.ndarray, ufunc: np.ufunc,
              out_idx: np.ndarray, out_val: np.ndarray) -> int:
    """Coalesce the concatenation of ``pieces`` (indices in [lo, hi]) with values ``val``.

    Writes the ascending unique indices to ``out_idx`` and the values of each index, left-folded
    in input order, to ``out_val`` (whose dtype is the accumulation dtype); returns their number.
    One integer sort of ``(index - lo) << b | position`` orders the entries stably without an
    argsort (a stable argsort when such a key would not fit 63 bits); ``ufunc.at`` then folds
    them sequentially, which is exact and in order by definition.
    """
    size = val.shape[0]
    shift = (size - 1).bit_length()
    kdt = _key_dtype(hi - lo, shift)
    if kdt is not None and kdt == _key_dtype(hi, shift):
        lo = 0  # absolute indices fit the same key type: one pass fewer
    if kdt is None:
        cat = np.concatenate(pieces).astype(np.int64, copy=False)
        order = np.argsort(cat, kind="stable")
        key = cat[order] - lo
    else:
        key, start = np.empty(size, kdt), 0
        for piece in pieces:
            part = key[start:start + piece.size]
            if lo:
                np.subtract(piece, piece.dtype.type(lo), out=part, casting="unsafe")
                part <<= shift
            else:
                np.left_shift(piece, shift, out=part, dtype=kdt, casting="unsafe")
            start += piece.size
        key |= np.arange(size, dtype=kdt)
        key.sort()
        order = key & ((1 << shift) - 1)
        key >>= shift
    head = np.empty(size, bool)
    head[:1] = True
    np.not_equal(key[1:], key[:-1], out=head[1:])
    run = np.empty(size, np.intp)
    run[:1] = 0
    np.cumsum(head[1:], out=run[1:])
    runs = int(run[-1]) + 1
    uniq = out_idx[:runs]
    uniq[...] = key[head]
    if lo:
        uniq += out_idx.dtype.type(lo)
    fold = out_val[:runs]
    fold.fill(_identity(ufunc, out_val.dtype))
    folded = val[order].astype(out_val.dtype, copy=False)
    ufunc.at(fold, run, folded)
    _fix_zero_ties(fold, run, folded, ufunc)
    return runs


def _trimmed(a: np.ndarray, size: int) -> np.ndarray:
    """``a[:size]``, copied when that frees more than half of ``a``."""
    return a[:size].copy() if 2 * size < a.shape[0] else a[:size]


def coo_reduce(indices: Any, values: Any, op: Any = "sum", n: int | None = None,
               accumulate_dtype: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Coalesce unsorted COO entries with duplicates into ascending unique indices.

    Args:
        indices: 1-D int32/int64, any order, duplicates allowed, non-negative.
        values: 1-D (one per index) or 2-D rows ``(len(indices), width)``.
        op: sum, prod, max or min; the values of one index are left-folded in input order.
        n: dense length; when given, every index must be < n.
        accumulate_dtype: dtype to reduce in (e.g. float32 for float16), cast back once.
    Returns:
        ``(indices, values)`` with the input index dtype and value dtype.
    Raises:
        InvalidArgument: length mismatch, index out of range, bad op. InvalidType: bad dtype.
    """
    idx, val = _pair(indices, values)
    ufunc = _reduce_op(op)
    hi = _check_range(idx, None if n is None else _length(n))
    acc = _accumulate(accumulate_dtype, val.dtype)
    if idx.size == 0:
        return idx.copy(), val.copy()
    lo = int(idx.min())
    loops = _table_loops(idx, val, ufunc, acc, lo, hi)
    if loops is not None:
        with _index_table(lo, hi) as table, np.errstate(all="ignore"):  # the cast into acc
            keys, rows = loops.sum_unsorted(idx, val, acc, lo, table)
        return _narrowed(keys, rows, keys.size, val.dtype)
    out_idx, out_val = np.empty_like(idx), np.empty(val.shape, acc)
    with np.errstate(all="ignore"):
        runs = _coalesce([idx], lo, hi, val, ufunc, out_idx, out_val)
    return _narrowed(out_idx, out_val, runs, val.dtype)


def _table_loops(idx: np.ndarray, val: np.ndarray, ufunc: Any, acc: np.dtype, lo: int,
                 hi: int) -> Any:
    """numba's loops where an unsorted reduction of ``idx``, ``val`` in ``acc`` takes its table
    (a sum, of a size numba takes, over a span :func:`_table_fits`, in a dtype it adds);
    else None."""
    wide = math.prod(val.shape[1:]) > 1  # rows; _fast counts elements, as merges do
    loops = _fast(val.size) if ufunc is np.add and _table_fits(hi - lo + 1, idx.size, wide) \
        else None
    return loops if loops is not None and acc in loops.SUM_DTYPES else None


@contextlib.contextmanager
def _index_table(lo: int, hi: int) -> Iterator[np.ndarray]:
    """numba's index table over [lo, hi] (this thread's, kept): all -1 before, and declared
    so again after (not after an error: the next call fills it)."""
    table = _accel.kept_filled(hi - lo + 1, np.int32, -1)
    yield table
    _accel.mark_filled(table, -1)


def _table_fits(span: int, entries: int, rows: bool) -> bool:
    """Whether an unsorted sum of ``entries`` over ``span`` indices takes numba's table (the
    bounds above)."""
    if rows:
        return span <= min(TABLE_SPAN, TABLE_PER_ENTRY * entries)
    return span <= min(TABLE_SPAN_1D, TABLE_PER_ENTRY_1D * entries)


def merge_sorted(parts: Sequence[tuple[Any, Any]], op: Any = "sum",
                 accumulate_dtype: Any = None, *, checked: bool = True
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Merge already coalesced COO parts (each sorted, unique) into one, reducing duplicates.

    The values of one index are left-folded in part order, so the result is bitwise
    deterministic and equals ``coo_reduce`` of the concatenated parts. Index dtype: int64 if
    any part has int64 indices, else int32. Values: 1-D or rows, one dtype and width for all.
    ``checked=False``: the caller guarantees sorted, unique, non-negative parts (skips a
    device read on a GPU).
    """
    pairs = _sorted_parts(parts, checked)
    ref = pairs[0][1]
    ufunc = _reduce_op(op)
    acc = _accumulate(accumulate_dtype, ref.dtype)
    itype = np.result_type(*(i.dtype for i, _ in pairs))
    indices = [i for i, _ in pairs]
    if len(pairs) == 1:
        return _narrowed(indices[0].astype(itype), pairs[0][1].astype(acc), indices[0].size,
                         ref.dtype)
    values = [v for _, v in pairs]
    total = sum(i.size for i in indices)
    elements = total * math.prod(ref.shape[1:])  # wide rows
    if ufunc is np.add and few_enough(elements):
        return few_summed(indices, values, acc, ref.dtype)
    two = two_summed(indices, values, acc, itype) if ufunc is np.add and ref.ndim == 1 else None
    if two is not None:
        return _narrowed(*two, two[0].shape[0], ref.dtype)
    fast = _fast(elements)
    merged = None if fast is None else fast.merge(indices, values, ufunc, acc, itype)
    if merged is not None:
        return _narrowed(*merged, ref.dtype)
    cuts = _block_cuts(indices, total)
    out_idx, out_val = np.empty(total, itype), np.empty((total,) + ref.shape[1:], acc)
    done = 0
    with np.errstate(all="ignore"):
        for b in range(len(cuts[0]) - 1):
            pieces = [i[c[b]:c[b + 1]] for i, c in zip(indices, cuts) if c[b + 1] > c[b]]
            if pieces:
                lo, hi = min(int(p[0]) for p in pieces), max(int(p[-1]) for p in pieces)
                val = np.concatenate([v[c[b]:c[b + 1]] for (_, v), c in zip(pairs, cuts)])
                done += _coalesce(pieces, lo, hi, val, ufunc, out_idx[done:], out_val[done:])
    return _narrowed(out_idx, out_val, done, ref.dtype)


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
               itype: np.dtype) -> tuple[np.ndarray, np.ndarray] | None:
    """The sum of two to :data:`CHAIN_PARTS` parts by numba's two-way merge, chained in part
    order (:data:`TWO_WAY`), in ``acc`` (one numba adds in), or None (another path sums them)."""
    if not TWO_WAY or not 2 <= len(indices) <= CHAIN_PARTS:
        return None
    loops = _accel.loops()
    if loops is None or acc not in loops.SUM_DTYPES:
        return None
    with np.errstate(all="ignore"):  # the cast into acc, as every path makes it
        idx, val = indices[0], values[0]
        for more, rows in zip(indices[1:], values[1:]):
            idx, val = loops.sum_two(idx, val, more, rows, acc, itype)
        return idx, val


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


def _narrowed(out_idx: np.ndarray, out_val: np.ndarray, done: int,
              dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Trim a merge's outputs to ``done`` entries and cast the values back to ``dtype`` once
    (overflow to inf, as in any reduction in that dtype, is not a warning)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _trimmed(out_idx, done), _trimmed(out_val, done).astype(dtype, copy=False)


def scatter_reduce(dense: Any, indices: Any, values: Any, op: Any = "sum", *,
                   checked: bool = True) -> np.ndarray:
    """Reduce ``values`` into ``dense[indices]`` in place and return ``dense``.

    Duplicate indices accumulate: each ``dense[i]`` becomes ``dense[i] op v0 op v1 ...`` folded
    left in input order. ``dense`` is 1-D, or 2-D rows with ``values`` of shape
    ``(len(indices), dense.shape[1])``; ``values.dtype`` must equal ``dense.dtype``.
    ``checked=False``: the caller guarantees strictly increasing indices in range (skips a
    device read on a GPU).
    """
    dense, idx, val = _scatter_operands(dense, indices, values)
    ufunc = _reduce_op(op)
    if checked:
        _check_range(idx, dense.shape[0])
    first = dense[idx] if ufunc in _ZERO_TIE and dense.dtype.kind == "f" else None
    with np.errstate(all="ignore"):
        ufunc.at(dense, idx, val)
    if first is not None:  # the ±0 rule counts dense's own zeros too
        _fix_zero_ties(dense, idx, first, ufunc)
        _fix_zero_ties(dense, idx, val, ufunc)
    return dense


def gather(dense: Any, indices: Any) -> np.ndarray:
    """Return ``dense[indices]`` (rows when ``dense`` is 2-D); indices must be in range."""
    dense = _values(dense, "dense")
    idx = _indices(indices)
    _check_range(idx, dense.shape[0])
    return dense[idx]


def densify(indices: Any, values: Any, n: int) -> np.ndarray:
    """Return the dense array of length ``n`` (rows if values are 2-D), zero where absent.

    Each present entry is the left-fold sum of its values (a single value is copied, so -0.0
    stays -0.0), as if by ``coo_reduce`` followed by an assignment.
    """
    idx, val = _pair(indices, values)
    n = _length(n)
    _check_range(idx, n)
    dense = np.zeros((n,) + val.shape[1:], val.dtype)
    if not _increasing(idx):
        idx, val = coo_reduce(idx, val, "sum")
    dense[idx] = val
    return dense
