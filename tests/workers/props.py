"""Property-based tests (hypothesis) over the public API's arguments, on 1 or 2 ranks.

    props.py EXAMPLES

Every rank draws the same examples (derandomized, no shrinking: the ranks stay in lockstep)
and uses its own part of each. Property: a call either returns what numpy computes from every
rank's input (the reference is built from first principles, not from cupycoll), or raises a
cupycoll error (a typed CupycollError) on **every** rank, never an untyped exception, a hang
or a result on some ranks and an error on others.
"""

from __future__ import annotations

import sys

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import cupycoll as cc
from cupycoll.errors import CupycollError

WORLD = MPI.COMM_WORLD
P, RANK = WORLD.size, WORLD.rank
comm = cc.init("mpi", timeout=30)
SETTINGS = settings(max_examples=int(sys.argv[1]), derandomize=True, database=None,
                    deadline=None, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck))
GOOD_DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "int64"]
DTYPES = GOOD_DTYPES * 3 + ["complex64", "bool"]  # mostly valid: both paths get examples
OPS = ["sum", "prod", "max", "min", "avg"] * 3 + ["mean", 3]


def outcome(fn) -> tuple[str, object]:
    """("ok", result) or (error class name, message); untyped exceptions propagate."""
    try:
        return "ok", fn()
    except CupycollError as exc:
        return type(exc).__name__, str(exc)


def agree(kind: str) -> list[str]:
    """Every rank's outcome kind; fail unless all succeeded or all raised typed errors."""
    every = WORLD.allgather(kind)
    assert all(k == "ok" for k in every) or all(k != "ok" for k in every), every
    return every


def reduce_reference(arrays: list[np.ndarray], op: str) -> np.ndarray:
    """op over ranks, elementwise, in float64 (inputs are small integers: exact)."""
    stack = np.stack([a.astype(np.float64) for a in arrays])
    if op == "avg":
        total = stack.sum(0) / P
        return np.trunc(total) if arrays[0].dtype.kind in "iu" else total
    return {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op](stack, axis=0)


@SETTINGS
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 5), max_size=2),
       op=st.sampled_from(OPS), seed=st.integers(0, 2**16), verb=st.sampled_from(
           ["allreduce", "reduce", "broadcast", "allgather", "reduce_scatter"]),
       root=st.sampled_from([0, P - 1] * 4 + [P, -1, "0", True]))
def test_dense(dtype, shape, op, seed, verb, root):
    inputs = [np.random.default_rng([seed, r]).integers(0, 4, shape).astype(dtype)
              for r in range(P)]
    x = inputs[RANK]
    call = {"allreduce": lambda: cc.allreduce(x, op, comm=comm),
            "reduce": lambda: cc.reduce(x, root, op, comm=comm),
            "broadcast": lambda: cc.broadcast(x, root, comm=comm),
            "allgather": lambda: cc.allgather(x, comm=comm),
            "reduce_scatter": lambda: cc.reduce_scatter(x, op, comm=comm)}[verb]
    kind, got = outcome(call)
    agree(kind)
    if kind != "ok":
        return
    assert dtype not in ("complex64", "bool"), "an unsupported dtype was accepted"
    if verb == "broadcast":
        want = inputs[root]
    elif verb == "allgather":
        want = np.concatenate(inputs)
    else:
        assert op in ("sum", "prod", "max", "min", "avg"), f"op {op!r} was accepted"
        want = reduce_reference(inputs, op)
        if verb == "reduce_scatter":
            want = np.split(want, P)[RANK]
        if verb == "reduce" and RANK != root:
            assert got is None
            return
    assert got.dtype == x.dtype and np.array_equal(got.astype(np.float64), want), (got, want)


