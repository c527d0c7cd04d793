"""Top-k allreduce family (Ok-Topk, TopkA, gTopk, Gaussian-k, dense), selectors, compressor.

``topk_allreduce(x, k, algorithm=...)`` returns on every rank the identical approximate top-k
(by magnitude) of the sum over ranks of ``x``; ``TopkCompressor`` wraps it with Ok-Topk SGD's
residuals. Importing this package registers the algorithms (``cupycoll.algorithms("topk")``).
"""

from __future__ import annotations

import numbers

from ..errors import InvalidArgument
from . import dense, gaussiank, gtopk, oktopk, topka  # noqa: F401  (register the algorithms)
from . import _oktopk_small  # noqa: F401  (the record of refresh steps finished in the validation)
from ._common import WordCost, TopkOutcome, TopkState
from .api import topk_allreduce
from .compressor import TopkCompressor
from .selectors import Exact, Gaussian, Selection, Selector, Threshold

__all__ = ["topk_allreduce", "TopkCompressor", "TopkState", "TopkOutcome", "WordCost",
           "Selector", "Selection", "Exact", "Threshold", "Gaussian", "cost_model"]


def cost_model(algorithm: str, p: int, k: int, n: int) -> WordCost:
    """Return the per-rank cost model (words received, latency) of ``algorithm`` on p ranks,
    for ``0 < k <= n``."""
    from .._registry import algorithms, record

    if algorithm not in algorithms("topk"):
        raise InvalidArgument("algorithm", algorithm, f"valid: {algorithms('topk')}")
    for name, value, least in (("p", p, 1), ("k", k, 1), ("n", n, k)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
            raise InvalidArgument(name, value, f"must be an int >= {least}")
    return record("topk", algorithm).cost(int(p), int(k), int(n))
