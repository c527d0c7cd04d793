"""Whether a numpy call hands its core loop to the numba loops of :mod:`._numba`.

numba is imported lazily, only for large inputs, so numpy users who never reach the threshold
(or set ``CUPYCOLL_NUMBA=off``) never import it.
"""

from __future__ import annotations

import sys
from typing import Any

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


def free_scratch() -> None:
    """Free the temporaries that the numba loops keep between calls of this thread."""
    loops = sys.modules.get(f"{__package__}._numba")
    if loops is not None:
        loops.free_scratch()
