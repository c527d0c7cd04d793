"""In-process top-k tests (also the mutation run's selection, tests/mutation/run.py): inputs built so
that one documented branch of a selector decides the outcome, outcome worked from the rule."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from cupycoll.topk.selectors import Gaussian, magnitude_sample

N, K = 1 << 18, 2621  # sampled: the corrected policy predicts its count from a sample


def _sampled_positions() -> tuple[np.ndarray, float]:
    """The positions magnitude_sample reads for (N, K), and its scale (set-up, not the oracle)."""
    where, scale = magnitude_sample(np.arange(N, dtype=np.float64), K)
    assert 1 < scale < 0.75 * K / 4
    return np.asarray(where, np.int64), scale


def _plus_minus_one(where: np.ndarray, spread: bool = False) -> np.ndarray:
    """x = +-1 on the sampled positions (``spread``: +-u, u distinct in [0.5, 1.5]), alternating
    signs, 0 elsewhere: mean about 0, std about 1 on the sample."""
    x = np.zeros(N, np.float32)
    u = np.linspace(0.5, 1.5, where.size) if spread else np.ones(where.size)
    x[where] = np.where(np.arange(where.size) % 2 == 0, u, -u)
    return x


def test_gaussian_prediction_below_3k_4_is_not_the_fit():
    """Corrected policy: the sample holds one entry of 10 (prediction = scale < 3k/4, the fit
    missed) and k - 1 entries of 10 lie outside it. The fit (about 2.6 for a std near 1) is
    therefore not used: the sample's quantile passes every sampled entry (all reach 1), far more
    than 5k/4, so the exact top k is taken -- the k entries of 10, threshold 10."""
    where, _ = _sampled_positions()
    x = _plus_minus_one(where)
    x[where[0]] = 10.0
    outside = np.setdiff1d(np.arange(N), where)[: K - 1]
    x[outside] = -10.0
    sel = Gaussian().select(x, K)
    assert sel.threshold == 10.0
    np.testing.assert_array_equal(np.sort(sel.indices), np.sort(np.r_[where[0], outside]))


def test_gaussian_keeps_3k_4_when_the_fit_selects_fewer():
    """Corrected policy: the sample predicts about k at the fit (j sampled entries of 10, j *
    scale near k) but x has no other large entries, so the fit selects only j < 3k/4: the
    selector falls back to the sample's quantile and keeps at least 3k/4 entries (its contract:
    a count in [3k/4, 5k/4] whenever x has that many nonzeros)."""
    where, scale = _sampled_positions()
    x = _plus_minus_one(where, spread=True)  # no ties: a top-k cut can reach 5k/4
    j = int(round(K / scale))
    x[where[1: 2 * j: 2]] = 10.0  # j entries, on positive slots (mean stays near 0)
    sel = Gaussian().select(x, K)
    assert 0.75 * K <= sel.count <= 1.25 * K, (sel.count, j)
    big = np.abs(x[np.asarray(sel.indices)])
    assert np.all(big >= sel.threshold)
    assert np.count_nonzero(np.abs(x) >= sel.threshold) == sel.count


@pytest.mark.parametrize("case", ["overshoot", "normal", "negative mean", "heavy tail"])
def test_gaussian_reference_policy_corrects_in_one_direction(case, monkeypatch):
    """``Gaussian(policy="reference")`` selects what the reference code does: a first count
    below 3k//4 is raised until it reaches it, even past 5k//4 (no swinging back), and the
    mean enters the threshold with its sign."""
    rng = np.random.default_rng(3)
    n, k = 10000, 100
    x = rng.standard_normal(n)
    if case == "overshoot":  # few pass the fit; one division by 1.02 lets over 5k/4 through
        x[:60] = 10.0
        for _ in range(20):  # 100 entries just below the fit's threshold, which they move
            x[60:160] = (x.mean() + 2.5758293035489 * x.std()) / 1.01
    elif case == "negative mean":
        x -= 0.5
    elif case == "heavy tail":
        x = rng.standard_t(2, n)
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "workers"))
    for name in ("_common", "topk_ref"):  # the workers' (a benchmark's _common may be loaded)
        monkeypatch.delitem(sys.modules, name, raising=False)
    from topk_ref import gaussian_reference

    got = Gaussian(policy="reference").select(x, k)
    want = gaussian_reference(x, k)
    assert np.asarray(got.indices).tolist() == want.tolist(), (case, got.indices.size, want.size)
    if case == "overshoot":
        fit = x.mean() + 2.5758293035489 * x.std()
        assert (np.abs(x) >= fit).sum() < 75 and want.size > 125, want.size


def test_index_dtype_is_int64_from_2_to_the_31():
    from cupycoll.topk._common import index_dtype

    assert index_dtype(2**31 - 1) == np.dtype(np.int32)
    assert index_dtype(2**31) == np.dtype(np.int64) == index_dtype(2**40)


def test_state_names_tau_in_its_error():
    import pytest

    from cupycoll.errors import InvalidType
    from cupycoll.topk import TopkState

    with pytest.raises(InvalidType, match="argument 'tau' "):
        TopkState(tau=1.5)


def test_state_last_records_the_wire():
    """After a call, ``state.last["wire"]`` names the wire the call used (coo by default)."""
    from mpi4py import MPI

    import cupycoll as cc
    from cupycoll.topk import TopkState

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    st = TopkState()
    cc.topk_allreduce(np.arange(64, dtype=np.float32), 4, algorithm="gtopk", comm=comm, state=st)
    assert st.last["wire"] == "coo"


def test_oktopk_threshold_search_stops_on_float32_ties(monkeypatch):
    """Ok-Topk's histogram search on a step whose sums are all equal (no edge count near k):
    it refines the bin of the k-th magnitude until the bin holds no two float32 values, which a
    window of 2 octaves in 32 bins, each round 32 times finer, reaches by round 5 (2^-24 octave
    is below float32's spacing) -- before MAX_ROUNDS (8), which a float64 search would use."""
    from mpi4py import MPI

    import cupycoll as cc
    from cupycoll.topk import TopkState
    from cupycoll.topk import _global_threshold as gt

    rounds = []
    counts = gt._counts_at_edges
    monkeypatch.setattr(gt, "_counts_at_edges", lambda *a: rounds.append(1) or counts(*a))
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    st = TopkState(tau=8, tau_prime=8)
    x = np.full(64, 1.5, np.float32)
    cc.topk_allreduce(x, 4, algorithm="oktopk", comm=comm, state=st)  # step 0: refresh
    rounds.clear()
    cc.topk_allreduce(x, 4, algorithm="oktopk", comm=comm, state=st)
    assert not st.last["refresh"] and 1 <= len(rounds) <= 5 < gt.MAX_ROUNDS, len(rounds)


def test_topk_front_door_names_each_bad_argument():
    """topk_allreduce on one rank: each bad argument raises our type naming it (and the rule)."""
    import pytest

    import cupycoll as cc
    from cupycoll.errors import InvalidArgument, InvalidType
    x = np.arange(1, 11, dtype=np.float32)
    with pytest.raises(InvalidType, match="an int") as info:
        cc.topk_allreduce(x, 2.5)
    assert info.value.argument == "k" and "rank 0" in str(info.value)
    with pytest.raises(InvalidType) as info:
        cc.topk_allreduce(x, 3, selector="exact")
    assert info.value.argument == "selector"
    for bad in ("bogus", 3, "BFLOAT16 "):
        with pytest.raises(InvalidArgument) as info:
            cc.topk_allreduce(x, 3, wire_values=bad)
        assert info.value.argument == "wire_values", (bad, info.value.argument)


def test_topk_rounded_wire_leaves_its_remainders_in_the_state():
    """wire_values with a state: ``state.last["remainders"]`` holds (indices, values) pairs of
    this rank's rounding errors on entries of the result (none on one rank: nothing travels)."""
    import cupycoll as cc
    from cupycoll.topk import TopkState
    x = (np.arange(1, 101, dtype=np.float32) * np.float32(1.0001)).astype(np.float32)
    state = TopkState()
    res = cc.topk_allreduce(x, 5, state=state, wire_values="bfloat16")
    pairs = state.last["remainders"]
    assert len(pairs) >= 1
    for idx, val in pairs:
        assert set(np.asarray(idx).tolist()) <= set(np.asarray(res.indices).tolist())
        assert not np.asarray(val).any()
    assert np.array_equal(np.asarray(res.values), x[np.asarray(res.indices)])


def test_state_rejects_a_non_selector_naming_the_selectors():
    import pytest

    from cupycoll.errors import InvalidType
    from cupycoll.topk import TopkState
    with pytest.raises(InvalidType, match=r"selector \(Exact, Threshold, Gaussian\)") as info:
        TopkState(selector="exact")
    assert info.value.argument == "selector"


def test_compressor_books_its_xi_measurement_under_its_name():
    """measure_xi: the allreduce of the gradient sum is booked as ``compressor.xi``."""
    import cupycoll as cc
    comm = cc.get_comm()
    comm.stats.reset()
    comp = cc.TopkCompressor(64, 0.1, comm=comm, warmup_steps=0, measure_xi=True)
    comp.step(np.linspace(-1, 1, 64).astype(np.float32))
    assert len(comp.xi) == 1 and "compressor.xi" in comm.stats.by_op
    assert not _BARE_VERBS & set(comm.stats.by_op), sorted(comm.stats.by_op)


def test_compressor_warmup_and_xi_follow_their_definitions():
    """One rank, exact top-k (``dense``): a warm-up step returns every index (int32 below
    2**31) with the gradient as its average and leaves no residual; later steps record xi =
    ||top-k(acc) - result|| / ||grad||, which is 0 for an exact top-k of acc even where the
    gradient's own top-k differs (a residual carried over), and 0 for a zero gradient."""
    import cupycoll as cc
    comm = cc.get_comm()
    comp = cc.TopkCompressor(6, 2 / 6, algorithm="dense", comm=comm, warmup_steps=1,
                             measure_xi=True)
    first = np.array([1.0, -2.0, 3.0, 0.5, 0.0, 4.0], np.float32)
    upd = comp.step(first)
    assert upd.indices.dtype == np.int32 and upd.indices.tolist() == list(range(6))
    assert upd.values.tolist() == first.tolist() and not comp.residual.any() and comp.xi == []
    upd = comp.step(np.array([3.0, 0.0, 0.0, 2.5, 0.0, 0.0], np.float32))  # both sent
    assert upd.indices.tolist() == [0, 3] and comp.xi == [0.0]
    comp.residual = np.array([0.0, 0.0, 0.0, 0.0, 5.0, 0.0], np.float32)
    upd = comp.step(np.array([0.0, 1.0, 2.0, 0.0, 0.0, 0.0], np.float32))
    assert upd.indices.tolist() == [2, 4] and upd.values.tolist() == [2.0, 5.0]
    assert comp.xi == [0.0, 0.0]  # the gradient's own top-2 is {1, 2}: not what xi measures
    comp.step(np.zeros(6, np.float32))
    assert comp.xi == [0.0, 0.0, 0.0]


_BARE_VERBS = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "exchange",
               "alltoallv", "allgatherv"}


