"""Which MPI call a cupycoll ``reduce`` should post: raw mpi4py ``Reduce`` (blocking),
``Ireduce`` and ``Iallreduce`` (each tested in a loop that yields the core every 8 tests, as
cupycoll's wait does), side by side per size, float32 sum onto rank 0 (run under mpiexec).

cupycoll's MPI backend runs ``reduce`` as an allreduce from ``CUPYCOLL_REDUCE_AS_ALLREDUCE``
bytes (docs/dense.md): this measures the crossover on a machine. A time is the median over
rounds of the slowest rank (each call after a barrier); the calls alternate, twice.

    mpiexec -n 2 python -m mpi4py bench/bench_mpi_reduce.py --sizes 64K,128K,256K,16M
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from _common import parse_size
from mpi4py import MPI


def tested(request: MPI.Request) -> None:
    """Complete ``request`` by tests, yielding the core every 8 (cupycoll's wait loop)."""
    polls = 0
    while not request.Test():
        polls += 1
        if polls % 8 == 0:
            os.sched_yield()


def median_of_slowest(comm: MPI.Comm, call, rounds: int) -> float:
    for _ in range(max(3, rounds // 10)):
        call()
    times = []
    for _ in range(rounds):
        comm.Barrier()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(np.max(comm.allgather(np.array(times)), axis=0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="64K,128K,256K,1M,16M")
    parser.add_argument("-n", "--rounds", type=int, default=300, help="rounds below 1 MiB "
                        "(a tenth from 1 MiB)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    at_root = comm.rank == 0
    if at_root:
        print(f"# ranks={comm.size}  float32 sum onto rank 0  median of the slowest rank, us")
        print(f"# {'size':>10}{'Reduce':>12}{'Ireduce':>12}{'Iallreduce':>12}")
    for text in args.sizes.split(","):
        count = parse_size(text) // 4
        x, out, scratch = (np.ones(count, np.float32) for _ in range(3))
        rounds = args.rounds if count * 4 < 1 << 20 else max(5, args.rounds // 10)
        calls = {"Reduce": lambda: comm.Reduce(x, out if at_root else None, root=0),
                 "Ireduce": lambda: tested(comm.Ireduce(x, out if at_root else None, root=0)),
                 "Iallreduce": lambda: tested(comm.Iallreduce(x, out if at_root else scratch))}
        best = {name: min(median_of_slowest(comm, call, rounds) for _ in range(2))
                for name, call in calls.items()}
        if at_root:
            print(f"  {text:>10}" + "".join(f"{t * 1e6:>12.1f}" for t in best.values()),
                  flush=True)


if __name__ == "__main__":
    main()
