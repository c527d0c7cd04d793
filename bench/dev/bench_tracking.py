"""What the reliability machinery costs small calls, side by side in one run (rank 0 prints).

The late-rank tracking adds two things to a collective that does not time out: one store of the
collective count into this rank's slot of the arrival board as it starts, and the publication
of its finish (``Board.finish``, ``cupycoll/comm/_watchdog.py``), both in the calls timed here.
Interruptible waits add another: a blocking call is posted nonblocking and tested from Python
(MPI's blocking call would ignore Ctrl-C). This times, interleaved one of each per round:
``cc.allreduce`` of 8 bytes and a 10-entry ``sparse_allreduce`` as they are, the same two on a
communicator whose blocking calls are MPI's own (uninterruptible: the comparison), mpi4py's
``Allreduce``, and 1000 board stores in a loop (printed per store).

    mpiexec -n 2 python -m mpi4py bench/dev/bench_tracking.py -n 2000
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from _common import interleaved  # noqa: E402

from cupycoll._arguments import positive_int
import cupycoll as cc  # noqa: E402
from cupycoll.comm.mpi import MPICommunicator  # noqa: E402

STORES = 1000


class Uninterruptible(MPICommunicator):
    """Completes blocking calls with MPI's own blocking call (no Python test loop)."""

    def _launch(self, blocking, op_name, call, icall, args, finalize=None, keep=()):
        if not blocking:
            return super()._launch(blocking, op_name, call, icall, args, finalize, keep)
        call(*args)
        if finalize is not None:
            finalize()
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", "--iters", type=positive_int, default=2000)
    parser.add_argument("-w", "--warmup_iters", type=int, default=100)
    args = parser.parse_args()
    comm = cc.init("mpi")
    plain = Uninterruptible()
    x, y = np.ones(2, np.float32), np.empty(2, np.float32)
    rng = np.random.default_rng([7, comm.rank])
    idx = np.sort(rng.choice(1000, 10, replace=False)).astype(np.int64)
    val = rng.standard_normal(10).astype(np.float32)
    slot = comm._slot

    def stores() -> None:
        for i in range(STORES):
            slot[0] = i

    calls = {
        "cc.allreduce 8 B": lambda: cc.allreduce(x, comm=comm, out=y),
        "  MPI blocking calls": lambda: cc.allreduce(x, comm=plain, out=y),
        "mpi4py Allreduce 8 B": lambda: comm.mpi_comm.Allreduce(x, y),
        "cc.sparse_allreduce 10": lambda: cc.sparse_allreduce(idx, val, 1000, comm=comm),
        "  MPI blocking calls ": lambda: cc.sparse_allreduce(idx, val, 1000, comm=plain),
        f"{STORES} board stores": stores,
    }
    samples = interleaved(calls, args.iters, args.warmup_iters, comm)
    if comm.rank == 0:
        med = {name: float(np.median(s)) for name, s in samples.items()}
        store = med[f"{STORES} board stores"] / STORES
        call = med["cc.allreduce 8 B"]
        print(f"# ranks={comm.size} iters={args.iters}  median of the slowest rank")
        for name, t in med.items():
            print(f"  {name:<24}{t * 1e6:>10.2f} us")
        print(f"  one board store         {store * 1e9:>10.1f} ns = {store / call:.3%} of "
              "cc.allreduce 8 B")


if __name__ == "__main__":
    main()
