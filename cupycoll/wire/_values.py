"""Low-precision values on the wire: bfloat16 or float16 payloads, round to nearest even.

Works on numpy and cupy arrays alike (array operations only). bfloat16 needs no ml_dtypes: it is
the top half of a float32, rounded on the uint32 bits. float64 input is rounded to bfloat16 in
one step: float32 with round-to-odd first, which cannot double-round (16 bits stay below the
bfloat16 rounding position, 13 below float16's), so float64 -> float16 takes the same route
and never depends on how a library casts float64 to float16. float32 -> float16 is the
namespace's own cast (numpy's and CUDA's ``__float2half_rn`` round to nearest even).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._types import array_namespace
from ..errors import InvalidArgument, InvalidType

__all__ = ["FORMATS", "round_values", "widen_values", "rounding_error"]

#: the payload formats and their bytes per value.
FORMATS = {"bfloat16": 2, "float16": 2}
_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _format(fmt: Any) -> str:
    if fmt not in FORMATS:
        raise InvalidArgument("fmt", fmt, f"valid: {sorted(FORMATS)}")
    return fmt


def _round_to_odd_f32(xp: Any, x: Any) -> Any:
    """float64 -> float32 bits rounded to odd: truncate toward zero, set the last bit if inexact.

    Overflow gives the largest float32 (odd), which bfloat16 then rounds to inf, as it must.
    """
    with np.errstate(all="ignore"):  # underflow to 0 and overflow are the rounding
        near = x.astype(np.float32)
        back = near.astype(np.float64)
        away = xp.abs(back) > xp.abs(x)  # rounded up in magnitude: step back one ulp
        inexact = back != x
    finite = xp.isfinite(x)
    # |bits| - 1 ulp where rounded away (never below 0: |x| > 0)
    bits = near.view(np.uint32) - (away & finite).astype(np.uint32)
    return bits | (inexact & finite).astype(np.uint32)


def _bfloat16_bits(xp: Any, values: Any) -> Any:
    """RNE float (any of float16/32/64) -> bfloat16 bits as uint16; NaN stays a quiet NaN."""
    if values.dtype == np.float64:
        bits = _round_to_odd_f32(xp, values)
    else:
        bits = values.astype(np.float32).view(np.uint32)  # float16 -> float32 is exact
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return xp.where(nan, quiet, rounded).astype(np.uint16)


def widen_values(payload: Any, fmt: str, dtype: Any = np.float32) -> Any:
    """The values a payload of ``fmt`` stands for, as ``dtype`` (float32 or float64; exact)."""
    fmt = _format(fmt)
    dt = np.dtype(dtype)
    if dt not in _FLOATS[1:]:
        raise InvalidType("dtype", dt, "float32 or float64")
    if getattr(payload, "dtype", None) != np.uint16:
        raise InvalidType("payload", getattr(payload, "dtype", type(payload).__name__),
                          "a uint16 array")
    if fmt == "float16":
        return payload.view(np.float16).astype(dt)
    wide = (payload.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return wide.astype(dt, copy=False)


def rounding_error(values: Any, rounded: Any) -> Any:
    """``values - rounded``, the sender's error feedback, computed quietly (the caller's numpy
    error state must not turn inf - inf into an exception on one rank in the middle of a
    collective). Whatever travels as +-inf keeps no error: an infinite value (an owner's sum
    that a sender's overflow made infinite) and a finite one that overflowed the format
    (float16 beyond +-65504, as IEEE rounding and a half-precision sum make it) alike. The
    result is then +-inf there, which an AMP ``GradScaler`` sees and skips the step for,
    discarding that gradient: a residual that kept the value would send it, and overflow,
    again at every step, and ``value - inf`` would leave NaN in it for good."""
    xp = array_namespace(values)
    with np.errstate(invalid="ignore"):
        error = xp.where(values == rounded, 0, values - rounded)
    return xp.where(xp.isinf(rounded), 0, error)


def round_values(values: Any, fmt: str) -> tuple[Any, Any]:
    """Round ``values`` for the wire: ``(payload, rounded)``.

    ``payload`` is uint16 of the same shape (the bits of ``fmt``); ``rounded`` is what the
    receiver will see, in the input dtype (float32 for float16 input), so the sender can keep
    ``values - rounded`` as its error feedback.
    """
    fmt = _format(fmt)
    xp = array_namespace(values)
    if getattr(values, "dtype", None) not in _FLOATS:
        raise InvalidType("values", getattr(values, "dtype", type(values).__name__),
                          "an array of float16, float32 or float64")
    if fmt == "float16":
        narrow = values
        if values.dtype == np.float64:  # not every float64 -> float16 cast rounds once
            narrow = _round_to_odd_f32(xp, values).view(np.float32)
        with np.errstate(all="ignore"):  # overflow to inf, underflow: the rounding
            payload = narrow.astype(np.float16).view(np.uint16)
    else:
        payload = _bfloat16_bits(xp, values)
    out = np.float64 if values.dtype == np.float64 else np.float32
    return payload, widen_values(payload, fmt, out)
