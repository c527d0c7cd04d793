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
concatenated parts.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Any, Callable, Sequence

import numpy as np

from ._types import ReduceOp, array_namespace, parse_op
from .errors import InvalidArgument, InvalidType

__all__ = ["count_abs_ge", "select_abs_ge", "kth_abs", "topk_abs", "coo_reduce", "merge_sorted",
           "scatter_reduce", "gather", "densify", "VALUE_DTYPES", "INDEX_DTYPES"]

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
        if probe is not None and array_namespace(probe) is not np:
            from . import _cupy_primitives

            return getattr(_cupy_primitives, name)(*args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper


def _array(a: Any, argument: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise InvalidType(argument, type(a).__name__, "a numpy or cupy array")
    return a


def _values(a: Any, argument: str, ndims: tuple[int, ...] = (1, 2)) -> np.ndarray:
    a = _array(a, argument)
    if a.dtype not in VALUE_DTYPES:
        raise InvalidType(argument, a.dtype, f"an array of one of {[d.name for d in VALUE_DTYPES]}")
    if a.ndim not in ndims:
        raise InvalidArgument(argument, a.shape, f"must have {' or '.join(map(str, ndims))} dimensions")
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


def _check_range(idx: np.ndarray, n: int | None, argument: str = "indices") -> None:
    """Raise unless every index is in [0, n) (or >= 0 when n is None)."""
    if idx.size == 0:
        return
    lo = int(idx.min())
    if lo < 0:
        raise InvalidArgument(argument, lo, "indices must be non-negative")
    if n is not None:
        hi = int(idx.max())
        if hi >= n:
            raise InvalidArgument(argument, hi, f"index out of range for n={n}")


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
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    if dtype.kind == "f":
        return -np.inf if ufunc is np.maximum else np.inf
    return info.min if ufunc is np.maximum else info.max


# --------------------------------------------------------------------------------------------
# thresholds and top-k
# --------------------------------------------------------------------------------------------

def _real(t: Any, argument: str = "t") -> Any:
    if isinstance(t, np.ndarray) and t.ndim == 0:
        t = t[()]
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (numbers.Real, np.integer, np.floating)):
        raise InvalidType(argument, type(t).__name__, "a real number")
    return t


def _abs_ge_mask(x: np.ndarray, t: Any) -> np.ndarray | bool:
    """Boolean mask of |x| >= t, exact for every dtype; a bool when the answer is uniform."""
    if x.dtype.kind == "f":
        tt = x.dtype.type(t)
        if tt < t:  # t is not representable: the least representable value above it
            tt = np.nextafter(tt, x.dtype.type(np.inf))
        return (x >= tt) | (x <= -tt)
    if isinstance(t, (numbers.Integral, np.integer)):
        tt = int(t)
    else:
        t = float(t)
        if math.isnan(t):
            return False
        if math.isinf(t):
            return t < 0
        tt = math.ceil(t)
    if tt <= 0:
        return True
    info = np.iinfo(x.dtype)
    if tt > info.max + 1:
        return False
    if tt == info.max + 1:
        return x == info.min
    return (x >= tt) | (x <= -tt)


@_dispatch
def count_abs_ge(x: Any, t: Any) -> int:
    """Return the number of entries with ``|x_i| >= t`` (NaN never counts).

    Args:
        x: 1-D array of a value dtype.
        t: real threshold, compared exactly (not rounded to ``x.dtype``).
    """
    x, t = _values(x, "x", (1,)), _real(t)
    mask = _abs_ge_mask(x, t)
    if isinstance(mask, (bool, np.bool_)):
        return int(x.size) if mask else 0
    return int(np.count_nonzero(mask))


@_dispatch
def select_abs_ge(x: Any, t: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(indices, values)`` of the entries with ``|x_i| >= t``, indices ascending.

    Indices are int32 when ``len(x) < 2**31``, else int64; values are copies of ``x[indices]``.
    NaN is never selected.
    """
    x, t = _values(x, "x", (1,)), _real(t)
    itype = _index_dtype(x.size)
    mask = _abs_ge_mask(x, t)
    if isinstance(mask, (bool, np.bool_)):
        idx = np.arange(x.size, dtype=itype) if mask else np.empty(0, itype)
    else:
        idx = np.flatnonzero(mask).astype(itype, copy=False)
    return idx, x[idx]


def _magnitudes(x: np.ndarray) -> np.ndarray:
    """|x| exactly: floats keep their dtype, integers become the unsigned type of their width."""
    mag = np.abs(x)
    if x.dtype.kind == "i":
        mag = mag.view(np.dtype(f"u{x.dtype.itemsize}"))
    return mag


@_dispatch
def kth_abs(x: Any, k: int) -> Any:
    """Return the exact k-th largest ``|x_i|`` (k = 1 is the largest), the threshold of top-k.

    NaN ranks below every number: the result is NaN only when fewer than k entries are numbers.
    Float inputs give a scalar of ``x.dtype``; int32/int64 give uint32/uint64 (``|INT_MIN|`` fits).
    """
    x = _values(x, "x", (1,))
    k = _k(k, x.size)
    mag = _magnitudes(x)
    valid = x.size
    if mag.dtype.kind == "f" and np.isnan(mag.max()):
        valid -= int(np.count_nonzero(np.isnan(mag)))
        if k > valid:
            return mag.dtype.type(np.nan)
    return np.partition(mag, valid - k)[valid - k]


@_dispatch
def topk_abs(x: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(indices, values)`` of the k entries of largest magnitude, indices ascending.

    Exact; ties at the k-th magnitude go to the lower indices; NaN ranks below every number.
    Index dtype as in :func:`select_abs_ge`.
    """
    x = _values(x, "x", (1,))
    k = _k(k, x.size)
    mag = _magnitudes(x)
    t = kth_abs(x, k)
    if mag.dtype.kind == "f" and np.isnan(t):
        above, tied = ~np.isnan(mag), np.isnan(mag)
    else:
        above, tied = mag > t, mag == t
    need = k - int(np.count_nonzero(above))
    take = np.flatnonzero(tied)[:need]
    keep = above
    keep[take] = True
    idx = np.flatnonzero(keep).astype(_index_dtype(x.size), copy=False)
    return idx, x[idx]


# --------------------------------------------------------------------------------------------
# sparse reductions
# --------------------------------------------------------------------------------------------

def _fold_runs(idx: np.ndarray, val: np.ndarray, ufunc: np.ufunc,
               acc: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Coalesce ``(idx, val)``: ascending unique indices, values left-folded in input order."""
    order = np.argsort(idx, kind="stable")
    sidx = idx[order]
    head = np.empty(sidx.size, bool)
    head[:1] = True
    np.not_equal(sidx[1:], sidx[:-1], out=head[1:])
    uniq = sidx[head]
    slot = np.empty(idx.size, np.intp)
    slot[order] = np.cumsum(head) - 1
    out = np.full((uniq.size,) + val.shape[1:], _identity(ufunc, acc), acc)
    ufunc.at(out, slot, val.astype(acc, copy=False))
    return uniq, out.astype(val.dtype, copy=False)


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
    _check_range(idx, None if n is None else _length(n))
    return _fold_runs(idx, val, ufunc, _accumulate(accumulate_dtype, val.dtype))


@_dispatch
def merge_sorted(parts: Sequence[tuple[Any, Any]], op: Any = "sum",
                 accumulate_dtype: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Merge already coalesced COO parts (each sorted, unique) into one, reducing duplicates.

    The values of one index are left-folded in part order, so the result is bitwise
    deterministic and equals ``coo_reduce`` of the concatenated parts. Index dtype: int64 if
    any part has int64 indices, else int32. Values: 1-D or rows, one dtype and width for all.
    """
    if not isinstance(parts, (list, tuple)) or not parts:
        raise InvalidArgument("parts", parts, "must be a non-empty list of (indices, values)")
    pairs = []
    for p, part in enumerate(parts):
        if not isinstance(part, (list, tuple)) or len(part) != 2:
            raise InvalidType(f"parts[{p}]", type(part).__name__, "an (indices, values) pair")
        idx, val = _pair(part[0], part[1], f"parts[{p}].")
        if idx.size > 1 and not np.all(idx[1:] > idx[:-1]):
            raise InvalidArgument(f"parts[{p}].indices", idx, "must be sorted and unique")
        _check_range(idx, None, f"parts[{p}].indices")
        pairs.append((idx, val))
    ref = pairs[0][1]
    for p, (_, val) in enumerate(pairs):
        if val.dtype != ref.dtype:
            raise InvalidType(f"parts[{p}].values", val.dtype, f"{ref.dtype} like parts[0]")
        if val.shape[1:] != ref.shape[1:]:
            raise InvalidArgument(f"parts[{p}].values", val.shape, f"row shape {ref.shape[1:]} like parts[0]")
    ufunc = _reduce_op(op)
    acc = _accumulate(accumulate_dtype, ref.dtype)
    itype = np.result_type(*(i.dtype for i, _ in pairs))
    idx = np.concatenate([i.astype(itype, copy=False) for i, _ in pairs])
    val = np.concatenate([v for _, v in pairs])
    return _fold_runs(idx, val, ufunc, acc)


# --------------------------------------------------------------------------------------------
# dense <-> sparse
# --------------------------------------------------------------------------------------------

@_dispatch
def scatter_reduce(dense: Any, indices: Any, values: Any, op: Any = "sum") -> np.ndarray:
    """Reduce ``values`` into ``dense[indices]`` in place and return ``dense``.

    Duplicate indices accumulate: each ``dense[i]`` becomes ``dense[i] op v0 op v1 ...`` folded
    left in input order. ``dense`` is 1-D, or 2-D rows with ``values`` of shape
    ``(len(indices), dense.shape[1])``; ``values.dtype`` must equal ``dense.dtype``.
    """
    dense = _values(dense, "dense")
    idx, val = _pair(indices, values)
    if val.dtype != dense.dtype:
        raise InvalidType("values", val.dtype, f"{dense.dtype} like dense")
    if val.shape[1:] != dense.shape[1:]:
        raise InvalidArgument("values", val.shape, f"rows of shape {dense.shape[1:]} like dense")
    ufunc = _reduce_op(op)
    _check_range(idx, dense.shape[0])
    ufunc.at(dense, idx, val)
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

    Duplicate indices are summed.
    """
    idx, val = _pair(indices, values)
    n = _length(n)
    _check_range(idx, n)
    dense = np.zeros((n,) + val.shape[1:], val.dtype)
    np.add.at(dense, idx, val)
    return dense
