"""Result delivery of sparse_allreduce: alloc_fn, completion_fn, async Work, env default, DLPack.

Usage: sparse_delivery.py SEED
"""

from __future__ import annotations

import os
import sys

import numpy as np
from _common import DLPackOnly, assert_identical_across_ranks, rng_for
from mpi4py import MPI

from cupycoll.comm.mpi import MPICommunicator
from cupycoll.comm import Work
from cupycoll.errors import InvalidArgument
from cupycoll.sparse import SparseResult, sparse_allreduce

N = 1000



def inputs(seed: int, rank: int, case: int, width: int = 0):
    rng = rng_for(seed, rank, case)
    idx = rng.integers(0, N, 50)
    shape = (idx.size, width) if width else (idx.size,)
    return idx, rng.integers(-5, 6, shape).astype(np.float64)


def expected(seed: int, size: int, case: int, width: int = 0):
    dense = np.zeros((N, width) if width else N)
    seen = np.zeros(N, bool)
    for r in range(size):
        idx, val = inputs(seed, r, case, width)
        np.add.at(dense, idx, val)
        seen[idx] = True
    union = np.flatnonzero(seen)
    return union, dense[union]


def main() -> None:
    seed = int(sys.argv[1])
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=30)
    size, rank = comm.size, comm.rank

    # alloc_fn: the caller's buffers come back filled
    calls = []

    def alloc(nnz, index_dtype, values_shape, value_dtype, ctx):
        calls.append((nnz, np.dtype(index_dtype), values_shape, np.dtype(value_dtype), ctx))
        return np.empty(nnz, index_dtype), np.empty(values_shape, value_dtype)

    res = sparse_allreduce(*inputs(seed, rank, 0, 4), N, comm=comm, alloc_fn=alloc, fn_ctx="ctx")
    union, want = expected(seed, size, 0, 4)
    assert calls == [(union.size, np.dtype(np.int64), (union.size, 4), np.dtype(np.float64),
                      "ctx")], calls
    assert np.array_equal(res.indices, union) and np.array_equal(res.values, want)

    # a read-only alloc_fn buffer is a typed error, not numpy's ValueError
    try:
        sparse_allreduce(*inputs(seed, rank, 0, 4), N, comm=comm, alloc_fn=lambda k, it, vs, vt,
                         c: (np.empty(k, it), np.broadcast_to(np.zeros((1,) + vs[1:], vt), vs)))
    except InvalidArgument as exc:
        assert "writable" in str(exc), str(exc)
    else:
        raise AssertionError("read-only alloc_fn buffer did not raise InvalidArgument")

    # completion_fn: called once with the result and the context
    seen = {}

    def done(indices, values, ctx):
        ctx["indices"], ctx["values"] = indices.copy(), values.copy()

    res = sparse_allreduce(*inputs(seed, rank, 1), N, comm=comm, completion_fn=done, fn_ctx=seen)
    union, want = expected(seed, size, 1)
    assert np.array_equal(seen["indices"], union) and np.array_equal(seen["values"], want)
    assert isinstance(res, SparseResult) and np.array_equal(res.values, want)

    # async: several calls in flight with sync calls between them; results in call order
    works = []
    for case in range(2, 8):
        algorithm = ["allgather", "mask", "dense", "recursive_doubling", "split", "auto"][case - 2]
        works.append(sparse_allreduce(*inputs(seed, rank, case), N, comm=comm, async_op=True,
                                      algorithm=algorithm, op="sum"))
        sync = sparse_allreduce(*inputs(seed, rank, 100 + case), N, comm=comm)
        assert np.array_equal(sync.values, expected(seed, size, 100 + case)[1])
    for case, work in zip(range(2, 8), works):
        assert isinstance(work, Work)
        got = work.result()
        assert work.is_completed()
        union, want = expected(seed, size, case)
        assert np.array_equal(got.indices, union) and np.array_equal(got.values, want), case
        assert_identical_across_ranks(got.indices, got.values)

    # async delivery errors surface from wait()
    bad = sparse_allreduce(*inputs(seed, rank, 9), N, comm=comm, async_op=True,
                           alloc_fn=lambda k, it, vs, vt, c: (np.empty(k, it), np.empty(1, vt)))
    try:
        bad.wait()
    except Exception as exc:  # InvalidArgument from the wrong-sized value buffer
        assert "alloc_fn" in str(exc), str(exc)
    else:
        raise AssertionError("wrong-sized alloc_fn buffer did not raise from wait()")

    # CUPYCOLL_ALGORITHM sets the default algorithm
    os.environ["CUPYCOLL_ALGORITHM"] = "mask"
    comm.stats.reset()
    sparse_allreduce(*inputs(seed, rank, 10), N, comm=comm)
    del os.environ["CUPYCOLL_ALGORITHM"]
    assert size == 1 or "mask.indices" in comm.stats.by_op, comm.stats.by_op

    # DLPack-only inputs come back as numpy arrays through DLPack, values correct
    idx, val = inputs(seed, rank, 11)
    res = sparse_allreduce(DLPackOnly(idx), DLPackOnly(val), N, comm=comm)
    assert np.array_equal(res.values, expected(seed, size, 11)[1])

    # avg of integers truncates toward zero, like NCCL
    ival = np.array([-7, 7, 3], np.int32) if rank == 0 else np.zeros(3, np.int32)
    res = sparse_allreduce(np.array([1, 2, 3]), ival, 10, op="avg", comm=comm)
    assert res.values.tolist() == [int(-7 / size), int(7 / size), int(3 / size)], res

    # NaN propagates like in a dense sum
    fval = np.array([np.nan, 1.0], np.float32) if rank == 0 else np.array([2.0, 3.0], np.float32)
    res = sparse_allreduce(np.array([4, 5]), fval, 10, comm=comm, algorithm="split")
    assert np.isnan(res.values[0]) and res.values[1] == 1.0 + 3.0 * (size - 1)

    # output="dense": async into the caller's buffer (and its type, through DLPack), the
    # completion callback called once with (None, the dense vector, fn_ctx), every algorithm
    union, want = expected(seed, size, 12, 3)
    dense_want = np.zeros((N, 3))
    dense_want[union] = want
    idx, val = inputs(seed, rank, 12, 3)
    for algorithm in ("auto", "dense", "split", "allgather"):
        seen = []
        out = np.full((N, 3), np.nan)
        work = sparse_allreduce(idx, val, N, comm=comm, algorithm=algorithm, output="dense",
                                out=out, async_op=True, fn_ctx="ctx",
                                completion_fn=lambda i, v, ctx: seen.append((i, v, ctx)))
        got = work.wait()
        assert got is out and np.array_equal(out, dense_want), algorithm
        assert len(seen) == 1 and seen[0][0] is None and seen[0][1] is out
        assert seen[0][2] == "ctx"
        wrapped = sparse_allreduce(DLPackOnly(idx), DLPackOnly(val), N, comm=comm,
                                   output="dense", algorithm=algorithm)
        assert np.array_equal(np.asarray(wrapped), dense_want), algorithm
    if rank == 0:
        print(f"ok delivery on {size} ranks")


if __name__ == "__main__":
    main()
