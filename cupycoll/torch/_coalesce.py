"""Coalescing a CPU sparse gradient: the rows and sums of torch's ``coalesce()``, bit for bit,
in one compiled pass instead of torch's row-by-row loop.

torch's CPU ``coalesce()`` sorts the row indices (``indices.sort()``), copies the first entry
of each run of equal indices and adds the others to it in the sorted order. :func:`coalesce`
takes the same sort and folds the values in that same order with numba (the GIL released, so
a background call overlaps the caller's thread): the same float sums, hence the same result as
gloo's sparse allreduce, which coalesces with torch. Without numba (or with
``CUPYCOLL_NUMBA=off``), on CUDA, for dtypes numba does not add, and below
:data:`FROM` entries (where torch's loop is as fast and no compile is worth it), torch's own
``coalesce()`` runs.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ..primitives._accel import loops

__all__ = ["coalesce", "FROM"]

#: entries (rows with duplicates) from which the compiled fold runs.
FROM = 1 << 14
_FOLDED = (torch.float32, torch.float64, torch.int32, torch.int64)


def coalesce(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (1-D int64, ascending, unique) and values of ``tensor.coalesce()``.

    ``tensor``: sparse COO with one sparse dimension."""
    fold = _fold() if _compiled_fits(tensor) else None
    if fold is None:
        done = tensor.coalesce()
        return done.indices()[0], done.values()
    values = tensor._values().contiguous()
    keys, order = tensor._indices()[0].sort()
    rows = values.reshape(values.shape[0], math.prod(values.shape[1:]))
    runs = int((keys[1:] != keys[:-1]).sum()) + 1  # the output's size: no nnz-long buffer
    out_idx = torch.empty(runs, dtype=keys.dtype)
    out_val = torch.empty((runs, rows.shape[1]), dtype=rows.dtype)
    fold(order.numpy(), keys.numpy(), rows.numpy(), out_idx.numpy(), out_val.numpy())
    return out_idx, out_val.reshape((runs, *values.shape[1:]))


def _compiled_fits(tensor: torch.Tensor) -> bool:
    """Whether the compiled fold takes ``tensor`` (see the module docstring)."""
    return (not tensor.is_cuda and not tensor.is_coalesced() and tensor._nnz() >= FROM
            and tensor.dtype in _FOLDED)


def _fold() -> Any:
    """The compiled fold, or None where numba does not run (see the module docstring)."""
    return None if loops() is None else _compiled()  # None: CUPYCOLL_NUMBA=off, or no numba


@functools.lru_cache(maxsize=None)
def _compiled() -> Any:
    """The fold's module imported once (a failed import is not retried on every call)."""
    try:
        from ._coalesce_numba import fold
    except (ImportError, RuntimeError):  # RuntimeError: numba finds no writable cache dir
        return None
    return fold

