"""Ok-Topk's refresh step of a small call, finished by the validation allreduce.

A ``topk_allreduce`` call without a state is a refresh step of a fresh :class:`TopkState`, and
its result depends on nothing but every rank's local selection L_r: Ok-Topk sums each selected
index over the ranks that selected it (in its region owner's order g, g-1, ..., from +0: see
``split_and_reduce``), keeps the nonzero sums, and returns their exact top-k (``topk_abs``:
ties to the lower index). When every L_r fits in the entry slots of the validation allreduce
(:mod:`cupycoll._agreement`, as ``sparse_allreduce``'s small calls do), that one collective
allgathers them, and every rank computes the same result locally: the region boundaries from
the gathered selections (the same proposals and floor average as ``region_boundaries``), then
the sums in the owners' order. Same bits as the full algorithm, one collective instead of six.

Which collectives run never depends on local data (the vector's length depends on P only);
each rank writes its count + 1 into its agreement column ``count`` (0 when its selection did
not fit), so after the checks all ranks agree whether to finish here.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from .. import _agreement as agreement
from .._result import SparseResult
from ..sparse.small import block_words, blocks, pack
from ._common import index_dtype
from .oktopk import proposed_cuts
from .selectors import Threshold

__all__ = ["SmallRefresh"]


class SmallRefresh:
    """One call's small path: :meth:`pack` before the validation allreduce, :meth:`finish`
    after its checks passed; ``result`` is then the call's result, or None (run the algorithm).
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.result: SparseResult | None = None

    def pack(self, draft: agreement.Draft, x: Any, k: int) -> None:
        """Select locally (a fresh state's step 0, a refresh step: the default) and write the
        selection into this rank's slot of ``draft`` when it fits."""
        comm, p = self.comm, self.comm.size
        self.n = int(x.shape[0])
        sel = Threshold().select(x, k)
        idx, val = sel.indices, sel.values
        fits = block_words(sel.count, idx.dtype.itemsize, val.dtype.itemsize) <= \
            agreement.slot_words(p)
        draft.column("count", sel.count + 1 if fits else 0)
        draft.vec = pack(comm, draft.vec, draft.slot(), idx, val, None)

    def finish(self, agreed: agreement.Agreed, k: int, dtype: np.dtype) -> None:
        """Compute the result from the settled agreement when every rank's selection came."""
        counts = agreed.columns["count"]
        if not all(c > 0 for c in counts):
            return
        parts = blocks(agreed.slots, [c - 1 for c in counts], index_dtype(self.n), dtype, 0)
        idx, val = _refresh(parts, self.n, k, dtype)
        xp = self.comm.xp
        self.result = SparseResult(xp.asarray(idx), xp.asarray(val), self.n)


def _refresh(parts: list[tuple[np.ndarray, np.ndarray]], n: int, k: int,
             dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Ok-Topk's refresh result from every rank's selection (host): sums in region-owner order,
    nonzero sums, their exact top-k. A few dozen entries: plain Python beats numpy calls here."""
    p = len(parts)
    indices = [idx.tolist() for idx, _ in parts]
    cuts = [sum(c) // p for c in zip(*(proposed_cuts(i, n, p) for i in indices))]
    by_index: dict[int, list] = {}
    for r, (idx, (_, val)) in enumerate(zip(indices, parts)):  # floats hold float16-64 exactly
        for i, v in zip(idx, val.tolist()):
            by_index.setdefault(i, []).append((r, v))
    keys = sorted(by_index)
    sums = [by_index[i][0][1] for i in keys]  # one contribution: +0 + v is v (or +0, dropped)
    shared = [j for j, i in enumerate(keys) if len(by_index[i]) > 1]
    if shared:
        value = dtype.type
        with np.errstate(all="ignore"):
            for j in shared:
                seq = by_index[keys[j]]
                g = bisect_right(cuts, keys[j])  # the owner: ranks g, g-1, ..., 0, P-1, ..., g+1
                mine = bisect_right([r for r, _ in seq], g)
                total = value(0)
                for _, v in seq[:mine][::-1] + seq[mine:][::-1]:
                    total = total + value(v)
                sums[j] = float(total)
    # the nonzero sums (neither 0 nor NaN), then their exact top-k as topk_abs picks it: larger
    # magnitudes first, ties to the lower index (a stable sort of the ascending positions)
    keep = [j for j, s in enumerate(sums) if s != 0 and s == s]
    if len(keep) > k:
        keep = sorted(sorted(keep, key=lambda j: -abs(sums[j]))[:k])
    return (np.array([keys[j] for j in keep], dtype=index_dtype(n)),
            np.array([sums[j] for j in keep], dtype=dtype))