def test_every_booking_of_the_library_names_its_phase():
    """Every top-k algorithm and sparse algorithm (one rank, in-process) books its traffic under
    its own operation names, never under a bare verb name (an op name dropped on the way) other
    than its own name."""
    import cupycoll as cc
    comm = cc.get_comm()
    x = np.linspace(-1, 1, 300).astype(np.float32)
    for algorithm in cc.algorithms("topk"):
        comm.stats.reset()
        cc.topk_allreduce(x, 7, algorithm=algorithm, comm=comm)
        assert not _BARE_VERBS & set(comm.stats.by_op), (algorithm, sorted(comm.stats.by_op))
    idx, val = np.array([1, 5, 9], np.int64), np.array([1.0, -0.0, 2.0], np.float32)
    for algorithm in cc.algorithms("sparse"):
        comm.stats.reset()
        cc.sparse_allreduce(idx, val, 16, algorithm=algorithm, comm=comm)
        bare = (_BARE_VERBS - {algorithm}) & set(comm.stats.by_op)  # "allgather" is one's name
        assert not bare, (algorithm, sorted(comm.stats.by_op))
    comm.stats.reset()  # the compressor's warm-up steps: a dense allreduce under its name
    comp = cc.TopkCompressor(300, 0.05, comm=comm, warmup_steps=2)
    for _ in range(3):
        comp.step(x)
    assert "compressor.warmup" in comm.stats.by_op, sorted(comm.stats.by_op)
    assert not _BARE_VERBS & set(comm.stats.by_op), sorted(comm.stats.by_op)


