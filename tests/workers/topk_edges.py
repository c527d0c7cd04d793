"""Top-k edge cases on every rank count, against plain numpy references (topk_ref).

Usage: topk_edges.py [SEED emulated] (emulated: only the NaN checks, on the GPU path: emulated
NCCL and cupy, the kernels compiled for the CPU).

NaN: never selected by any algorithm or selector, never in a result, left in its rank's
residual by the compressor. An inf k-th magnitude on an Ok-Topk refresh step (inf inputs, a
float16 sum that overflows): the state's global threshold stays finite and the next steps
select 0.9k..1.1k, an upper set of the union of the local selections. A bad state on one rank
(fields set after construction too): InvalidType / InvalidArgument naming 'state' on every rank;
a bad selector setting on one rank alike, naming 'selector' (the communicator lives on).
Ranks restored from two runs' checkpoints at the same step: MismatchError on every rank.
"""

from __future__ import annotations

import pickle
import sys

import numpy as np
from mpi4py import MPI

import topk_ref as ref
from _common import assert_identical_across_ranks, emulation, expect_raises, host, rng_for

EMU = emulation(sys.argv)  # before cupycoll's communicators

import cupycoll as cc  # noqa: E402
from cupycoll.errors import (CupycollError, InvalidArgument, InvalidType,  # noqa: E402
                             MismatchError)
from cupycoll.topk import (Gaussian, Threshold, TopkCompressor, TopkState,  # noqa: E402
                           topk_allreduce)

WORLD = MPI.COMM_WORLD


def numbers_top(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact top-k of the numbers of x (NaN left out), ascending indices."""
    idx = np.flatnonzero(~np.isnan(x))
    return ref.top_of(idx, x[idx], k)


def check_nan_result(comm, xs: list[np.ndarray], k: int, alg: str) -> None:
    """One call: no NaN in the result; dense, topka and gtopk equal their references."""
    res = host(topk_allreduce(comm.xp.asarray(xs[comm.rank]), k, algorithm=alg, comm=comm))
    assert_identical_across_ranks(res.indices, res.values)
    assert not np.isnan(res.values).any(), (alg, res.values)
    locals_ = [numbers_top(x, k) for x in xs]
    with np.errstate(invalid="ignore"):
        total = np.sum([x.astype(np.float64) for x in xs], axis=0)
    want = {"dense": numbers_top(total, k), "topka": ref.union_sum(locals_),
            "gtopk": ref.gtopk(locals_, k)}.get(alg)
    if want is not None:
        np.testing.assert_array_equal(res.indices, want[0], err_msg=alg)
        np.testing.assert_array_equal(res.values, want[1], err_msg=alg)


def nan_never_selected(comm) -> None:
    """The last rank's vector all NaN; rank 0 with one NaN and k = n (fewer than k numbers)."""
    p, r = comm.size, comm.rank
    xs = ref.inputs(11, p, 1000)
    xs[-1][:] = np.nan
    small = [np.arange(1, 9, dtype=np.float32) for _ in range(p)]
    small[0][3] = np.nan
    for alg in cc.algorithms("topk"):
        check_nan_result(comm, xs, 10, alg)
        check_nan_result(comm, small, 8, alg)
        comp = TopkCompressor(8, 1.0, algorithm=alg, comm=comm)
        upd, residual = host((comp.step(comm.xp.asarray(small[r])), comp.residual))
        assert not np.isnan(upd.values).any(), (alg, upd.values)
        assert np.isnan(residual[3]) == (r == 0), (alg, residual)
        kept = WORLD.allreduce(np.nan_to_num(residual).astype(np.float64), op=MPI.SUM)
        sent = sum(np.nan_to_num(x).astype(np.float64) for x in small)
        np.testing.assert_allclose(kept + p * upd.to_dense(), sent, rtol=1e-6, err_msg=alg)
    sel = Threshold(policy="reference")  # its refresh step takes the exact top-k
    res = host(topk_allreduce(comm.xp.asarray(xs[r]), 10, comm=comm, selector=sel,
                              state=TopkState()))
    assert not np.isnan(res.values).any()
    if r == p - 1:
        assert sel.last_count == 0, sel.last_count


def exact_inputs(seed: int, p: int, n: int, dtype: str) -> list[np.ndarray]:
    """Every rank's input: multiples of 1/64 in [-4, 4] (any sum of four is exact in float16)."""
    return [(np.clip(np.round(rng_for(seed, q).standard_normal(n) * 64), -255, 255) / 64)
            .astype(dtype) for q in range(p)]


def inf_threshold(comm) -> None:
    """Step 0 (refresh): 2k entries whose sum is inf on every rank; then ordinary steps."""
    p, r = comm.size, comm.rank
    n, k = 20000, 500
    for dtype in ("float16", "float32", "float64"):
        big = 40000.0 if dtype == "float16" and p > 1 else np.inf  # float16: the sum overflows
        state = TopkState(tau_prime=100)
        for step in range(4):
            xs = exact_inputs(100 + step, p, n, dtype)
            for x in xs if step == 0 else ():
                x[: 2 * k] = big
            res = topk_allreduce(xs[r], k, comm=comm, state=state)
            assert 0 < state.global_th <= np.finfo(dtype).max, (dtype, step, state.global_th)
            if step == 0:
                assert res.nnz == k and np.isinf(res.values).all(), (dtype, res.values)
                continue
            ui, uv = ref.union_sum([(sel, x[sel]) for x in xs
                                    for sel in [ref.quantile_local(x, k)]])
            assert 0.9 * k <= res.nnz <= 1.1 * k, (dtype, step, res.nnz)
            assert ref.upper_set(ui, uv, res.indices), (dtype, step)
            np.testing.assert_array_equal(res.values, uv[np.searchsorted(ui, res.indices)])


def bad_states(comm) -> None:
    """Each bad field set on the last rank after a good call: every rank raises naming 'state'
    and that rank; then a good call. Bad fields at construction raise there."""
    p, r = comm.size, comm.rank
    n, last = 2000, p - 1
    x = exact_inputs(7, p, n, "float32")[r]
    cases = [(InvalidArgument, "boundaries", np.r_[1, np.arange(1, p) * 500, n]),  # not from 0
             (InvalidType, "boundaries", [0, n]), (InvalidType, "step", "a"),
             (InvalidArgument, "step", -1), (InvalidType, "step", 1.5),
             (InvalidType, "padded_allgather", "yes"), (InvalidArgument, "global_th", np.nan)]
    if p > 1:  # above n; descending
        cases.append((InvalidArgument, "boundaries", np.r_[0, np.full(p - 1, n + 1000), n]))
    if p > 2:
        cases.append((InvalidArgument, "boundaries", np.r_[0, np.arange(p - 1, 0, -1) * 500, n]))
    for kind, field, value in cases:
        for comp in (None, TopkCompressor(n, 0.1, comm=comm, tau=64)):
            state = TopkState(tau=64) if comp is None else comp.state
            call = (lambda: topk_allreduce(x, 200, comm=comm, state=state)) if comp is None \
                else (lambda: comp.step(x))
            call()
            good = getattr(state, field)
            if r == last:
                setattr(state, field, value)
            exc = expect_raises(kind, call)
            assert (exc.argument, exc.rank) == ("state", last), (field, value, exc)
            assert r != last or field in str(exc), exc
            setattr(state, field, good)
            call()
        if field != "boundaries":
            expect_raises(kind, TopkState, **{field: value})


def restored(saved: bytes, comm) -> TopkCompressor:
    comp = pickle.loads(saved)
    comp.comm = comm
    return comp


def mixed_checkpoints(comm) -> None:
    """Two runs checkpointed at step 5 (other data, so other thresholds): ranks restored from
    one run go on as the run itself does, bit for bit; ranks restored from both raise
    MismatchError on every rank (the compressor, its first step synchronous or not, and its
    state passed to topk_allreduce)."""
    p, r = comm.size, comm.rank
    n = 20000
    runs, saved = [], []
    for run in (0, 1):
        comp = TopkCompressor(n, 0.01, comm=comm, tau=64)
        for s in range(5):
            comp.step(exact_inputs(50 * run + s, p, n, "float32")[r] * (1 + 7 * run))
        runs.append(comp)
        saved.append(pickle.dumps(comp))
    grad = exact_inputs(99, p, n, "float32")[r]
    got, want = restored(saved[0], comm).step(grad), runs[0].step(grad)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.values, want.values)
    if p == 1:
        return
    for async_op in (False, True):
        comp = restored(saved[r % 2], comm)
        exc = expect_raises(MismatchError, comp.step, grad, async_op=async_op)
        assert "state crc32" in str(exc), exc
    state = restored(saved[r % 2], comm).state
    expect_raises(MismatchError, topk_allreduce, grad, 200, comm=comm, state=state)
    exc = expect_raises(MismatchError, topk_allreduce, grad, 200, comm=comm,
                        state=TopkState(step=5 if r == p - 1 else 0))  # each value, its ranks
    others = "rank 0" if p == 2 else f"ranks 0-{p - 2}"
    assert f"(step: 0 on {others}; 5 on rank {p - 1})" in str(exc), exc


