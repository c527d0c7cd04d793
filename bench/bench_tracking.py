"""What the late-rank tracking costs a small dense call, side by side in one run (rank 0 prints).

The tracking adds exactly one thing to a collective that does not time out: one store of the
collective count into this rank's slot of the arrival board (``cupycoll/comm/_watchdog.py``).
This times, interleaved one of each per round, ``cc.allreduce`` of 8 bytes (the whole call,
tracking included), mpi4py's ``Allreduce`` of the same buffer, and 1000 board stores in a loop;
it prints the cost of one store as a fraction of the allreduce.

    mpiexec -n 2 python -m mpi4py bench/bench_tracking.py -n 2000
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import interleaved

import cupycoll as cc

STORES = 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", "--iters", type=int, default=2000)
    parser.add_argument("-w", "--warmup_iters", type=int, default=100)
    args = parser.parse_args()
    comm = cc.init("mpi")
    x, y = np.ones(2, np.float32), np.empty(2, np.float32)
    slot = comm._slot

    def stores() -> None:
        for i in range(STORES):
            slot[0] = i

    calls = {
        "cc.allreduce 8 B": lambda: cc.allreduce(x, comm=comm, out=y),
        "mpi4py Allreduce 8 B": lambda: comm.mpi_comm.Allreduce(x, y),
        f"{STORES} board stores": stores,
    }
    samples = interleaved(calls, args.iters, args.warmup_iters, comm.mpi_comm)
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
