"""CuPy kernels' bits where numpy's differ: float max/min NaNs and float-to-integer casts.

* ``cupy.maximum``/``minimum`` (CuPy 14, ``cupy/_math/misc.py``) compute
  ``(isnan(in0) | isnan(in1)) ? out0_type(NAN) : max(in0, in1)`` with
  ``NAN = __int_as_float(0x7fffffff)``: every NaN result is that float, converted to the output
  type (float16: 0x7fff, as CUDA's ``__float2half``; float64: widened, 0x7fffffffe0000000).
* ``cupy.fmax``/``fmin`` call CUDA's ``fmax``/``fmin``: NaN only when both inputs are, and then
  the canonical NaN (float16 ``__hmax``: 0x7fff; float32 ``max.f32``: 0x7fffffff); float64
  keeps numpy's bits (not known for certain).
* float to 32/64-bit integers: CUDA's ``cvt.rzi`` saturates and gives 0 for NaN (CuPy's
  "Differences between CuPy and NumPy": ``[-1.]`` to uint32 gives 0, ``inf`` to int32
  2147483647); an out-of-range value cast to a narrower integer raises :class:`EmulationError`
  (what the kernel gives is not known for certain).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .device import EmulationError

__all__ = ["canonical_nans", "cast", "copyto", "CANONICAL"]

#: the ufuncs whose NaN results get CuPy's bits
CANONICAL = frozenset({"maximum", "minimum", "fmax", "fmin"})

_NAN = {np.dtype(np.float16): np.uint16(0x7FFF), np.dtype(np.float32): np.uint32(0x7FFFFFFF),
        np.dtype(np.float64): np.uint64(0x7FFFFFFFE0000000)}
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def canonical_nans(name: str, result: Any, where: Any = True) -> Any:
    """Give ``result`` (of ufunc ``name``, written in place) CuPy's NaN bits."""
    if not isinstance(result, np.ndarray) or result.dtype not in _NAN:
        return result
    if name in ("fmax", "fmin") and result.dtype == np.float64:
        return result
    mask = np.isnan(result) & where
    if mask.any():
        result.view(_UINT[result.itemsize])[mask] = _NAN[result.dtype]
    return result


def cast(a: np.ndarray, dtype: Any, order: str = "K") -> np.ndarray:
    """``a.astype(dtype)`` as a CUDA kernel converts: float to integer saturates, NaN to 0."""
    dtype = np.dtype(dtype)
    with np.errstate(all="ignore"):
        out = a.astype(dtype, order=order)
    if a.dtype.kind != "f" or dtype.kind not in "iu" or a.size == 0:
        return out
    info = np.iinfo(dtype)
    wide = a.astype(np.float64)
    high, low, nan = wide >= float(info.max) + 1, wide <= float(info.min) - 1, np.isnan(wide)
    if not (high.any() or low.any() or nan.any()):
        return out
    if dtype.itemsize < 4:
        raise EmulationError(f"cast of {a.dtype} NaN or out-of-range values to {dtype}: what "
                             "a CUDA kernel gives is undefined here (C++ leaves it undefined)")
    out[high], out[low], out[nan] = info.max, info.min, 0
    return out


def copyto(dst: np.ndarray, src: Any, casting: str = "same_kind", where: Any = True) -> None:
    """``np.copyto``, a float source into an integer destination converted as :func:`cast`
    (CuPy runs one elementwise conversion kernel for it)."""
    src = np.asarray(src)
    if (src.dtype.kind == "f" and dst.dtype.kind in "iu"
            and np.can_cast(src.dtype, dst.dtype, casting)):
        src = cast(np.broadcast_to(src, dst.shape), dst.dtype)
    np.copyto(dst, src, casting=casting, where=where)
