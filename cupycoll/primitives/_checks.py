"""Argument checks and normalisation shared by the numpy twins and the cupy primitives.

Each helper raises the same error (type, argument name, message) on either side, so a bad call
fails identically on CPU and GPU.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any

import numpy as np

from .._types import UFUNCS, array_namespace, parse_op, to_host, writable
from ..errors import InvalidArgument, InvalidType
from ._accel import _fast


#: dtypes of values (and of dense arrays) every primitive accepts.
VALUE_DTYPES = tuple(np.dtype(t) for t in ("float16", "float32", "float64", "int32", "int64"))
#: dtypes of index arrays.
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


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


#: indices up to this many are checked as a Python list (faster than numpy on a few)
_LISTED = 32


def _index_stats(idx: Any) -> tuple[int, int, bool]:
    """``(min, max, strictly increasing)`` of non-empty indices, read from a device in ONE
    transfer (three separate reads would each synchronise the host). On the host, sorted
    indices (the usual input) cost one comparison pass: their ends are the min and max."""
    if type(idx) is np.ndarray:
        if idx.shape[0] <= _LISTED:  # a few indices: Python compares them faster than numpy
            seq = idx.tolist()
            if all(map(operator.lt, seq, seq[1:])):
                return seq[0], seq[-1], True
            return min(seq), max(seq), False
        fast = _fast(idx.shape[0])
        if fast is not None:
            return fast.index_stats(idx)
        increasing = idx.shape[0] < 2 or bool((idx[1:] > idx[:-1]).all())
        if increasing:
            return int(idx[0]), int(idx[-1]), True
        return int(idx.min()), int(idx.max()), False
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
    if parsed not in UFUNCS:
        raise InvalidArgument("op", op, "avg is the caller's job (sum, then divide); "
                              "use sum, prod, max or min")
    return UFUNCS[parsed]


def _accumulate(accumulate_dtype: Any, dtype: np.dtype) -> np.dtype:
    if accumulate_dtype is None:
        return dtype
    try:  # the arithmetic's dtype: its byte order is this machine's, whatever was named
        acc = np.dtype(accumulate_dtype).newbyteorder("=")
    except TypeError:
        raise InvalidType("accumulate_dtype", accumulate_dtype, "a dtype") from None
    if acc not in VALUE_DTYPES:
        raise InvalidType("accumulate_dtype", acc, f"one of {[d.name for d in VALUE_DTYPES]}")
    return acc


def _index_dtype(n: int) -> np.dtype:
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def _real(t: Any, argument: str = "t") -> Any:
    if type(t) is float or type(t) is int:  # the usual case, without the ABC checks below
        return t
    if isinstance(t, np.ndarray) and t.ndim == 0:
        t = t[()]
    real = (numbers.Real, np.integer, np.floating)
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, real):
        raise InvalidType(argument, type(t).__name__, "a real number")
    return t


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


def _scatter_operands(dense: Any, indices: Any, values: Any) -> tuple[Any, Any, Any]:
    """Validate scatter_reduce's arrays: dense writable, values of its dtype and row shape."""
    dense = _values(dense, "dense")
    if not writable(dense):  # numpy's ufunc.at writes read-only arrays (a read-only map: a crash)
        raise InvalidArgument("dense", "a read-only array", "must be writable: the rows are "
                              "reduced into it")
    idx, val = _pair(indices, values)
    if val.dtype != dense.dtype:
        raise InvalidType("values", val.dtype, f"{dense.dtype} like dense")
    if val.shape[1:] != dense.shape[1:]:
        raise InvalidArgument("values", val.shape, f"rows of shape {dense.shape[1:]} like dense")
    return dense, idx, val


def _combined(a: Any, b: Any) -> None:
    """Check combine's operands: ``a`` a numpy or cupy array of numbers, ``b`` a scalar (a 0-d
    array too: a CuPy reduction's) or an array of ``a``'s shape."""
    a = _array(a, "a")
    if a.dtype.kind not in "biufc":
        raise InvalidType("a", a.dtype, "an array of numbers")
    if not (np.isscalar(b) or getattr(b, "shape", None) in ((), a.shape)):
        raise InvalidArgument("b", getattr(b, "shape", type(b).__name__),
                              f"must be a scalar (0-d array) or an array of a's shape {a.shape}")
