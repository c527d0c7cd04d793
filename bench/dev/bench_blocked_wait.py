"""The CPU a rank burns while blocked waiting for a late peer: in a plain MPI call, or in
cupycoll's interruptible wait.

Rank 0 sleeps ``--late`` seconds, then every rank calls ``COMM_WORLD.allgather`` (``--via
mpi``) or ``cc.allreduce`` of 4 floats (``--via cupycoll``); each other rank prints the CPU
seconds of its wait. With ``--calls N`` rank 0 is late by a random 0..``--late`` seconds before
each of N calls (many short waits, as ranks a few milliseconds apart meet in a training loop),
and the CPU is over the N calls, with their wall time. Run it under the settings to compare,
e.g. MPICH's yield while it polls, or cupycoll's napping from the first poll round:

    mpiexec -n 4 python -m mpi4py bench/dev/bench_blocked_wait.py
    MPIR_CVAR_ENABLE_HEAVY_YIELD=1 mpiexec -n 4 python -m mpi4py bench/dev/bench_blocked_wait.py
    CUPYCOLL_SPIN=0 mpiexec -n 2 python -m mpi4py bench/dev/bench_blocked_wait.py \\
        --via cupycoll --late 0.003 --calls 300

On cores the job has to itself a polling rank burns its wait whole; where ranks share the cores
(more ranks than cores, or two jobs) the rank that polls takes CPU from the late one.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--late", type=float, default=2.0, help="rank 0's delay, seconds")
    parser.add_argument("--via", choices=("mpi", "cupycoll"), default="mpi",
                        help="the call waited in: MPI's allgather or cupycoll's allreduce")
    parser.add_argument("--calls", type=int, default=0,
                        help="calls, each after a random delay of rank 0 up to --late "
                        "(0: one call after exactly --late)")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if args.via == "cupycoll":
        import cupycoll as cc

        comm, x = cc.init("mpi", timeout=max(60.0, 4 * args.late)), np.ones(4, np.float32)
        call = lambda: cc.allreduce(x, comm=comm)  # noqa: E731
        call()  # (its first call makes what later calls reuse)
    else:
        call = lambda: world.allgather(world.rank)  # noqa: E731
    delays = (np.random.default_rng(0).uniform(0, args.late, args.calls) if args.calls
              else [args.late])
    world.Barrier()
    started, wall = time.process_time(), time.perf_counter()
    for delay in delays:
        if world.rank == 0:
            time.sleep(delay)
        call()
    waited = world.gather(time.process_time() - started)
    wall = time.perf_counter() - wall
    if world.rank == 0:
        cpu = ", ".join(f"{t:.3f}" for t in waited[1:])
        what = (f"{len(delays)} calls, rank 0 late by up to {args.late} s ({wall:.2f} s)"
                if args.calls else f"rank 0 late by {args.late} s")
        print(f"{world.size} ranks, {args.via}, {what}: CPU-s of the others' waits: {cpu}")


if __name__ == "__main__":
    main()
