"""Entries with duplicate indices whose sum is left for where their rows land
(:class:`Unfolded`): ``coo_reduce``'s bitmap walk split in two, so that an algorithm which
scatters a rank's rows into a larger buffer sums them there (:mod:`cupycoll.sparse.mask`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._numpy_reduce import _index_marks, _table_loops

__all__ = ["Unfolded", "unfold", "folded"]


class Unfolded:
    """Entries with duplicate indices whose sum is left for where their rows land: ``keys``
    (their ascending distinct indices), then :meth:`into` folds each index's rows straight
    into a row of a larger buffer (a union's rows, a dense vector's), the same left fold in
    input order as :func:`coo_reduce`, without its coalesced copy in between.

    ``shape`` and ``dtype`` are those of the coalesced values (``len(keys)`` rows of the
    accumulate dtype); :meth:`folded` makes them.
    """

    def __init__(self, loops: Any, indices: np.ndarray, rows: np.ndarray, lo: int, hi: int,
                 row: tuple) -> None:
        self._loops, self._indices, self._rows, self._span = loops, indices, rows, (lo, hi)
        with _index_marks(*self._span) as marks:
            self.keys = loops.distinct_sorted(indices, lo, marks)
        self.dtype = rows.dtype
        self.shape = (self.keys.shape[0],) + row
        self.ndim = len(self.shape)
        self._folded: np.ndarray | None = None

    def into(self, out: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Fold the rows of ``keys[i]`` into ``out[slots[i]]`` (``out``: C-contiguous, of
        ``dtype``, rows of this row shape; its other rows untouched) and return ``out``."""
        lo = self._span[0]
        with _index_marks(*self._span) as marks:
            self._loops.fold_rows(self._indices, lo, marks, self.keys, slots, self._rows,
                                  out.reshape(out.shape[0], self._rows.shape[1]))
        return out

    def fold_into(self, out: np.ndarray) -> np.ndarray:
        """Write the coalesced values (row i: the sum of ``keys[i]``'s rows) into ``out``
        (C-contiguous, of ``shape`` and ``dtype``) and return it."""
        return self.into(out, np.arange(self.shape[0], dtype=np.int32))

    def folded(self) -> np.ndarray:
        """The coalesced values: each key's rows summed (what :func:`coo_reduce` returns in
        the accumulate dtype), made once."""
        if self._folded is None:
            self._folded = self.fold_into(np.empty(self.shape, self.dtype))
        return self._folded


def folded(values: Any) -> Any:
    """``values`` as an array: :class:`Unfolded` rows summed, anything else as it is."""
    return values.folded() if isinstance(values, Unfolded) else values


def unfold(indices: np.ndarray, values: np.ndarray, acc: np.dtype) -> Unfolded | None:
    """The host entries ``indices`` (any order, duplicates, in range) and ``values`` as
    :class:`Unfolded` rows in ``acc``, where numba's table takes their sum; else None (then
    :func:`coo_reduce` sums them)."""
    if indices.size == 0:
        return None
    lo, hi = int(indices.min()), int(indices.max())
    loops = _table_loops(indices, values, np.add, acc, lo, hi)
    if loops is None:
        return None
    row = tuple(values.shape[1:])
    with np.errstate(all="ignore"):  # the cast into acc, as coo_reduce makes it
        rows = np.ascontiguousarray(values, acc).reshape(indices.size, math.prod(row))
    return Unfolded(loops, indices, rows, lo, hi, row)
