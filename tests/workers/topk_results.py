"""Top-k allreduce results on every rank against independent references (run under mpiexec).

Usage: topk_results.py full|light. Checks, for every algorithm: identical bits on every rank,
ascending unique indices, dtypes; each algorithm's exact semantics against a plain-Python
reference built from the inputs and the documented rules only (dense = exact top-k of the sum;
topka = sum of the local top-k sets; gaussiank = sum of selections obeying the rule: default a
threshold selection of 3k/4..5k/4 entries, reference policy simulated; gtopk = simulated pairwise
tree; oktopk refresh = exact top-k of the sums of the local selections, non-refresh: default a
threshold selection of the union of 0.9k..1.1k entries, reference policy simulated step by step
with ``topk_ref.ReferencePolicy``); recall >= 0.8 of the exact top-k on correlated data; Ok-Topk's
state across steps and its padded allgather.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
from mpi4py import MPI

import topk_ref as ref
from _common import assert_identical_across_ranks

import cupycoll as cc
from cupycoll.topk import Exact, Gaussian, Threshold, TopkState, topk_allreduce
from cupycoll.topk.api import run

WORLD = MPI.COMM_WORLD


def check_shape(res, n: int, dtype: str) -> None:
    idx = np.asarray(res.indices)
    assert idx.dtype == np.int32, idx.dtype
    assert res.values.dtype == np.dtype(dtype), res.values.dtype
    assert res.n == n
    assert np.all(np.diff(idx) > 0), "indices not ascending/unique"
    assert idx.size == 0 or (idx[0] >= 0 and idx[-1] < n)
    assert_identical_across_ranks(res.indices, res.values)


def assert_equal(res, want_i, want_v) -> None:
    np.testing.assert_array_equal(np.asarray(res.indices, np.int64), want_i)
    np.testing.assert_array_equal(np.asarray(res.values, np.float64), want_v)


def exact_reference(xs: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    total = np.sum([x.astype(np.float64) for x in xs], axis=0)
    idx = ref.topk(total, k)
    return idx, total[idx]


def check_case(comm, seed: int, n: int, k: int, dtype: str, zeros: bool = False) -> dict:
    """One input, every algorithm; return the recall of each."""
    p, r = comm.size, comm.rank
    xs = ref.inputs(seed, p, n, dtype, zeros=zeros)
    want_i, want_v = exact_reference(xs, k)
    recalls = {}
    for alg in cc.algorithms("topk"):
        if alg in ("oktopk", "gaussiank", "topka", "gtopk"):
            out = run_outcome(comm, xs[r], k, alg)
            res, sel = out.result, out.selection
        else:
            res = topk_allreduce(xs[r], k, algorithm=alg, comm=comm)
            sel = None
        check_shape(res, n, dtype)
        recalls[alg] = ref.recall(np.asarray(res.indices), want_i)
        if alg == "dense":
            assert_equal(res, want_i, want_v)
        elif alg == "topka":
            assert_equal(res, *ref.union_sum([top_pair(x, k) for x in xs]))
        elif alg == "gtopk":
            assert_equal(res, *ref.gtopk([top_pair(x, k) for x in xs], k))
        elif alg == "gaussiank":  # default policy: each rank's selection obeys the rule
            chosen = WORLD.allgather(np.asarray(sel.indices, np.int64))
            for x, c in zip(xs, chosen):
                assert ref.gaussian_corrected_ok(x, k, c), (seed, c.size, k)
            assert_equal(res, *ref.union_sum([(i, x[i]) for i, x in zip(chosen, xs)]))
            st = TopkState(selector=Gaussian(policy="reference"))
            res = topk_allreduce(xs[r], k, algorithm=alg, comm=comm, state=st)
            chosen = [ref.gaussian_reference(x, k) for x in xs]
            assert_equal(res, *ref.union_sum([(i, x[i]) for i, x in zip(chosen, xs)]))
        elif alg == "oktopk":  # a call without state is a refresh step: exact top-k of the sums
            ui, uv = ref.union_sum([(i, x[i]) for x in xs for i in [ref.quantile_local(x, k)]])
            nz = uv != 0
            assert_equal(res, *ref.top_of(ui[nz], uv[nz], k))
            check_small_call(comm, xs[r], k, res, ref.quantile_local(xs[r], k).size)
    return recalls


def check_small_call(comm, x, k: int, full, local_count: int) -> None:
    """A stateless Ok-Topk call: the same bits as the full algorithm's refresh step; finished by
    the validation allreduce alone (topk/_oktopk_small.py) when every rank's selection fits in
    its slot (int32 index + value, padded per stream), else the full algorithm."""
    words = cc._agreement.slot_words(comm.size)
    need = -(-local_count * 4 // 8) + -(-local_count * x.dtype.itemsize // 8)
    fits = WORLD.allreduce(int(need <= words), op=MPI.MIN)
    comm.stats.reset()
    with warnings.catch_warnings(), np.errstate(all="warn", under="ignore"):  # numpy default:
        # inf - inf stays quiet
        warnings.simplefilter("error")
        res = topk_allreduce(x, k, comm=comm)
    assert res.n == full.n == x.shape[0]
    assert res.indices.dtype == full.indices.dtype and res.values.dtype == full.values.dtype
    np.testing.assert_array_equal(res.indices, full.indices)
    np.testing.assert_array_equal(res.values.view(np.uint8), full.values.view(np.uint8))
    ops = set(comm.stats.by_op)
    assert (ops == {"topk.validate"}) == bool(fits), (ops, fits, local_count, words)


def check_small_bits(comm, seed: int) -> None:
    """Continuous values (a shared component, so every rank selects the same indices and their
    sums depend on the order), -0 and +-inf: a stateless call's bits equal the full algorithm's
    (regions summed in their owners' order), for k that fit and k that do not."""
    shared = np.random.default_rng(seed).standard_normal(600) * 3
    own = np.random.default_rng([seed, comm.rank]).standard_normal(600)
    x = (shared + own).astype(np.float32)
    x[::37] = -0.0
    x[599] = 40 + own[0]  # the last index, selected everywhere
    x[0] = 1e8 if comm.rank == 0 else 20.0  # the first: its float32 sum depends on the order
    x[5] = np.inf if comm.rank % 2 else -np.inf  # inf - inf: a NaN sum, never selected
    x[7] = np.inf
    for k in (1, 3, 20, 40, 150):
        full = run_outcome(comm, x, k, "oktopk").result
        check_small_call(comm, x, k, full, int(run_outcome(comm, x, k, "oktopk")
                                                .selection.count))
    words = cc._agreement.slot_words(comm.size)  # int32 + float32: `count` words when even
    n = max(1000, 2 * (words + 1))
    for count in (words, words + 1) if words % 2 == 0 else ():  # exactly full, one over
        x = np.zeros(n, np.float32)
        x[np.random.default_rng([seed, comm.rank]).choice(n, count, replace=False)] = \
            np.arange(1, count + 1, dtype=np.float32)
        full = run_outcome(comm, x, count, "oktopk").result
        check_small_call(comm, x, count, full, count)


def top_pair(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    idx = ref.topk(x, k)
    return idx, x[idx]


def run_outcome(comm, x, k, alg, state=None):
    from cupycoll.topk.api import validate

    arr, kk = validate(comm, x, k, alg)
    return run(comm, arr, kk, alg, None, state)


def oktopk_sequence(comm, seed: int, n: int, k: int, steps: int, padded: bool | None,
                    policy: str = "quantile") -> list:
    """Run Ok-Topk with a state over drifting inputs; check every step against the documented
    rules applied to the inputs (never the library's thresholds); return the results."""
    p, r = comm.size, comm.rank
    state = TopkState(tau=3, tau_prime=2, padded_allgather=padded,
                      selector=Threshold(policy=policy))
    sims = [ref.ReferencePolicy(k) for _ in range(p)]
    base = ref.inputs(seed, p, n)
    results = []
    for t in range(steps):
        xs = [(x + ref.inputs(seed + 100 + t, p, n, noise=16, base=8)[q]).astype(np.float32)
              for q, x in enumerate(base)]
        bounds_before = None if state.boundaries is None else state.boundaries.copy()
        out = run_outcome(comm, xs[r], k, "oktopk", state)
        res = out.result
        check_shape(res, n, "float32")
        assert state.step == t + 1
        refresh = t % 2 == 0
        assert state.last["refresh"] == refresh, (t, state.last)
        if t % 3 and bounds_before is not None:
            np.testing.assert_array_equal(state.boundaries, bounds_before)
        b = state.boundaries
        assert b[0] == 0 and b[-1] == n and np.all(np.diff(b) >= 0)
        assert_identical_across_ranks(b, np.array([state.global_th]))
        if policy == "reference":
            locals_ = [sim.local(x, refresh) for sim, x in zip(sims, xs)]
        else:
            locals_ = [ref.quantile_local(x, k) for x in xs]
        np.testing.assert_array_equal(np.asarray(out.selection.indices), locals_[r])
        ui, uv = ref.union_sum([(i, x[i]) for i, x in zip(locals_, xs)])
        nz = uv != 0
        if policy == "reference":
            assert_equal(res, *sims[0].result(ui, uv, refresh))
        elif refresh:
            assert_equal(res, *ref.top_of(ui[nz], uv[nz], k))
        else:  # a threshold selection of the union with its exact sums, 0.9k..1.1k entries
            got = np.asarray(res.indices, np.int64)
            assert_equal(res, got, uv[np.searchsorted(ui, got)])
            assert ref.upper_set(ui, uv, got) and 0.9 * k <= got.size <= 1.1 * k, (t, got.size)
        np.testing.assert_array_equal(np.asarray(out.included),
                                      np.intersect1d(locals_[r], np.asarray(res.indices)))
        results.append((np.asarray(res.indices).copy(), np.asarray(res.values).copy()))
    return results


def check_ties(comm) -> None:
    """Gradients of one magnitude (the k-th of every selection tied): Ok-Topk with a state
    returns exactly k entries on every step, the lowest indices of the union with their exact
    sums, whether the ranks' supports coincide or not; local selections are cut to k."""
    p, r, n, k = comm.size, comm.rank, 120 * comm.size, 10
    for disjoint in (False, True):
        xs = [np.zeros(n, np.float32) for _ in range(p)]
        for q, x in enumerate(xs):
            x[q * 120:(q + 1) * 120 if disjoint else n] = (-1.0) ** q
        state = TopkState(tau=3, tau_prime=2)
        for step in range(4):
            out = run_outcome(comm, xs[r], k, "oktopk", state)
            locals_ = [ref.quantile_local(x, k) for x in xs]
            assert locals_[r].size == k
            np.testing.assert_array_equal(np.asarray(out.selection.indices), locals_[r])
            ui, uv = ref.union_sum([(i, x[i]) for i, x in zip(locals_, xs)])
            nz = uv != 0
            assert_equal(out.result, ui[nz][:k], uv[nz][:k])
            assert_identical_across_ranks(np.asarray(out.result.indices))


def main() -> None:
    mode = sys.argv[1]
    comm = cc.init("mpi")
    p = comm.size
    worst: dict[str, float] = {}
    cases = [(1, 1, 1, "float32"), (2, 7, 3, "float64"), (3, 1000, 10, "float32"),
             (4, 4099, 41, "float32"), (5, 257, 257, "float32"), (6, 300, 30, "float16"),
             (7, 64, 5, "float32", True)]
    if mode == "light":
        cases = [cases[0], cases[3], cases[4]]
    for seed, n, k, dtype, *zeros in cases:
        recalls = check_case(comm, seed, n, k, dtype, bool(zeros))
        if n >= 1000:
            for alg, rec in recalls.items():
                worst[alg] = min(worst.get(alg, 1.0), rec)
    for alg, rec in worst.items():
        assert rec >= 0.8, f"{alg}: recall {rec:.3f} < 0.8 on correlated data"
    check_small_bits(comm, 17)
    check_ties(comm)
    # Ok-Topk across steps: refresh every tau'=2, repartition every tau=3; padded == native
    steps = 5 if mode == "light" else 7
    for policy in ("quantile", "reference"):
        native = oktopk_sequence(comm, 11, 3000, 30, steps, False, policy)
        padded = oktopk_sequence(comm, 11, 3000, 30, steps, True, policy)
        for (ai, av), (bi, bv) in zip(native, padded):
            np.testing.assert_array_equal(ai, bi)
            np.testing.assert_array_equal(av, bv)
    # a selector passed by the caller replaces the default and persists in the state
    state = TopkState()
    x = ref.inputs(3, p, 500)[comm.rank]
    topk_allreduce(x, 9, comm=comm, selector=Exact(), state=state)
    assert isinstance(state.selector, Exact)
    topk_allreduce(x, 9, comm=comm, state=state)
    assert isinstance(state.selector, Exact) and state.step == 2 and not state.last["refresh"]
    topk_allreduce(x, 12, comm=comm, state=state)  # a new k forces a refresh step
    assert state.last["refresh"] and state.k == 12
    assert isinstance(TopkState().selector, type(None)) and Threshold().threshold is None
    if comm.rank == 0:
        print("recall", {a: round(v, 3) for a, v in sorted(worst.items())})
        print("OK")


if __name__ == "__main__":
    main()
