"""Words moved per rank by the top-k algorithms, read from ``comm.stats`` (run under mpiexec).

A word is 4 bytes (an int32 index or an fp32 value): one (index, value) pair is 8 bytes.
Constructed inputs make the expected volumes exact:

- balanced: every rank selects the same k indices, k/P in every region -> Ok-Topk's
  split-and-reduce and allgather each receive exactly k(P-1)/P pairs per rank, balance moves 0;
- skewed: the global top-k all reduce into region 0 (rank 0) -> balance ships (P-1)/P of them
  from rank 0, every peer receives k/P pairs; the step stays within 6k(P-1)/P words;
- TopkA receives k(P-1) pairs = 2k(P-1) words; gTopk's tree gives each merging rank k pairs per
  merge and the broadcast k pairs: at most 4k ceil(log2 P) words;
- drifting random data: every non-refresh Ok-Topk step stays within 6k(P-1)/P words.
"""

from __future__ import annotations

import numpy as np

import topk_ref as ref

import cupycoll as cc
from cupycoll.topk import TopkState, topk_allreduce

PAIR = 8
PHASES = ("oktopk.reduce", "oktopk.balance", "oktopk.allgather")


def received(comm, op: str) -> int:
    st = comm.stats.by_op.get(op)
    return 0 if st is None else st.bytes_received


def sent(comm, op: str) -> int:
    st = comm.stats.by_op.get(op)
    return 0 if st is None else st.bytes_sent


def assert_phases_named(comm, *expected: str) -> None:
    """Every collective is booked as ``<algorithm>.<phase>``, the expected names included."""
    ops = set(comm.stats.by_op)
    assert all("." in op for op in ops), sorted(ops)
    assert set(expected) <= ops, (sorted(expected), sorted(ops))