@SETTINGS
@given(n=st.sampled_from([1, 7, 64] * 3 + [0, -3, True, 2.0]), seed=st.integers(0, 2**16),
       index_dtype=st.sampled_from(["int32", "int64"] * 3 + ["float32", "uint8"]),
       value_dtype=st.sampled_from(["float32", "float64", "int32", "int64"] * 2 + ["complex64"]),
       op=st.sampled_from(["sum", "max", "min", "avg"] * 2 + ["bogus"]),
       algorithm=st.sampled_from(list(cc.algorithms("sparse")) * 2 + ["bogus"]),
       bad_rank=st.sampled_from([None] * 6 + [0, P - 1]), width=st.sampled_from([0, 0, 2]))
def test_sparse(n, seed, index_dtype, value_dtype, op, algorithm, bad_rank, width):
    length = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 8

    def local(r):
        rng = np.random.default_rng([seed, r])
        idx = rng.integers(0, length, int(rng.integers(0, 2 * length + 1)))
        if r == bad_rank:
            idx = np.append(idx, length)  # out of range on one rank only
        shape = (idx.size, width) if width else (idx.size,)
        return idx.astype(index_dtype), rng.integers(-5, 6, shape).astype(value_dtype)
    inputs = [local(r) for r in range(P)]
    kind, got = outcome(lambda: cc.sparse_allreduce(*inputs[RANK], n, op=op,
                                                    algorithm=algorithm, comm=comm))
    agree(kind)
    if kind != "ok":
        return
    assert bad_rank is None and algorithm != "bogus" and op != "bogus", "bad input accepted"
    dense = np.full((P, length) + ((width,) if width else ()), np.nan)
    for r, (idx, val) in enumerate(inputs):  # reduce duplicates per rank, then across ranks
        for i, v in zip(idx, val.astype(np.float64)):
            cur = dense[r, i]
            first = np.isnan(cur)
            dense[r, i] = np.where(first, v, {"sum": cur + v, "avg": cur + v,
                                              "max": np.maximum(cur, v),
                                              "min": np.minimum(cur, v)}[op])
    touched = ~np.all(np.isnan(dense), axis=(0,) + tuple(range(2, dense.ndim)))
    want_idx = np.flatnonzero(touched)
    assert np.array_equal(np.asarray(got.indices), want_idx), (got.indices, want_idx)
    rows = np.nan_to_num(dense[:, want_idx], nan=0.0)  # absent on a rank counts as 0 there
    want = {"sum": np.sum, "avg": np.sum, "max": np.max, "min": np.min}[op](rows, axis=0)
    if op == "avg":
        want = want / P
        want = np.trunc(want) if np.dtype(value_dtype).kind in "iu" else want
    assert np.allclose(np.asarray(got.values, np.float64), want), (got.values, want)


@SETTINGS
@given(n=st.integers(1, 40), k=st.sampled_from([1, 3, 40] * 2 + [0, 41, True]),
       dtype=st.sampled_from(["float32", "float64", "float16"] * 2 + ["int32"]),
       seed=st.integers(0, 2**16), algorithm=st.sampled_from(["dense"] * 4 + ["bogus"]))
def test_topk_dense(n, k, dtype, seed, algorithm):
    inputs = [(np.random.default_rng([seed, r]).permutation(n) + 1).astype(dtype) * (r + 1)
              for r in range(P)]
    kind, got = outcome(lambda: cc.topk_allreduce(inputs[RANK], k, algorithm=algorithm,
                                                  comm=comm))
    agree(kind)
    if kind != "ok":
        return
    assert algorithm == "dense" and dtype != "int32" and 0 < k <= n and k is not True
    total = np.sum([a.astype(np.float64) for a in inputs], axis=0)
    idx = np.asarray(got.indices)
    assert idx.size == k and np.all(np.diff(idx) > 0)  # no zero sums: exactly k
    assert np.allclose(np.asarray(got.values, np.float64), total[idx], rtol=1e-2)
    rest = np.delete(np.abs(total), idx)
    assert rest.size == 0 or idx.size == 0 or rest.max() <= np.abs(total[idx]).min() * 1.01


for test in (test_dense, test_sparse, test_topk_dense):
    test()
    WORLD.Barrier()
if RANK == 0:
    print("OK")
