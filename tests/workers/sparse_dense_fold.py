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
import functools
import os
import sys
import tempfile

import numpy as np
from _common import assert_identical_across_ranks, rng_for
from mpi4py import MPI

from cupycoll.comm.mpi import MPICommunicator
from cupycoll.sparse import sparse_allreduce
from cupycoll.sparse._cost import Cost, Shape
from cupycoll.sparse.auto import call_cost

CASES = [  # n, k, width, value dtype, op, pattern
    (1000, 120, 0, "float32", "sum", "random"), (1000, 999, 0, "float32", "sum", "random"),
    (37, 9, 0, "float64", "sum", "cancel"), (513, 60, 8, "float32", "sum", "random"),
    (300, 40, 9, "float16", "avg", "random"), (90, 30, 8, "int32", "sum", "cancel"), (777, 100, 0, "int64", "sum", "zeros"),
    (200, 50, 0, "int32", "sum", "empty_some"), (400, 80, 0, "float32", "max", "random"),
    (400, 80, 3, "float64", "min", "cancel"), (5, 5, 0, "float32", "sum", "random"),
    (64, 0, 8, "float32", "sum", "random"), (2049, 300, 16, "float64", "sum", "zeros"),
    (300, 200, 0, "float32", "sum", "negzero"), (40, 40, 0, "float64", "avg", "negzero"),
    (60, 30, 4, "float32", "sum", "negzero"), (30, 30, 3, "float64", "sum", "special"),
    (50, 20, 0, "float32", "sum", "cancel"), (64, 20, 0, "float16", "sum", "random"),
    (64, 20, 0, "float64", "prod", "random")]


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
        if pattern == "negzero":  # -0 at every third entry on every rank, +0 on odd ranks
            val[::3] = -0.0
            val[1::3] = -0.0 if r % 2 == 0 else 0.0
        if pattern == "special":
            val = val.astype(dtype)
            val[::4] = [np.inf, -np.inf, np.nan, -0.0][r % 4]
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
    with np.errstate(invalid="ignore"):  # inf + -inf
        summed = functools.reduce(np.add, dense)  # a left fold: numpy's sum starts from +0
    total = {"sum": summed, "avg": summed / size, "max": stack.max(0),
             "min": stack.min(0), "prod": stack.prod(0)}[op]
    union = np.flatnonzero(seen)
    return union, total[union]


def signed_zero_cost(inputs, n: int, size: int, op: str, rank: int) -> Cost:
    """The data-dependent traffic the -0 fill adds when some rank holds a -0 float value, from
    the documented rule: a count per rank (allgather), then every peer's rows with a -0
    element (8 bytes each, one message per peer with some), then one int32 holder count per
    distinct such row (allreduce)."""
    values = [v for _, v in inputs]
    if (op not in ("sum", "avg") or values[0].dtype.kind != "f" or values[0].itemsize < 4
            or not any(((v == 0) & np.signbit(v)).any() for v in values)):
        return Cost()
    rows = [set(idx[((val.reshape(len(idx), -1) == 0)
                     & np.signbit(val.reshape(len(idx), -1))).any(axis=1)].tolist())
            for idx, val in inputs]
    distinct = len(set().union(*rows))
    c = Cost()
    if size > 1:
        others = [len(r) for q, r in enumerate(rows) if q != rank]
        c.book("dense.signed_zeros.counts", (size - 1) * 8, size - 1)
        c.book("dense.signed_zeros", 8 * sum(others), sum(1 for k in others if k))
        if distinct:
            c.book("dense.signed_zeros.held", (2 * (size - 1) * 4 * distinct) // size,
                   2 * (size - 1))
    return c


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
        got_values = res.values.astype(np.float64)
        assert np.allclose(got_values, want, atol=tol, rtol=0, equal_nan=True), \
            f"{label}: values differ"
        if np.dtype(dtype).kind == "f":  # the ±0 rule: -0 only where every rank holds -0
            zero = want == 0
            assert np.array_equal(np.signbit(got_values[zero]), np.signbit(want[zero])), \
                f"{label}: signs of zeros differ"
        # the dtype the reduction runs in: float16's own, but float32 for its average
        acc = np.dtype(np.float32 if (dtype, op) == ("float16", "avg") else dtype)
        shape = dataclasses.replace(Shape.from_inputs(
            [i for i, _ in inputs], n, width, 4, acc.itemsize), op=op,
            float_values=acc.kind == "f" and acc.itemsize >= 4)
        model = call_cost("dense", shape, rank).add(signed_zero_cost(inputs, n, size, op, rank))
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
    assert profile.links == {}, profile.links  # one node: no per-link prices
    assert set(profile.gamma) == {"merge", "merge2", "row", "dense", "dense_row", "dense_rows",
                                  "dense_wide", "scan", "code", "fill", "fold", "fold2", "union"}, \
        profile.gamma
    assert all(v >= 0 for v in profile.gamma.values()), profile.gamma
    from cupycoll.tuner.calibrate import CURVE_SIZES

    curve = profile.native_curve  # one point per size, by booked bytes, time never falling
    if comm.size > 1:
        factor = 2 * (comm.size - 1) / comm.size
        assert [v for v, _ in curve] == [float(int(factor * (b // 4 * 4))) for b in CURVE_SIZES]
        assert all(t0 <= t1 for (_, t0), (_, t1) in zip(curve, curve[1:])) and curve[0][1] > 0
    else:
        assert curve == []
    assert_identical_across_ranks(np.frombuffer(repr(profile.as_dict()).encode(), np.uint8))
    if comm.rank == 0:
        with tempfile.TemporaryDirectory() as tmp:
            path = save_profile(profile, os.path.join(tmp, "p.json"))
            assert load_profile(path) == profile
    if comm.size in (3, 4):  # 2 ranks per node: intra among node mates, inter along the rails
        os.environ["CUPYCOLL_RANKS_PER_NODE"] = "2"
        try:
            nodes = tune(comm, repeats=2)
        finally:
            os.environ.pop("CUPYCOLL_RANKS_PER_NODE")
        assert set(nodes.links) == {"intra", "inter"}, nodes.links
        for prices in nodes.links.values():
            assert set(prices) == {"alpha_p2p", "alpha_msg", "beta_p2p"}, prices
            assert all(np.isfinite(v) and v >= 0 for v in prices.values()), prices
        assert nodes.link("inter").alpha_p2p == nodes.links["inter"]["alpha_p2p"]
        assert nodes.meta["nodes"] == 2
        assert_identical_across_ranks(np.frombuffer(repr(nodes.as_dict()).encode(), np.uint8))


if __name__ == "__main__":
    main()
