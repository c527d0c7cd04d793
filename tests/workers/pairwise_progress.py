"""A large asynchronous ``reduce`` (the MPI backend's pairwise exchange and gather, whose second
phase each rank posts after its first completes) progresses as MPI's nonblocking collectives do,
without a wait of its own on this communicator:

- ``dropped``: every rank but the root drops its Work without waiting (``close()``-ing the
  communicator on odd ranks) and ends; the root's wait completes (before: it waited forever).
- ``crossed``: the root waits for the reduce, then an allreduce on a duplicate; the others run
  that allreduce first and wait for the reduce after (before: every rank waited forever).
- ``closed``: every rank closes the communicator with the reduce pending, then waits for it
  (before: ``BackendUnavailable``).
- ``polled`` / ``timed``: rank 0 reduces onto rank 1 on one communicator, then polls
  ``is_completed()`` of (or ``wait(timeout=)`` for) an allreduce on another, which rank 1 joins
  only once its reduce is done (before: no poll posted the reduce's second phase).
- ``left``: rank 0 leaves that reduce and allreduce pending and ends; its exit's settling of
  either communicator posts the reduce's second phase (before: where the exit settled the
  allreduce's communicator first, rank 1 waited the 5 s it gives it).
- ``duplicated``: the root reduces and then duplicates the communicator; the others start the
  reduce, duplicate it and wait for the reduce after (before: the duplicate's host wait posted
  no second phase, so the root waited in the reduce and the others in the duplicate for ever).

Sums of small integers checked against the exact total; runs without a timeout (the launch's
own timeout is the hang detector)."""

from __future__ import annotations

import gc
import sys
import time

import numpy as np

import cupycoll as cc

comm = cc.init("mpi", timeout=0)
RANK, P = comm.rank, comm.size
COUNT = 70_000  # 560 KB of float64: above CUPYCOLL_REDUCE_PAIRWISE's 256 KiB
x = np.arange(COUNT, dtype=np.float64) % 7 + RANK
total = P * (np.arange(COUNT) % 7) + P * (P - 1) / 2
scenario = sys.argv[1]

if scenario in ("polled", "timed", "left"):
    other, start = comm.dup(), time.monotonic()
    if RANK == 0:
        reduced = cc.reduce(x, root=1, comm=other, async_op=True)  # (the exit settles comm
        summed = cc.allreduce(np.ones(4), comm=comm, async_op=True)  # first)
        if scenario == "polled":
            while not summed.is_completed():
                assert time.monotonic() - start < 20, "the allreduce never completed"
        elif scenario == "timed":
            summed.wait(timeout=20)
        if scenario != "left":
            reduced.wait()
    else:
        assert np.array_equal(cc.reduce(x, root=1, comm=other), total)
        cc.allreduce(np.ones(4), comm=comm)
        took = time.monotonic() - start
        assert took < 2.5, f"rank {RANK} waited {took:.1f} s for rank 0's reduce"
    print(f"PAIRWISE rank {RANK} {scenario} ok", flush=True)
    sys.exit(0)
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
elif scenario == "duplicated":
    if RANK == 0:
        assert np.array_equal(work.wait(), total)
    twin = comm.dup()
    work.wait()
    assert np.array_equal(cc.allreduce(np.ones(4), comm=twin), np.full(4, float(P)))
elif scenario == "closed":
    comm.close()
    result = work.wait()
    if RANK == 0:
        assert np.array_equal(result, total)
print(f"PAIRWISE rank {RANK} {scenario} ok", flush=True)
