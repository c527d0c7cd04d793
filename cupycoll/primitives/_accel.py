"""Whether a numpy call hands its core loop to the numba loops of :mod:`._numba`.

numba is imported lazily, only for large inputs, so numpy users who never reach the threshold
(or set ``CUPYCOLL_NUMBA=off``) never import it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np

from .._config import setting


#: entries from which the numba loops run: below, numba's import and compile are not worth it.
_FAST_FROM = 1 << 14


def _fast(size: int) -> Any:
    """``cupycoll.primitives._numba`` for ``size`` entries, unless small, CUPYCOLL_NUMBA=off or
    numba does not import (then None: the numpy loops run)."""
    if setting("CUPYCOLL_NUMBA") == "off" or size < _FAST_FROM:
        return None
    try:
        from . import _numba
    except (ImportError, RuntimeError):  # RuntimeError: numba finds no writable cache directory
        return None
    return _numba


#: this thread's kept host buffer (see kept_buffer).
_KEPT = threading.local()


def kept_buffer(size: int, dtype: Any) -> np.ndarray:
    """An uninitialised host array of ``size`` elements, this thread's, reused by the next call.

    For dense working buffers that never leave a call (the ``dense`` sparse algorithm's
    densified values): a fresh n-long array costs a page fault per 4 KiB page on first touch
    (~4 us each on our VMs: 64 MB costs more than filling it). The largest asked for is kept
    until :func:`free_scratch`.
    """
    nbytes = int(size) * np.dtype(dtype).itemsize
    buffer = getattr(_KEPT, "buffer", None)
    if buffer is None or buffer.size < nbytes:
        buffer = _KEPT.buffer = np.empty(nbytes, np.uint8)
    return buffer[:nbytes].view(dtype)


def free_scratch() -> None:
    """Free the temporaries that the numba loops (and kept_buffer) keep for this thread."""
    _KEPT.__dict__.clear()
    loops = sys.modules.get(f"{__package__}._numba")
    if loops is not None:
        loops.free_scratch()
