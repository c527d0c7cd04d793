"""Ok-Topk's density under error feedback: the compressor workload against the documented rules.

Workload (issue 11): ``TopkCompressor`` over many steps, gradient = a heavy-tailed component
shared by every rank (fixed, or drifting each step) + per-rank noise, multiples of 1/8 so every
sum is exact. Every rank rebuilds every rank's gradient and accumulator from the seeds and the
previous residuals, and checks each step against a reference built from the inputs and the
documented rules only (never from the library's thresholds or selections):

- default policy: rank r's local selection is a threshold selection of acc_r (every magnitude
  reaching its smallest one) of 0.8k..1.1k entries -- below 2^16 entries exactly the magnitudes
  reaching the k-th one; the result is an upper set (by |sum|) of the union of the local
  selections, with the exact sums as values; on refresh steps exactly the top-k of the union;
  otherwise 0.9k <= nnz <= 1.1k;
- ``Threshold(policy="reference")``: the reference code's heuristics simulated step by step
  (:class:`topk_ref.ReferencePolicy`), results equal bit for bit;
- the new residual is acc with exactly (local selection ∩ result) zeroed, so mass is conserved:
  sum of new residuals + P * update == sum of accumulators (checked too);
- words received per rank in the three data phases on non-refresh steps <= 2.2 x 2k(P-1)/P
  (default policy; cases with k >= 64 P, where region sizes are not dominated by noise);
- Gaussian-k (default corrected policy) and TopkA with ``Threshold()``: every rank's selection
  is a threshold selection of 3k/4..5k/4 (0.8k..1.1k) entries on every step.

The local selection is read back from the selector (every rank allgathers it) and held to the
rule on the inputs before it is used as the reference's local selection.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import topk_ref as ref
from _common import rng_for

import cupycoll as cc
from cupycoll.topk import Threshold, TopkCompressor

WORLD = MPI.COMM_WORLD
PHASES = ("oktopk.reduce", "oktopk.balance", "oktopk.allgather")


def gradients(seed: int, p: int, n: int, t: int, drift: bool) -> list[np.ndarray]:
    """Every rank's gradient at step t: shared t(3) component (+ a fresh t(3) part when drifting)
    + per-rank normal noise, rounded to multiples of 1/8."""
    shared = rng_for(seed, 10_000).standard_t(3, n) * 64
    if drift:
        shared = shared + rng_for(seed, 10_001, t).standard_t(3, n) * 12
    return [(np.round((shared + rng_for(seed, q, t).standard_normal(n) * 32) * 8) / 8)
            .astype(np.float32) for q in range(p)]


def recording(selector):
    """Make ``selector.select`` keep its last selection's indices in ``selector.chosen``."""
    inner = selector.select

    def select(*args, **kwargs):
        out = inner(*args, **kwargs)
        selector.chosen = np.asarray(out.indices, np.int64)
        return out

    selector.select = select
    return selector


def threshold_selection(a: np.ndarray, chosen: np.ndarray) -> bool:
    """True when ``chosen`` is every entry of ``a`` above its smallest magnitude and, of those
    at it, the lowest indices (ties at the k-th magnitude are cut to k)."""
    return chosen.size > 0 and ref.upper_set(np.arange(a.size), a, chosen)


def data_words(comm) -> float:
    mine = sum(comm.stats.by_op[o].bytes_received for o in PHASES if o in comm.stats.by_op)
    return WORLD.allreduce(mine, op=MPI.MAX) / 4


def run_case(comm, seed: int, n: int, density: float, drift: bool, policy: str, steps: int,
             tau: int | str, tau_prime: int) -> dict:
    p, r = comm.size, comm.rank
    selector = recording(Threshold(policy=policy))
    comp = TopkCompressor(n, density, algorithm="oktopk", comm=comm, tau=tau,
                          tau_prime=tau_prime, selector=selector)
    k = comp.k
    sims = [ref.ReferencePolicy(k) for _ in range(p)]
    residuals = [np.zeros(n, np.float32) for _ in range(p)]
    worst = {"nnz": [1.0, 1.0], "local": [1.0, 1.0], "words": 0.0}
    for t in range(steps):
        refresh = t % tau_prime == 0
        grads = gradients(seed, p, n, t, drift)
        accs = [res + g for res, g in zip(residuals, grads)]
        comm.stats.reset()
        upd = comp.step(grads[r])
        words = data_words(comm)
        if policy == "reference":
            locals_ = [sim.local(a, refresh) for sim, a in zip(sims, accs)]
        else:
            locals_ = WORLD.allgather(selector.chosen)
            for a, sel in zip(accs, locals_):
                assert threshold_selection(a, sel), f"step {t}: not a threshold selection"
                assert 0.8 * k <= sel.size <= 1.1 * k, (t, sel.size, k)
                if n < 1 << 16:
                    np.testing.assert_array_equal(sel, ref.quantile_local(a, k))
        ui, uv = ref.union_sum([(i, a[i]) for i, a in zip(locals_, accs)])
        res_i = np.asarray(upd.indices, np.int64)
        res_sum = np.asarray(upd.values, np.float64) * p
        if policy == "reference":
            want_i, want_v = sims[0].result(ui, uv, refresh)
            np.testing.assert_array_equal(res_i, want_i, err_msg=f"step {t}: result indices")
            np.testing.assert_allclose(res_sum, want_v, rtol=1e-6, err_msg=f"step {t}")
        else:
            np.testing.assert_allclose(res_sum, uv[np.searchsorted(ui, res_i)], rtol=1e-6)
            assert np.isin(res_i, ui).all(), f"step {t}"
            if refresh:  # the exact top-k of the union (ties to the lower index)
                nz = uv != 0
                np.testing.assert_array_equal(res_i, ref.top_of(ui[nz], uv[nz], k)[0])
            else:
                assert ref.upper_set(ui, uv, res_i), f"step {t}: not a threshold selection"
                assert 0.9 * k <= res_i.size <= 1.1 * k, (t, res_i.size, k)
                assert words <= 2.2 * 2 * k * (p - 1) / p or k < 64 * p, (t, words, k)
        if not refresh:
            worst["nnz"] = [min(worst["nnz"][0], res_i.size / k),
                            max(worst["nnz"][1], res_i.size / k)]
            sizes = [sel.size / k for sel in locals_]
            worst["local"] = [min(worst["local"][0], *sizes), max(worst["local"][1], *sizes)]
            if p > 1:
                worst["words"] = max(worst["words"], words / (2 * k * (p - 1) / p))
        for q in range(p):  # the residual keeps everything but (local selection ∩ result)
            residuals[q] = accs[q].copy()
            residuals[q][np.intersect1d(locals_[q], res_i)] = 0
        np.testing.assert_array_equal(comp.residual, residuals[r], err_msg=f"step {t}: residual")
        total = np.sum([a.astype(np.float64) for a in accs], axis=0)
        after = np.sum([x.astype(np.float64) for x in residuals], axis=0)
        np.testing.assert_allclose(after + p * upd.to_dense().astype(np.float64), total,
                                   rtol=0, atol=1e-5 * max(1.0, float(np.abs(total).max())))
    return worst


