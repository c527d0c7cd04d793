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


def test_cost_model_names_what_it_cannot_price():
    """A name a caller cannot run (oktopk's small path rides in the agreement), p or k below 1
    or n below k: the library's error naming the argument, never a builtin one."""
    for args, argument in ((("oktopk_small", 4, 100, 10**4), "algorithm"),
                           (("nope", 4, 1, 1), "algorithm"), (("oktopk", 0, 100, 10**4), "p"),
                           (("topka", 4, 0, 10), "k"), (("gtopk", 4, 20, 10), "n"),
                           (("dense", 2.5, 1, 1), "p")):
        with pytest.raises(InvalidArgument) as info:
            cost_model(*args)
        assert info.value.argument == argument, args
    assert cost_model("oktopk", np.int64(8), 1000, 10**6) == cost_model("oktopk", 8, 1000, 10**6)


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


def test_threshold_reference_refresh_is_exact_then_reused():
    x = heavy(2)
    sel = Threshold(policy="reference")
    first = sel.select(x, 200, refresh=True)
    np.testing.assert_array_equal(first.indices, reference_topk(x, 200))
    assert first.threshold == pytest.approx(np.sort(np.abs(x))[-200])
    again = sel.select(x, 200, refresh=False)  # same data, reused threshold: same selection
    np.testing.assert_array_equal(again.indices, first.indices)
    assert sel.last_count == 200


def test_threshold_reference_count_feedback_and_cap():
    x = heavy(3)
    sel = Threshold(policy="reference")
    sel.select(x, 200, refresh=True)
    th = kth_magnitude(x, 200)  # the documented refresh rule, from the input
    assert sel.threshold == th
    small = sel.select(x * 0.5, 200, refresh=False)  # far too few pass: divide by 1.012
    assert small.count < 200 * 2 / 3 and sel.threshold == pytest.approx(th / 1.012)
    sel.threshold = th
    big = sel.select(x * 3, 200, refresh=False)  # far too many: raised x1.03 at most 5 times
    assert big.threshold == pytest.approx(th * 1.03 ** 5)
    want = np.flatnonzero(np.abs(x * 3) >= big.threshold)
    np.testing.assert_array_equal(big.indices, want)
    assert sel.threshold == pytest.approx(big.threshold * 1.012)


def kth_magnitude(x, k):
    return np.sort(np.abs(x.astype(np.float64)))[-k]


@pytest.mark.parametrize("n, density", [(20000, 0.01), (1 << 18, 0.3), (300, 0.5), (1 << 16, 0.02),
                                        (1 << 20, 0.01), (1 << 20, 0.001), (1 << 20, 0.2)])
