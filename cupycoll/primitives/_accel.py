"""Whether a numpy call hands its core loop to the numba loops of :mod:`._numba`.

numba is imported lazily, by the first large input or the first small sum of several ranks'
parts (``LOOP_SUM``), so numpy users who reach neither (or set ``CUPYCOLL_NUMBA=off``) never
import it; by default in a background thread, the numpy loops running until it is ready
(:func:`loops`).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .._config import setting
from ._common import EveryThread


#: entries from which the numba loops run: below, numba's import and compile are not worth it.
_FAST_FROM = 1 << 14


def _fast(size: int) -> Any:
    """``cupycoll.primitives._numba`` for ``size`` entries, unless small, CUPYCOLL_NUMBA=off or
    numba does not import (then None: the numpy loops run)."""
    return None if size < _FAST_FROM else loops()


def loops() -> Any:
    """``cupycoll.primitives._numba`` whatever the size, or None: with CUPYCOLL_NUMBA=off, where
    numba does not import, and (``auto``, the default) until its import, started here in a
    background thread, has finished: numba's import and its first cached load take about a
    second, which a process's first call would otherwise wait for, and the numpy loops give
    the same bits meanwhile. ``on`` imports it here and waits. Kept once its import has
    finished: a thread that finds it in ``sys.modules`` while another thread still imports it
    would get a module half-made."""
    mode = setting("CUPYCOLL_NUMBA")
    if mode == "off" or _FAILED:
        return None
    if _LOADED is not None:
        return _LOADED
    if mode == "on":
        return _load()
    global _LOADER
    with _LOADER_LOCK:
        if _LOADER is None:
            _LOADER = threading.Thread(target=_load, name="cupycoll-numba-import", daemon=True)
            _LOADER.start()
    return None


def loading() -> bool:
    """Whether numba's import runs in the background now (:func:`loops`): while it does, it
    holds the interpreter lock for long stretches, and a call on another thread takes many
    times its usual time (so ``auto``'s learn mode does not count such a call's time)."""
    return _LOADED is None and _LOADER is not None and _LOADER.is_alive()


def ready() -> Any:
    """:func:`loops`, waiting for numba's import where it runs in the background (for what
    measures the loops: ``cupycoll tune``, the benchmarks)."""
    if setting("CUPYCOLL_NUMBA") == "off" or _FAILED:
        return None
    return _LOADED if _LOADED is not None else _load()


def _load() -> Any:
    """Import the numba loops and load one of them from numba's cache (its first cached load
    sets up numba's compiler); keep them in ``_LOADED``, or note that numba does not run."""
    global _LOADED, _FAILED
    try:
        from . import _numba
    except (ImportError, RuntimeError):  # RuntimeError: numba finds no writable cache directory
        _FAILED = True
        return None
    _numba.index_stats(np.arange(2))
    _LOADED = _numba
    return _numba


#: the imported loops (set by :func:`_load` once their import has finished); whether that
#: import failed (then it is not tried again); the background thread that imports them.
_LOADED: Any = None
_FAILED = False
_LOADER: threading.Thread | None = None
_LOADER_LOCK = threading.Lock()


#: each thread's kept host buffer (see kept_buffer).
_KEPT = EveryThread()


def kept_buffer(size: int, dtype: Any) -> np.ndarray:
    """An uninitialised host array of ``size`` elements, this thread's, reused by the next call.

    For dense working buffers that never leave a call (the ``dense`` sparse algorithm's
    densified values): a fresh n-long array costs a page fault per 4 KiB page on first touch
    (together more than a fill of it: docs/primitives.md). The largest asked for is kept
    until :func:`free_scratch`.
    """
    nbytes = int(size) * np.dtype(dtype).itemsize
    buffer = getattr(_KEPT, "buffer", None)
    if buffer is None or buffer.size < nbytes:
        buffer = _KEPT.buffer = np.empty(nbytes, np.uint8)
        _KEPT.filled = None
    return buffer[:nbytes].view(dtype)


def kept_filled(size: int, dtype: Any, fill: Any) -> np.ndarray:
    """:func:`kept_buffer`'s array with every element ``fill``, written only where it is not
    known to hold it already: after a call that restored what it wrote and said so with
    :func:`mark_filled`, the next call of the same dtype and fill writes nothing below that
    call's size (the ``dense`` algorithm: an O(n) fill becomes O(union))."""
    dtype = np.dtype(dtype)
    array = kept_buffer(size, dtype)
    key, known = (dtype, np.asarray(fill, dtype).tobytes()), getattr(_KEPT, "filled", None)
    done = known[2] if known is not None and known[:2] == key else 0
    _KEPT.filled = None  # the caller writes into it: nothing is known until mark_filled
    if done < size:
        array[done:] = fill
    return array


def mark_filled(array: np.ndarray, fill: Any) -> None:
    """Declare that :func:`kept_filled`'s ``array`` holds ``fill`` everywhere again."""
    if getattr(_KEPT, "buffer", None) is not None and np.shares_memory(array, _KEPT.buffer):
        _KEPT.filled = (array.dtype, np.asarray(fill, array.dtype).tobytes(), array.size)


def free_scratch() -> None:
    """Free the temporaries that the numba loops (and kept_buffer) keep, for every thread (the
    background worker of asynchronous calls too)."""
    _KEPT.clear_all()
    if _LOADED is not None:
        _LOADED.free_scratch()
