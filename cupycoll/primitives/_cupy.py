"""The primitives of :mod:`cupycoll.primitives` for cupy arrays, built on the kernels in ``kernels/``.

Same signatures, validation and results as the numpy twins, bit for bit (see that module for the
semantics). The orchestration lives in :class:`KernelPrimitives`, which only needs an array
namespace and a kernel launcher: :class:`~cupycoll._kernels.CupyLauncher` on a GPU, and in the
tests a launcher that runs the same kernels compiled for the CPU, so the logic between the kernels
(scans, radix passes, sort and run detection) is exercised without a GPU too.

Magnitudes are compared as *ranks* (see ``kernels/common.cuh``): 0 for NaN, else the magnitude's
bits plus one, an unsigned integer that orders magnitudes exactly for every dtype.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence

import numpy as np

from .._kernels import CTYPES, OPS, CupyLauncher, expression
from .._types import parse_op
from . import _checks
from ._common import _abs_threshold

__all__ = ["count_abs_ge", "select_abs_ge", "kth_abs", "topk_abs", "coo_reduce", "merge_sorted",
           "scatter_reduce", "gather", "densify", "KernelPrimitives", "Launcher"]

#: bits of the magnitude rank of each dtype (the radix select runs bits / 4 passes).
_RANK_BITS = {np.dtype(np.float16): 16, np.dtype(np.float32): 32, np.dtype(np.float64): 64,
              np.dtype(np.int32): 32, np.dtype(np.int64): 64}
_RADIX_ITEMS_PER_THREAD = 256


class Launcher(Protocol):
    """Runs one kernel instantiation over a grid; ``xp`` is the array namespace it works on."""

    xp: Any

    def shape(self, items: int) -> tuple[int, int]: ...

    def __call__(self, file: str, expr: str, shape: tuple[int, int], *args: Any) -> None: ...


def _threshold_rank(dtype: np.dtype, t: Any) -> int | None:
    """Return r such that ``|x| >= t`` iff ``rank(x) > r``, or None when nothing can qualify."""
    least = _abs_threshold(dtype, t)
    if isinstance(least, bool):
        return 0 if least else None  # every rank is > 0 for integers
    if dtype.kind == "f":  # rank(x) > bits(least) iff bits(|x|) >= bits(least)
        return int(np.array(least).view(f"u{dtype.itemsize}"))
    return least  # rank(x) = |x| + 1 > least iff |x| >= least


class KernelPrimitives:
    """The primitives over ``launcher``'s array namespace, each a few kernels plus array calls."""

    def __init__(self, launcher: Launcher, chunk: int = 4096):
        self.launch = launcher
        self.chunk = chunk  # elements per compaction tile (one block's run of the input)

    @property
    def xp(self) -> Any:
        return self.launch.xp

    # ---------------------------------------------------------------- thresholds and top-k
    def _tiles(self, nchunks: int) -> tuple[int, int]:
        """Launch shape of the tile kernels: one block per tile, up to the launcher's cap."""
        block = self.launch.shape(1)[1]
        return self.launch.shape(nchunks * block)

    def _rank_counts(self, x: Any, r: int) -> tuple[Any, int]:
        """Per-tile counts of ranks above and equal to ``r``, as a (2, nchunks) int64 array."""
        nchunks = -(-x.size // self.chunk)
        counts = self.xp.empty(2 * nchunks, np.int64)
        self.launch("select.cu", expression("cc_rank_count", CTYPES[x.dtype]),
                    self._tiles(nchunks), x, np.int64(x.size), np.int64(self.chunk),
                    np.uint64(r), np.int64(nchunks), counts)
        return counts.reshape(2, nchunks), nchunks

    def _rank_select(self, x: Any, r: int, k: int | None) -> tuple[Any, Any]:
        """Entries of rank > r, plus (top-k, ``k`` given) the lowest-index ties of rank r up to k."""
        xp = self.xp
        counts, nchunks = self._rank_counts(x, r)
        ends = xp.cumsum(counts, axis=1)
        above = int(ends[0, -1])
        need = 0 if k is None else k - above
        itype = _checks._index_dtype(x.size)
        idx, val = xp.empty(above + need, itype), xp.empty(above + need, x.dtype)
        if above + need:
            self.launch("select.cu", expression("cc_rank_select", CTYPES[x.dtype], CTYPES[itype]),
                        self._tiles(nchunks), x, np.int64(x.size), np.int64(self.chunk),
                        np.uint64(r), np.int64(nchunks), (ends - counts).ravel(), np.int64(need),
                        idx, val)
        return idx, val

    def _kth_rank(self, x: Any, k: int) -> int:
        """Rank of the k-th largest magnitude, by radix select 4 bits at a time."""
        xp = self.xp
        grid, block = self.launch.shape(-(-x.size // _RADIX_ITEMS_PER_THREAD))
        threads = grid * block
        state = xp.asarray(np.array([0, k], np.uint64))
        partial = xp.empty(16 * threads, np.uint32)
        hist_expr = expression("cc_radix_histogram", CTYPES[x.dtype])
        for shift in range(_RANK_BITS[x.dtype] - 4, -1, -4):
            self.launch("radix_select.cu", hist_expr, (grid, block), x, np.int64(x.size), state,
                        np.int32(shift), partial)
            hist = partial.reshape(16, threads).sum(axis=1, dtype=np.uint64)
            self.launch("radix_select.cu", "cc_radix_pick", (1, 1), hist, np.int32(shift), state)
        return int(state[0])

    def count_abs_ge(self, x: Any, t: Any) -> int:
        """Number of entries with ``|x_i| >= t``; NaN never counts."""
        x, t = _checks._values(x, "x", (1,)), _checks._real(t)
        r = _threshold_rank(x.dtype, t)
        if r is None or x.size == 0:
            return 0
        counts, _ = self._rank_counts(self.xp.ascontiguousarray(x), r)
        return int(counts[0].sum())

    def select_abs_ge(self, x: Any, t: Any) -> tuple[Any, Any]:
        """``(indices, values)`` of the entries with ``|x_i| >= t``, indices ascending."""
        x, t = _checks._values(x, "x", (1,)), _checks._real(t)
        r = _threshold_rank(x.dtype, t)
        if r is None or x.size == 0:
            itype = _checks._index_dtype(x.size)
            return self.xp.empty(0, itype), self.xp.empty(0, x.dtype)
        return self._rank_select(self.xp.ascontiguousarray(x), r, None)

    def kth_abs(self, x: Any, k: int) -> Any:
        """The exact k-th largest ``|x_i|`` as a numpy scalar (uint for integer ``x``)."""
        x = _checks._values(x, "x", (1,))
        k = _checks._k(k, x.size)
        rank = self._kth_rank(self.xp.ascontiguousarray(x), k)
        if x.dtype.kind == "f":
            if rank == 0:
                return x.dtype.type(np.nan)
            return np.array(rank - 1, f"u{x.dtype.itemsize}").view(x.dtype)[()]
        return np.dtype(f"u{x.dtype.itemsize}").type(rank - 1)

    def topk_abs(self, x: Any, k: int) -> tuple[Any, Any]:
        """The k entries of largest magnitude, ties to lower indices, indices ascending."""
        x = _checks._values(x, "x", (1,))
        k = _checks._k(k, x.size)
        x = self.xp.ascontiguousarray(x)
        return self._rank_select(x, self._kth_rank(x, k), k)

    # ---------------------------------------------------------------- sparse reductions
    def _runs(self, idx: Any) -> tuple[Any, Any, Any]:
        """Stable sort order of ``idx``, start of each run of equal indices, and run indices."""
        xp = self.xp
        perm = xp.argsort(idx, kind="stable") if xp is np else xp.argsort(idx)
        sidx = idx[perm]
        head = xp.empty(sidx.size, bool)
        head[:1] = True
        xp.not_equal(sidx[1:], sidx[:-1], out=head[1:])
        starts = xp.flatnonzero(head)
        return perm.astype(np.int64, copy=False), starts, sidx[starts]

    def _fold(self, idx: Any, val: Any, op: Any, acc: np.dtype) -> tuple[Any, Any]:
        """Coalesce ``(idx, val)``: ascending unique indices, values left-folded in input order."""
        xp = self.xp
        if idx.size == 0:
            return idx.copy(), val.copy()
        work = xp.ascontiguousarray(val.astype(acc, copy=False))
        perm, starts, uniq = self._runs(idx)
        width = math.prod(val.shape[1:])
        out = xp.empty((starts.size,) + val.shape[1:], acc)
        self.launch("segment.cu", expression("cc_segment_fold", CTYPES[acc], OPS[op]),
                    self.launch.shape(starts.size * width), work, perm, np.int64(idx.size),
                    np.int64(width), starts, np.int64(starts.size), None, out)
        return uniq, out.astype(val.dtype, copy=False)

    def coo_reduce(self, indices: Any, values: Any, op: Any = "sum", n: int | None = None,
                   accumulate_dtype: Any = None) -> tuple[Any, Any]:
        """Coalesce unsorted COO entries into ascending unique indices (left fold per index)."""
        idx, val = _checks._pair(indices, values)
        op = _op(op)
        _checks._checked_range(idx, None if n is None else _checks._length(n))
        return self._fold(idx, val, op, _checks._accumulate(accumulate_dtype, val.dtype))

    def merge_sorted(self, parts: Sequence[tuple[Any, Any]], op: Any = "sum",
                     accumulate_dtype: Any = None, *, checked: bool = True) -> tuple[Any, Any]:
        """Merge coalesced COO parts; duplicates left-folded in part order."""
        pairs = _checks._sorted_parts(parts, checked)
        op = _op(op)
        ref = pairs[0][1]
        acc = _checks._accumulate(accumulate_dtype, ref.dtype)
        itype = np.result_type(*(i.dtype for i, _ in pairs))
        idx = self.xp.concatenate([i.astype(itype, copy=False) for i, _ in pairs])
        val = self.xp.concatenate([v for _, v in pairs])
        return self._fold(idx, val, op, acc)

    # ---------------------------------------------------------------- dense <-> sparse
    def _scatter(self, dense: Any, idx: Any, val: Any, op: Any, increasing: bool) -> None:
        """``dense[idx] op= val`` in place on a C-contiguous ``dense`` (indices validated)."""
        xp = self.xp
        if idx.size == 0:
            return
        width = math.prod(dense.shape[1:])
        val = xp.ascontiguousarray(val)
        types = (CTYPES[dense.dtype], CTYPES[idx.dtype], OPS[op])
        shape = self.launch.shape(idx.size * width)
        args = (dense, xp.ascontiguousarray(idx), val, np.int64(idx.size), np.int64(width))
        if increasing:
            self.launch("scatter.cu", expression("cc_scatter_unique", *types), shape, *args)
        elif dense.dtype.kind == "i":
            self.launch("scatter.cu", expression("cc_scatter_atomic", *types), shape, *args)
        else:
            perm, starts, uniq = self._runs(idx)
            self.launch("segment.cu", expression("cc_segment_fold", types[0], types[2]),
                        self.launch.shape(starts.size * width), val, perm, np.int64(idx.size),
                        np.int64(width), starts, np.int64(starts.size),
                        uniq.astype(np.int64, copy=False), dense)

    def scatter_reduce(self, dense: Any, indices: Any, values: Any, op: Any = "sum", *,
                       checked: bool = True) -> Any:
        """Reduce ``values`` into ``dense[indices]`` in place (left fold in input order).

        Range and order come from one device read (none with ``checked=False``: the caller
        guarantees strictly increasing indices in range)."""
        dense, idx, val = _checks._scatter_operands(dense, indices, values)
        op = _op(op)
        increasing = _checks._checked_range(idx, dense.shape[0]) if checked else True
        if dense.flags.c_contiguous:
            self._scatter(dense, idx, val, op, increasing)
        else:
            work = self.xp.ascontiguousarray(dense)
            self._scatter(work, idx, val, op, increasing)
            dense[...] = work
        return dense

    def gather(self, dense: Any, indices: Any) -> Any:
        """``dense[indices]`` (rows when ``dense`` is 2-D); indices must be in range."""
        xp = self.xp
        dense = _checks._values(dense, "dense")
        idx = _checks._indices(indices)
        _checks._checked_range(idx, dense.shape[0])
        out = xp.empty((idx.size,) + dense.shape[1:], dense.dtype)
        width = math.prod(dense.shape[1:])
        if idx.size:
            self.launch("gather.cu", expression("cc_gather_rows", CTYPES[dense.dtype],
                                                CTYPES[idx.dtype]),
                        self.launch.shape(idx.size * width), xp.ascontiguousarray(dense),
                        xp.ascontiguousarray(idx), np.int64(idx.size), np.int64(width), out)
        return out

    def densify(self, indices: Any, values: Any, n: int) -> Any:
        """Dense array of length ``n`` (rows if values are 2-D): coalesced sums, zeros elsewhere."""
        idx, val = _checks._pair(indices, values)
        n = _checks._length(n)
        increasing = _checks._checked_range(idx, n)
        dense = self.xp.zeros((n,) + val.shape[1:], val.dtype)
        if not increasing:
            idx, val = self._fold(idx, val, parse_op("sum"), val.dtype)
        dense[idx] = val
        return dense


def _op(op: Any) -> Any:
    """Parse and check a reduction op like the numpy twin (avg is the caller's job)."""
    _checks._reduce_op(op)
    return parse_op(op)


_GPU = KernelPrimitives(CupyLauncher())
count_abs_ge = _GPU.count_abs_ge
select_abs_ge = _GPU.select_abs_ge
kth_abs = _GPU.kth_abs
topk_abs = _GPU.topk_abs
coo_reduce = _GPU.coo_reduce
merge_sorted = _GPU.merge_sorted
scatter_reduce = _GPU.scatter_reduce
gather = _GPU.gather
densify = _GPU.densify
