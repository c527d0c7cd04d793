"""Local selectors: which entries of a rank's dense vector it offers to a top-k allreduce.

Three policies (Ok-Topk spec section 2):

- :class:`Exact`: the exact top-k by magnitude (``topk_abs``), every step. Exactly k entries.
- :class:`Threshold`: Ok-Topk's selector. On a refresh step the exact top-k, whose k-th
  magnitude becomes the threshold; in between one O(n) pass ``|x| >= threshold`` with the
  reference code's count feedback: while more than ``cap*k`` entries pass, the threshold is raised
  by ``cap_scale`` (at most ``cap_tries`` times; re-selecting only among the entries already
  selected, so it costs O(count), not O(n)); after selecting, fewer than ``low*k`` divides the
  threshold by ``scale`` and more than ``high*k`` multiplies it, for the next step.
- :class:`Gaussian`: Gaussian-k. The threshold ``|mean| + z*std`` with ``z = Phi^-1(1 - d/2)``,
  ``d = k/n``, is the magnitude above which a normal distribution would leave ``k`` entries;
  then up to ``max_corrections`` rescalings by ``scale`` while the count is outside
  ``[low*k, high*k]``. Real gradients have heavier tails, so the count can stay far from k.

Every selector returns a :class:`Selection` (ascending indices, their values, the threshold) and
keeps the count in ``last_count``. Zeros are never selected by the threshold selectors.
"""

from __future__ import annotations

import abc
import statistics
from typing import Any, NamedTuple

import numpy as np

from .._types import array_namespace
from ..primitives import count_abs_ge, select_abs_ge, topk_abs
from ._common import min_abs, positive_threshold

__all__ = ["Selection", "Selector", "Exact", "Threshold", "Gaussian"]


class Selection(NamedTuple):
    """Selected ``indices`` (ascending), their ``values``, and the magnitude ``threshold`` used
    (None for :class:`Exact`, which selects by rank, not by threshold)."""

    indices: Any
    values: Any
    threshold: float | None

    @property
    def count(self) -> int:
        """Number of selected entries."""
        return int(self.indices.shape[0])


class Selector(abc.ABC):
    """Base of the selectors; ``last_count`` is the count of the most recent selection."""

    name = "selector"

    def __init__(self) -> None:
        self.last_count = 0

    @abc.abstractmethod
    def _select(self, x: Any, k: int, refresh: bool) -> Selection:
        """Select from ``x`` (1-D float array) about ``k`` entries."""

    def select(self, x: Any, k: int, *, refresh: bool = True) -> Selection:
        """Return this rank's selection from ``x``; ``refresh`` asks stateful selectors to
        recompute their threshold exactly (Ok-Topk's ``t % tau' == 0``)."""
        sel = self._select(x, k, refresh)
        self.last_count = sel.count
        return sel

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Exact(Selector):
    """The exact top-k by magnitude; ties go to the lower index. Cost: one ``topk_abs``."""

    name = "exact"

    def _select(self, x: Any, k: int, refresh: bool) -> Selection:
        idx, val = topk_abs(x, k)
        return Selection(idx, val, None)


class Threshold(Selector):
    """Ok-Topk's threshold selector: exact on refresh steps, reused with count feedback between.

    Args:
        low, high, scale: after each selection, fewer than ``low*k`` entries divides the
            threshold by ``scale``, more than ``high*k`` multiplies it (reference VGG values).
        cap, cap_scale, cap_tries: before accepting a selection of more than ``cap*k`` entries,
            multiply the threshold by ``cap_scale``, up to ``cap_tries`` times.
    Attributes:
        threshold: the current magnitude threshold (None until the first refresh).
    """

    name = "threshold"

    def __init__(self, *, low: float = 2 / 3, high: float = 5 / 4, scale: float = 1.012,
                 cap: float = 4 / 3, cap_scale: float = 1.03, cap_tries: int = 5) -> None:
        super().__init__()
        self.low, self.high, self.scale = low, high, scale
        self.cap, self.cap_scale, self.cap_tries = cap, cap_scale, cap_tries
        self.threshold: float | None = None
        self._k: int | None = None

    def _select(self, x: Any, k: int, refresh: bool) -> Selection:
        if refresh or self.threshold is None or self._k != k:
            idx, val = topk_abs(x, k)
            th = positive_threshold(min_abs(val), x.dtype)
            self._k = k
        else:
            th = self.threshold
            idx, val = select_abs_ge(x, th)
            tries = 0
            while idx.shape[0] > self.cap * k and tries < self.cap_tries:
                th *= self.cap_scale
                tries += 1
                pos, val = select_abs_ge(val, th)
                idx = idx[pos]
        count = int(idx.shape[0])
        self.threshold = th
        if count < self.low * k:
            self.threshold = positive_threshold(th / self.scale, x.dtype)
        elif count > self.high * k:
            self.threshold = th * self.scale
        return Selection(idx, val, th)

    def __repr__(self) -> str:
        return f"Threshold(threshold={self.threshold})"


class Gaussian(Selector):
    """Gaussian-k: threshold from a normal fit of ``x``, with bounded count corrections.

    Args:
        low, high: acceptable count range ``[low*k, high*k]``.
        scale: each correction multiplies or divides the threshold by this.
        max_corrections: at most this many corrections (each one O(n) count pass).
    """

    name = "gaussian"

    def __init__(self, *, low: float = 3 / 4, high: float = 5 / 4, scale: float = 1.02,
                 max_corrections: int = 20) -> None:
        super().__init__()
        self.low, self.high, self.scale, self.max_corrections = low, high, scale, max_corrections

    def estimate(self, x: Any, k: int) -> float:
        """Return the Gaussian estimate ``|mean| + z*std`` of the k-th magnitude of ``x``."""
        xp = array_namespace(x)
        density = k / x.shape[0]
        z = statistics.NormalDist().inv_cdf(1 - density / 2) if density < 1 else 0.0
        mean = float(xp.mean(x, dtype=np.float64))
        std = float(xp.std(x, dtype=np.float64))
        return abs(mean) + z * std

    def _select(self, x: Any, k: int, refresh: bool) -> Selection:
        th = positive_threshold(self.estimate(x, k), x.dtype)
        count = count_abs_ge(x, th)
        for _ in range(self.max_corrections):
            if count < self.low * k:
                th = positive_threshold(th / self.scale, x.dtype)
            elif count > self.high * k:
                th *= self.scale
            else:
                break
            count = count_abs_ge(x, th)
        idx, val = select_abs_ge(x, th)
        return Selection(idx, val, th)
