"""The ``dense`` algorithm's two presence paths, exactly, against an independent numpy reference.

Usage: sparse_dense_fold.py SEED

Folded presence (sum/avg of rows of width >= 8: a count per row in the tail of the values'
allreduce) and the packed bitmap (1-D values; max/min/prod): the union must be exactly the union of the inputs' indices (entries that
cancel to 0, explicit zeros and empty ranks included), the values the float64/int64 sums or
maxima of the densified inputs (integer-valued inputs: exact), the traffic equal to the cost
model per op name, and the result bitwise identical on every rank. The tuner's ``tune`` is run
once (2 repeats) and every rank must hold the same profile.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

import numpy as np
from _common import assert_identical_across_ranks, rng_for
from mpi4py import MPI

from cupycoll.comm.mpi import MPICommunicator
from cupycoll.sparse import sparse_allreduce
from cupycoll.sparse._cost import Shape
from cupycoll.sparse.auto import call_cost

CASES = [  # n, k, width, value dtype, op, pattern
    (1000, 120, 0, "float32", "sum", "random"), (1000, 999, 0, "float32", "sum", "random"),
    (37, 9, 0, "float64", "sum", "cancel"), (513, 60, 8, "float32", "sum", "random"),
    (300, 40, 9, "float16", "avg", "random"), (90, 30, 8, "int32", "sum", "cancel"), (777, 100, 0, "int64", "sum", "zeros"),
    (200, 50, 0, "int32", "sum", "empty_some"), (400, 80, 0, "float32", "max", "random"),
    (400, 80, 3, "float64", "min", "cancel"), (5, 5, 0, "float32", "sum", "random"),
    (64, 0, 8, "float32", "sum", "random"), (2049, 300, 16, "float64", "sum", "zeros")]


def inputs_of(seed: int, case: int, size: int):
    n, k, width, dtype, op, pattern = CASES[case]
    out = []
    for r in range(size):
        rng = rng_for(seed, r, case)
        kk = 0 if pattern == "empty_some" and r % 2 else min(k, n)
        idx = np.sort(rng.choice(n, kk, replace=False)).astype(np.int32)
        shape = (kk, width) if width else (kk,)
        val = rng.integers(-3, 4, shape).astype(dtype)
        if pattern == "zeros":
            val[::2] = 0
        if pattern == "cancel":  # rank r and r+1 put opposite values at the same indices
            idx = np.sort(rng_for(seed, r // 2 * 2, case).choice(n, min(k, n), replace=False))
            idx = idx.astype(np.int32)
            val = rng_for(seed, r // 2 * 2, case + 99).integers(1, 4, shape).astype(dtype)
            val = -val if r % 2 else val
        out.append((idx, val))
    return out


def reference(inputs, n: int, width: int, op: str, size: int):
    shape = (n, width) if width else (n,)
    seen = np.zeros(n, bool)
    dense = [np.zeros(shape) for _ in inputs]
    for d, (idx, val) in zip(dense, inputs):
        d[idx] = val
        seen[idx] = True
    stack = np.stack(dense)
    total = {"sum": stack.sum(0), "avg": stack.sum(0) / size, "max": stack.max(0),
             "min": stack.min(0)}[op]
    union = np.flatnonzero(seen)
    return union, total[union]


def main() -> None:
    seed = int(sys.argv[1])
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=60)
    size, rank = comm.size, comm.rank
    results = []
    for case, (n, k, width, dtype, op, pattern) in enumerate(CASES):
        inputs = inputs_of(seed, case, size)
        comm.stats.reset()
        res = sparse_allreduce(*inputs[rank], n, op=op, algorithm="dense", comm=comm)
        union, want = reference(inputs, n, width, op, size)
        label = f"rank {rank} case {case} {CASES[case]}"
        assert np.array_equal(res.indices, union), f"{label}: union differs"
        assert res.indices.dtype == np.int32 and res.values.dtype == np.dtype(dtype), label
        tol = 1e-2 if dtype == "float16" and op == "avg" else 0
        assert np.allclose(res.values.astype(np.float64), want, atol=tol, rtol=0), \
            f"{label}: values differ"
        shape = dataclasses.replace(Shape.from_inputs(
            [i for i, _ in inputs], n, width, 4, np.dtype(dtype).itemsize), op=op)
        model = call_cost("dense", shape, rank)
        got = {o: (s.bytes_received, s.messages_received) for o, s in comm.stats.by_op.items()
               if s.bytes_received or s.messages_received}
        assert got == {o: (model.received[o], model.messages[o]) for o in model.received}, \
            f"{label}: traffic {got} != model {model.received} {model.messages}"
        results += [res.indices, res.values]
    assert_identical_across_ranks(*results)
    check_tune(comm)
    if rank == 0:
        print(f"ok {len(CASES)} dense cases on {size} ranks")


def check_tune(comm) -> None:
    """``tune`` writes a profile on rank 0 that every rank holds identically."""
    from cupycoll.tuner.calibrate import tune
    from cupycoll.tuner.profile import load_profile, save_profile

    profile = tune(comm, repeats=2)
    assert set(profile.gamma) == {"merge", "row", "dense", "scan", "code"}, profile.gamma
    assert all(v >= 0 for v in profile.gamma.values()), profile.gamma
    assert_identical_across_ranks(np.frombuffer(repr(profile.as_dict()).encode(), np.uint8))
    if comm.rank == 0:
        with tempfile.TemporaryDirectory() as tmp:
            path = save_profile(profile, os.path.join(tmp, "p.json"))
            assert load_profile(path) == profile


if __name__ == "__main__":
    main()