def balanced_input(p: int, r: int, n: int, k: int) -> np.ndarray:
    """Every rank: the same k evenly spaced indices carry distinct values >= 2, the rest tiny."""
    x = np.random.default_rng([7, r]).random(n).astype(np.float32) * 1e-3
    picks = np.arange(k) * (n // k)
    x[picks] = 2 + np.arange(k, dtype=np.float32) / k
    return x


def skewed_input(p: int, r: int, n: int, k: int) -> np.ndarray:
    """Region 0 = [0, n/P): k/P indices per rank, disjoint across ranks, value 10. Regions j >= 1:
    the same k/P indices on every rank, value 1 (sum P < 10). So the k largest sums are all in
    region 0, while every rank's local selection is spread k/P per region."""
    x = np.random.default_rng([8, r]).random(n).astype(np.float32) * 1e-3
    per, width = k // p, n // p
    x[r * per + np.arange(per)] = 10
    for j in range(1, p):
        x[j * width + np.arange(per) * (width // per)] = 1
    return x


def oktopk_two_steps(comm, x, k, padded=False):
    """Refresh step, then a non-refresh step on the same input; stats cover the second only."""
    state = TopkState(padded_allgather=padded)
    topk_allreduce(x, k, comm=comm, state=state)
    comm.stats.reset()
    res = topk_allreduce(x, k, comm=comm, state=state)
    assert not state.last["refresh"]
    return res, state


def check_balanced(comm, n, k) -> dict:
    p = comm.size
    for padded in (False, True):
        res, state = oktopk_two_steps(comm, balanced_input(p, comm.rank, n, k), k, padded)
        assert res.nnz == k and state.last["global_count"] == k
        exact = (p - 1) * (k // p) * PAIR
        assert received(comm, "oktopk.reduce") == exact, (received(comm, "oktopk.reduce"), exact)
        assert received(comm, "oktopk.balance") == 0 and sent(comm, "oktopk.balance") == 0
        assert received(comm, "oktopk.allgather") == exact, received(comm, "oktopk.allgather")
        # the count exchanges, outside the model: P-1 int64 each way, an allgather of P int64
        assert received(comm, "oktopk.reduce.counts") == 8 * (p - 1)
        assert received(comm, "oktopk.balance.counts") == 8 * (p - 1)
        # the allgather reuses the balanced block sizes: no count round of its own
        assert not any(op.startswith("oktopk.allgather.") for op in comm.stats.by_op), \
            sorted(comm.stats.by_op)
    return {"reduce": exact / 4, "allgather": exact / 4}


def check_uneven_blocks(comm, n, k) -> None:
    """T = k = 24P + 1 selected sums: blocks of T//P + 1 (rank 0) and T//P (the others). Native
    allgatherv: rank r receives T - block_r pairs; padded: P-1 blocks of ceil(T/P) pairs."""
    p, r = comm.size, comm.rank
    blocks = [k // p + (j < k % p) for j in range(p)]
    native, padded_want = k - blocks[r], (p - 1) * -(-k // p)  # MPI: native allgatherv
    for padded, want in ((False, native), (None, native), (True, padded_want)):
        res, state = oktopk_two_steps(comm, balanced_input(p, r, n, k), k, padded)
        assert res.nnz == k and state.last["global_count"] == k
        got = received(comm, "oktopk.allgather")
        assert got == want * PAIR, (padded, got, want * PAIR)


def check_refresh(comm, n, k) -> None:
    """Refresh step on the balanced input: the k reduced sums are allgathered once (every one
    received by the P-1 ranks not owning it) after one count exchange."""
    from mpi4py import MPI

    p, state = comm.size, TopkState()
    comm.stats.reset()
    topk_allreduce(balanced_input(p, comm.rank, n, k), k, comm=comm, state=state)
    assert state.last["refresh"] and state.last["global_count"] == k  # the reduced nonzeros
    total = MPI.COMM_WORLD.allreduce(received(comm, "oktopk.refresh"))
    assert total == (p - 1) * k * PAIR, (total, (p - 1) * k * PAIR)
    assert received(comm, "oktopk.refresh.counts") == 8 * (p - 1)


def check_skewed(comm, n, k) -> dict:
    p, r = comm.size, comm.rank
    res, state = oktopk_two_steps(comm, skewed_input(p, r, n, k), k)
    assert res.nnz == k and int(np.asarray(res.indices).max()) < n // p
    np.testing.assert_array_equal(state.boundaries, np.arange(p + 1) * (n // p))
    per = k // p
    assert received(comm, "oktopk.reduce") == (p - 1) * per * PAIR
    if r == 0:
        assert sent(comm, "oktopk.balance") == (p - 1) * per * PAIR
        assert received(comm, "oktopk.balance") == 0
    else:
        assert received(comm, "oktopk.balance") == per * PAIR and sent(comm, "oktopk.balance") == 0
    assert received(comm, "oktopk.allgather") == (p - 1) * per * PAIR
    words = sum(received(comm, op) for op in PHASES) / 4
    assert words <= 6 * k * (p - 1) / p, words
    return {"balance_sent_rank0": (p - 1) * per * 2}


def check_topka_gtopk(comm, n, k) -> None:
    p, r = comm.size, comm.rank
    x = ref.inputs(21, p, n)[r]
    comm.stats.reset()
    topk_allreduce(x, k, algorithm="topka", comm=comm)
    assert received(comm, "topka.allgather") == (p - 1) * k * PAIR  # 2k(P-1) words
    comm.stats.reset()
    topk_allreduce(x, k, algorithm="gaussiank", comm=comm, state=TopkState())
    assert received(comm, "gaussiank.allgather") % PAIR == 0
    for data in (x, balanced_input(p, r, n, k)):
        comm.stats.reset()
        topk_allreduce(data, k, algorithm="gtopk", comm=comm)
        p2 = 1 << (p.bit_length() - 1)
        merges = int(r + p2 < p) if r < p2 else 0
        if r < p2:
            merges += next((j for j in range(p2.bit_length()) if r % (2 << j)),
                           p2.bit_length() - 1)
        assert_phases_named(comm, "topk.validate", "gtopk.broadcast")
        assert received(comm, "gtopk.reduce") == merges * k * PAIR
        assert received(comm, "gtopk.broadcast") == (k * PAIR if r else 0)
        total_words = (received(comm, "gtopk.reduce") + received(comm, "gtopk.broadcast")) / 4
        assert total_words <= 4 * k * max(1, (p - 1).bit_length()), total_words
    # identical supports: nothing is dropped, so the feedback carries no index
    assert received(comm, "gtopk.feedback") == 0


def check_drifting(comm, n, k, steps=9) -> float:
    """Non-refresh Ok-Topk steps on drifting correlated data stay within 6k(P-1)/P words."""
    p, r = comm.size, comm.rank
    state = TopkState(tau_prime=4)
    base = ref.inputs(31, p, n)[r]
    worst = 0.0
    for t in range(steps):
        x = (base + ref.inputs(200 + t, p, n, noise=32, base=4)[r]).astype(np.float32)
        comm.stats.reset()
        topk_allreduce(x, k, comm=comm, state=state)
        first = ("oktopk.boundaries",) if t == 0 and p > 1 else ()  # P = 1 has one region
        assert_phases_named(comm, "topk.validate", *first)
        if not state.last["refresh"] and p > 1:
            words = sum(received(comm, op) for op in PHASES) / 4
            worst = max(worst, words / (2 * k * (p - 1) / p))
            assert words <= 6 * k * (p - 1) / p, (t, words, state.last)
    return worst


def main() -> None:
    comm = cc.init("mpi")
    p = comm.size
    k = 24 * p
    n = 64 * k
    check_balanced(comm, n, k)
    if p > 1:
        check_uneven_blocks(comm, n, k + 1)
        check_refresh(comm, n, k)
    check_skewed(comm, n, k)
    check_topka_gtopk(comm, n, k)
    worst = check_drifting(comm, 8192, 80)
    if comm.rank == 0:
        print(f"drifting: worst non-refresh volume = {worst:.2f} x the 2k(P-1)/P bound")
        print("OK")


if __name__ == "__main__":
    main()