def gather_case(comm, seed: int, n: int, density: float, algorithm: str, selector,
                span: tuple[float, float], steps: int) -> None:
    """Gaussian-k / TopkA with a threshold selector under error feedback: every rank's selection
    (read back from the residual: the accumulator's nonzeros that were zeroed) is a threshold
    selection of ``span``*k entries, and the result is the sum of the selections."""
    p, r = comm.size, comm.rank
    comp = TopkCompressor(n, density, algorithm=algorithm, comm=comm, selector=selector)
    k = comp.k
    residuals = [np.zeros(n, np.float32) for _ in range(p)]
    for t in range(steps):
        grads = gradients(seed, p, n, t, True)
        accs = [res + g for res, g in zip(residuals, grads)]
        upd = comp.step(grads[r])
        everyone = WORLD.allgather(np.asarray(comp.residual))
        chosen = [np.flatnonzero((a != 0) & (res == 0)) for a, res in zip(accs, everyone)]
        for a, c in zip(accs, chosen):
            assert threshold_selection(a, c), (algorithm, t)
            assert span[0] * k <= c.size <= span[1] * k, (algorithm, t, c.size, k)
        ui, uv = ref.union_sum([(c, a[c]) for c, a in zip(chosen, accs)])
        np.testing.assert_array_equal(np.asarray(upd.indices, np.int64), ui)
        np.testing.assert_allclose(np.asarray(upd.values, np.float64) * p, uv, rtol=1e-6)
        residuals = [np.asarray(res, np.float32) for res in everyone]


def tied_far_case(comm) -> None:
    """Ok-Topk's step after a refresh on N(0, 1) values, whose k-th sum is tied at v far from
    the last threshold (outside its window): exactly k kept, the 5 larger sums then the lowest
    indices at v (float64's log-spaced edges once ran out of rounds: 12 of 60 at P = 3)."""
    from cupycoll.topk import TopkState

    n, k, rank = 3000, 60, comm.rank
    for dtype in (np.float32, np.float64):
        for v in (4.0, 1e3, 1e-3, 2.0 ** -20) + ((1e100,) if dtype == np.float64 else ()):
            state = TopkState(tau=1, tau_prime=1000)
            noise = np.random.default_rng([0, rank]).standard_normal(n).astype(dtype)
            cc.topk_allreduce(noise, k, algorithm="oktopk", comm=comm, state=state)
            tied = np.zeros(n, dtype)
            tied[:5], tied[100 + 200 * rank:300 + 200 * rank] = 2 * v, v
            got = cc.topk_allreduce(tied, k, algorithm="oktopk", comm=comm, state=state)
            assert not state.last["refresh"]
            assert got.indices.tolist() == list(range(5)) + list(range(100, 100 + k - 5)), \
                (np.dtype(dtype).name, v, got.indices.size)


def main() -> None:
    comm = cc.init("mpi")
    tied_far_case(comm)
    p = comm.size
    cases = [(1, 1 << 16, 0.02, False, "quantile", 12, "auto", 8),
             (2, 1 << 16, 0.02, True, "quantile", 12, "auto", 8),
             (3, 1 << 14, 0.005, True, "quantile", 8, 64, 32),
             (4, 1 << 14, 0.02, False, "reference", 10, 64, 32),
             (5, 1 << 14, 0.01, True, "reference", 8, 3, 4)]
    for seed, n, density, drift, policy, steps, tau, tau_prime in cases:
        worst = run_case(comm, seed, n, density, drift, policy, steps, tau, tau_prime)
        if comm.rank == 0:
            print(f"P={p} n={n} d={density} drift={drift} {policy}: non-refresh nnz/k "
                  f"{worst['nnz'][0]:.3f}-{worst['nnz'][1]:.3f}, local/k {worst['local'][0]:.2f}-"
                  f"{worst['local'][1]:.2f}, data words/bound <= {worst['words']:.2f}")
    gather_case(comm, 6, 1 << 14, 0.02, "gaussiank", None, (0.75, 1.25), 6)
    gather_case(comm, 7, 1 << 16, 0.02, "topka", Threshold(), (0.8, 1.1), 3)
    if comm.rank == 0:
        print("OK")


if __name__ == "__main__":
    main()
