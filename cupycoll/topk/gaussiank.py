"""``gaussiank``: Gaussian-threshold local selection, then allgatherv and merge (as ``topka``).

What is selected where: each rank selects with its selector (default :class:`Gaussian`: the
threshold ``|mean| + z*std`` of its own vector with up to 20 count corrections, so its count is
about k but not exactly); the selections are allgathered and merged by sum in rank order, so the
result has up to about P*k entries. Nothing is dropped after leaving a rank: ``included`` is the
rank's whole selection.

Cost (per rank): 2c(P-1) words received for c selected entries per rank (about 2k(P-1)), log2 P
latency, plus the count allgather; the selection costs 3 + (corrections) O(n) passes instead of a
top-k. Identical bits on every rank, as ``topka``.
"""

from __future__ import annotations

from typing import Any

from ._common import TopkOutcome, TopkState, topk_algorithm
from .selectors import Gaussian
from .topka import cost, gather_selected

__all__ = ["gaussiank"]


@topk_algorithm("gaussiank", selector=Gaussian, cost=cost)
def gaussiank(comm: Any, x: Any, k: int, state: TopkState) -> TopkOutcome:
    """Gaussian-k: allgather every rank's Gaussian-threshold selection and sum them."""
    return gather_selected(comm, x, k, state, "gaussiank.allgather")
