"""Every sparse algorithm gives the same bits for NaN, +-inf and +-0, on every rank.

Usage: sparse_semantics.py SEED

Values are exact in every dtype (small integers, halves, +-0, +-inf, NaN), so the order of the
arithmetic cannot show, and every algorithm must return exactly the numpy reference of
sparse_random (absent entries count as +0; a +0/-0 tie gives +0 for max and -0 for min; NaN is
numpy's NaN, bit for bit): the same bits in allgather, mask, dense, recursive_doubling, split,
hierarchical and auto, for every op and float dtype, 1-D and rows, with indices present on every
rank ("full", so products are not absent zeros) or on some; with ``output="dense"`` the same bits
at the union and +0 elsewhere. Results must also be bitwise identical on every rank.
"""

from __future__ import annotations

import os
import sys
from unittest import mock

import numpy as np
from _common import assert_identical_across_ranks, rng_for
from mpi4py import MPI
from sparse_random import ALGORITHMS, reference, same_bits

from cupycoll.comm.mpi import MPICommunicator
from cupycoll.sparse import sparse_allreduce

EXACT = np.array([-2, -1, -0.5, -0.0, 0.0, 0.5, 1, 2, 3, np.nan, np.inf, -np.inf])
N = 24
#: the bits of numpy's NaN in each float dtype: every NaN of a result must have them.
CANONICAL = {d: np.array(np.nan, d).view(f"u{np.dtype(d).itemsize}")
             for d in ("float16", "float32", "float64")}


def rank_input(seed: int, case: int, rank: int, pattern: str, width: int, dtype: str):
    """One rank's entries: every index ("full") or a random subset, values from EXACT."""
    rng = rng_for(seed, rank, case)
    idx = np.arange(N) if pattern == "full" else np.flatnonzero(rng.random(N) < 0.5)
    rng.shuffle(idx)
    shape = (idx.size,) + ((width,) if width else ())
    # NaN and inf in one entry of ten, so most indices stay finite and their zeros show
    weights = np.where(np.isfinite(EXACT), 9.0 / np.isfinite(EXACT).sum(), 1 / 3)
    return idx, rng.choice(EXACT, shape, p=weights / weights.sum()).astype(dtype)


def main() -> None:
    """The checks with hierarchical over nodes of 2 ranks (P = 3 has a short node)."""
    # the reference meets inf - inf and 0 * inf on purpose
    with mock.patch.dict(os.environ, CUPYCOLL_RANKS_PER_NODE="2"), np.errstate(all="ignore"):
        check(int(sys.argv[1]))


def overflowing(rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Finite values whose product (P = 3: rank 2 holds no row 5) or pairwise sum (P = 4)
    overflows both ways; one row elsewhere."""
    big = {3: [1e30, 1e30, None], 4: [3e38, 3e38, -3e38, -3e38]}.get(size, [None] * size)
    if big[rank] is None:
        return np.array([1]), np.array([1.0], np.float32)
    return np.array([5]), np.array([big[rank]], np.float32)


def check(seed: int) -> None:
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=60)
    size, rank, case, results = comm.size, comm.rank, 0, []
    for dtype in ("float16", "float32", "float64"):
        for op in ("sum", "prod", "max", "min", "avg"):
            for pattern in ("full", "some"):
                for width in (0, 3):
                    case += 1
                    prm = dict(op=op, dtype=dtype, width=width)
                    inputs = [rank_input(seed, case, r, pattern, width, dtype)
                              for r in range(size)]
                    ref_idx, ref_val, _, _ = reference(inputs, prm, size)
                    want = ref_val.astype(dtype)
                    for algorithm in ALGORITHMS:
                        res = sparse_allreduce(*inputs[rank], N, op=op, algorithm=algorithm,
                                               comm=comm)
                        where = f"{algorithm} {prm} {pattern}"
                        assert np.array_equal(res.indices, ref_idx), where
                        assert same_bits(res.values, want), \
                            f"{where}: got\n{res.values}\nwant\n{want}"
                        results += [res.indices, res.values]
                        dense = sparse_allreduce(*inputs[rank], N, op=op, algorithm=algorithm,
                                                 comm=comm, output="dense")
                        absent = np.setdiff1d(np.arange(N), ref_idx)
                        assert not dense[absent].view(np.uint8).any(), f"{where}: not +0"
                        assert same_bits(dense[ref_idx], want), \
                            f"{where}, dense output: got\n{dense[ref_idx]}\nwant\n{want}"
                        results.append(dense)
                        for got in (res.values, dense):
                            nan = got[np.isnan(got)]
                            assert np.all(nan.view(f"u{nan.itemsize}") == CANONICAL[dtype]), \
                                f"{where}: a NaN without numpy's NaN bits"
    for algorithm in ALGORITHMS:  # a float16 average whose sum leaves float16's range
        big = np.array([60000, -40000, 1], np.float16)
        got = sparse_allreduce(np.arange(3), big, N, op="avg", algorithm=algorithm, comm=comm)
        assert same_bits(got.values, big), f"{algorithm}: float16 avg {got.values}"
    for algorithm in ALGORITHMS:  # finite inputs whose reduction makes a NaN (inf * 0 at
        # P = 3, inf - inf at P = 4: MPI's pairwise sum): a dense output's NaN bits too
        # and values within float32's range that a float16 wire carries as +-inf
        big = np.float32(1e5 if rank % 2 == 0 else -1e5)
        for inputs, wire_values in ((overflowing(rank, size), None),
                                    ((np.array([5]), np.array([big])), "float16")):
            got = sparse_allreduce(*inputs, N, op="prod" if size == 3 else "sum",
                                   algorithm=algorithm, comm=comm, output="dense",
                                   wire_values=wire_values)
            nan = got[np.isnan(got)]
            assert np.all(nan.view(np.uint32) == CANONICAL["float32"]), \
                f"{algorithm} {wire_values}: a NaN made by overflow without numpy's bits: {got}"
            results.append(got)
    for algorithm in ALGORITHMS:  # a dense output into the values themselves (out=values)
        for values in (np.full(N, rank + 1.0, np.float32), np.full((N, 2), rank + 1.0)):
            got = sparse_allreduce(np.arange(N), values, N, algorithm=algorithm, comm=comm,
                                   output="dense", out=values)
            assert got is values and (values == size * (size + 1) / 2).all(), \
                f"{algorithm}: out=values gave {values[:3]}"
    assert_identical_across_ranks(*results)
    if rank == 0:
        print(f"ok {case} semantics cases x {len(ALGORITHMS)} algorithms on {size} ranks")


if __name__ == "__main__":
    main()
