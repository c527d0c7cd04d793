"""The compiled fold of :mod:`._coalesce` (imports numba; loaded only where it runs)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..primitives._numba_cache import make_process_safe

__all__ = ["fold"]


@njit(cache=True, nogil=True)
def _fold(order, keys, values, out_idx, out_val):  # type: ignore[no-untyped-def]
    run, previous, width = -1, -1, values.shape[1]
    for j in range(order.shape[0]):
        source = order[j]
        if keys[j] != previous:
            run += 1
            previous = keys[j]
            out_idx[run] = previous
            for c in range(width):
                out_val[run, c] = values[source, c]
        else:
            for c in range(width):
                out_val[run, c] += values[source, c]
    return run + 1


def fold(order: np.ndarray, keys: np.ndarray, values: np.ndarray, out_idx: np.ndarray,
         out_val: np.ndarray) -> int:
    """Fold the rows ``values[order]`` whose sorted ``keys`` are equal, left to right: the
    first copied, the others added in turn (torch's ``coalesce()`` loop); writes the unique keys
    to ``out_idx`` and the sums to ``out_val`` and returns how many there are. Keys are
    non-negative (row indices)."""
    return int(_fold(order, keys, values, out_idx, out_val))


make_process_safe(globals())  # ranks compiling at once: see primitives/_numba_cache
