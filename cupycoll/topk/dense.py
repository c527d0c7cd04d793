"""``dense``: dense allreduce of x, then the exact top-k of the sum — the reference the others approximate.

What is selected where: nothing is selected locally (the selector is ignored); every rank
allreduces its whole vector (sum), then takes ``top_numbers`` of the sum, so the result is exactly
the top-k of the sum over ranks (ties to the lower index; a NaN sum is never selected, so fewer
than k entries where the sum holds fewer than k numbers). Every rank contributed its full value
at every result index, so ``included`` = the result's indices on every rank.

Cost (per rank): 2n(P-1)/P words received (bandwidth-optimal allreduce), 2 log2 P latency.
Identical bits on every rank: the allreduce gives every rank the same sum and ``top_numbers`` is
deterministic.
"""

from __future__ import annotations

from typing import Any

from .._result import SparseResult
from .._types import ReduceOp
from .._registry import register
from ._common import WordCost, TopkOutcome, TopkState, log2_ceil
from .selectors import Exact, Selection, top_numbers

__all__ = ["dense", "cost"]


def cost(p: int, k: int, n: int) -> WordCost:
    """Words received per rank and latency of ``dense`` on p ranks."""
    return WordCost(2.0 * n * (p - 1) / p, 2.0 * log2_ceil(p))


def dense(comm: Any, x: Any, k: int, state: TopkState) -> TopkOutcome:
    """Allreduce ``x`` densely, then return the exact top-k of the sum (values = sums)."""
    total = comm.xp.empty_like(x)
    comm.allreduce(x, total, ReduceOp.SUM, op_name="dense.allreduce").wait()
    idx, val = top_numbers(total, k)
    state.last = {"refresh": True, "local_count": int(x.shape[0]),
                  "global_count": int(idx.shape[0])}
    return TopkOutcome(SparseResult(idx, val, int(x.shape[0])), idx, Selection(idx, val, None))


ALGORITHM = register("topk", "dense", dense, cost=cost, selector=Exact)
