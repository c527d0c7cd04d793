"""``topka``: local selection, allgatherv, merge — every rank's selection reaches every rank.

What is selected where: each rank selects locally with its selector (default :class:`Exact`:
its own top-k); the selections are allgathered (indices and values, counts exchanged first) and
merged in rank order (``merge_sorted``), so the result has up to P*k entries and the value at i is
the sum over the ranks that selected i. Nothing is dropped after leaving a rank: ``included`` is
the rank's whole selection.

Cost (per rank): 2k(P-1) words received (k indices + k values from each of P-1 peers, one
packed message per peer), plus the allgather of one count per rank (booked ``<op>.counts``;
compact wire: (count, bytes) pairs, and each selection's index stream encoded over [0, n)). Identical bits on every rank: all ranks merge the same gathered data in
the same (rank) order.
"""

from __future__ import annotations

from typing import Any

from .._result import SparseResult
from ..primitives import merge_sorted
from ..wire._exchange import gather_entries
from ..wire._pack import COO
from ..wire._values import rounding_error
from .._registry import register
from ._common import WordCost, TopkOutcome, TopkState, log2_ceil
from .selectors import Exact

__all__ = ["topka", "cost", "gather_selected"]


def cost(p: int, k: int, n: int) -> WordCost:
    """Words received per rank and latency of ``topka`` (and ``gaussiank``) on p ranks."""
    return WordCost(2.0 * k * (p - 1), float(log2_ceil(p)))


def gather_selected(comm: Any, x: Any, k: int, state: TopkState, op_name: str) -> TopkOutcome:
    """Select locally with ``state.selector``, allgatherv the selections (one packed block per
    peer), merge them by sum. Every rank merges the values as they travelled (rounded when the
    wire rounds them, its own too); a rank's rounding errors are its remainders."""
    n = int(x.shape[0])
    wire = state.wire or COO
    sel = state.selector.select(x, k, refresh=state.refresh)
    parts, _ = gather_entries(comm, sel.indices, sel.values, op_name, wire, 0, n)
    idx, val = merge_sorted(parts)
    state.last = {"refresh": state.refresh, "local_count": sel.count,
                  "global_count": int(idx.shape[0])}
    sent = parts[comm.rank][1]
    remainders = ((sel.indices, rounding_error(sel.values, sent)),) if wire.rounds(sel.values.dtype) else ()
    return TopkOutcome(SparseResult(idx, val, n), sel.indices, sel, remainders)


def topka(comm: Any, x: Any, k: int, state: TopkState) -> TopkOutcome:
    """TopkA: allgather every rank's local top-k and sum them (up to P*k entries)."""
    return gather_selected(comm, x, k, state, "topka.allgather")


ALGORITHM = register("topk", "topka", topka, cost=cost, selector=Exact)
