"""TopkCompressor mass conservation, warm-up, xi, DLPack input; typed errors on every rank.

Mass conservation, checked after every step against the inputs every rank regenerates from the
shared seeds: sum over ranks of the new residuals + P * update == sum over ranks of (old
residual + grad). With tau=5, tau'=3 the run covers refresh, non-refresh and repartition steps.
"""

from __future__ import annotations

import pickle

import numpy as np
from mpi4py import MPI

import topk_ref as ref
from _common import assert_identical_across_ranks, expect_raises

import cupycoll as cc
from cupycoll.errors import InvalidArgument, InvalidType, MismatchError
from cupycoll.topk import Exact, Threshold, TopkCompressor, TopkState, topk_allreduce

WORLD = MPI.COMM_WORLD


class Tensor:
    """A minimal non-numpy tensor exposing only the DLPack protocol (stands in for torch)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def rank_sum(a: np.ndarray) -> np.ndarray:
    return WORLD.allreduce(np.asarray(a, np.float64), op=MPI.SUM)


def conservation(comm, alg: str, n: int, steps: int, *, dtype: str = "float32", wrap=None,
                 **kwargs) -> TopkCompressor:
    p, r = comm.size, comm.rank
    comp = TopkCompressor(n, 0.02, algorithm=alg, comm=comm, tau=5, tau_prime=3, **kwargs)
    before = np.zeros(n)  # sum over ranks of the residuals
    refreshes = set()
    for t in range(steps):
        grads = ref.inputs(1000 + t, p, n, dtype)
        upd = comp.step(wrap(grads[r]) if wrap else grads[r])
        assert isinstance(upd.values, np.ndarray) and upd.values.dtype == np.dtype(dtype)
        assert_identical_across_ranks(upd.indices, upd.values)
        after = rank_sum(comp.residual)
        incoming = before + np.sum([g.astype(np.float64) for g in grads], axis=0)
        got = after + p * upd.to_dense().astype(np.float64)
        scale = max(1.0, float(np.abs(incoming).max()))
        np.testing.assert_allclose(got, incoming, rtol=0, atol=1e-5 * scale,
                                   err_msg=f"{alg}: mass not conserved at step {t}")
        before = after
        refreshes.add(comp.state.last.get("refresh"))
    if alg != "dense" and comp.steps > comp.warmup_steps + 1:
        assert refreshes >= {True, False}, refreshes
    return comp


def gtopk_reentry(comm) -> None:
    """A value dropped by one merge comes back through another subtree: the dropped rank keeps it.

    P=3: rank 2 folds into rank 0 (keeps index 9, drops rank 0's index 5); rank 1 brings index 5
    back (value 3). P=4: (0,1) keeps 7 and drops rank 0's 5; (2,3) keeps rank 2's 5; the root
    keeps 5. Either way the result is {5: 3} from a single rank and rank 0 must keep its 1.
    """
    p, r = comm.size, comm.rank
    entries = {3: {0: (5, 1.0), 1: (5, 3.0), 2: (9, 2.0)},
               4: {0: (5, 1.0), 1: (7, 2.0), 2: (5, 3.0), 3: (9, 0.5)}}[p]
    grad = np.zeros(16, np.float32)
    i, v = entries[r]
    grad[i] = v
    comp = TopkCompressor(16, 1 / 16, algorithm="gtopk", comm=comm)
    upd = comp.step(grad)
    np.testing.assert_array_equal(upd.indices, [5])
    np.testing.assert_array_equal(upd.values, [np.float32(3.0 / p)])
    expect = grad.copy()
    if v == 3.0:
        expect[5] = 0
    np.testing.assert_array_equal(comp.residual, expect)


def errors(comm) -> None:
    """Bad input on one rank raises a typed error on every rank; a good call works afterwards."""
    p, r = comm.size, comm.rank
    last = p - 1
    x = np.ones(10, np.float32)
    cases = [
        (InvalidArgument, "k", lambda: topk_allreduce(x, 0 if r == last else 3, comm=comm)),
        (InvalidArgument, "k", lambda: topk_allreduce(x, 11, comm=comm, algorithm="topka")),
        (InvalidType, "x", lambda: topk_allreduce(x.astype(np.int32) if r == last else x, 3,
                                                    comm=comm)),
        (InvalidArgument, "x", lambda: topk_allreduce(np.ones((2, 5), np.float32) if r == last
                                                      else x, 3, comm=comm)),
        (InvalidArgument, "algorithm", lambda: topk_allreduce(
            x, 3, comm=comm, algorithm="nope" if r == last else "oktopk")),
        (InvalidType, "k", lambda: topk_allreduce(x, 2.5 if r == last else 3, comm=comm)),
        (InvalidType, "state", lambda: topk_allreduce(x, 3, comm=comm,
                                                      state="s" if r == last else None)),
        (InvalidArgument, "grad", lambda: TopkCompressor(10, 0.5, comm=comm).step(
            np.ones(9 if r == last else 10, np.float32))),
    ]
    if p > 1:
        cases += [
            (MismatchError, None, lambda: topk_allreduce(np.ones(10 + (r == 0), np.float32), 3,
                                                         comm=comm)),
            (MismatchError, None, lambda: topk_allreduce(x, 3 + (r == 0), comm=comm)),
            (MismatchError, None, lambda: topk_allreduce(
                x.astype(np.float64) if r == 0 else x, 3, comm=comm)),
            (MismatchError, None, lambda: topk_allreduce(
                x, 3, comm=comm, algorithm="topka" if r == 0 else "oktopk")),
        ]
        message = str(expect_raises(MismatchError, cases[-2][2]))
        assert "float64 on rank 0" in message and "float32 on rank" in message, message
        message = str(expect_raises(MismatchError, cases[-1][2]))
        assert ("'topka'" if r == 0 else "'oktopk'") in message, message
        message = str(expect_raises(MismatchError, cases[-4][2]))
        assert "disagree on the length of x of topk_allreduce (" in message and \
            "11 on rank 0" in message and f"seen on rank {r})" in message, message
        message = str(expect_raises(MismatchError, lambda: topk_allreduce(
            x, 3, comm=comm, wire_values="bfloat16" if r == 0 else None)))
        assert "disagree on wire / wire_values" in message and \
            ("bfloat16" if r == 0 else "None") in message, message
        # rank 0 restored from the checkpoint of one step before (Ok-Topk's repartition
        # and refresh steps follow the count): every rank raises instead of hanging
        comp = TopkCompressor(10, 0.3, comm=comm, tau_prime=2)
        comp.step(x)
        saved = pickle.dumps(comp)
        comp.step(x)
        if r == 0:
            comp = pickle.loads(saved)
            comp.comm = comm
        message = str(expect_raises(MismatchError, lambda: comp.step(x)))
        rest = "rank 1" if comm.size == 2 else f"ranks 1-{comm.size - 1}"
        assert f"(step: 1 on rank 0; 2 on {rest}, " in message and "step count" in message, \
            message
        # a setting that changes the collectives of later steps only: refused at the first
        # (before: the ranks ran different collectives from step 1 and hung)
        for make in (lambda: TopkCompressor(10, 0.3, comm=comm, selector=Threshold(
                         policy="reference" if r == 0 else "quantile")),
                     lambda: _padded(TopkCompressor(10, 0.3, comm=comm), r == 0)):
            comp = make()
            message = str(expect_raises(MismatchError, lambda: comp.step(x)))
            assert "True on rank 0; False on" in message, message
        message = str(expect_raises(MismatchError, lambda: topk_allreduce(
            x, 3, comm=comm, state=TopkState(), selector=Threshold(
                policy="reference" if r == 0 else "quantile"))))
        assert "reference threshold: True on rank 0" in message, message
        for algorithm in ("topka", "gtopk", "gaussiank", "dense"):  # no collective follows the
            topk_allreduce(x, 3, comm=comm, algorithm=algorithm, selector=Threshold(  # policy
                policy="reference") if r == 0 else Exact())
        comp = TopkCompressor(10, 0.2 if r == 0 else 0.3, comm=comm)  # named as the caller's
        message = str(expect_raises(MismatchError, lambda: comp.step(x)))
        assert "the k (density x n) of TopkCompressor.step" in message, message
        comp = TopkCompressor(10, 0.3, comm=comm)
        message = str(expect_raises(MismatchError, lambda: comp.step(
            x.astype(np.float64) if r == 0 else x)))
        assert "dtype of grad in TopkCompressor.step" in message, message
    for exc_type, argument, call in cases:
        exc = expect_raises(exc_type, call)
        if argument is not None:
            assert exc.argument == argument, (exc.argument, argument)
            everywhere = call is cases[1][2]  # k > n on every rank: each names itself
            assert exc.rank == (r if everywhere else last), (exc.rank, argument)
    for bad in (lambda: TopkCompressor(0, 0.1, comm=comm),
                lambda: TopkCompressor(10, 0.0, comm=comm),
                lambda: TopkState(tau=0)):
        expect_raises(InvalidArgument, bad)
    res = topk_allreduce(x * (r + 1), 3, comm=comm)
    assert res.nnz == 3


def tied_kth(comm) -> None:
    """Ok-Topk's documented tie rule in every float dtype: the k-th sum tied (20 entries
    summing to 2P, 200 of each rank's own at 1, k = 60): every step keeps k, the tied value's
    lowest indices (before: a float64 search ran out of rounds before its bin held one value
    and kept the 20 above the tie)."""
    x = np.zeros(3000)
    x[:20] = 2.0
    x[100 + 200 * comm.rank: 300 + 200 * comm.rank] = 1.0
    for dtype in (np.float32, np.float64):
        state = TopkState(tau=1, tau_prime=1000)  # one refresh, then the histogram's search
        for step in range(3):
            got = topk_allreduce(x.astype(dtype), 60, algorithm="oktopk", comm=comm,
                                 state=state)
            assert got.indices.tolist() == list(range(20)) + list(range(100, 140)), \
                (np.dtype(dtype).name, step, got.indices.size)


def every_entry(comm, n: int = 2000, steps: int = 12) -> None:
    """Density 1 with every algorithm: each step's update is the ranks' average of the whole
    gradient and the residuals sum to zero (before, reused thresholds kept an entry back now
    and then, and Gaussian-k some on every step)."""
    for alg in cc.algorithms("topk"):
        comp = TopkCompressor(n, 1.0, algorithm=alg, comm=comm, tau=5, tau_prime=3)
        for t in range(steps):
            grads = ref.inputs(2000 + t, comm.size, n, "float32")
            grads = [g * (1 + t % 4) for g in grads]  # scales that move the thresholds
            want = np.sum([g.astype(np.float64) for g in grads], axis=0) / comm.size
            got = comp.step(grads[comm.rank]).to_dense().astype(np.float64)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max(),
                                       err_msg=f"{alg}: density 1, step {t}")
            assert not np.count_nonzero(rank_sum(comp.residual)), (alg, t)  # (sums of 0
            # stay where they are: each rank keeps its part of a row that cancels out)


def _padded(comp: TopkCompressor, padded: bool) -> TopkCompressor:
    comp.state.padded_allgather = padded
    return comp


def main() -> None:
    comm = cc.init("mpi")
    tied_kth(comm)
    every_entry(comm)
    n, steps = 2000, 14
    for alg in cc.algorithms("topk"):
        conservation(comm, alg, n, steps)
    comp = conservation(comm, "oktopk", n, 6, warmup_steps=2, measure_xi=True)
    assert len(comp.xi) == 4 and all(np.isfinite(comp.xi)) and min(comp.xi) >= 0
    assert comp.state.step == 4
    comp = conservation(comm, "dense", n, 3, measure_xi=True)
    assert comp.xi == [0.0, 0.0, 0.0]
    conservation(comm, "gtopk", n, 4, dtype="float64", wrap=Tensor)
    conservation(comm, "oktopk", n, 4, wrap=Tensor)
    if comm.size in (3, 4):
        gtopk_reentry(comm)
    errors(comm)
    if comm.rank == 0:
        print("OK")


if __name__ == "__main__":
    main()
