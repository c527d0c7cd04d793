"""numpy twins of the sparse reductions and dense <-> sparse moves: ``combine``, ``coo_reduce``,
``merge_sorted``, ``scatter_reduce``, ``gather``, ``densify`` (semantics in
:mod:`cupycoll.primitives`)."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Sequence

import numpy as np

from .._types import array_namespace
from . import _accel
from ._accel import _fast
from ._checks import (_accumulate, _check_range, _combined, _increasing, _indices, _length,
                      _pair, _reduce_op, _scatter_operands, _sorted_parts, _values)
from ._common import _block_cuts, _identity
from ._numpy_few import chained_first, few_enough, few_summed, two_summed


#: the zero each op returns on a +0/-0 tie (the sign bit's value).
_ZERO_TIE = {np.maximum: False, np.minimum: True}

#: unsorted sums (``coo_reduce``) take numba's table path (``sum_unsorted``: a bitmap over the
#: index span) over a span (max - min + 1) of at most ``TABLE_SPAN`` slots and
#: ``TABLE_PER_ENTRY`` slots an entry, one value an index or rows (the bounds of the measured
#: grid, where it takes 0.06-0.72x the sort path's time: docs/primitives.md). A bit a slot, kept
#: per thread: 2 MiB at most.
TABLE_SPAN, TABLE_PER_ENTRY = 1 << 24, 256


def combine(a: Any, b: Any, op: Any) -> Any:
    """Return ``a op b`` elementwise (numpy or cupy), with the order-free ±0 rule of max/min.

    ``op`` is sum, prod, max or min; ``b`` may be a scalar. A +0/-0 tie gives +0 for max and -0
    for min (numpy's ufuncs would return ``b``); NaN propagates as in numpy.
    """
    _combined(a, b)
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
        with _index_marks(lo, hi) as marks, np.errstate(all="ignore"):  # the cast into acc
            keys, rows = loops.sum_unsorted(idx, val, acc, lo, marks)
        return _narrowed(keys, rows, keys.size, val.dtype)
    out_idx, out_val = np.empty_like(idx), np.empty(val.shape, acc)
    with np.errstate(all="ignore"):
        runs = _coalesce([idx], lo, hi, val, ufunc, out_idx, out_val)
    return _narrowed(out_idx, out_val, runs, val.dtype)


def _table_loops(idx: np.ndarray, val: np.ndarray, ufunc: Any, acc: np.dtype, lo: int,
                 hi: int) -> Any:
    """numba's loops where an unsorted reduction of ``idx``, ``val`` in ``acc`` takes its table
    path (a sum, of a size numba takes, over a span within the bounds above, in a dtype it
    adds); else None."""
    fits = hi - lo + 1 <= min(TABLE_SPAN, TABLE_PER_ENTRY * idx.size)
    loops = _fast(val.size) if ufunc is np.add and fits else None  # (elements, as merges count)
    return loops if loops is not None and acc in loops.SUM_DTYPES else None


@contextlib.contextmanager
def _index_marks(lo: int, hi: int) -> Iterator[np.ndarray]:
    """numba's bitmap over [lo, hi], a bit an index (this thread's, kept): all clear before,
    and declared so again after (not after an error: the next call clears it)."""
    marks = _accel.kept_filled(((hi - lo) >> 6) + 1, np.uint64, 0)
    yield marks
    _accel.mark_filled(marks, 0)


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
    idx, val, _ = merged_pairs(pairs, _reduce_op(op),
                               _accumulate(accumulate_dtype, pairs[0][1].dtype))
    return idx, val


def merged_pairs(pairs: Sequence[tuple[np.ndarray, np.ndarray]], ufunc: np.ufunc,
                 acc: np.dtype, absent_zero: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, bool]:
    """:func:`merge_sorted` of host parts its caller knows valid (sorted unique indices; values
    of one dtype and row shape), by the ufunc of the op, accumulating in ``acc``: the sparse
    algorithms' merges, without the checks of a public call. ``absent_zero``: a float sum
    that needs no cast back may count absent entries as +0 (``fill_absent``'s rule) in the
    two-way merge's pass; the third item says whether it did."""
    ref = pairs[0][1]
    itype = np.result_type(*(i.dtype for i, _ in pairs))
    indices = [i for i, _ in pairs]
    if len(pairs) == 1:
        return _narrowed(indices[0].astype(itype), pairs[0][1].astype(acc), indices[0].size,
                         ref.dtype) + (False,)
    values = [v for _, v in pairs]
    total = sum(i.size for i in indices)
    elements = total * math.prod(ref.shape[1:])  # wide rows
    if ufunc is np.add and few_enough(elements):
        return few_summed(indices, values, acc, ref.dtype) + (False,)
    chained = ufunc is np.add and chained_first(len(pairs), total, ref.shape[1:])
    settles = absent_zero and acc == ref.dtype and acc.kind == "f"
    two = two_summed(indices, values, acc, itype, settles) if chained else None
    if two is not None:
        return _narrowed(*two, two[0].shape[0], ref.dtype) + (settles,)
    fast = _fast(elements)
    merged = None if fast is None else fast.merge(indices, values, ufunc, acc, itype)
    if merged is not None:
        return _narrowed(*merged, ref.dtype) + (False,)
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
    return _narrowed(out_idx, out_val, done, ref.dtype) + (False,)


def _narrowed(out_idx: np.ndarray, out_val: np.ndarray, done: int,
              dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Trim a merge's outputs to ``done`` entries and cast the values back to ``dtype`` once
    (overflow to inf, as in any reduction in that dtype, is not a warning)."""
    if out_val.dtype == dtype:  # nothing to cast
        return _trimmed(out_idx, done), _trimmed(out_val, done)
    with np.errstate(over="ignore", invalid="ignore"):
        return _trimmed(out_idx, done), _trimmed(out_val, done).astype(dtype)


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


def canonical_nan(values: Any, divide_by: int = 1) -> Any:
    """Give every NaN in float ``values`` numpy's NaN bits, in place, and return ``values``;
    ``divide_by`` > 1 (an average's P): divide them by it first, in the same read on the host.

    A NaN's sign and payload depend on the order of the operands (x86 keeps the first NaN and
    makes ``inf - inf`` a negative NaN; MPI's built-in ops combine in a per-rank order), so
    without this the results of the algorithms, or of one algorithm on two ranks, could differ
    in NaN bits. One masked copy, no host read (no synchronisation on a GPU); on the host,
    past numba's threshold, one read of the bits first (no NaN or infinity: nothing to
    copy).
    """
    if values.dtype.kind != "f" or values.size == 0:
        return values
    fast = _fast(values.size) if isinstance(values, np.ndarray) else None
    if fast is not None and divide_by > 1 and values.flags.c_contiguous \
            and values.dtype.itemsize >= 4:  # numba divides float32 and float64: one pass
        special = fast.divide_finding_specials(values, divide_by)
    else:
        if divide_by > 1:
            with np.errstate(all="ignore"):  # a subnormal's quotient: 0, never a raise here
                values /= divide_by
        special = fast is None or fast.special_values(values, minus_zero=False)[0]
    if not special:  # no NaN: done
        return values
    xp = array_namespace(values)
    xp.copyto(values, values.dtype.type(np.nan), where=xp.isnan(values))
    return values
