"""Local selectors: which entries of a rank's dense vector it offers to a top-k allreduce.

Three selectors (Ok-Topk spec section 2), two of them with two policies:

- :class:`Exact`: the exact top-k by magnitude (:func:`top_numbers`), every step: k entries, or
  every number of x where it holds fewer than k (a NaN is never selected).
- :class:`Threshold` (Ok-Topk's selector):
  ``policy="quantile"`` (default): every step, a threshold read from a fixed pseudo-random
  sample of ``x`` (about 256 sampled entries above the k-th magnitude, at most 2^15 entries and
  1/64 of x), set so that at least 0.8k entries pass (3 standard deviations sure), then one
  ``|x| >= t`` pass: about k entries. Counts outside ``[0.8k, 1.1k]`` (LOCAL_RANGE) are
  corrected in the same step: too many are cut to the exact top-k of the selection (one partition of the selection,
  O(count)), too few select again below a lower sampled threshold. So the count stays in range
  whatever the residuals did since the last step, for about one pass over x (vectors shorter
  than 2^16: the exact k-th magnitude, then the pass). ``policy="reference"``: the reference
  code's heuristic -- exact top-k on refresh steps, in between the last threshold reused with
  count feedback: while more than ``cap*k`` pass, raise it by ``cap_scale`` (at most
  ``cap_tries`` times, re-selecting among the selected entries), then for the next step divide
  by ``scale`` below ``low*k`` and multiply above ``high*k``. Under error feedback that lets
  several times k entries through (issue 11); it is kept so the comparison stays reproducible.
- :class:`Gaussian` (Gaussian-k): the threshold ``|mean| + z*std``, ``z = Phi^-1(1 - d/2)``,
  ``d = k/n``, above which a normal distribution would leave k entries.
  ``policy="corrected"`` (default): mean, std and the predicted count come from the same sample;
  when the predicted count is outside ``[low*k, high*k]``, or the pass selects fewer than
  ``low*k``, the threshold is corrected to the quantile policy's sampled one; a count above
  ``high*k`` is cut to the exact top-k of the selection (O(count)). So the count lands in range
  on every step, for about one pass over x. ``policy="reference"``: the reference code's
  rule -- the threshold ``mean + z*std`` (signed mean) of the whole vector; a count below
  ``floor(low*k)`` divides it by ``scale`` while the count stays below, a count above
  ``floor(high*k)`` multiplies it while the count stays above, at most ``max_corrections``
  times (one O(n) count each; a correction that jumps past the other bound is kept) -- real
  gradients have heavier tails, so the count can stay far from k.

Every selector returns a :class:`Selection` (ascending indices, their values, the threshold) and
keeps the count in ``last_count``. Zeros are never selected by the threshold selectors, NaN by
none; a k of every entry selects every nonzero number, whatever the selector.
"""

from __future__ import annotations

import abc
import math
import numbers
import statistics
from typing import Any, NamedTuple

import numpy as np

from .._types import array_namespace
from ..errors import InvalidArgument, InvalidType
from ..primitives import count_abs_ge, kth_abs, select_abs_ge, topk_abs
from ..primitives._common import smallest_positive
from ..primitives._numpy_select import abs_ge_kth

__all__ = ["Selection", "Selector", "Exact", "Threshold", "Gaussian", "magnitude_sample",
           "reference_threshold", "min_abs", "smallest_positive", "positive_threshold",
           "top_numbers"]

#: sample size of the sampled quantile: about SAMPLE_HITS sampled entries lie above the k-th
#: magnitude (the sampled count's relative error is about 1/sqrt of it); the sample is at least
#: SAMPLE_MIN, at most SAMPLE_MAX and at most 1/64 of x (a random gather touches a cache line
#: per entry); vectors shorter than 64 * SAMPLE_MIN are used whole.
SAMPLE_HITS = 256
SAMPLE_MIN = 1 << 10
SAMPLE_MAX = 1 << 15
#: the quantile policy's accepted local count, as fractions of k (outside: corrected in the step;
#: the upper end is near 1 because the split-and-reduce volume grows with the local count).
LOCAL_RANGE = (0.8, 1.1)
_POSITIONS: dict = {}


def min_abs(values: Any) -> float:
    """Smallest magnitude of a non-empty array, as a host float."""
    return float(array_namespace(values).abs(values).min())


def top_numbers(x: Any, k: int) -> tuple[Any, Any]:
    """``topk_abs`` without NaN: the ``min(k, numbers in x)`` entries of largest magnitude.

    ``topk_abs`` ranks NaN lowest but fills its k slots with NaN where x holds fewer than k
    numbers; a top-k allreduce never selects a NaN (it stays in its rank's residual).
    """
    idx, val = topk_abs(x, k)
    xp = array_namespace(val)
    nan = xp.isnan(val)
    if bool(nan.any()):
        keep = xp.flatnonzero(~nan)
        idx, val = idx[keep], val[keep]
    return idx, val


