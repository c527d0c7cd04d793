"""Every top-k algorithm on tiny inputs in one short launch (run under mpiexec, 2-3 ranks).

Written for mutation testing (tests/mutation/run.py): mutmut runs, per mutant, the tests that
called the mutated function, so a launch of a few seconds that reaches every function of
``cupycoll/topk/`` keeps a mutant's run short. The checks are those of the regular workers on
smaller inputs (their references are reused: plain numpy from the inputs and the documented
rules, see ``topk_ref.py``), plus:

- Ok-Topk's reference policy over non-refresh steps whose inputs shrink, so the global count T
  falls below 2k/3 and the shared threshold is divided by 1.008 step after step (simulated by
  ``topk_ref.ReferencePolicy``; every result bit for bit);
- the compact wire equals the coo wire bit for bit for every algorithm (padded and native
  Ok-Topk allgathers), and rounded wire values conserve mass under error feedback.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import topk_ref as ref
from _common import assert_identical_across_ranks, topk_compact_equals_coo
from topk_compressor import conservation, errors, gtopk_reentry
from topk_results import assert_equal, check_case, check_shape, check_small_bits, \
    oktopk_sequence, run_outcome
from topk_volume import assert_phases_named, check_balanced, check_refresh, check_skewed, \
    check_topka_gtopk, check_uneven_blocks, received, sent, skewed_input

import cupycoll as cc
from cupycoll.topk import Threshold, TopkState, topk_allreduce
from cupycoll.wire import encoded_nbytes

WORLD = MPI.COMM_WORLD


def shrinking_reference_policy(comm, seed: int, n: int, k: int, steps: int) -> int:
    """Reference policy, one refresh then non-refresh steps on inputs shrinking by 1/8 of the
    first step's scale a step (multiples of 1/128: sums stay exact):
    T < 2k/3 divides the global threshold (and the local ones) each time. Returns how many
    non-refresh steps had T < 2k/3 (the caller checks it is most of them)."""
    p, r = comm.size, comm.rank
    state = TopkState(tau=1000, tau_prime=1000, selector=Threshold(policy="reference"))
    sims = [ref.ReferencePolicy(k) for _ in range(p)]
    base = ref.inputs(seed, p, n)
    low = 0
    for t in range(steps):
        xs = [((x + ref.inputs(seed + 50 + t, p, n, noise=8, base=4)[q]) * (16 - 2 * t) / 16)
              .astype(np.float32) for q, x in enumerate(base)]
        refresh = t == 0
        out = run_outcome(comm, xs[r], k, "oktopk", state)
        check_shape(out.result, n, "float32")
        locals_ = [sim.local(x, refresh) for sim, x in zip(sims, xs)]
        np.testing.assert_array_equal(np.asarray(out.selection.indices), locals_[r])
        ui, uv = ref.union_sum([(i, x[i]) for i, x in zip(locals_, xs)])
        before = sims[0].global_th
        assert_equal(out.result, *sims[0].result(ui, uv, refresh))
        if not refresh:
            assert state.last["global_count"] == out.result.nnz
            low += sims[0].global_th < before
    return low


def global_feedback_edges(comm, k: int = 12) -> None:
    """Reference policy's global feedback at its edges: T = 2k/3 - 1, 2k/3, 4k/3, 4k/3 + 1.

    Ranks 0 and 1 select disjoint indices (every other rank holds zeros), so a sum is one
    rank's value. Step 0 (refresh): both select 100..111, the global threshold is the 12th
    largest sum, 106. Step 1: T sums reach 106 (rank 0 selects 8 or 9 entries, rank 1 8 or
    fewer, all of them at least its local threshold 100). Step 2: rank 1 selects 12 sums
    >= 106 (more than k: a refresh would cut 105.5), rank 0 selects 105.5 at index 20 and 106.5
    at index 21: 105.5 is in the result iff T < 2k/3 (106 / 1.008 = 105.16), 106 and 106.5 iff
    T <= 4k/3 (106 * 1.008 = 106.85). Step 3: a single sum passes (T = 1).
    """
    p, r, n = comm.size, comm.rank, 128
    for t1 in (2 * k // 3 - 1, 2 * k // 3, 4 * k // 3, 4 * k // 3 + 1):
        state = TopkState(tau=1000, tau_prime=1000, selector=Threshold(policy="reference"))
        sims = [ref.ReferencePolicy(k) for _ in range(p)]
        for t in range(4):
            xs = [np.zeros(n, np.float32) for _ in range(p)]
            if t == 0:
                xs[0][:k] = xs[1][100:100 + k] = 100 + np.arange(k)
            elif t == 1 and t1 <= 2 * k // 3:  # rank 0: 4 sums >= 106 and 4 below
                xs[0][:8] = [106, 107, 108, 109, 100, 101, 102, 103]
                xs[1][100:100 + t1 - 4] = 106 + np.arange(t1 - 4)
            elif t == 1:
                xs[0][:t1 - 8] = 106 + np.arange(t1 - 8)
                xs[1][100:108] = 106 + np.arange(8)
            elif t == 2:
                xs[0][:4], xs[1][100:100 + k] = 106 + np.arange(4), 106 + np.arange(k)
                xs[0][20], xs[0][21] = 105.5, 106.5
            else:  # one sum in the whole result: every rank still returns it
                xs[0][0] = 200
            out = run_outcome(comm, xs[r], k, "oktopk", state)
            locals_ = [sim.local(x, t == 0) for sim, x in zip(sims, xs)]
            ui, uv = ref.union_sum([(i, x[i]) for i, x in zip(locals_, xs)])
            assert_equal(out.result, *sims[0].result(ui, uv, t == 0))
            got = set(np.asarray(out.result.indices).tolist())
            if t == 1:
                assert state.last["global_count"] == t1, (t1, state.last)
            if t == 2:
                assert (20 in got) == (t1 < 2 * k / 3), (t1, sorted(got))
                assert (21 in got) == (0 in got) == (t1 <= 4 * k / 3), (t1, sorted(got))


def wires(comm, n: int = 600, k: int = 12) -> None:
    """compact == coo bit for bit, every algorithm and step; rounded values conserve mass."""
    p, r = comm.size, comm.rank
    topk_compact_equals_coo(comm, k, lambda t: ref.inputs(40 + t, p, n)[r], steps=3, tau=2,
                            tau_prime=2)
    for algorithm in cc.algorithms("topk"):
        if algorithm == "oktopk":  # each value is one owner's sum, rounded once to bfloat16
            for wire in ("coo", "compact"):
                state = TopkState(tau=2, tau_prime=2)
                for t in range(3):
                    res = topk_allreduce(ref.inputs(70 + t, p, n)[r] / 3, k, comm=comm,
                                         state=state, wire=wire, wire_values="bfloat16")
                    bits = np.asarray(res.values, np.float32).view(np.uint32)
                    assert not (bits & 0xFFFF).any(), (wire, t, "a value is not bfloat16")
        if algorithm == "oktopk":  # float16 values travel exact: wire_values changes nothing
            states = [TopkState(tau=2, tau_prime=2) for _ in range(2)]
            for t in range(3):
                x = ref.inputs(80 + t, p, 300, "float16")[r]
                plain = topk_allreduce(x, 30, comm=comm, state=states[0])
                wired = topk_allreduce(x, 30, comm=comm, state=states[1], wire_values="bfloat16")
                assert plain.values.tobytes() == wired.values.tobytes(), t
        for wire, fmt in (("compact", "bfloat16"),):
            comp = cc.TopkCompressor(n, 0.02, algorithm=algorithm, comm=comm, wire=wire,
                                     wire_values=fmt, tau=3, tau_prime=2)
            for t in range(4):
                g = (ref.inputs(60 + t, p, n)[r] / 3).astype(np.float32)
                before = comp.residual.astype(np.float64) + g.astype(np.float64)
                upd = comp.step(g)
                want = WORLD.allreduce(before, op=MPI.SUM)
                after = WORLD.allreduce(comp.residual.astype(np.float64), op=MPI.SUM)
                dense = np.zeros(n)
                dense[np.asarray(upd.indices)] = np.asarray(upd.values, np.float64) * p
                err = float(np.abs(after + dense - want).max()) / max(1.0, np.abs(want).max())
                assert err < 1e-5, (algorithm, wire, fmt, t, err)
                assert_identical_across_ranks(upd.indices, upd.values)


def compact_balance_sizes(comm, k: int) -> None:
    """Skewed input on the compact wire: rank 0 ships a balance piece to every peer, after one
    int64 byte length each, booked under ``oktopk.balance.sizes``; a piece, and a block of the
    allgather, is its fp32 values and its indices encoded over ``[0, n)``."""
    p, r, n = comm.size, comm.rank, 64 * k
    state = TopkState()
    x = skewed_input(p, r, n, k)
    comm.stats.reset()
    topk_allreduce(x, k, comm=comm, state=state, wire="compact")
    assert_phases_named(comm, "oktopk.boundaries", "oktopk.refresh")  # the first step's
    comm.stats.reset()
    topk_allreduce(x, k, comm=comm, state=state, wire="compact")
    assert not state.last["refresh"]
    if r == 0:
        assert sent(comm, "oktopk.balance.sizes") == 8 * (p - 1), sent(comm, "oktopk.balance.sizes")
    else:  # block r of the T = k selected sums: indices r*k/P .. (r+1)*k/P - 1, over [0, n)
        assert received(comm, "oktopk.balance.sizes") == 8, received(comm, "oktopk.balance.sizes")
        per = k // p
        want = 4 * per + encoded_nbytes(np.arange(r * per, (r + 1) * per), 0, n)
        assert received(comm, "oktopk.balance") == want, (received(comm, "oktopk.balance"), want)
    per = k // p  # the allgather: every other rank's block, encoded the same way
    want = sum(4 * per + encoded_nbytes(np.arange(j * per, (j + 1) * per), 0, n)
               for j in range(p) if j != r)
    assert received(comm, "oktopk.allgather") == want, (received(comm, "oktopk.allgather"), want)


def main() -> None:
    comm = cc.init("mpi")
    p = comm.size
    for seed, n, k, dtype, *zeros in [(1, 1, 1, "float32"), (2, 7, 3, "float64"),
                                      (3, 400, 10, "float32"), (5, 33, 33, "float32"),
                                      (6, 300, 30, "float16"), (7, 64, 5, "float32", True)]:
        check_case(comm, seed, n, k, dtype, bool(zeros))
    check_small_bits(comm, 19)  # stateless calls finished by the validation allreduce
    for policy in ("quantile", "reference"):
        native = oktopk_sequence(comm, 11, 900, 18, 5, False, policy)
        padded = oktopk_sequence(comm, 11, 900, 18, 5, True, policy)
        for (ai, av), (bi, bv) in zip(native, padded):
            np.testing.assert_array_equal(ai, bi)
            np.testing.assert_array_equal(av, bv)
    low = shrinking_reference_policy(comm, 13, 900, 18, 6)
    assert low >= 3, low
    if p > 1:
        global_feedback_edges(comm)
    k = 8 * p
    check_balanced(comm, 64 * k, k)
    check_uneven_blocks(comm, 64 * k, k + 1)
    check_refresh(comm, 64 * k, k)
    check_skewed(comm, 64 * k, k)
    check_topka_gtopk(comm, 64 * k, k)
    compact_balance_sizes(comm, k)
    for alg in cc.algorithms("topk"):
        conservation(comm, alg, 300, 6)
    comp = conservation(comm, "oktopk", 300, 5, warmup_steps=2, measure_xi=True)
    assert len(comp.xi) == 3 and all(np.isfinite(comp.xi)) and min(comp.xi) >= 0
    if p == 3:
        gtopk_reentry(comm)
    errors(comm)
    wires(comm)
    if comm.rank == 0:
        print("OK")


if __name__ == "__main__":
    main()
