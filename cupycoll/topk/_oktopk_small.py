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
not fit), so after the checks all ranks agree whether to finish here. The finishing step is
the record ``oktopk_small`` of the top-k registry, flagged ``rides`` (a caller cannot name it;
the front door runs it where every selection came).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from .. import _agreement as agreement
from .._registry import register
from .._result import SparseResult
from ..sparse.small import block_words, blocks, pack
from ._common import TopkOutcome, index_dtype
from .oktopk import proposed_cuts
from .selectors import Selection, Threshold

__all__ = ["SmallRefresh", "oktopk_small", "ALGORITHM"]


class SmallRefresh:
    """One call's small path: :meth:`pack` before the validation allreduce, :meth:`finish`
    after its checks passed; ``slots`` and ``counts`` are then every rank's selection (run
    :func:`oktopk_small` on them), or None (run the algorithm)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.slots: np.ndarray | None = None
        self.counts: list[int] | None = None
        self.threshold: float | None = None

    def pack(self, draft: agreement.Draft, x: Any, k: int) -> None:
        """Select locally (a fresh state's step 0, a refresh step: the default) and write the
        selection into this rank's slot of ``draft`` when it fits."""
        comm, p = self.comm, self.comm.size
        sel = Threshold().select(x, k)
        idx, val, self.threshold = sel.indices, sel.values, sel.threshold
        fits = block_words(sel.count, idx.dtype.itemsize, val.dtype.itemsize) <= \
            agreement.slot_words(p)
        draft.column("count", sel.count + 1 if fits else 0)
        draft.vec = pack(comm, draft.vec, draft.slot(), idx, val, None)

    def finish(self, agreed: agreement.Agreed) -> None:
        """Keep the settled agreement's slots when every rank's selection came."""
        counts = agreed.columns["count"]
        if all(c > 0 for c in counts):
            self.slots, self.counts = agreed.slots, [c - 1 for c in counts]


def oktopk_small(comm: Any, x: Any, k: int, state: Any = None, *, slots: np.ndarray,
                 counts: list[int], threshold: float | None = None) -> TopkOutcome:
    """Ok-Topk's refresh step from every rank's selection, which rode in the validation
    (``slots``; ``counts``: each rank's selected entries; ``threshold``: the one this rank
    selected with): the same result as ``oktopk``'s refresh step, and this rank's selected
    indices in it (``included``: each of them a full contribution of a kept sum)."""
    n, dtype = int(x.shape[0]), np.dtype(x.dtype)
    parts = blocks(slots, counts, index_dtype(n), dtype, 0)
    idx, val = _refresh(parts, n, k, dtype)
    mine, mine_values = parts[comm.rank]
    included = np.intersect1d(mine, idx, assume_unique=True).astype(idx.dtype, copy=False)
    xp = comm.xp
    return TopkOutcome(SparseResult(xp.asarray(idx), xp.asarray(val), n), xp.asarray(included),
                       Selection(xp.asarray(mine.copy()), xp.asarray(mine_values.copy()),
                                 threshold))


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


ALGORITHM = register("topk", "oktopk_small", oktopk_small, rides=True, selector=Threshold)
