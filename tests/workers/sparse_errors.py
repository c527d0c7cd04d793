"""Bad sparse_allreduce arguments raise the right error on EVERY rank, quickly, never a hang.

Usage: sparse_errors.py   (3+ ranks)

Each case breaks the arguments of one rank (or of all ranks, or makes ranks disagree); every
rank must raise the expected type within a few seconds, the message must name the argument and
the offending rank, and a correct call right after must still work (nothing left in flight).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from cupycoll.comm.mpi import MPICommunicator
from cupycoll.errors import InvalidArgument, InvalidType, MismatchError
from cupycoll.sparse import sparse_allreduce

N = 100


class BrokenTensor:
    """A DLPack object that fails with a non-cupycoll exception when asked its device."""

    def __dlpack__(self, **kw):
        raise AssertionError("never asked")

    def __dlpack_device__(self):
        raise RuntimeError("device lost")


def good(rank: int) -> dict:
    return dict(indices=np.array([rank, 7, 50], np.int64),
                values=np.array([1.0, 2.0, 3.0], np.float32), n=N)


def cases(size: int):
    """(name, fn(rank) -> kwargs, expected type, offending rank(s) or None, text in message)."""
    last = size - 1

    def on(victim, **bad):
        return lambda r: {**good(r), **(bad if r == victim else {})}

    def all_(**bad):
        return lambda r: {**good(r), **bad}

    def per_rank(key, fn):
        return lambda r: {**good(r), key: fn(r)}

    yield "index >= n on rank 1", on(1, indices=np.array([1, N + 5, 3])), InvalidArgument, 1, \
        str(N + 5)
    yield "negative index on last rank", on(last, indices=np.array([-4, 2, 3])), \
        InvalidArgument, last, "-4"
    yield "index n beside index 0 on rank 1", on(1, indices=np.array([0, 3, N])), \
        InvalidArgument, 1, f"(got {N})"  # the index out of range is named, not the lowest
    yield "float indices on rank 0", on(0, indices=np.array([1.0, 2.0, 3.0])), InvalidType, 0, \
        "indices"
    yield "3-D values on rank 1", on(1, values=np.zeros((3, 2, 2), np.float32)), \
        InvalidArgument, 1, "values"
    yield "length mismatch on last rank", on(last, values=np.zeros(2, np.float32)), \
        InvalidArgument, last, "values"
    yield "list values on rank 2", on(2, values=[1.0, 2.0, 3.0]), InvalidType, 2, "values"
    yield "complex values on rank 0", on(0, values=np.zeros(3, np.complex64)), InvalidType, 0, \
        "values"
    yield "2-D indices on rank 1", on(1, indices=np.zeros((3, 1), np.int64)), InvalidArgument, \
        1, "indices"
    yield "float n on rank 2", on(2, n=100.0), InvalidType, 2, "'n'"
    yield "n = 0 everywhere", all_(n=0), InvalidArgument, None, "'n'"
    yield "bad op on rank 1", lambda r: {**good(r), "op": "xor" if r == 1 else "sum"}, \
        InvalidArgument, 1, "op"
    yield "unknown algorithm everywhere", lambda r: {**good(r), "algorithm": "ring"}, \
        InvalidArgument, None, "split"
    yield "unknown algorithm on rank 2", lambda r: {**good(r), "algorithm": "ring" if r == 2
                                                    else "split"}, InvalidArgument, 2, "algorithm"
    yield "bad accumulate_dtype on rank 0", lambda r: {**good(r), "accumulate_dtype":
                                                       "complex64" if r == 0 else None}, \
        InvalidType, 0, "accumulate_dtype"
    yield "non-callable completion_fn on rank 1", lambda r: {
        **good(r), "completion_fn": 3 if r == 1 else None}, InvalidType, 1, "completion_fn"
    yield "n differs on last rank", per_rank("n", lambda r: N + (r == last)), MismatchError, \
        None, "n ("
    yield "value dtype differs", lambda r: {**good(r), "values": np.ones(3, np.float64 if r == 1
                                                                     else np.float32)}, \
        MismatchError, None, "value_dtype"
    yield "index dtype differs", lambda r: {**good(r), "indices": good(r)["indices"].astype(
        np.int32 if r == 0 else np.int64)}, MismatchError, None, "index_dtype"
    yield "width differs", lambda r: {**good(r), "values": np.ones((3, 2 + (r == 1)),
                                                                   np.float32)}, \
        MismatchError, None, "width"
    yield "op differs", lambda r: {**good(r), "op": "max" if r == last else "sum"}, \
        MismatchError, None, "op"
    yield "algorithm differs", lambda r: {**good(r), "algorithm": "mask" if r == 1 else "split"}, \
        MismatchError, None, "algorithm"
    yield "async_op differs", lambda r: {**good(r), "async_op": r == 0}, MismatchError, None, \
        "async_op"
    yield "unknown output on rank 2", on(2, output="coo"), InvalidArgument, 2, "output"
    yield "output differs", lambda r: {**good(r), "output": "dense" if r == 1 else "sparse"}, \
        MismatchError, None, "output (sparse on rank"
    yield "out without output='dense' on rank 0", on(0, out=np.zeros(N, np.float32)), \
        InvalidArgument, 0, "out"
    yield "out of the wrong length on rank 1", lambda r: {
        **good(r), "output": "dense", "out": np.zeros(N + (r == 1), np.float32)}, \
        InvalidArgument, 1, "out"
    yield "out of the wrong dtype on last rank", lambda r: {
        **good(r), "output": "dense", "out": np.zeros(N, np.float64 if r == last
                                                      else np.float32)}, InvalidArgument, last, \
        "'out'"
    yield "read-only out on rank 1", lambda r: {
        **good(r), "output": "dense", "out": np.broadcast_to(np.float32(0), (N,)) if r == 1
        else np.zeros(N, np.float32)}, InvalidArgument, 1, "'out'"
    yield "strided out on rank 2", lambda r: {
        **good(r), "output": "dense", "out": np.zeros(2 * N, np.float32)[::2] if r == 2
        else np.zeros(N, np.float32)}, InvalidArgument, 2, "'out'"
    yield "alloc_fn with output='dense' on rank 0", lambda r: {
        **good(r), "output": "dense", "alloc_fn": (lambda *a: None) if r == 0 else None}, \
        InvalidArgument, 0, "alloc_fn"
    yield "foreign exception on rank 1", on(1, values=BrokenTensor()), InvalidArgument, 1, \
        "values"
    yield "two ranks bad", lambda r: {**good(r), "indices": np.array([r, N + r, 0])
                                      if r in (1, 2) else good(r)["indices"]}, \
        InvalidArgument, (1, 2), "index out of range"


def main() -> None:
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=20)
    size, rank = comm.size, comm.rank
    assert size >= 3, "run on 3+ ranks"
    for name, make, exc_type, culprit, text in cases(size):
        start = time.monotonic()
        try:
            sparse_allreduce(comm=comm, **make(rank))
        except exc_type as caught:
            error, message = caught, str(caught)
        else:
            raise AssertionError(f"rank {rank}, {name}: no {exc_type.__name__} raised")
        elapsed = time.monotonic() - start
        assert elapsed < 5, f"rank {rank}, {name}: took {elapsed:.1f} s"
        assert text in message, f"rank {rank}, {name}: {text!r} not in {message!r}"
        if exc_type is InvalidArgument and name.startswith(("index ", "negative index")):
            assert error.argument == "indices", f"rank {rank}, {name}: {error.argument!r}"  # n too
            assert f"n={N})" in message, f"rank {rank}, {name}: {message}"
        if isinstance(culprit, tuple):  # a bad rank names itself, the others the first bad rank
            culprit = rank if rank in culprit else culprit[0]
        if culprit is not None:
            assert getattr(error, "rank", None) == culprit, f"rank {rank}, {name}: {message}"
            assert f"rank {culprit}" in message, f"rank {rank}, {name}: {message}"
        res = sparse_allreduce(comm=comm, **good(rank))  # the communicator still works
        assert res.indices.tolist() == sorted({*range(size), 7, 50}), name
    # a wrong-sized buffer from alloc_fn raises (locally: every rank got the same bad buffer)
    try:
        sparse_allreduce(comm=comm, **good(rank),
                         alloc_fn=lambda k, it, vs, vt, ctx: (np.empty(k + 1, it),
                                                              np.empty(vs, vt)))
    except InvalidArgument as exc:
        assert "alloc_fn" in str(exc) and "index_buf" in str(exc), str(exc)
    else:
        raise AssertionError("alloc_fn with a wrong-sized buffer did not raise")
    comm.barrier()
    if rank == 0:
        print(f"ok error cases on {size} ranks")


if __name__ == "__main__":
    main()
