"""Soak: many calls of random sizes, verbs, algorithms, sync and async; memory must stay flat.

    soak.py CALLS [MAX_GROWTH]

Every call's input comes from a seed all ranks share, so each rank checks dense and sparse
results against numpy sums of every rank's regenerated input. RSS is read after the first
third of the calls and at the end; growth must stay below MAX_GROWTH (default 0.03). A leak
grows with the calls; warming up does not: caches, pools and the allocator's arenas add a
one-off ~2 MB step that lands anywhere in the first ~600 calls (measured: a warm point at a
tenth gave +2.6% or +6.4% run to run, at a third +0.6-0.9%). Rank 0 prints calls, seconds, RSS before/after.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import cupycoll as cc
from _common import rng_for

CALLS = int(sys.argv[1])
MAX_GROWTH = float(sys.argv[2]) if len(sys.argv) > 2 else 0.03
comm = cc.init("mpi", timeout=60)
P, RANK = comm.size, comm.rank
SPARSE, TOPK = cc.algorithms("sparse"), cc.algorithms("topk")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def dense_input(i: int, r: int, n: int) -> np.ndarray:
    return rng_for(i, r).integers(-50, 50, n).astype(np.float32)


def sparse_input(i: int, r: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = rng_for(i, r)
    idx = np.sort(rng.choice(n, int(rng.integers(0, min(n, 64) + 1)), replace=False))
    return idx.astype(np.int64), rng.integers(-9, 9, idx.size).astype(np.float32)


def one_call(i: int, pick: np.random.Generator, pending: list) -> None:
    kind = int(pick.integers(0, 4))
    n = int(pick.integers(1, 4000))
    async_op = bool(pick.integers(0, 2))
    if kind == 0:
        got = cc.allreduce(dense_input(i, RANK, n), comm=comm, async_op=async_op)
        want = sum(dense_input(i, r, n) for r in range(P))
        pending.append((got, lambda res, want=want: np.array_equal(res, want)))
    elif kind == 1:
        algorithm = SPARSE[int(pick.integers(0, len(SPARSE)))]
        got = cc.sparse_allreduce(*sparse_input(i, RANK, n), n, comm=comm, algorithm=algorithm,
                                  async_op=async_op)
        want = np.zeros(n, np.float32)
        for r in range(P):
            idx, val = sparse_input(i, r, n)
            np.add.at(want, idx, val)

        def same(res, want=want):
            dense = np.zeros(n, np.float32)
            dense[res.indices] = res.values
            return np.array_equal(dense, want)
        pending.append((got, same))
    elif kind == 2:
        k = int(pick.integers(1, n + 1))
        res = cc.topk_allreduce(dense_input(i, RANK, n), k, comm=comm,
                                algorithm=TOPK[int(pick.integers(0, len(TOPK)))])
        assert np.all(np.diff(res.indices) > 0) and (res.indices.size == 0
                                                     or 0 <= res.indices[0] <= res.indices[-1] < n)
    else:
        got = cc.broadcast(dense_input(i, RANK, n), root=int(pick.integers(0, P)), comm=comm,
                           async_op=async_op)
        pending.append((got, lambda res: res.shape == (n,)))
    if len(pending) > 4 or not async_op:
        for got, ok in pending:
            res = got.wait() if isinstance(got, cc.Work) else got
            assert ok(res), f"call {i}: wrong result"
        pending.clear()


def main() -> None:
    pick = np.random.default_rng(12)  # the same sequence of choices on every rank
    pending: list = []
    start, warm = time.monotonic(), 0
    for i in range(CALLS):
        if i == CALLS // 3:
            warm = rss_bytes()
        one_call(i, pick, pending)
    for got, ok in pending:
        assert ok(got.wait() if isinstance(got, cc.Work) else got)
    end = rss_bytes()
    growth = (end - warm) / warm
    every = comm.mpi_comm.allgather(growth)
    if RANK == 0:
        print(f"SOAK calls={CALLS} P={P} seconds={time.monotonic() - start:.1f} "
              f"rss_growth={', '.join(f'{g:+.2%}' for g in every)}")
    assert growth < MAX_GROWTH, f"rank {RANK}: RSS grew {growth:.1%}"
    print("OK")


main()
