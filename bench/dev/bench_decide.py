"""What deciding costs a sparse_allreduce call: the front door's ``plan()`` for an explicit
algorithm, auto's ``estimate`` and auto's ``learn``, side by side in one run, in microseconds.

    mpiexec -n 2 python -m mpi4py bench/dev/bench_decide.py

Every rank calls ``sparse_allreduce`` a few times (one shape class; learn's trials done), then
times ``plan()`` of the last agreed call ``--reps`` times per mode, the modes in turn over
``--rounds`` rounds; rank 0 prints each mode's median over the rounds, the slowest rank's.
The plan is what a call adds between its validation and its algorithm (deciding the algorithm
and its wire format); a repeated shape class is what a training loop makes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

import cupycoll as cc
from cupycoll.sparse import api

MODES = ("explicit", "estimate", "learn")


def prepared_call(comm, n: int, k: int):
    """The Prepared of an auto call after its class's learning trials."""
    seen = {}
    real = api.plan

    def keep(on, prepared, async_op=False):
        seen["prepared"] = prepared
        return real(on, prepared, async_op)

    api.plan = keep
    rng = np.random.default_rng(comm.rank)
    try:
        for _ in range(20):
            idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
            cc.sparse_allreduce(idx, np.ones(k, np.float32), n, comm=comm)
    finally:
        api.plan = real
    return seen["prepared"]


def time_plan(comm, prepared, reps: int) -> float:
    api.plan(comm, prepared)
    start = time.perf_counter()
    for _ in range(reps):
        api.plan(comm, prepared)
    return (time.perf_counter() - start) / reps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 20)
    p.add_argument("--entries", type=int, default=10_000, help="entries per rank")
    p.add_argument("--reps", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    comm = cc.init("mpi")
    auto_call = prepared_call(comm, args.n, args.entries)
    calls = {"explicit": dataclasses.replace(auto_call, algorithm="recursive_doubling"),
             "estimate": dataclasses.replace(auto_call, auto_mode="estimate"),
             "learn": dataclasses.replace(auto_call, auto_mode="learn")}
    seconds = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            seconds[mode].append(time_plan(comm, calls[mode], args.reps))
    slowest = {mode: comm.mpi_comm.allreduce(float(np.median(s)), op=_max()) for mode, s in
               seconds.items()}
    if comm.rank == 0:
        print(f"# P = {comm.size}, n = {args.n}, {args.entries} entries a rank; plan() in us "
              f"(median of {args.rounds} rounds of {args.reps}, slowest rank)")
        print("  ".join(f"{mode} {slowest[mode] * 1e6:.1f}" for mode in MODES))
    return 0


def _max():
    from mpi4py import MPI

    return MPI.MAX


if __name__ == "__main__":
    os.environ.pop("CUPYCOLL_AUTO", None)  # the modes are set per call above
    sys.exit(main())