def bad_selectors(comm) -> None:
    """A selector setting made bad on the last rank after construction: every rank raises
    naming 'selector' and that rank (before any data moves); the next call runs."""
    p, r, last = comm.size, comm.rank, comm.size - 1
    x = exact_inputs(9, p, 2000, "float32")[r]
    cases = [(Gaussian, "gaussiank", "low", "0.75", InvalidType),
             (Gaussian, "gaussiank", "max_corrections", None, InvalidType),
             (Threshold, "oktopk", "scale", 0, InvalidArgument),
             (Threshold, "topka", "policy", "nope", InvalidArgument)]
    for make, alg, setting, value, kind in cases:
        sel = make(policy="reference")
        if r == last:
            setattr(sel, setting, value)
        exc = expect_raises(kind, topk_allreduce, x, 100, comm=comm, algorithm=alg, selector=sel)
        assert (exc.argument, exc.rank) == ("selector", last), (setting, exc)
        assert r != last or setting in str(exc), exc
        assert topk_allreduce(x, 100, comm=comm, algorithm=alg).nnz >= 1
    comp = TopkCompressor(2000, 0.05, comm=comm)  # its whole state replaced on one rank
    comp.step(x)
    good = comp.state
    if r == last:
        comp.state = None
    if p > 1:  # before: AttributeError there, timeouts here (alone, it steps statelessly)
        expect_raises(CupycollError, comp.step, x)
    comp.state = good
    assert comp.step(x).nnz >= 1


def main() -> None:
    if EMU is not None:
        nan_never_selected(cc.init("nccl"))
        EMU.check_logs()
        if WORLD.rank == 0:
            print("OK emulated")
        return
    comm = cc.init("mpi")
    nan_never_selected(comm)
    inf_threshold(comm)
    bad_states(comm)
    bad_selectors(comm)
    mixed_checkpoints(comm)
    if comm.rank == 0:
        print("OK")


if __name__ == "__main__":
    main()