def test_threshold_quantile_selects_a_threshold_set_of_0_8k_to_1_1k_every_step(n, density):
    """Below 2^16 entries the threshold is the exact k-th magnitude; above, a sampled one: either
    way every magnitude reaching the threshold is selected and the count is in [0.8k, 1.1k] --
    unless ties at the k-th magnitude exceed 1.1k: then the exact top k, ties to lower indices."""
    rng = np.random.default_rng(n)
    k = max(1, int(density * n))
    sel = Threshold()
    assert sel.policy == "quantile"
    for step, scale in enumerate((1.0, 4.0, 0.25, 9.0)):  # growing/shrinking residuals
        x = (rng.standard_t(3, n) * scale).astype(np.float32)
        got = sel.select(x, k, refresh=step == 0)
        mag = np.abs(x.astype(np.float64))
        want = np.flatnonzero(mag >= got.threshold)
        np.testing.assert_array_equal(got.indices, want)
        np.testing.assert_array_equal(got.values, x[want])
        assert 0.8 * k <= want.size <= 1.1 * k and sel.last_count == want.size
        if n < 1 << 16:
            assert got.threshold == kth_magnitude(x, k)
    heavy_tie = np.repeat(np.float32([1, 2]), [n - k // 2, k // 2])  # k-th value on a tie
    got = sel.select(heavy_tie, k)  # the top k: the twos, then the lowest-index ones
    np.testing.assert_array_equal(got.indices, np.r_[0:k - k // 2, n - k // 2:n])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("n, k, nans, zeros", [(1000, 10, 0, 0), (1000, 10, 5, 900), (50, 45, 10, 0),
                                               (50, 40, 0, 30), (7, 7, 0, 0), (65535, 300, 3, 0)])
def test_threshold_quantile_of_a_short_vector_is_its_exact_kth_magnitude(dtype, n, k, nans, zeros):
    """Short host vectors take one |x| for the k-th magnitude and the pass (abs_ge_kth): NaN
    ranks lowest, zeros never pass, fewer than k numbers (or nonzeros) select every nonzero."""
    rng = np.random.default_rng([n, k, nans])
    x = rng.standard_normal(n).astype(dtype)
    x[rng.choice(n, zeros, replace=False)] = 0
    x[rng.choice(n, nans, replace=False)] = np.nan
    got = Threshold().select(x, k)
    mag = np.abs(x.astype(np.float64))
    numbers = np.sort(mag[~np.isnan(mag)])
    kth = numbers[-k] if k <= numbers.size else 0.0
    want = np.flatnonzero((mag >= kth) & (mag > 0))
    if want.size > 1.1 * k:  # ties at the k-th: cut to |x| >= k-th of the selection: the same
        want = want[mag[want] >= np.sort(mag[want])[-k]]
    np.testing.assert_array_equal(got.indices, want)
    np.testing.assert_array_equal(got.values, x[want])
    assert got.indices.dtype == np.int32 and got.values.dtype == dtype
    assert got.threshold == (kth if kth > 0 else float(np.finfo(dtype).smallest_subnormal))


def test_threshold_quantile_with_fewer_nonzeros_than_k_selects_all_nonzeros():
    x = np.zeros(1 << 17, np.float32)
    x[[5, 70000, 100000]] = [1, -2, 3]
    for policy in ("quantile", "reference"):
        got = Threshold(policy=policy).select(x, 1000)
        np.testing.assert_array_equal(got.indices, [5, 70000, 100000])


def test_threshold_never_selects_zeros():
    x = np.zeros(100, np.float32)
    x[[3, 50]] = [1, -2]
    for policy in ("quantile", "reference"):
        sel = Threshold(policy=policy)
        sel.select(x, 10, refresh=True)
        assert sel.threshold > 0
        np.testing.assert_array_equal(sel.select(x, 10, refresh=False).indices, [3, 50])


def test_policies_are_checked():
    with pytest.raises(InvalidArgument):
        Threshold(policy="fast")
    with pytest.raises(InvalidArgument):
        Gaussian(policy="quantile")


def test_gaussian_reference_lands_near_k_on_normal_data():
    x = np.random.default_rng(4).standard_normal(50000).astype(np.float32)
    g = Gaussian(policy="reference")
    sel = g.select(x, 500)
    assert 0.75 * 500 <= sel.count <= 1.25 * 500
    np.testing.assert_array_equal(sel.indices, np.flatnonzero(np.abs(x) >= sel.threshold))
    assert g.estimate(x, 500) == pytest.approx(2.576, rel=0.05)


@pytest.mark.parametrize("tail", ["normal", "t3", "t1", "scaled"])
@pytest.mark.parametrize("n, density", [(1 << 18, 0.01), (1 << 18, 0.001), (20000, 0.05)])
def test_gaussian_corrected_count_lands_in_range(tail, n, density):
    rng = np.random.default_rng(7)
    x = {"normal": lambda: rng.standard_normal(n), "t3": lambda: rng.standard_t(3, n),
         "t1": lambda: rng.standard_t(1, n),
         "scaled": lambda: rng.standard_normal(n) * np.where(rng.random(n) < 0.02, 50, 1)}[tail]()
    x = x.astype(np.float32)
    k = int(density * n)
    sel = Gaussian().select(x, k)
    assert 0.75 * k <= sel.count <= 1.25 * k, (sel.count, k)
    want = np.flatnonzero(np.abs(x.astype(np.float64)) >= sel.threshold)  # a threshold selection
    np.testing.assert_array_equal(sel.indices, want)
    if tail == "t1" and density == 0.01:  # the reference misses on heavy tails: why we correct
        ref = Gaussian(policy="reference").select(x, k)
        assert not 0.75 * k <= ref.count <= 1.25 * k, (ref.count, k)


def test_gaussian_selector_on_all_zeros_selects_nothing():
    for policy in ("corrected", "reference"):
        assert Gaussian(policy=policy).select(np.zeros(50, np.float32), 5).count == 0


def test_histogram_threshold_count_from_first_principles():
    """One rank: the threshold's count of |v| >= t, counted by numpy, is in [0.9k, 1.1k] and is
    the count returned, wherever the previous threshold was (window hit, below, above)."""
    from mpi4py import MPI

    from cupycoll.topk._global_threshold import histogram_threshold

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    rng = np.random.default_rng(9)
    mags = np.abs(rng.standard_t(2, 50000)).astype(np.float32)
    for k in (1, 50, 700, 20000):
        for center in (float(np.sort(mags)[-k]), 1e-30, 1e30, 3.0):
            t, count = histogram_threshold(comm, mags, k, 50000, center, np.float32)
            assert count == np.count_nonzero(mags.astype(np.float64) >= t)
            assert 0.9 * k <= count <= 1.1 * k or (k == 1 and count == 1), (k, center, count)
    ties = np.repeat(np.float32([1.0, 2.0, 3.0]), [500, 500, 500])  # k-th value on a big tie
    for k in (800, 700):  # no count in range: the tied k-th value, whose count is >= k
        t, count = histogram_threshold(comm, ties, k, 1500, 1.0, np.float32)
        assert count == 1000 and np.count_nonzero(ties >= t) == 1000
    for k in (10, 400):  # all tied: never the edge above, which selects nothing
        t, count = histogram_threshold(comm, np.ones(1000, np.float32), k, 1000, 1.0, np.float32)
        assert count == 1000 and t <= 1.0
    t, count = histogram_threshold(comm, ties[:5], 700, 1500, 1.0, np.float32)  # fewer than k
    assert count == 5 and t > 0


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
    with pytest.raises(InvalidArgument, match="auto"):
        TopkState(tau="often")
    st = TopkState(tau=4, tau_prime=2)
    assert st.refresh and st.repartition(64)
    st.step = 2
    assert st.refresh and not st.repartition(1)  # an int tau ignores the auto period
    st.step = 4
    assert st.repartition(64)
    auto = TopkState()
    assert auto.tau == "auto"
    auto.step = 3
    assert auto.repartition(1) and not auto.repartition(64)


def test_auto_tau_from_region_share_noise():
    """tau="auto": every step when sqrt(2 ln P * P / k) > 5 %, the paper's 64 otherwise."""
    from cupycoll.topk.oktopk import auto_tau

    for p, k in [(1, 10), (2, 100), (4, 1048), (8, 1048), (8, 10_485), (4, 10_485),
                 (4, 167_772), (1024, 1_000_000), (1024, 20_000_000)]:
        noisy = p > 1 and np.sqrt(2 * np.log(p) * p / k) > 0.05
        assert auto_tau(k, p) == (1 if noisy else 64), (p, k)
    assert auto_tau(10_485, 8) == 1 and auto_tau(10_485, 4) == 64


class _SameProposals:
    """What ``region_boundaries`` needs of a communicator of ``size`` ranks that all propose the
    same points: the allreduce (sum) is ``size`` times this rank's proposal."""

    xp = np

    def __init__(self, size):
        self.size = size

    def allreduce(self, send, recv, op, op_name):
        recv[...] = send * self.size

    def fetch(self, work, out):
        return out


def test_region_boundaries_from_the_documented_rule():
    """Proposals ``S[i*c]`` with c = |S| // P (also at c = 1), equal split points ``i*n // P``
    when |S| < P, and [0, n] on one rank -- references from the rule, in Python integers."""
    from cupycoll.topk.oktopk import region_boundaries

    n = 1000
    for p in (2, 3, 4):
        for size in (0, 1, p - 1, p, p + 1, 2 * p - 1, 2 * p, 5 * p + 2):
            sel = np.sort(np.random.default_rng(size).choice(n, size, replace=False))
            c = size // p
            points = [int(sel[i * c]) for i in range(1, p)] if c else [i * n // p
                                                                      for i in range(1, p)]
            got = region_boundaries(_SameProposals(p), sel.astype(np.int32), n)
            assert got.dtype == np.int64 and got.tolist() == [0, *points, n], (p, size)
    big = 2**61 + 1  # equal split points in integers (float64 spacing is 512 there)
    got = region_boundaries(_SameProposals(3), np.arange(2, dtype=np.int64), big)
    assert got.tolist() == [0, big // 3, 2 * big // 3, big]
    one = region_boundaries(_SameProposals(1), np.arange(5, dtype=np.int32), n)
    assert one.dtype == np.int64 and one.tolist() == [0, n]


def test_oktopk_recomputes_missing_or_stale_boundaries():
    """A state without boundaries past step 0, or whose boundaries were made for another n, gets
    fresh ones: the top entries of x (largest magnitudes, found by numpy) are in the result
    wherever they are, also beyond the old n (one rank, so the threshold selection of 0.8k..1.1k
    entries contains at least the top 0.8k)."""
    from mpi4py import MPI

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    rng = np.random.default_rng(4)
    st = TopkState(tau=8, tau_prime=8)
    st.step = 1  # not a repartition step, no boundaries yet
    for n in (100, 300):  # second call: same state, longer x, top entries beyond 100
        x = (rng.standard_normal(n) * 0.01).astype(np.float32)
        x[n - 20:n - 10] = np.arange(10, 20, dtype=np.float32)
        res = cc.topk_allreduce(x, 10, algorithm="oktopk", comm=comm, state=st)
        idx = np.asarray(res.indices, np.int64)
        top = np.argsort(-np.abs(x), kind="stable")[:8]
        assert res.n == n and set(top.tolist()) <= set(idx.tolist()), (n, idx)
        np.testing.assert_array_equal(np.asarray(res.values), x[idx])


def test_oktopk_all_zero_refresh_keeps_a_positive_threshold():
    """An all-zero refresh step: empty result, global threshold = the least positive value of
    x's dtype (never 0 or None: zeros are never selected), so the next step is no refresh."""
    from mpi4py import MPI

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    st = TopkState(tau_prime=8)
    res = cc.topk_allreduce(np.zeros(64, np.float32), 4, algorithm="oktopk", comm=comm, state=st)
    assert res.nnz == 0 and st.last["global_count"] == 0
    assert st.global_th == float(np.nextafter(np.float32(0), np.float32(1)))
    cc.topk_allreduce(np.arange(64, dtype=np.float32), 4, algorithm="oktopk", comm=comm, state=st)
    assert not st.last["refresh"]


@pytest.mark.parametrize("tails, quarters", [("triangular", 3), ("laplace", 5)])
def test_gaussian_reference_accepts_counts_of_exactly_3k_4_and_5k_4(tails, quarters):
    """Both policies: a count of exactly 3k/4 (light tails) or 5k/4 (heavy tails) at the
    normal fit (the reference policy's with the signed mean, the corrected one's with |mean|)
    is in range, so the fit is kept, although an entry lies within 2% of it (one rescaling by
    1.02 would change the selection)."""
    import statistics

    rng = np.random.default_rng(1)
    x = (rng.uniform(-1, 1, 4000) + rng.uniform(-1, 1, 4000) if tails == "triangular"
         else rng.laplace(size=4000)).astype(np.float32)
    mag = np.abs(x.astype(np.float64))
    mean, std = float(np.mean(x.astype(np.float64))), float(np.std(x.astype(np.float64)))
    near = (1 / 1.02, 1) if quarters == 3 else (1, 1.02)
    for policy, centre in (("reference", mean), ("corrected", abs(mean))):  # corrected: x is
        for k in range(8, 400, 4):  # its own sample (n < 2^16)
            th = centre + statistics.NormalDist().inv_cdf(1 - k / x.size / 2) * std
            count = int(np.count_nonzero(mag >= th))
            if 4 * count == quarters * k and \
                    np.any((mag >= th * near[0]) & (mag < th * near[1])):
                break
        else:
            pytest.fail(f"no k with a count of exactly {quarters}k/4 at the {policy} fit")
        sel = Gaussian(policy=policy).select(x, k)
        np.testing.assert_array_equal(sel.indices, np.flatnonzero(mag >= th))


def test_selector_reprs_name_their_class():
    assert repr(Exact()) == "Exact()"
    assert repr(Threshold()).startswith("Threshold(policy='quantile'")
    assert repr(Gaussian()) == "Gaussian(policy='corrected')"


def test_auto_tau_at_k_1_and_between_the_two_and_three_log_rules():
    """k = 1 on two ranks is noisy (sqrt(2 ln 2 * 2) > 5 %); P = 4, k = 5000: sqrt(2 ln 4 * 4 /
    5000) = 4.7 % is below 5 % (a factor 3 instead of 2 would be 5.8 %, above)."""
    from cupycoll.topk.oktopk import auto_tau

    assert auto_tau(1, 2) == 1
    assert auto_tau(5000, 4) == 64 and auto_tau(4000, 4) == 1


def test_gaussian_corrected_keeps_the_sample_fit_when_its_prediction_is_in_range():
    """Corrected policy on normal data, n = 2^18 (sampled): the threshold is the normal fit of
    the sample (mean and std of the sample, z from k/n) when the sample predicts 3k/4..5k/4."""
    import statistics

    from cupycoll.topk.selectors import magnitude_sample

    x = np.random.default_rng(3).standard_normal(1 << 18).astype(np.float32)
    k = 2621
    sample, scale = magnitude_sample(x, k)
    assert scale > 1
    s = np.asarray(sample, np.float64)
    th = abs(s.mean()) + statistics.NormalDist().inv_cdf(1 - k / x.size / 2) * s.std()
    assert 0.75 * k <= np.count_nonzero(np.abs(s) >= th) * scale <= 1.25 * k
    sel = Gaussian().select(x, k)
    assert sel.threshold == pytest.approx(th, rel=1e-9)
    np.testing.assert_array_equal(sel.indices, np.flatnonzero(np.abs(x) >= sel.threshold))


def test_distinct_needs_two_values_of_the_dtype_below_hi():
    """``_distinct(lo, hi)``: [lo, hi) holds at least two values of the dtype; hi itself is
    not in the range (a float32 step and a float64 step between the same numbers)."""
    from cupycoll.topk._global_threshold import _distinct

    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    up1 = float(np.nextafter(np.float32(1), np.float32(2)))
    up2 = float(np.nextafter(np.float32(up1), np.float32(2)))
    assert not _distinct(1.0, up1, f32)  # only 1.0
    assert _distinct(1.0, up2, f32)      # 1.0 and up1
    assert not _distinct(1.0000000001, up2, f32)  # lo rounds up to up1: only up1
    assert _distinct(1.0, up1, f64)      # many float64 values in between



def bounds_by_definition(index_parts, n):
    """Region bounds from the spec: the floor average of every rank's ``selected[i*c]``
    (c = its count // P; ``i*n // P`` when c = 0)."""
    p = len(index_parts)
    proposals = [[int(i[j * (len(i) // p)]) if len(i) // p else j * n // p for j in range(1, p)]
                 for i in index_parts]
    return [0] + [sum(col) // p for col in zip(*proposals)] + [n]


def owner_by_definition(bounds, key):
    return max(j for j in range(len(bounds) - 1) if bounds[j] <= key)


def refresh_by_definition(parts, n, k):
    """Ok-Topk's refresh result written out from the spec: an index of region g is summed from
    +0 over ranks g, g-1, ..., 0, P-1, ..., g+1 in float32; the nonzero sums' top-k by
    magnitude, ties to the lower index."""
    p, bounds = len(parts), bounds_by_definition([i for i, _ in parts], n)
    sums = {}
    for key in sorted({int(i) for idx, _ in parts for i in idx}):
        g, total = owner_by_definition(bounds, key), np.float32(0)
        for step in range(p):
            idx, val = parts[(g - step) % p]
            hit = np.flatnonzero(idx == key)
            if hit.size:
                with np.errstate(invalid="ignore"):  # inf - inf
                    total = np.float32(total + val[hit[0]])
        if total != 0 and not np.isnan(total):
            sums[key] = total
    top = sorted(sorted(sums), key=lambda i: -abs(float(sums[i])))[:k]
    return np.array(sorted(top)), np.array([sums[i] for i in sorted(top)], np.float32)


@pytest.mark.parametrize("p, short", [(2, 0), (3, 0), (3, 5), (4, 0), (4, 7), (5, 0)])
def test_small_refresh_sums_in_the_region_owners_order(p, short):
    """The cuts land on selected indices (every rank selects the same ones, one rank maybe
    ``short`` fewer) and each index holds one 1e8, on rank g + 1 of its owner g, and 19s
    elsewhere: summed in the owner's order the 19s come first (float32: 1e8 + 19 (P - 1)
    rounded up), in any other rank's order 1e8 comes earlier and the sum is less."""
    from cupycoll.topk._oktopk_small import _refresh

    n, keys = 90, np.arange(2, 88, 3, dtype=np.int32)
    index_parts = [keys] * (p - 1) + [keys[:len(keys) - short]]
    bounds = bounds_by_definition(index_parts, n)
    owners = np.array([owner_by_definition(bounds, int(i)) for i in keys])
    assert short or set(bounds[1:-1]) <= set(keys.tolist())  # short: averaged off the keys
    parts = [(i, np.where((owners[:len(i)] + 1) % p == r, 1e8, 19).astype(np.float32))
             for r, i in enumerate(index_parts)]
    for k in (3, 10, len(keys)):
        idx, val = _refresh(parts, n, k, np.dtype(np.float32))
        want_idx, want_val = refresh_by_definition(parts, n, k)
        np.testing.assert_array_equal(idx, want_idx)
        np.testing.assert_array_equal(val.view(np.int32), want_val.view(np.int32))


def test_small_refresh_drops_zero_and_nan_sums_and_breaks_ties_low():
    from cupycoll.topk._oktopk_small import _refresh

    parts = [(np.array([1, 4, 6, 9], np.int32), np.array([2, np.inf, -0.0, 5], np.float32)),
             (np.array([1, 4, 7, 9], np.int32), np.array([-2, -np.inf, 5, -5], np.float32))]
    for k in (1, 2, 3):
        idx, val = _refresh(parts, 12, k, np.dtype(np.float32))
        want_idx, want_val = refresh_by_definition(parts, 12, k)
        np.testing.assert_array_equal(idx, want_idx)
        np.testing.assert_array_equal(val, want_val)
    assert _refresh(parts, 12, 1, np.dtype(np.float32))[0].tolist() == [7]


def test_small_refresh_is_a_record_with_each_ranks_included_entries():
    """``oktopk_small`` is registered like the top-k algorithms but rides in the validation (a
    caller cannot name it); its run function on slots packed as the validation packs them
    gives, on each rank, the refresh result by definition, that rank's selection, and as
    ``included`` the selected indices the result holds (L_r ∩ result, as ``oktopk``)."""
    from types import SimpleNamespace

    from cupycoll import _agreement
    from cupycoll._registry import priced, record
    from cupycoll.sparse.small import pack
    from cupycoll.topk.selectors import Threshold

    found = record("topk", "oktopk_small")
    assert found.rides and "oktopk_small" not in cc.algorithms("topk")
    assert "oktopk_small" not in priced("topk")
    p, n, k = 3, 200, 6
    words = _agreement.slot_words(p)
    vec = np.zeros(p * words, np.int64)
    xs = [np.random.default_rng([5, r]).standard_normal(n).astype(np.float32) for r in range(p)]
    selections = [Threshold().select(x, k) for x in xs]
    for r, sel in enumerate(selections):
        pack(SimpleNamespace(xp=np, size=p), vec, r * words, sel.indices, sel.values, None)
    parts = [(s.indices, s.values) for s in selections]
    want_idx, want_val = refresh_by_definition(parts, n, k)
    kept = [np.isin(sel.indices, want_idx) for sel in selections]
    assert any(m.any() for m in kept) and not all(m.all() for m in kept)  # both kinds occur
    for r, sel in enumerate(selections):
        out = found.run(SimpleNamespace(xp=np, size=p, rank=r), xs[r], k, slots=vec,
                        counts=[s.count for s in selections], threshold=sel.threshold)
        np.testing.assert_array_equal(out.result.indices, want_idx)
        np.testing.assert_array_equal(out.result.values.view(np.int32), want_val.view(np.int32))
        np.testing.assert_array_equal(out.selection.indices, sel.indices)
        np.testing.assert_array_equal(out.selection.values, sel.values)
        assert out.selection.threshold == sel.threshold
        assert out.included.tolist() == sorted(set(sel.indices.tolist()) & set(want_idx.tolist()))
        assert out.remainders == ()
