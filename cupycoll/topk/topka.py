"""``topka``: local selection, allgatherv, merge — every rank's selection reaches every rank.

What is selected where: each rank selects locally with its selector (default :class:`Exact`:
its own top-k); the selections are allgathered (indices and values, counts exchanged first) and
merged in rank order (``merge_sorted``), so the result has up to P*k entries and the value at i is
the sum over the ranks that selected i. Nothing is dropped after leaving a rank: ``included`` is
the rank's whole selection.

Cost (per rank): 2k(P-1) words received (k indices + k values from each of P-1 peers), log2 P
latency with a recursive-doubling allgatherv, plus the allgather of one count per rank
(booked ``<op>.counts``). Identical bits on every rank: all ranks merge the same gathered data in
the same (rank) order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._result import SparseResult
from ..primitives import merge_sorted
from ._common import Cost, TopkOutcome, TopkState, log2_ceil, topk_algorithm
from .selectors import Exact

__all__ = ["topka", "cost", "gather_selected"]


def cost(p: int, k: int, n: int) -> Cost:
    """Words received per rank and latency of ``topka`` (and ``gaussiank``) on p ranks."""
    return Cost(2.0 * k * (p - 1), float(log2_ceil(p)))


def gather_selected(comm: Any, x: Any, k: int, state: TopkState, op_name: str) -> TopkOutcome:
    """Select locally with ``state.selector``, allgatherv the selections, merge them by sum."""
    n = int(x.shape[0])
    sel = state.selector.select(x, k, refresh=state.refresh)
    all_idx, counts = comm.allgatherv(sel.indices, op_name=op_name)
    all_val, _ = comm.allgatherv(sel.values, counts=counts, op_name=op_name)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    parts = [(all_idx[offsets[r]:offsets[r + 1]], all_val[offsets[r]:offsets[r + 1]])
             for r in range(comm.size)]
    idx, val = merge_sorted(parts)
    state.last = {"refresh": state.refresh, "local_count": sel.count,
                  "global_count": int(idx.shape[0])}
    return TopkOutcome(SparseResult(idx, val, n), sel.indices, sel)


@topk_algorithm("topka", selector=Exact, cost=cost)
def topka(comm: Any, x: Any, k: int, state: TopkState) -> TopkOutcome:
    """TopkA: allgather every rank's local top-k and sum them (up to P*k entries)."""
    return gather_selected(comm, x, k, state, "topka.allgather")
