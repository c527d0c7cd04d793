"""The CPU a rank burns while blocked in a plain MPI call, waiting for a late peer.

Rank 0 sleeps ``--late`` seconds, then every rank calls ``COMM_WORLD.allgather``; each other
rank prints the CPU seconds of its wait. Run it under the MPI library's settings to compare,
e.g. MPICH's yield while it polls:

    mpiexec -n 4 python -m mpi4py bench/dev/bench_blocked_wait.py
    MPIR_CVAR_ENABLE_HEAVY_YIELD=1 mpiexec -n 4 python -m mpi4py bench/dev/bench_blocked_wait.py

On cores the job has to itself a polling rank burns its wait whole; where ranks share the cores
(more ranks than cores, or two jobs) the rank that polls takes CPU from the late one.
"""

from __future__ import annotations

import argparse
import time

from mpi4py import MPI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--late", type=float, default=2.0, help="rank 0's delay, seconds")
    late = parser.parse_args().late
    world = MPI.COMM_WORLD
    world.Barrier()
    if world.rank == 0:
        time.sleep(late)
    started = time.process_time()
    world.allgather(world.rank)
    waited = world.gather(time.process_time() - started)
    if world.rank == 0:
        cpu = ", ".join(f"{t:.2f}" for t in waited[1:])
        print(f"{world.size} ranks, rank 0 late by {late} s: CPU-s of the others' waits: {cpu}")


if __name__ == "__main__":
    main()