def positive_threshold(th: float, dtype: Any) -> float:
    """Return ``th``, or the least positive value when ``th`` is 0 or NaN (never select zeros),
    or the largest finite value when ``th`` is above it (an inf k-th magnitude: a threshold
    kept for the next step stays finite, so it can be scaled and binned)."""
    if not th > 0:  # NaN too
        return smallest_positive(dtype)
    return min(th, float(np.finfo(dtype).max))


class Selection(NamedTuple):
    """Selected ``indices`` (ascending), their ``values``, and the magnitude ``threshold`` used
    (None for :class:`Exact`, which selects by rank, not by threshold)."""

    indices: Any
    values: Any
    threshold: float | None

    @property
    def count(self) -> int:  # the number of selected entries
        return int(self.indices.shape[0])


def magnitude_sample(x: Any, k: int) -> tuple[Any, float]:
    """Return (``x`` at fixed pseudo-random positions, n / sample size); all of x when small.

    The positions depend only on (n, sample size), so every call -- and every rank -- samples the
    same entries; they are ascending, so the gather reads x in order.
    """
    xp, n = array_namespace(x), int(x.shape[0])
    m = min(max(SAMPLE_MIN, -(-SAMPLE_HITS * n // k)), SAMPLE_MAX, n // 64)
    if m < SAMPLE_MIN:
        return x, 1.0
    key = (xp.__name__, getattr(getattr(x, "device", None), "id", None), n, m)  # (a GPU's own)
    positions = _POSITIONS.get(key)
    if positions is None:
        where = np.sort(np.random.default_rng(0x0C70).integers(0, n, m))
        positions = xp.asarray(where)
        if len(_POSITIONS) > 16:
            _POSITIONS.clear()
        _POSITIONS[key] = positions
    return x[positions], n / m


def _below_kth(sample: Any, scale: float, k: int, low: float) -> float:
    """A magnitude that at least ``low*k`` entries of x reach, 3 standard deviations sure, from
    ``magnitude_sample``.

    Whole vector (scale 1): the exact k-th magnitude. Sample, h = k / scale sampled entries
    expected above the k-th: the sample's r-th largest magnitude, r the least >= h with
    ``r/h * (1 - 3/sqrt(r)) >= low``: r = h when h >= 225 (about k entries pass, +-1/sqrt(h)),
    a little above h for small samples.
    """
    size = int(sample.shape[0])
    h = k / scale
    r = k if scale == 1.0 else max(1, math.ceil(h))
    while scale != 1.0 and r / h * (1 - 3 / math.sqrt(r)) < low and r <= size:
        r += 1 + r // 16
    return float(kth_abs(sample, r)) if r <= size else 0.0


def _exact_top(idx: Any, val: Any, k: int) -> tuple[Any, Any, float]:
    """Cut a selection of more than k entries (no NaN, ascending indices) to its exact top k,
    ties at the k-th magnitude to the lower indices (as :class:`Exact`): a flat gradient has
    every entry tied, and keeping them all would send them all. One partition, a cumulative
    sum and a mask over the selection, O(count)."""
    xp = array_namespace(val)
    mag = xp.abs(val)
    kth = xp.partition(mag, mag.shape[0] - k)[mag.shape[0] - k]  # stays on the device
    above, tied = mag > kth, mag == kth
    keep = xp.flatnonzero(above | (tied & (xp.cumsum(tied) <= k - xp.count_nonzero(above))))
    return idx[keep], val[keep], positive_threshold(float(kth), val.dtype)  # (inf: finite)


def _quantile_select(x: Any, k: int, low: float,
                     sampled: tuple[Any, float] | None = None) -> tuple[Any, Any, float]:
    """Select ``|x| >= t``, t the sampled magnitude that ``low*k`` entries reach (``sampled``:
    the ``magnitude_sample`` of x, when already taken). When fewer than ``low*k`` pass (a 3-sigma
    miss), select again below a sampled magnitude 1.5k entries reach, then all nonzeros (when x
    has fewer nonzeros than that)."""
    sample, scale = sampled or magnitude_sample(x, k)
    floor = smallest_positive(x.dtype)
    if scale == 1.0 and type(x) is np.ndarray:  # x whole on the host: the first try passes
        idx, val, th = abs_ge_kth(x, k, floor)
        return idx, val, positive_threshold(th, x.dtype)
    for target in (low, 1.5, 0.0):
        kth = _below_kth(sample, scale, k, target) if target else floor
        th = positive_threshold(kth, x.dtype)  # (an inf k-th selects the infs alone, as the
        idx, val = select_abs_ge(x, kth if kth == math.inf else th)  # host's exact path does)
        if idx.shape[0] >= low * k or th <= floor:
            break
    return idx, val, th


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
        if k >= x.shape[0] and self.name != "exact":  # every number: nothing to estimate
            idx, val = select_abs_ge(x, positive_threshold(0.0, x.dtype))
            least = min_abs(val) if val.shape[0] else 0.0  # (the k-th magnitude, as an exact
            sel = Selection(idx, val, positive_threshold(least, x.dtype))  # selection's)
        else:
            sel = self._select(x, k, refresh)
        self.last_count = sel.count
        return sel

    def check(self, rank: int | None = None) -> None:
        """Raise ``InvalidArgument``/``InvalidType`` naming a setting this selector cannot
        select with (given to it or changed since; ``rank`` in the message): a call checks its
        selector with its other arguments, so every rank raises."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _check_settings(selector: Selector, policies: tuple[str, ...], counts: tuple[str, ...],
                    rank: int | None) -> None:
    """The policy one of ``policies``, ``counts`` whole numbers >= 0, every other setting of
    ``selector.__init__`` a finite real > 0 (``low`` >= 0), ``high`` >= ``low``; the errors name
    ``selector`` (the agreement's name for it) and say which setting."""
    if selector.policy not in policies:
        raise InvalidArgument("selector", selector.policy,
                              f"its policy must be one of {policies}", rank=rank)
    for name in ("low", "high", "scale", "cap", "cap_scale") + counts:
        if not hasattr(selector, name):
            continue
        value, whole = getattr(selector, name), name in counts
        if isinstance(value, (bool, np.bool_)) or not isinstance(
                value, numbers.Integral if whole else numbers.Real):
            raise InvalidType("selector", f"{name}={type(value).__name__}", f"a selector whose "
                              f"{name} is {'an int' if whole else 'a real number'}", rank=rank)
        zero_ok = whole or name == "low"
        if not (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
            raise InvalidArgument("selector", value, f"its {name} must be finite and "
                                  f"{'>= 0' if zero_ok else '> 0'}", rank=rank)
    if selector.high < selector.low:
        raise InvalidArgument("selector", selector.high,
                              f"its high must be >= its low = {selector.low}", rank=rank)


class Exact(Selector):
    """The exact top-k by magnitude; ties go to the lower index; NaN never (fewer than k
    entries where x holds fewer than k numbers). Cost: one ``topk_abs``."""

    name = "exact"

    def _select(self, x: Any, k: int, refresh: bool) -> Selection:
        idx, val = top_numbers(x, k)
        return Selection(idx, val, None)


class Threshold(Selector):
    """Ok-Topk's threshold selector (module docstring): ``policy="quantile"`` (default) or
    ``"reference"``. With Ok-Topk the policy also picks the global threshold's rule
    (:mod:`cupycoll.topk.oktopk`).

    Args:
        policy: "quantile" or "reference".
        low, high, scale: reference policy: after each selection, fewer than ``low*k`` entries
            divides the threshold by ``scale``, more than ``high*k`` multiplies it (VGG values).
        cap, cap_scale, cap_tries: reference policy: before accepting a selection of more than
            ``cap*k`` entries, multiply the threshold by ``cap_scale``, up to ``cap_tries`` times.
    Attributes:
        threshold: the threshold of the last selection (reference policy: for the next one).
    """

    name = "threshold"

    def __init__(self, *, policy: str = "quantile", low: float = 2 / 3, high: float = 5 / 4,
                 scale: float = 1.012, cap: float = 4 / 3, cap_scale: float = 1.03,
                 cap_tries: int = 5) -> None:
        super().__init__()
        self.policy = policy
        self.low, self.high, self.scale = low, high, scale
        self.cap, self.cap_scale, self.cap_tries = cap, cap_scale, cap_tries
        self.threshold: float | None = None
        self._k: int | None = None
        self.check()

    def check(self, rank: int | None = None) -> None:
        _check_settings(self, ("quantile", "reference"), ("cap_tries",), rank)

    def _select(self, x: Any, k: int, refresh: bool) -> Selection:
        if self.policy == "quantile":
            idx, val, th = _quantile_select(x, k, LOCAL_RANGE[0])
            if idx.shape[0] > LOCAL_RANGE[1] * k:
                idx, val, th = _exact_top(idx, val, k)
            self.threshold = th
            return Selection(idx, val, th)
        return self._reference(x, k, refresh)

    def _reference(self, x: Any, k: int, refresh: bool) -> Selection:
        if refresh or self.threshold is None or self._k != k:
            idx, val = top_numbers(x, k)
            least = min_abs(val) if val.shape[0] else 0.0  # x all NaN: nothing selected
            th = positive_threshold(least, x.dtype)
            if least == 0:  # fewer than k nonzeros: never select zeros
                pos, val = select_abs_ge(val, th)
                idx = idx[pos]
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
        if count < self.low * k:
            th_next = th / self.scale
        else:
            th_next = th * self.scale if count > self.high * k else th
        self.threshold = positive_threshold(th_next, x.dtype)
        return Selection(idx, val, th)

    def __repr__(self) -> str:
        return f"Threshold(policy={self.policy!r}, threshold={self.threshold})"


def reference_threshold(selector: Any) -> bool:
    """Whether ``selector`` is ``Threshold(policy="reference")``: with Ok-Topk the global
    threshold then follows the reference code's count feedback instead of an allreduced
    histogram (another sequence of collectives, so every rank must pick alike)."""
    return isinstance(selector, Threshold) and selector.policy == "reference"


class Gaussian(Selector):
    """Gaussian-k: threshold from a normal fit, count kept in ``[low*k, high*k]`` (module
    docstring): ``policy="corrected"`` (default) or ``"reference"``.

    Args:
        policy: "corrected" or "reference".
        low, high: acceptable count range ``[low*k, high*k]``.
        scale, max_corrections: reference policy: at most ``max_corrections`` rescalings of the
            threshold by ``scale`` (each one O(n) count pass).
    """

    name = "gaussian"

    def __init__(self, *, policy: str = "corrected", low: float = 3 / 4, high: float = 5 / 4,
                 scale: float = 1.02, max_corrections: int = 20) -> None:
        super().__init__()
        self.policy = policy
        self.low, self.high, self.scale, self.max_corrections = low, high, scale, max_corrections
        self.check()

    def check(self, rank: int | None = None) -> None:
        _check_settings(self, ("corrected", "reference"), ("max_corrections",), rank)

    def estimate(self, x: Any, k: int) -> float:
        """Return the Gaussian estimate ``|mean| + z*std`` of the k-th magnitude of ``x``."""
        return _normal_fit(x, k / x.shape[0])

    def _select(self, x: Any, k: int, refresh: bool) -> Selection:
        if self.policy == "reference":
            return self._reference(x, k)
        sample, scale = magnitude_sample(x, k)
        th = positive_threshold(_normal_fit(sample, k / x.shape[0]), x.dtype)
        predicted = count_abs_ge(sample, th) * scale
        if self.low * k <= predicted <= self.high * k:
            idx, val = select_abs_ge(x, th)
        if not self.low * k <= predicted <= self.high * k or idx.shape[0] < self.low * k:
            idx, val, th = _quantile_select(x, k, self.low, (sample, scale))  # the fit missed
        if idx.shape[0] > self.high * k:
            idx, val, th = _exact_top(idx, val, k)
        return Selection(idx, val, th)

    def _reference(self, x: Any, k: int) -> Selection:
        fit = _normal_fit(x, k / x.shape[0], signed=True)
        if not math.isfinite(fit):  # a NaN or an infinity in x: the k-th magnitude of its numbers
            top = top_numbers(x, k)[1]
            fit = min_abs(top) if top.shape[0] else 0.0
        th = positive_threshold(fit, x.dtype)
        low, high = math.floor(self.low * k), math.floor(self.high * k)
        count = count_abs_ge(x, th)
        factor = 1 / self.scale if count < low else self.scale if count > high else None
        for _ in range(self.max_corrections if factor is not None else 0):
            th = positive_threshold(th * factor, x.dtype)
            count = count_abs_ge(x, th)
            if (count >= low) if factor < 1 else (count <= high):
                break  # one direction only, as the reference code corrects
        return Selection(*select_abs_ge(x, th), th)

    def __repr__(self) -> str:
        return f"Gaussian(policy={self.policy!r})"


def _normal_fit(x: Any, density: float, signed: bool = False) -> float:
    """``|mean| + Phi^-1(1 - density/2) * std`` of x: where a normal fit leaves the top density
    (``signed``: the mean as it is, the reference code's)."""
    xp = array_namespace(x)
    z = statistics.NormalDist().inv_cdf(1 - density / 2) if density < 1 else 0.0
    with np.errstate(all="ignore"):  # an infinity or NaN gives a NaN fit, not a raise here
        mean = float(xp.mean(x, dtype=np.float64))  # on one rank mid-collective
        std = float(xp.std(x, dtype=np.float64))
    return (mean if signed else abs(mean)) + z * std
