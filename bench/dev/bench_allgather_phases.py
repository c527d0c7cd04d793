"""allgather's two phases measured against the time model: the exchange and the merge.

Run under ``mpiexec``: each case (``n/density/width``, ``random`` indices as bench_sparse draws
them) runs allgather's exchange (``wire._exchange.gather_entries``: the own block packed, every
peer's received) and its merge (``sparse._common.reduce_parts``), each timed as the slowest
rank's, median of ``--repeats`` after a barrier, beside the model's price of the same phase with
the profile ``auto`` reads (``tuner.predict.comm_time`` of allgather's cost, ``local_time`` of
its work):

    mpiexec -n 2 python -m mpi4py bench/dev/bench_allgather_phases.py
    mpiexec -n 4 python -m mpi4py bench/dev/bench_allgather_phases.py --cases 5M/0.03/0

``meas/model`` above 1: the model prices that phase low; ``-`` where it prices the phase 0
(one rank, or no entries). The validation allreduce and the
call's fixed cost are outside both phases (``sparse_allreduce`` adds them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import parse_size  # noqa: E402
from bench_sparse import make_input  # noqa: E402

from cupycoll._arguments import positive_int
import cupycoll  # noqa: E402
from cupycoll._types import ReduceOp  # noqa: E402
from cupycoll.primitives import _accel  # noqa: E402
from cupycoll.sparse._common import reduce_parts  # noqa: E402
from cupycoll.sparse._cost import Shape  # noqa: E402
from cupycoll.sparse.allgather import cost  # noqa: E402
from cupycoll.tuner.predict import comm_time, local_time, work  # noqa: E402
from cupycoll.tuner.profile import profile_for  # noqa: E402
from cupycoll.wire._exchange import gather_entries  # noqa: E402

CASES = "5M/0.03/0,1800000/0.1/0,256K/0.15/4,100000/0.02/8"


def slowest_median(comm, call, repeats: int) -> float:
    """Median over ``repeats`` of the slowest rank's seconds of ``call()`` after a barrier."""
    from mpi4py import MPI

    times = []
    for _ in range(repeats):
        comm.mpi_comm.Barrier()
        start = time.perf_counter()
        call()
        times.append(comm.mpi_comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=CASES, help="n/density/width, comma-separated")
    parser.add_argument("--repeats", type=positive_int, default=9)
    args = parser.parse_args()
    comm = cupycoll.comm.init("mpi")
    _accel.ready()
    profile = profile_for(comm)
    if comm.rank == 0:
        print(f"# P = {comm.size}, profile {profile.name}; ms, the slowest rank's median")
        print(f"# {'case':>16} {'exchange':>9} {'model':>7} {'meas/model':>10} "
              f"{'merge':>7} {'model':>7} {'meas/model':>10}")
    for case in args.cases.split(","):
        text, density, width = case.split("/")
        n, width = parse_size(text), int(width)
        idx, val = make_input(0, comm.rank, comm.size, n, int(float(density) * n), width,
                              "random")
        counts = comm.mpi_comm.allgather(int(idx.size))
        parts = gather_entries(comm, idx, val, "allgather", counts=counts)[0]
        exchange = slowest_median(
            comm, lambda: gather_entries(comm, idx, val, "allgather", counts=counts),
            args.repeats)
        merge = slowest_median(
            comm, lambda: reduce_parts(parts, ReduceOp.SUM, np.dtype(np.float32)), args.repeats)
        shape = Shape(comm.size, n, width, 4, 4, tuple(counts))
        priced = [max(comm_time(cost(shape, r, profile), profile) for r in range(comm.size)),
                  max(local_time(work("allgather", shape, r, profile), profile)
                      for r in range(comm.size))]
        if comm.rank == 0:
            cells = "".join(f" {m * 1e3:9.2f} {p * 1e3:7.2f} "
                            + (f"{m / p:10.2f}" if p > 0 else f"{'-':>10}")
                            for m, p in zip((exchange, merge), priced))
            print(f"  {case:>16}{cells}", flush=True)


if __name__ == "__main__":
    main()
