"""``gaussiank``: Gaussian-threshold local selection, then allgatherv and merge (as ``topka``).

What is selected where: each rank selects with its selector (default :class:`Gaussian`,
corrected policy: the threshold ``|mean| + z*std`` fitted on a sample of its own vector,
corrected in the same step to the sampled k-th magnitude when the count would leave
``[3k/4, 5k/4]``; ``Gaussian(policy="reference")``: the whole vector's fit with up to 20
rescalings, whose count can stay far from k on heavy tails); the selections are allgathered and
merged by sum in rank order, so the result has up to about P*k entries. Nothing is dropped
after leaving a rank: ``included`` is the rank's whole selection.

Cost (per rank): 2c(P-1) words received for c selected entries per rank (about 2k(P-1)), log2 P
latency, plus the count allgather; the selection costs about one O(n) pass (reference policy:
3 + corrections passes) instead of a top-k. Identical bits on every rank, as ``topka``.
"""

from __future__ import annotations

from typing import Any

from .._registry import register
from ._common import TopkOutcome, TopkState
from .selectors import Gaussian
from .topka import cost, gather_selected

__all__ = ["gaussiank"]


def gaussiank(comm: Any, x: Any, k: int, state: TopkState) -> TopkOutcome:
    """Gaussian-k: allgather every rank's Gaussian-threshold selection and sum them."""
    return gather_selected(comm, x, k, state, "gaussiank.allgather")


ALGORITHM = register("topk", "gaussiank", gaussiank, cost=cost, selector=Gaussian)
