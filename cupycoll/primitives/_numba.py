"""numba loops of the hot numpy primitives: an optional accelerator, bitwise equal to the twins.

Imported lazily by :mod:`cupycoll.primitives._accel` only when ``CUPYCOLL_NUMBA`` allows it and
numba imports. Only the core loops live here: validation, casts to the accumulation dtype and
back, output dtypes and trimming stay in the numpy code, so errors and dtypes cannot diverge.

Each loop does what the numpy twin does, element by element: the merge folds the values of one
index into the identity of the op in part order (``ufunc.at`` on an identity-filled output), with
numpy's max/min (``a > b or isnan(a) ? a : b``, likewise ``<``): NaN propagates (the first NaN
stays), except that a +0/-0 tie gives +0 for max and -0 for min (``primitives.combine``). The
scans compare magnitudes exactly like :func:`primitives._numpy_select._abs_ge_test`. Compiled on
first use per signature and cached in ``__pycache__`` (numba recompiles silently when that
directory is read-only).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np
from numba import njit

from .._config import setting
from ._common import EveryThread, _abs_threshold, _block_cuts, _identity
from ._numba_cache import make_process_safe
from ._numba_merge import close_up, fold_part, merge_blocks
from ._numba_dense import (add_rows, copy_hit_rows, copy_hits, copy_unequal,  # noqa: F401
                           densify_sorted, divide_finding_specials, hit_masks, index_stats,
                           MAGNITUDE, OUTSIDE, positions_in, row_hits, scatter_rows,
                           special_values, UNEQUAL, union_sorted)
from ._numba_small import (SUM_DTYPES, distinct_sorted, fold_rows, sum_parts,  # noqa: F401
                           sum_two, sum_unsorted)

__all__ = ["merge", "select", "select_unequal", "select_unequal_rows", "count", "densify_sorted",
           "scatter_rows", "add_rows", "special_values", "divide_finding_specials",
           "index_stats", "positions_in", "union_sorted", "sum_parts", "sum_two", "sum_unsorted",
           "distinct_sorted", "fold_rows", "SUM_DTYPES", "threads", "piece_count",
           "free_scratch"]

#: op codes of the merge loop, keyed by the numpy ufunc of _types.UFUNCS.
OPS = {np.add: 0, np.multiply: 1, np.maximum: 2, np.minimum: 3}
#: dtypes the merge loop accumulates in (float16 has no native numba arithmetic).
MERGE_DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "int32", "int64"))
#: entries of a piece at least: a loop is cut into min(threads, entries // _PIECE) pieces, so
#: many threads do not split small loops into pieces that cost more to hand out than to run.
_PIECE = 1 << 17
#: environment variables in which MPI launchers tell the number of ranks on this node.
_LOCAL_RANKS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")
#: the thread pool, by process id: a forked child (a DataLoader worker) makes its own.
_POOLS: dict[int, ThreadPoolExecutor] = {}
#: per-thread temporaries of the merge, reused (see _scratch), each at most _SCRATCH_KEPT bytes.
_SCRATCH = EveryThread()
_SCRATCH_KEPT = 1 << 22
#: parts that merge folds straight from their own rows (more: rows concatenated first, so the
#: fold is not one loop call per part and piece)
_DIRECT_PARTS = 8


def threads() -> int:
    """Threads one loop may use: ``CUPYCOLL_THREADS``, by default (auto) the CPUs of this
    process divided among the MPI ranks of this node, so ranks sharing cores stay serial."""
    wanted = setting("CUPYCOLL_THREADS")
    if wanted != "auto":
        return int(wanted)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ranks = next((int(os.environ[k]) for k in _LOCAL_RANKS if os.environ.get(k, "").isdigit()), 1)
    return max(1, (cpus or 1) // max(1, ranks))


def piece_count(size: int) -> int:
    """How many pieces a loop over ``size`` items is cut into: one per thread, fewer when small."""
    if size < 2 * _PIECE:  # one piece whatever the threads (no threads() call)
        return 1
    return max(1, min(threads(), size // _PIECE))


def _in_threads(jobs: list[Callable[[], Any]]) -> list[Any]:
    """The results of the jobs (numba loops that release the GIL), run in parallel: the first
    in this thread, the others on the pool."""
    others, here = [], []
    if len(jobs) > 1:
        pool = _POOLS.get(os.getpid())
        if pool is None:  # setdefault: a pool made by a racing thread wins, ours starts no thread
            pool = _POOLS.setdefault(os.getpid(), ThreadPoolExecutor(thread_name_prefix="cupycoll"))
        for i, job in enumerate(jobs[1:], 1):
            try:
                others.append(pool.submit(job))
            except RuntimeError:  # the interpreter's exit shut the pool while a thread of the
                here = jobs[i:]  # program's calls on: the rest run in this thread
                break
    try:
        first = jobs[0]()
        rest = [job() for job in here]
    finally:
        results = [future.result() for future in others]
    return [first, *results, *rest]


def _scratch(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A temporary of this thread, kept for the next call when up to ``_SCRATCH_KEPT`` bytes.

    A merge of 1M entries would touch ~2000 fresh pages of temporaries, each a page fault
    (docs/primitives.md). Larger ones are not kept: kept, they would stay through the rest of
    a sparse allreduce and raise its peak (docs/primitives.md has split's). :func:`free_scratch`
    drops them."""
    size = math.prod(shape) * np.dtype(dtype).itemsize
    if size > _SCRATCH_KEPT:
        return np.empty(shape, dtype)
    buffer = getattr(_SCRATCH, name, None)
    if buffer is None or buffer.size < size:
        buffer = np.empty(size, np.uint8)
        setattr(_SCRATCH, name, buffer)
    return buffer[:size].view(dtype).reshape(shape)