@pytest.mark.parametrize("argument,args", [
    ("n", (0, 0.5)), ("n", (-3, 0.5)), ("n", (2.5, 0.5)), ("n", ("8", 0.5)), ("n", (True, 0.5)),
    ("density", (8, 0.0)), ("density", (8, 1.0000001)), ("density", (8, 1.5)),
    ("density", (8, -0.1)), ("density", (8, float("nan"))), ("density", (8, True)),
    ("density", (8, "0.1")), ("warmup_steps", (8, 0.5, -1))])
def test_compressor_names_each_bad_argument(argument, args):
    """TopkCompressor's own checks: n an int >= 1, density a number in (0, 1] (1 itself is
    valid), warmup_steps an int >= 0; the error names the argument."""
    import cupycoll as cc
    from cupycoll.errors import CupycollError
    kwargs = {"warmup_steps": args[2]} if len(args) > 2 else {}
    with pytest.raises(CupycollError) as info:
        cc.TopkCompressor(args[0], args[1], **kwargs)
    assert info.value.argument == argument, info.value
    assert cc.TopkCompressor(8, 1).k == 8 and cc.TopkCompressor(8, 1e-9).k == 1


def test_compressor_k_is_the_floor_of_density_times_n_up_to_rounding():
    """k = floor(density * n), where a product a few ulps below an integer counts as it: 0.29 *
    100 is 29 (float arithmetic: 28.999999999999996), 2 / 6 * 6 is 2, 0.2899 * 100 is 28."""
    import cupycoll as cc
    for n in (100, 1000, 12345, 6, 2**20):
        for d in (0.29, 0.57, 0.58, 0.07, 0.1, 1 / 3, 2 / 6, 0.2899, np.float64(0.29)):
            exact = d * n
            near = round(exact)
            want = near if abs(exact - near) <= 1e-12 * exact else int(exact)
            assert cc.TopkCompressor(n, d).k == max(1, want), (n, d)
    assert cc.TopkCompressor(100, 0.29).k == 29 and cc.TopkCompressor(100, 0.58).k == 58
    assert cc.TopkCompressor(100, 0.2899).k == 28


