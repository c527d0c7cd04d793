"""Work left pending at a normal exit: rank 0 starts an asynchronous dense allreduce and ends
without waiting for it, the others wait for theirs (before: rank 0 sat in MPI_Finalize, the
others in their wait, forever without a timeout); every rank's ``add_done_callback`` on an
asynchronous sparse call runs before the process ends (before: the completer, a daemon thread,
was ended with them queued). Each callback and each waiter prints a line; runs without a
timeout (CUPYCOLL_TIMEOUT=0): the launch's own timeout is the hang detector.

With the argument ``aborted``: rank 0 leaves its allreduce pending and every other rank
aborts the communicator instead of joining it: rank 0's exit reads that on the arrival board
and ends at once (it must not wait for an operation nobody will complete).

With the argument ``thread``: the main thread returns while a non-daemon thread of the
program's own (a checkpoint thread) makes asynchronous sparse calls on its own duplicate and a
synchronous one whose numba loops run in pieces on the pool (CUPYCOLL_THREADS=2): every call
completes right (before: the interpreter's exit hook had shut both pools, "cannot schedule new
futures after shutdown", at another call on each rank)."""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import cupycoll as cc

comm = cc.init("mpi", timeout=0)
RANK, P = comm.rank, comm.size
x = np.full(1 << 16, RANK + 1.0, np.float32)
if sys.argv[1:] == ["thread"]:
    import threading
    import time

    from cupycoll.primitives import _accel

    own = comm.dup()
    _accel.ready()  # numba's loops, cut into pieces from 2**18 entries
    n = 1 << 22
    big = np.unique(np.random.default_rng(RANK).integers(0, n, 300_000))
    want = np.unique(np.concatenate([np.unique(np.random.default_rng(q).integers(
        0, n, 300_000)) for q in range(P)]))

    def checkpoint() -> None:
        time.sleep(0.5)  # the main thread has returned by now
        for i in range(5):
            idx = np.array([i, 10 + RANK], np.int64)
            got = cc.sparse_allreduce(idx, np.ones(2, np.float32), 64, comm=own,
                                      async_op=True).wait()
            assert got.indices.tolist() == sorted({i} | {10 + q for q in range(P)}), got
        got = cc.sparse_allreduce(big, np.ones(big.size, np.float32), n, op="max",
                                  algorithm="allgather", comm=own)
        assert np.array_equal(got.indices, want)
        print(f"EXIT rank {RANK} thread done", flush=True)

    threading.Thread(target=checkpoint).start()  # not a daemon: the interpreter joins it
    sys.exit(0)
if sys.argv[1:] == ["aborted"]:
    if RANK == 0:
        pending = cc.allreduce(x, async_op=True, comm=comm)
    else:
        comm.abort()
    MPI.COMM_WORLD.Barrier()
    print(f"EXIT rank {RANK} leaves", flush=True)
    sys.exit(0)
pending = cc.allreduce(x, async_op=True, comm=comm)
if RANK > 0:
    assert np.all(pending.wait() == P * (P + 1) / 2)
    print(f"EXIT rank {RANK} waited", flush=True)
idx = np.array([RANK], np.int64)
work = cc.sparse_allreduce(idx, np.ones(1, np.float32), P, comm=comm, async_op=True)
work.add_done_callback(lambda done: print(
    f"EXIT rank {RANK} callback {done.wait().values.tolist() == [1.0] * P}", flush=True))
MPI.COMM_WORLD.Barrier()  # (mpi4py's, not a collective of comm: rank 0 leaves its work as is)