def free_scratch() -> None:
    """Drop every thread's kept temporaries."""
    _SCRATCH.clear_all()


@njit(cache=True, nogil=True)
def count_hits(x, lo, hi):  # type: ignore[no-untyped-def]
    """Number of elements of x with ``x >= hi or x <= lo`` (:func:`select`'s hits)."""
    hits = 0
    for i in range(x.size):
        hits += (x[i] >= hi) | (x[i] <= lo)
    return hits


def merge(indices: Sequence[np.ndarray], values: Sequence[np.ndarray], ufunc: np.ufunc,
          acc: np.dtype, itype: np.dtype) -> tuple[np.ndarray, np.ndarray, int] | None:
    """merge_sorted's core on validated parts: ``(out_idx, out_val, count)``, None if unsupported.

    Values are cast to ``acc`` by numpy (as the twin does) before the loop folds them. Up to
    :data:`_DIRECT_PARTS` parts fold straight from their own rows (:func:`_fold_parts`);
    more are concatenated first, so the fold stays one loop per piece.
    """
    if acc not in MERGE_DTYPES or not any(i.size for i in indices):
        return None
    counts = np.fromiter((i.size for i in indices), np.int64, len(indices))
    starts = np.zeros(len(indices) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    total = int(starts[-1])
    shift = max(1, (total - 1).bit_length())
    if max((int(i[-1]) for i in indices if i.size), default=0).bit_length() + shift > 62:
        return None
    row = values[0].shape[1:]
    width = math.prod(row)
    idx = np.concatenate(indices, out=_scratch("idx", (total,), itype), casting="unsafe")
    direct = len(indices) <= _DIRECT_PARTS
    with np.errstate(all="ignore"):  # the twin's cast to acc, under the twin's errstate
        val = np.empty((0, width), acc) if direct else np.concatenate(
            values, out=_scratch("val", (total,) + row, acc), casting="unsafe").reshape(
                total, width)
    ident = np.full(1, _identity(ufunc, acc), acc)
    out_idx, out_val = np.empty(total, itype), np.empty((total,) + row, acc)
    cuts = np.array(_block_cuts(list(indices), total), np.int64)
    pieces = piece_count(total)
    edges = (np.arange(pieces + 1) * (cuts.shape[1] - 1)) // pieces
    begins = cuts[:, edges[:-1]].sum(axis=0)  # entries before a piece's first block
    work = _scratch("keys", (pieces, 2, int(np.diff(cuts, axis=1).sum(axis=0).max())), np.int64)
    slots = _scratch("slots", (total if direct else 0,), np.int64)
    rows = out_val.reshape(total, width)
    args = (idx, starts, cuts, shift, val, ident, OPS[ufunc], out_idx,
            rows if not direct else np.empty((total, 0), acc), slots)  # direct: idx closed up
    ends = np.array(_in_threads([partial(merge_blocks, *args, work[p], edges[p], edges[p + 1],
                                         begins[p]) for p in range(pieces)]))
    count = close_up(out_idx, args[8], begins, ends)
    if direct:
        _fold_parts(values, acc, slots, starts, cuts, edges, begins, ends, ident, OPS[ufunc],
                    rows)
    return out_idx, out_val, count


def _fold_parts(values: Sequence[np.ndarray], acc: np.dtype, slots: np.ndarray,
                starts: np.ndarray, cuts: np.ndarray, edges: np.ndarray, begins: np.ndarray,
                ends: np.ndarray, ident: np.ndarray, op: int, rows: np.ndarray) -> None:
    """Fold every part's rows into ``rows`` at the ``slots`` merge_blocks placed them in,
    part after part (the order of the fold), piece by piece on threads; a piece's rows are
    moved down by what close_up moved its indices."""
    width = rows.shape[1]
    with np.errstate(all="ignore"):  # the twin's cast to acc
        parts = [np.ascontiguousarray(v, acc).reshape(v.shape[0], width) for v in values]
    closed = np.concatenate([[0], np.cumsum(ends - begins)])

    def piece(p: int) -> None:
        for part, (val, at) in enumerate(zip(parts, starts)):
            a, b = cuts[part, edges[p]], cuts[part, edges[p + 1]]
            if b > a:
                fold_part(slots[at + a:at + b], closed[p] - begins[p], val[a:b], ident, op,
                          rows)

    _in_threads([partial(piece, p) for p in range(len(edges) - 1)])


def _scan_bounds(x: np.ndarray, t: Any) -> tuple[Any, Any] | None:
    """``(lo, hi)`` of x's dtype with ``|x| >= t`` exactly ``x <= lo or x >= hi``, or None.

    ``lo = -tt``, ``hi = tt`` for the exact threshold tt of
    :func:`primitives._common._abs_threshold` (NaN fails both tests). None for the cases numpy keeps: float16 (no numba arithmetic), a
    uniform answer, and ``tt = |INT_MIN|``.
    """
    if x.dtype == np.float16:
        return None
    tt = _abs_threshold(x.dtype, t)
    if isinstance(tt, bool) or (x.dtype.kind == "i" and tt > np.iinfo(x.dtype).max):
        return None
    return x.dtype.type(-tt), x.dtype.type(tt)


def select(x: np.ndarray, t: Any, itype: np.dtype) -> tuple[np.ndarray, np.ndarray] | None:
    """select_abs_ge's core on a validated 1-D x: ``(indices as itype, values)``, or None
    when the case is not covered. Two passes (:func:`_masked`): the hits counted as bits, then
    exactly the hits copied (docs/primitives.md, "Threshold scans")."""
    bounds = _scan_bounds(x, t)
    if bounds is None:
        return None
    lo, hi = bounds
    test = MAGNITUDE if x.dtype.kind == "f" else OUTSIDE
    return _masked(x, lo, hi, test, itype,
                   lambda a, b, masks, oi, ov: copy_hits(x, a, b, masks, oi, ov))


def select_unequal(x: np.ndarray, sentinel: int, itype: np.dtype, reset: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The positions (as itype) and values of the elements of integer 1-D x that are not
    ``sentinel`` (the ``dense`` algorithm's union: values not -0, as bits), in two passes
    (:func:`_masked`; the copy per hit or per element, whichever the count says is cheaper:
    :func:`copy_unequal`); ``reset``: x is left all ``sentinel``."""
    s = x.dtype.type(sentinel)
    return _masked(x, s, s, UNEQUAL, itype, lambda a, b, masks, oi, ov: copy_unequal(
        x, s, a, b, masks, bool(reset), oi, ov))


def select_unequal_rows(bits: np.ndarray, sentinel: int, itype: np.dtype, reset: bool = False
                        ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`select_unequal` of the rows of a 2-D integer array: the positions (as itype)
    and copies of the rows with an element that is not ``sentinel`` (the ``dense`` algorithm's
    union of wide rows), in two passes per piece of rows on threads (a mark and count per row,
    then a copy of the marked rows only); ``reset``: those rows are left all ``sentinel``, so
    the kept buffer needs no fill on the next call (docs/sparse.md)."""
    s, rows = bits.dtype.type(sentinel), bits.shape[0]
    hits = _scratch("row_hits", (rows,), np.dtype(np.bool_))
    reset = bool(reset)
    return _count_then_copy(rows, piece_count(bits.size),
                            lambda a, b: row_hits(bits, s, a, b, hits),
                            lambda a, b, oi, ov: copy_hit_rows(bits, s, a, b, hits, reset, oi, ov),
                            itype, bits.shape[1:], bits.dtype)


def _masked(x: np.ndarray, lo: Any, hi: Any, test: int, itype: np.dtype,
            copy: Callable) -> tuple[np.ndarray, np.ndarray]:
    """The elements of x passing ``test`` and their positions: per piece on threads, one pass
    writing each block of 64 elements' hits as the bits of a word and counting them
    (:func:`hit_masks`, vectorised), then ``copy(first, last, masks, out_idx, out_val)`` into
    outputs of exactly that size."""
    blocks = -(-x.size // 64)
    masks = _scratch("masks", (blocks,), np.dtype(np.uint64))
    return _count_then_copy(blocks, piece_count(x.size),
                            lambda a, b: hit_masks(x, lo, hi, test, a, b, masks),
                            lambda a, b, oi, ov: copy(a, b, masks, oi, ov), itype, (), x.dtype)


def _count_then_copy(units: int, pieces: int, mark: Callable, copy: Callable, itype: np.dtype,
                     row: tuple, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Two passes over ``units`` (blocks or rows) cut into ``pieces`` spans on threads:
    ``mark(first, last)`` notes and counts a span's hits, then ``copy(first, last, out_idx,
    out_val)`` writes them into its slice of outputs of exactly the total size (positions as
    itype, values of ``row`` shape and ``dtype``)."""
    if pieces == 1:  # one span in this thread: no pool, no per-span slices
        hits = mark(0, units)
        out_idx, out_val = np.empty(hits, itype), np.empty((hits,) + tuple(row), dtype)
        copy(0, units, out_idx, out_val)
        return out_idx, out_val
    edges = [(p * units) // pieces for p in range(pieces + 1)]
    spans = list(zip(edges[:-1], edges[1:]))
    hits = _in_threads([partial(mark, a, b) for a, b in spans])
    ends = np.cumsum(hits)
    out_idx, out_val = np.empty(ends[-1], itype), np.empty((ends[-1],) + tuple(row), dtype)
    _in_threads([partial(copy, a, b, out_idx[e - h:e], out_val[e - h:e])
                 for (a, b), h, e in zip(spans, hits, ends)])
    return out_idx, out_val


def count(x: np.ndarray, t: Any) -> int | None:
    """count_abs_ge's core on a validated 1-D x; None when the case is not covered."""
    bounds = _scan_bounds(x, t)
    if bounds is None:
        return None
    pieces = piece_count(x.size)
    cuts = [(p * x.size) // pieces for p in range(pieces + 1)]
    return sum(_in_threads([partial(count_hits, x[a:b], *bounds)
                            for a, b in zip(cuts[:-1], cuts[1:])]))


make_process_safe(globals())  # ranks compiling at once: see _numba_cache
