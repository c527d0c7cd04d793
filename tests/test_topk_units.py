"""Single-process tests of the top-k selectors, state, registry and cost models."""

from __future__ import annotations

import numpy as np
import pytest

import cupycoll as cc
from cupycoll.errors import InvalidArgument, InvalidType
from cupycoll.topk import Exact, Gaussian, Threshold, TopkState, cost_model
from cupycoll.topk._oktopk_phases import block_sizes


def reference_topk(x, k):
    order = np.lexsort((np.arange(x.size), -np.abs(x.astype(np.float64))))
    return np.sort(order[:k])


def heavy(seed, n=20000):
    return np.random.default_rng(seed).standard_t(3, n).astype(np.float32)


def test_algorithms_are_registered():
    assert cc.algorithms("topk") == ["dense", "gaussiank", "gtopk", "oktopk", "topka"]


@pytest.mark.parametrize("p, lower, ok, gather, gtopk, msgs", [
    (8, 1.75, 5.25, 14, 12, 22), (16, 1.875, 5.625, 30, 16, 40), (256, 1.992, 5.977, 510, 32, 528)])
def test_cost_models_match_the_spec_table(p, lower, ok, gather, gtopk, msgs):
    k, n = 1000, 10**6
    assert cost_model("oktopk", p, k, n).words / k == pytest.approx(ok, abs=1e-3)
    assert cost_model("oktopk", p, k, n).words / 3 / k == pytest.approx(lower, abs=1e-3)
    assert cost_model("oktopk", p, k, n).latency == msgs
    assert cost_model("topka", p, k, n).words / k == gather
    assert cost_model("gaussiank", p, k, n).words / k == gather
    assert cost_model("gtopk", p, k, n).words / k == gtopk
    assert cost_model("dense", p, k, n).words == pytest.approx(2 * n * (p - 1) / p)


def test_exact_selector_is_the_exact_topk_with_ties_to_lower_index():
    x = np.array([3, -5, 5, 0, 1, -3, 5], np.float32)
    sel = Exact().select(x, 3)
    np.testing.assert_array_equal(sel.indices, [1, 2, 6])
    np.testing.assert_array_equal(sel.values, [-5, 5, 5])
    x = heavy(1)
    np.testing.assert_array_equal(Exact().select(x, 200).indices, reference_topk(x, 200))


def test_threshold_refresh_is_exact_then_reused():
    x = heavy(2)
    sel = Threshold()
    first = sel.select(x, 200, refresh=True)
    np.testing.assert_array_equal(first.indices, reference_topk(x, 200))
    assert first.threshold == pytest.approx(np.sort(np.abs(x))[-200])
    again = sel.select(x, 200, refresh=False)  # same data, reused threshold: same selection
    np.testing.assert_array_equal(again.indices, first.indices)
    assert sel.last_count == 200


def test_threshold_count_feedback_and_cap():
    x = heavy(3)
    sel = Threshold()
    sel.select(x, 200, refresh=True)
    th = sel.threshold
    small = sel.select(x * 0.5, 200, refresh=False)  # far too few pass: divide by 1.012
    assert small.count < 200 * 2 / 3 and sel.threshold == pytest.approx(th / 1.012)
    sel.threshold = th
    big = sel.select(x * 3, 200, refresh=False)  # far too many: raised x1.03 at most 5 times
    assert big.threshold == pytest.approx(th * 1.03 ** 5)
    want = np.flatnonzero(np.abs(x * 3) >= big.threshold)
    np.testing.assert_array_equal(big.indices, want)
    assert sel.threshold == pytest.approx(big.threshold * 1.012)


def test_threshold_never_selects_zeros():
    x = np.zeros(100, np.float32)
    x[[3, 50]] = [1, -2]
    sel = Threshold()
    sel.select(x, 10, refresh=True)
    assert sel.threshold > 0
    np.testing.assert_array_equal(sel.select(x, 10, refresh=False).indices, [3, 50])


def test_gaussian_selector_lands_near_k_on_normal_data():
    x = np.random.default_rng(4).standard_normal(50000).astype(np.float32)
    g = Gaussian()
    sel = g.select(x, 500)
    assert 0.75 * 500 <= sel.count <= 1.25 * 500
    np.testing.assert_array_equal(sel.indices, np.flatnonzero(np.abs(x) >= sel.threshold))
    assert g.estimate(x, 500) == pytest.approx(2.576, rel=0.05)


def test_gaussian_selector_on_all_zeros_selects_nothing():
    assert Gaussian().select(np.zeros(50, np.float32), 5).count == 0


def test_block_sizes_differ_by_at_most_one():
    for total in (0, 1, 7, 64, 65):
        for p in (1, 3, 4, 8):
            b = block_sizes(total, p)
            assert b.sum() == total and b.max() - b.min() <= 1 and np.all(np.diff(b) <= 0)


def test_state_validation():
    with pytest.raises(InvalidArgument):
        TopkState(tau_prime=0)
    with pytest.raises(InvalidType):
        TopkState(tau=1.5)
    with pytest.raises(InvalidType):
        TopkState(selector="exact")
    st = TopkState(tau=4, tau_prime=2)
    assert st.refresh and st.repartition
    st.step = 2
    assert st.refresh and not st.repartition
