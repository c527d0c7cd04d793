"""Where a dense verb's time goes above MPI, one layer at a time, side by side in one run
(run under mpiexec; rank 0 prints).

For ``allreduce`` and ``allgather`` (float32 sum, ``out=`` preallocated) at each size, the rows
add one layer each: MPI's blocking call; its nonblocking twin completed by tests that yield the
core every 8 (cupycoll's wait loop, ``bench_mpi_reduce.tested``); the MPI backend's launch of
that request (``_launch``: the first test, ``wait``'s interruptible loop); the backend's verb
(``_allreduce`` / ``_allgather``: buffer checks, stats, the arrival notice, the launch); and the
public verb (``cc.allreduce`` / ``cc.allgather``). A last row is the nonblocking twin after
``--spin`` microseconds of pure Python before each post: how much wall time a microsecond of
host work costs at this P. A time is the median over rounds of the slowest rank, the rows
interleaved (each round in its own shuffled order, a barrier before each call).
``bench/dev/bench_host.py`` gives the layers' host time in one process, where nothing waits.

With one rank per core the layers add about their host time (P = 2 here, ~2-3 us a verb).
With more ranks than cores (P = 4 on this 2-core machine) each microsecond of Python costs
several of wall time: ranks take turns on a core, and a collective ends when the last rank
has had its turn (docs/dense.md).

    mpiexec -n 2 python -m mpi4py bench/dev/bench_layers.py --sizes 8,256K,1M -n 400
    mpiexec -n 4 python -m mpi4py bench/dev/bench_layers.py --sizes 8,256K,1M -n 400
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from _common import interleaved, listed, one_of, parse_size, print_medians  # noqa: E402
from bench_mpi_reduce import tested  # noqa: E402
from mpi4py import MPI  # noqa: E402

from cupycoll._arguments import positive_int
import cupycoll as cc  # noqa: E402
from cupycoll.comm._mpi_types import _typed  # noqa: E402


def spin(seconds: float) -> None:
    """Hold the core for ``seconds`` of Python, as a layer's host work does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def layers(comm: Any, verb: str, nbytes: int, spin_s: float) -> dict[str, Callable[[], Any]]:
    """The calls of one verb and size, from MPI's blocking call up to the public verb."""
    mc, p = comm.mpi_comm, comm.size
    count = max(p, nbytes // 4 // p * p)
    if verb == "allreduce":
        x, out = np.ones(count, np.float32), np.empty(count, np.float32)
        blocking, icall = mc.Allreduce, mc.Iallreduce
        args: tuple = (_typed(x), _typed(out), MPI.SUM)
        backend = lambda: comm._allreduce(x, out, cc.ReduceOp.SUM, verb, True)  # noqa: E731
        public = lambda: cc.allreduce(x, out=out, comm=comm)  # noqa: E731
    else:
        x, out = np.ones(count // p, np.float32), np.empty(count, np.float32)
        blocking, icall = mc.Allgather, mc.Iallgather
        args = (_typed(x), _typed(out))
        backend = lambda: comm._allgather(x, out, verb, True)  # noqa: E731
        public = lambda: cc.allgather(x, out=out, comm=comm)  # noqa: E731
    return {"MPI blocking": lambda: blocking(*args),
            "MPI nonblocking + tests": lambda: tested(icall(*args)),
            "+ backend launch": lambda: comm._launch(True, verb, blocking, icall, args),
            "+ backend verb": backend,
            f"+ public verb ({verb})": public,
            f"nonblocking after {spin_s * 1e6:g} us spin": lambda: (spin(spin_s),
                                                                   tested(icall(*args)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="8,256K,1M",
                        help="bytes of the output (allgather) or of the vector (allreduce)")
    parser.add_argument("--verbs", type=listed(one_of("allreduce", "allgather")),
                        default="allreduce,allgather", help="comma list of allreduce, allgather")
    parser.add_argument("-n", "--iters", type=positive_int, default=400)
    parser.add_argument("-w", "--warmup_iters", type=int, default=20)
    parser.add_argument("--spin", type=float, default=2.0, help="microseconds of Python")
    args = parser.parse_args()
    comm = cc.init("mpi")
    for verb in args.verbs:
        for size in args.sizes.split(","):
            calls = layers(comm, verb, parse_size(size), args.spin * 1e-6)
            samples = interleaved(calls, args.iters, args.warmup_iters, comm)
            if comm.rank == 0:
                print(f"# {verb} {size}  ranks={comm.size}  median of the slowest rank")
                print_medians(samples, "MPI blocking", "layer", "x_blocking")


if __name__ == "__main__":
    main()
