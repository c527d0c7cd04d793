"""Exact rules shared by the numpy twins, the numba loops and the kernels: the identity of each
reduction, the rounding of a magnitude threshold to a dtype, and the blocks of a merge."""

from __future__ import annotations

import math
import numbers
import threading
import weakref
from fractions import Fraction
from typing import Any

import numpy as np


#: entries per block of merge_sorted: each block's sort, runs and fold stay in cache.
_MERGE_BLOCK = 1 << 15


def _identity(ufunc: np.ufunc, dtype: np.dtype) -> Any:
    """The exact identity of ``ufunc`` on ``dtype`` (``-0.0`` for float sums keeps ``-0.0``)."""
    if ufunc is np.add:
        return -0.0 if dtype.kind == "f" else 0
    if ufunc is np.multiply:
        return 1
    if dtype.kind == "f":
        return -np.inf if ufunc is np.maximum else np.inf
    info = np.iinfo(dtype)
    return info.min if ufunc is np.maximum else info.max


#: the largest finite value of each float dtype
_LARGEST = {np.dtype(d): float(np.finfo(d).max) for d in ("float16", "float32", "float64")}


def _abs_threshold(dtype: np.dtype, t: Any) -> Any:
    """Return the least magnitude of ``dtype`` that is >= t, or a bool if the test is uniform.

    ``|x| >= t`` then equals ``|x| >= result`` for every x of ``dtype``; a bool result is the
    answer for every element. Floats: the least value of the dtype >= t (t is never rounded
    down), 0 for t <= 0, False for NaN t. Integers: ``ceil(t)`` as an int in [1, 2**(bits-1)],
    True for t <= 0, False above ``|INT_MIN|`` or for NaN t. Shared by the numpy scans and the
    kernels' magnitude ranks so both round t the same way.
    """
    exact = _exact(t)
    if dtype.kind == "f":
        try:
            tf = float(exact)
        except OverflowError:  # an int or a Fraction beyond the float64 range
            tf = math.inf if exact > 0 else -math.inf
        with np.errstate(over="ignore"):  # beyond the dtype's range: its inf
            tt = dtype.type(tf)
        if float(tt) < exact:  # (float < int or Fraction compares exactly: 2**53 + 1 > 2.0**53)
            with np.errstate(under="ignore", over="ignore"):  # subnormal, or past the largest
                tt = np.nextafter(tt, dtype.type(np.inf))  # (inf): no raise mid-collective
        if math.isnan(tt):
            return False
        return tt if tt > 0 else dtype.type(0)
    if isinstance(exact, float):  # NaN or an infinity
        return False if math.isnan(exact) else exact < 0
    ti = math.ceil(exact)  # exact for a Fraction too (float(t) would round)
    if ti <= 0 or ti > 2 ** (8 * dtype.itemsize - 1):
        return ti <= 0
    return ti


def _exact(t: Any) -> Any:
    """``t`` as an exact number: an int, a Fraction (a float of any precision, numpy's long
    double included, by its integer ratio), or a float that is NaN or infinite."""
    if isinstance(t, (numbers.Integral, np.integer)):
        return int(t)
    if isinstance(t, numbers.Rational):
        return t
    if isinstance(t, (float, np.floating)):
        return Fraction(*t.as_integer_ratio()) if np.isfinite(t) else float(t)
    return _exact(float(t))


def _block_cuts(indices: list[np.ndarray], total: int) -> list[list[int]]:
    """Cut every part at shared index values into blocks of about ``_MERGE_BLOCK`` entries.

    Splitters are quantiles of a strided sample of all parts, so skewed parts still give even
    blocks; all copies of an index land in the same block (cuts are searchsorted 'left').
    """
    blocks = -(-total // _MERGE_BLOCK)
    if blocks <= 1:
        return [[0, i.size] for i in indices]
    stride = max(1, total // (8 * blocks))
    sample = np.sort(np.concatenate([i[::stride] for i in indices]))
    splitters = sample[(np.arange(1, blocks) * sample.size) // blocks]
    return [[0, *np.searchsorted(i, splitters).tolist(), i.size] for i in indices]


def smallest_positive(dtype: Any) -> float:
    """The least positive value of ``dtype`` (1 for integers): ``|v| >= it`` selects exactly
    the nonzeros. (``finfo``'s constant, not ``nextafter(0, 1)``, which warns of underflow
    where the caller's numpy error state asks for it.)"""
    dtype = np.dtype(dtype)
    return float(np.finfo(dtype).smallest_subnormal) if dtype.kind == "f" else 1


class EveryThread(threading.local):
    """A ``threading.local`` whose every thread's attributes :meth:`clear_all` drops, from any
    thread: ``free_scratch()`` in the caller's thread also frees what the background worker's
    (asynchronous) calls keep. A thread's attributes are let go with its Thread object, as a
    ``threading.local``'s are."""

    #: id of an instance -> id of a thread's attributes -> those attributes
    _every: dict[int, dict[int, dict]] = {}

    def __init__(self) -> None:  # run in each thread at its first use
        kept, every = self.__dict__, self._every.setdefault(id(self), {})
        every[id(kept)] = kept
        weakref.finalize(threading.current_thread(), every.pop, id(kept), None)

    def clear_all(self) -> None:
        for kept in list(self._every.get(id(self), {}).values()):
            kept.clear()
