"""A large asynchronous ``reduce`` (the MPI backend's pairwise exchange and gather, whose second
phase each rank posts after its first completes) progresses as MPI's nonblocking collectives do,
without a wait of its own on this communicator:

- ``dropped``: every rank but the root drops its Work without waiting (``close()``-ing the
  communicator on odd ranks) and ends; the root's wait completes (before: it waited forever).
- ``crossed``: the root waits for the reduce, then an allreduce on a duplicate; the others run
  that allreduce first and wait for the reduce after (before: every rank waited forever).
- ``closed``: every rank closes the communicator with the reduce pending, then waits for it
  (before: ``BackendUnavailable``).

Sums of small integers checked against the exact total; runs without a timeout (the launch's
own timeout is the hang detector)."""

from __future__ import annotations

import gc
import sys

import numpy as np

import cupycoll as cc

comm = cc.init("mpi", timeout=0)
RANK, P = comm.rank, comm.size
COUNT = 70_000  # 560 KB of float64: above CUPYCOLL_REDUCE_PAIRWISE's 256 KiB
x = np.arange(COUNT, dtype=np.float64) % 7 + RANK
total = P * (np.arange(COUNT) % 7) + P * (P - 1) / 2
scenario = sys.argv[1]

work = cc.reduce(x, root=0, async_op=True, comm=comm)
if scenario == "dropped":
    if RANK > 0:
        del work
        gc.collect()
        if RANK % 2:
            comm.close()
    else:
        assert np.array_equal(work.wait(), total)
elif scenario == "crossed":
    twin = comm.dup()
    if RANK == 0:
        assert np.array_equal(work.wait(), total)
    summed = cc.allreduce(np.ones(4), comm=twin)
    if RANK > 0:
        work.wait()
    assert np.array_equal(summed, np.full(4, float(P)))
elif scenario == "closed":
    comm.close()
    result = work.wait()
    if RANK == 0:
        assert np.array_equal(result, total)
print(f"PAIRWISE rank {RANK} {scenario} ok", flush=True)
