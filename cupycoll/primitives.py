"""Compute primitives of the sparse and top-k algorithms: numpy implementations that define them.

Every public function takes numpy or cupy arrays. numpy inputs run the implementation in this
module, which defines the semantics; cupy inputs are routed to the function of the same name in
``cupycoll._cupy_primitives`` (imported lazily, so numpy users never import cupy).

Magnitudes: ``|x|`` of a float is its absolute value; of an integer it is exact (``|INT_MIN|`` is
``2**(bits-1)``), which is why :func:`kth_abs` returns integer magnitudes as unsigned scalars.
NaN: never ``>= t`` (:func:`count_abs_ge`, :func:`select_abs_ge`), and ranked below every number,
including 0, by :func:`kth_abs` and :func:`topk_abs`.

Reductions (:func:`coo_reduce`, :func:`merge_sorted`, :func:`scatter_reduce`) are left folds in
input order: the values ``v0, v1, v2`` of one index reduce to ``(v0 op v1) op v2``. The result is
therefore defined bit for bit, and ``merge_sorted(parts)`` equals ``coo_reduce`` of the
concatenated parts. Float max/min are numpy's ``maximum``/``minimum`` (NaN propagates) except on
a tie of +0 and -0, which gives +0 for max and -0 for min whatever the order (:func:`combine`):
numpy would return the later operand, so the bits would depend on the order of the operands.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import sys
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ._config import setting
from ._types import ReduceOp, array_namespace, parse_op, to_host
from .errors import InvalidArgument, InvalidType

__all__ = ["count_abs_ge", "select_abs_ge", "kth_abs", "topk_abs", "coo_reduce", "merge_sorted",
           "scatter_reduce", "gather", "densify", "combine", "VALUE_DTYPES", "INDEX_DTYPES",
           "free_scratch"]

#: dtypes of values (and of dense arrays) every primitive accepts.
VALUE_DTYPES = tuple(np.dtype(t) for t in ("float16", "float32", "float64", "int32", "int64"))
#: dtypes of index arrays.
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))

_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum,
           ReduceOp.MIN: np.minimum}


# --------------------------------------------------------------------------------------------
# dispatch and validation
# --------------------------------------------------------------------------------------------

def _dispatch(fn: Callable) -> Callable:
    """Route a call to ``_cupy_primitives.<name>`` when its first argument holds cupy arrays."""
    name = fn.__name__
    first = next(iter(inspect.signature(fn).parameters))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        probe = args[0] if args else kwargs.get(first)
        for _ in range(2):  # merge_sorted: parts -> first part -> its indices
            if isinstance(probe, (list, tuple)) and probe:
                probe = probe[0]
        xp = np if probe is None else array_namespace(probe)
        if xp is not np:  # a device namespace may bring its own (e.g. kernels run on the CPU)
            impl = getattr(xp, "cupycoll_primitives", None)
            if impl is None:
                from . import _cupy_primitives as impl
            return getattr(impl, name)(*args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper


def _array(a: Any, argument: str) -> np.ndarray:
    if not isinstance(a, np.ndarray) and array_namespace(a) is np:
        raise InvalidType(argument, type(a).__name__, "a numpy or cupy array")
    return a


def _values(a: Any, argument: str, ndims: tuple[int, ...] = (1, 2)) -> np.ndarray:
    a = _array(a, argument)
    if a.dtype not in VALUE_DTYPES:
        raise InvalidType(argument, a.dtype, f"an array of one of {[d.name for d in VALUE_DTYPES]}")
    if a.ndim not in ndims:
        dims = " or ".join(map(str, ndims))
        raise InvalidArgument(argument, a.shape, f"must have {dims} dimensions")
    return a


def _indices(a: Any, argument: str = "indices") -> np.ndarray:
    a = _array(a, argument)
    if a.dtype not in INDEX_DTYPES:
        raise InvalidType(argument, a.dtype, "an array of int32 or int64")
    if a.ndim != 1:
        raise InvalidArgument(argument, a.shape, "must be 1-D")
    return a


def _pair(indices: Any, values: Any, argument: str = "") -> tuple[np.ndarray, np.ndarray]:
    idx = _indices(indices, f"{argument}indices")
    val = _values(values, f"{argument}values")
    if val.shape[0] != idx.shape[0]:
        raise InvalidArgument(f"{argument}values", val.shape,
                              f"needs one value (row) per index; there are {idx.shape[0]} indices")
    return idx, val


def _check_range(idx: np.ndarray, n: int | None, argument: str = "indices") -> int:
    """Raise unless every index is in [0, n) (>= 0 if n is None); return the largest (or -1)."""
    if idx.size == 0:
        return -1
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0:
        raise InvalidArgument(argument, lo, "indices must be non-negative")
    if n is not None and hi >= n:
        raise InvalidArgument(argument, hi, f"index out of range for n={n}")
    return hi


def _increasing(idx: Any) -> bool:
    """True when ``idx`` (numpy or cupy) is strictly increasing: sorted and unique."""
    return idx.size < 2 or bool((idx[1:] > idx[:-1]).all())


def _index_stats(idx: Any) -> tuple[int, int, bool]:
    """``(min, max, strictly increasing)`` of non-empty indices, read from a device in ONE
    transfer (three separate reads would each synchronise the host)."""
    xp = array_namespace(idx)
    stats = xp.stack([idx.min().astype(np.int64), idx.max().astype(np.int64),
                      xp.all(idx[1:] > idx[:-1]).astype(np.int64)])
    lo, hi, increasing = (int(v) for v in to_host(stats))
    return lo, hi, bool(increasing)


def _checked_range(idx: Any, n: int | None, argument: str = "indices") -> bool:
    """:func:`_check_range` and :func:`_increasing` from one read: raise unless every index is
    in [0, n) (>= 0 if n is None); return whether ``idx`` is strictly increasing."""
    if idx.size == 0:
        return True
    lo, hi, increasing = _index_stats(idx)
    if lo < 0:
        raise InvalidArgument(argument, lo, "indices must be non-negative")
    if n is not None and hi >= n:
        raise InvalidArgument(argument, hi, f"index out of range for n={n}")
    return increasing


def _length(n: Any, argument: str = "n") -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (numbers.Integral, np.integer)):
        raise InvalidType(argument, type(n).__name__, "an int")
    if n < 0:
        raise InvalidArgument(argument, n, "must be >= 0")
    return int(n)


def _k(k: Any, n: int) -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (numbers.Integral, np.integer)):
        raise InvalidType("k", type(k).__name__, "an int")
    if not 0 < k <= n:
        raise InvalidArgument("k", k, f"must satisfy 0 < k <= len(x) = {n}")
    return int(k)


def _reduce_op(op: Any) -> np.ufunc:
    parsed = parse_op(op)
    if parsed not in _UFUNCS:
        raise InvalidArgument("op", op, "avg is the caller's job (sum, then divide); "
                              "use sum, prod, max or min")
    return _UFUNCS[parsed]


def _accumulate(accumulate_dtype: Any, dtype: np.dtype) -> np.dtype:
    if accumulate_dtype is None:
        return dtype
    try:
        acc = np.dtype(accumulate_dtype)
    except TypeError:
        raise InvalidType("accumulate_dtype", accumulate_dtype, "a dtype") from None
    if acc not in VALUE_DTYPES:
        raise InvalidType("accumulate_dtype", acc, f"one of {[d.name for d in VALUE_DTYPES]}")
    return acc


def _index_dtype(n: int) -> np.dtype:
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def _identity(ufunc: np.ufunc, dtype: np.dtype) -> Any:
    """The exact identity of ``ufunc`` on ``dtype`` (``-0.0`` for float sums keeps ``-0.0``)."""
    if ufunc is np.add:
        return -0.0 if dtype.kind == "f" else 0
    if ufunc is np.multiply:
        return 1
    if dtype.kind == "f":
        return -np.inf if ufunc is np.maximum else np.inf
    info = np.iinfo(dtype)
    return info.min if ufunc is np.maximum else info.max


#: the zero each op returns on a +0/-0 tie (the sign bit's value).
_ZERO_TIE = {np.maximum: False, np.minimum: True}


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


#: entries from which the numba loops run: below, numba's import and compile are not worth it.
_FAST_FROM = 1 << 14


def _fast(size: int) -> Any:
    """``cupycoll._numba_kernels`` for ``size`` entries, unless small, CUPYCOLL_NUMBA=off or
    numba does not import (then None: the numpy loops run)."""
    if setting("CUPYCOLL_NUMBA") == "off" or size < _FAST_FROM:
        return None
    try:
        from . import _numba_kernels
    except (ImportError, RuntimeError):  # RuntimeError: numba finds no writable cache directory
        return None
    return _numba_kernels


def free_scratch() -> None:
    """Free the temporaries that the numba loops keep between calls of this thread."""
    loops = sys.modules.get(f"{__package__}._numba_kernels")
    if loops is not None:
        loops.free_scratch()


# --------------------------------------------------------------------------------------------
# thresholds and top-k
# --------------------------------------------------------------------------------------------

#: elements per block of the threshold scans: the block's |x| and mask stay in cache.
_BLOCK = 1 << 16
#: arrays at least this long find the top-k threshold from a sample (see _kth_candidates).
_SAMPLE_FROM = 1 << 16
_SAMPLE_SIZE = 1 << 14


def _real(t: Any, argument: str = "t") -> Any:
    if isinstance(t, np.ndarray) and t.ndim == 0:
        t = t[()]
    real = (numbers.Real, np.integer, np.floating)
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, real):
        raise InvalidType(argument, type(t).__name__, "a real number")
    return t


_Fill = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def _abs_threshold(dtype: np.dtype, t: Any) -> Any:
    """Return the least magnitude of ``dtype`` that is >= t, or a bool if the test is uniform.

    ``|x| >= t`` then equals ``|x| >= result`` for every x of ``dtype``; a bool result is the
    answer for every element. Floats: the least value of the dtype >= t (t is never rounded
    down), 0 for t <= 0, False for NaN t. Integers: ``ceil(t)`` as an int in [1, 2**(bits-1)],
    True for t <= 0, False above ``|INT_MIN|`` or for NaN t. Shared by the numpy scans and the
    kernels' magnitude ranks so both round t the same way.
    """
    if dtype.kind == "f":
        try:
            tf = float(t)
        except OverflowError:  # a Python int beyond the float64 range
            tf = math.inf if t > 0 else -math.inf
        with np.errstate(over="ignore"):
            tt = dtype.type(tf)
        if float(tt) < tf:
            tt = np.nextafter(tt, dtype.type(np.inf))
        if math.isnan(tt):
            return False
        return tt if tt > 0 else dtype.type(0)
    if isinstance(t, (numbers.Integral, np.integer)):
        ti = int(t)
    elif math.isnan(float(t)):
        return False
    elif math.isinf(float(t)):
        return float(t) < 0
    else:
        ti = math.ceil(float(t))
    if ti <= 0 or ti > 2 ** (8 * dtype.itemsize - 1):
        return ti <= 0
    return ti


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


@_dispatch
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


@_dispatch
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
    found, values = [np.empty(0, np.intp)], [x[:0]]
    for start, mask in _abs_ge_blocks(x, t):
        if isinstance(mask, bool):
            found.append(np.arange(x.size if mask else 0))
            values.append(x[: found[-1].size])
        else:
            hits = np.flatnonzero(mask)
            values.append(x[start:start + mask.size][hits])  # gathered while the block is cached
            hits += start
            found.append(hits)
    return np.concatenate(found).astype(itype), np.concatenate(values)


def _magnitudes(x: np.ndarray) -> np.ndarray:
    """|x| exactly: floats keep their dtype, integers become the unsigned type of their width."""
    mag = np.abs(x)
    if x.dtype.kind == "i":
        mag = mag.view(np.dtype(f"u{x.dtype.itemsize}"))
    return mag


def _kth_of(mag: np.ndarray, k: int) -> Any:
    """k-th largest of ``mag`` with NaN ranked lowest (NaN if fewer than k numbers)."""
    valid = mag.size
    if mag.dtype.kind == "f" and mag.size and np.isnan(mag.max()):
        valid -= int(np.count_nonzero(np.isnan(mag)))
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
        if t is not None:
            idx, val = select_abs_ge(x, t)
            if idx.size >= k:
                return _kth_of(_magnitudes(val), k), idx, val
    return _kth_of(_magnitudes(x), k), None, x


@_dispatch
def kth_abs(x: Any, k: int) -> Any:
    """Return the exact k-th largest ``|x_i|`` (k = 1 is the largest), the threshold of top-k.

    NaN ranks below every number: the result is NaN only when fewer than k entries are numbers.
    Float inputs give a scalar of ``x.dtype``; int32/int64 give uint32/uint64 (``|INT_MIN|`` fits).
    """
    x = _values(x, "x", (1,))
    return _kth_candidates(x, _k(k, x.size))[0]


@_dispatch
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


# --------------------------------------------------------------------------------------------
# sparse reductions
# --------------------------------------------------------------------------------------------

#: entries per block of merge_sorted: each block's sort, runs and fold stay in cache.
_MERGE_BLOCK = 1 << 15


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


@_dispatch
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
    out_idx, out_val = np.empty_like(idx), np.empty(val.shape, acc)
    with np.errstate(all="ignore"):
        runs = _coalesce([idx], int(idx.min()), hi, val, ufunc, out_idx, out_val)
    return _trimmed(out_idx, runs), _trimmed(out_val, runs).astype(val.dtype, copy=False)


def _sorted_parts(parts: Any, checked: bool = True) -> list[tuple[Any, Any]]:
    """Validate merge_sorted's parts: (indices, values) pairs, one value type, and (``checked``)
    each sorted, unique and non-negative, all parts read from a device at once."""
    if not isinstance(parts, (list, tuple)) or not parts:
        raise InvalidArgument("parts", parts, "must be a non-empty list of (indices, values)")
    pairs = []
    for p, part in enumerate(parts):
        if not isinstance(part, (list, tuple)) or len(part) != 2:
            raise InvalidType(f"parts[{p}]", type(part).__name__, "an (indices, values) pair")
        pairs.append(_pair(part[0], part[1], f"parts[{p}]."))
    ref = pairs[0][1]
    for p, (_, val) in enumerate(pairs):
        if val.dtype != ref.dtype:
            raise InvalidType(f"parts[{p}].values", val.dtype, f"{ref.dtype} like parts[0]")
        if val.shape[1:] != ref.shape[1:]:
            raise InvalidArgument(f"parts[{p}].values", val.shape,
                                  f"row shape {ref.shape[1:]} like parts[0]")
    if checked:
        _check_sorted([idx for idx, _ in pairs])
    return pairs


def _check_sorted(indices: list[Any]) -> None:
    """Raise unless every part is strictly increasing and starts at an index >= 0 (one read)."""
    xp = array_namespace(indices[0])
    flags = [xp.stack([xp.all(i[1:] > i[:-1]).astype(np.int64), i[0].astype(np.int64)])
             for i in indices if i.size]
    if not flags:
        return
    host = iter(to_host(xp.concatenate(flags)).reshape(-1, 2).tolist())
    for p, idx in enumerate(indices):
        increasing, first = next(host) if idx.size else (True, 0)
        if not increasing:
            raise InvalidArgument(f"parts[{p}].indices", idx, "must be sorted and unique")
        if first < 0:
            raise InvalidArgument(f"parts[{p}].indices", first, "indices must be non-negative")


def _block_cuts(indices: list[np.ndarray], total: int) -> list[list[int]]:
    """Cut every part at shared index values into blocks of about ``_MERGE_BLOCK`` entries.

    Splitters are quantiles of a strided sample of all parts, so skewed parts still give even
    blocks; all copies of an index land in the same block (cuts are searchsorted 'left').
    """
    blocks = -(-total // _MERGE_BLOCK)
    if blocks <= 1:
        return [[0, i.size] for i in indices]
    stride = max(1, total // (8 * blocks))
    sample = np.sort(np.concatenate([i[::stride] for i in indices]))
    splitters = sample[(np.arange(1, blocks) * sample.size) // blocks]
    return [[0, *np.searchsorted(i, splitters).tolist(), i.size] for i in indices]


@_dispatch
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
        return indices[0].astype(itype), pairs[0][1].astype(acc).astype(ref.dtype, copy=False)
    total = sum(i.size for i in indices)
    fast = _fast(total)
    merged = None if fast is None else fast.merge(indices, [v for _, v in pairs], ufunc, acc,
                                                  itype)
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


def _narrowed(out_idx: np.ndarray, out_val: np.ndarray, done: int,
              dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Trim a merge's outputs to ``done`` entries and cast the values back to ``dtype`` once
    (overflow to inf, as in any reduction in that dtype, is not a warning)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _trimmed(out_idx, done), _trimmed(out_val, done).astype(dtype, copy=False)


# --------------------------------------------------------------------------------------------
# dense <-> sparse
# --------------------------------------------------------------------------------------------

def _scatter_operands(dense: Any, indices: Any, values: Any) -> tuple[Any, Any, Any]:
    """Validate scatter_reduce's arrays: values match dense's dtype and row shape."""
    dense = _values(dense, "dense")
    idx, val = _pair(indices, values)
    if val.dtype != dense.dtype:
        raise InvalidType("values", val.dtype, f"{dense.dtype} like dense")
    if val.shape[1:] != dense.shape[1:]:
        raise InvalidArgument("values", val.shape, f"rows of shape {dense.shape[1:]} like dense")
    return dense, idx, val


@_dispatch
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


@_dispatch
def gather(dense: Any, indices: Any) -> np.ndarray:
    """Return ``dense[indices]`` (rows when ``dense`` is 2-D); indices must be in range."""
    dense = _values(dense, "dense")
    idx = _indices(indices)
    _check_range(idx, dense.shape[0])
    return dense[idx]


@_dispatch
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
