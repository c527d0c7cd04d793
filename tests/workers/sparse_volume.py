"""Bytes and messages of every sparse algorithm against its cost model, exactly, per rank.

Usage: sparse_volume.py SEED

Constructed inputs (disjoint, identical, random overlap, dense enough for recursive doubling's
switch, empty ranks) are rebuilt on every rank; after each call this rank's ``comm.stats``
(per operation name: bytes and messages received) must equal the model of the algorithm plus
the validation allreduce.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import rng_for
from mpi4py import MPI

from cupycoll.comm.mpi import MPICommunicator
from cupycoll.sparse import sparse_allreduce
from cupycoll.sparse._cost import Shape
from cupycoll.sparse.auto import call_cost

ALGORITHMS = ["allgather", "mask", "dense", "recursive_doubling", "split", "auto"]


def indices_for(pattern: str, rank: int, size: int, n: int, k: int, rng) -> np.ndarray:
    if pattern == "disjoint":
        return np.arange(rank, n, size)[:k]
    if pattern == "identical":
        return np.arange(0, n, max(n // max(k, 1), 1))[:k]
    if pattern == "empty_some":
        return np.empty(0, np.int64) if rank % 2 else np.unique(rng.integers(0, n, k))
    return np.unique(rng.integers(0, n, k))


def measured(comm) -> dict:
    return {op: (s.bytes_received, s.messages_received) for op, s in comm.stats.by_op.items()
            if s.bytes_received or s.messages_received}


def main() -> None:
    seed = int(sys.argv[1])
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=60)
    size, rank = comm.size, comm.rank
    cases = [(pattern, n, k, width, dtype, acc, itype)
             for pattern, n, k in (("disjoint", 4000, 300), ("identical", 4000, 300),
                                   ("random", 4000, 300), ("random", 64, 40),
                                   ("random", 1 << 20, 5000), ("empty_some", 500, 60))
             for width, dtype, acc, itype in ((0, "float32", None, "int32"),
                                              (3, "float16", "float32", "int64"),
                                              (0, "int64", None, "int64"))]
    checked = 0
    for c, (pattern, n, k, width, dtype, acc, itype) in enumerate(cases):
        inputs = []
        for r in range(size):
            rng = rng_for(seed, r, c)
            idx = indices_for(pattern, r, size, n, k, rng).astype(itype)
            shape = (idx.size, width) if width else (idx.size,)
            inputs.append((idx, rng.integers(-9, 10, shape).astype(dtype)))
        vbytes = np.dtype(acc or dtype).itemsize
        model_shape = Shape.from_inputs([i for i, _ in inputs], n, width,
                                        np.dtype(itype).itemsize, vbytes)
        for algorithm in ALGORITHMS:
            comm.stats.reset()
            sparse_allreduce(*inputs[rank], n, algorithm=algorithm, comm=comm,
                             accumulate_dtype=acc)
            model = call_cost(algorithm, model_shape, rank)
            want = {op: (model.received[op], model.messages[op]) for op in model.received}
            got = measured(comm)
            assert got == want, (f"rank {rank} {algorithm} {pattern} n={n} k={k} w={width} "
                                 f"{dtype}/{acc} {itype}:\n got  {sorted(got.items())}\n"
                                 f" want {sorted(want.items())}")
            assert comm.stats.bytes_received == model.bytes_received
            checked += 1
    if rank == 0:
        print(f"ok {checked} volume checks on {size} ranks")


if __name__ == "__main__":
    main()
