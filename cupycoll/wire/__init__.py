"""Wire formats: lossless coding of sorted index streams and low-precision values.

* :func:`encode_indices` / :func:`decode_indices` / :func:`encoded_nbytes`: a strictly
  increasing index stream as the smaller of bit-packed deltas and a bitmap (see
  :mod:`._index_codec` and docs/wire.md). numpy arrays run numba loops when available (numpy
  otherwise), cupy arrays the kernels of ``kernels/wire.cu``; every path writes the same bytes.
* :func:`round_values` / :func:`widen_values`: bfloat16 or float16 payloads, round to nearest
  even, for opt-in lossy values with error feedback.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..primitives import _accel
from .._types import array_namespace
from . import _index_codec
from ._values import FORMATS, round_values, widen_values

__all__ = ["encode_indices", "decode_indices", "encoded_nbytes", "round_values", "widen_values",
           "FORMATS"]


def fast(size: int) -> Any:
    """The numba codec for ``size`` entries wherever the primitives' numba loops would run
    (``CUPYCOLL_NUMBA`` not off, numba imports, not a small input), else None."""
    if _accel._fast(size) is None:
        return None
    from . import _numba  # imports: numba did

    return _numba


#: the kernel codec of each device namespace, by id (namespaces live as long as the process).
_CODECS: dict[int, Any] = {}


def _device_codec(xp: Any) -> Any:
    """The kernel codec of a device namespace: its own launcher when it brings primitives
    (kernels compiled for the CPU), else CuPy's."""
    codec = _CODECS.get(id(xp))
    if codec is None:
        from ._cupy import WireKernels

        own = getattr(xp, "cupycoll_primitives", None)
        if own is not None:
            codec = WireKernels(own.launch)
        else:
            from .._kernels import CupyLauncher

            codec = WireKernels(CupyLauncher())
        codec = _CODECS.setdefault(id(xp), codec)
    return codec


def encode_indices(idx: Any, lo: int, hi: int) -> Any:
    """Encode a strictly increasing index stream in ``[lo, hi)`` as a uint8 array (same
    namespace as ``idx``). Raises InvalidArgument/InvalidType for bad input."""
    xp = array_namespace(idx)
    if xp is not np:
        return _device_codec(xp).encode(idx, lo, hi)
    loops = fast(getattr(idx, "size", 0))
    return (loops or _index_codec).encode(idx, lo, hi)


def decode_indices(buf: Any, dtype: Any = np.int64) -> Any:
    """The indices encoded at the start of ``buf`` (a uint8 array or a slice of one), as
    ``dtype`` (int32 or int64), in ``buf``'s namespace."""
    xp = array_namespace(buf)
    if xp is not np:
        return _device_codec(xp).decode(buf, dtype)
    loops = fast(getattr(buf, "size", 0) * 8)
    return (loops or _index_codec).decode(buf, dtype)


def encoded_nbytes(idx: Any, lo: int, hi: int) -> int:
    """Exact ``len(encode_indices(idx, lo, hi))`` from a host (numpy) array."""
    idx = np.asarray(idx)
    return (fast(idx.size) or _index_codec).encoded_nbytes(idx, lo, hi)