def test_reference_threshold_recomputes_exactly_when_k_changes():
    """Reference policy: a call with another k recomputes the threshold exactly (the top k by
    magnitude), refresh or not; with the same k it reuses the previous threshold."""
    from cupycoll.topk import Threshold
    x = np.arange(1, 101, dtype=np.float32)  # magnitudes 1..100, all distinct
    sel = Threshold(policy="reference")
    first = sel.select(x, 5, refresh=True)
    assert sorted(np.asarray(first.indices).tolist()) == list(range(95, 100))
    again = sel.select(x, 20, refresh=False)  # k changed: exact top 20
    assert sorted(np.asarray(again.indices).tolist()) == list(range(80, 100))


def _priced(beta: float, code: float):
    from cupycoll.tuner import Profile

    return Profile("wire", 0.0, beta, 0.0, 0.0, {"code": code})


def test_topk_wire_choice_follows_the_documented_rule():
    """``choose_wire(request, values, p, k, n, profile)``: coo when asked or on one rank,
    compact when asked (P > 1), and ``auto`` compact exactly when the index bytes saved on k
    entries (4-byte indices below n = 2**31, else 8; coded size from the wire model) priced at
    beta beat two codings of k indices priced at gamma["code"]. Checked at gamma just below
    and just above each break-even point, with the values' rounding kept as asked."""
    from cupycoll.topk._wire import choose_wire
    from cupycoll.wire._model import expected_index_nbytes

    beta = 1e-9
    cheap, dear = _priced(beta, 0.0), _priced(0.0, 1.0)  # compact always / never pays
    for values in (None, "bfloat16", "float16"):
        for p in (1, 2, 5):
            for req, profile in (("coo", cheap), ("auto", dear), ("compact", cheap),
                                 ("auto", cheap), ("compact", dear)):
                w = choose_wire(req, values, p, 100, 10_000, profile)
                want = p > 1 and (req == "compact" or (req == "auto" and profile is cheap))
                assert w.compact is want and w.values == values, (req, p, values)
        for k, n in ((1000, 100_000), (100, 10_000), (1000, 2**31 - 1), (1000, 2**31),
                     (3, 2**40)):
            index_bytes = 4 if n < 2**31 else 8
            saved = k * index_bytes - expected_index_nbytes(k, n, index_bytes)
            edge = saved * beta / (2 * k)  # gamma at which compact just stops paying
            assert edge > 0, (k, n)
            for gamma, compact in ((edge * (1 - 1e-6), True), (edge * (1 + 1e-6), False)):
                w = choose_wire("auto", values, 4, k, n, _priced(beta, gamma))
                assert w.compact is compact and w.values == values, (k, n, gamma)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_an_inf_kth_magnitude_selects_the_infs_alone_on_host_and_device(dtype):
    """k infinities and one entry at the dtype's largest finite value: the host's exact path
    and the device's (a DeviceArray: the sampled path CuPy takes) both select the infs alone
    and keep the largest finite value as the threshold (the device selected the finite one too,
    the host kept inf)."""
    from cupycoll.testing.sync_counting import xp as device
    from cupycoll.topk import Threshold

    x = np.zeros(1000, dtype)
    x[:10], x[500], x[600:700] = np.inf, np.finfo(dtype).max, 1
    for a in (x, device.asarray(x)):
        got = Threshold().select(a, 10)
        assert np.asarray(got.indices).tolist() == list(range(10)), type(a)
        assert got.threshold == float(np.finfo(dtype).max), type(a)
    x[:100] = np.inf  # more infs than the count kept: cut to the top k, the threshold finite
    for a in (x, device.asarray(x)):
        got = Threshold().select(a, 10)
        assert got.count == 10 and got.threshold == float(np.finfo(dtype).max), type(a)
