"""What deciding costs a sparse_allreduce call: the front door's ``plan()`` for an explicit
algorithm, auto's ``estimate`` and auto's ``learn``, side by side in one run, in microseconds.

    mpiexec -n 2 python -m mpi4py bench/dev/bench_decide.py

Every rank calls ``sparse_allreduce`` ``--calls`` times (one shape class; learn's trials
done; the median of the last half is printed: the call the plan is part of), then
times ``plan()`` of the last agreed call ``--reps`` times per mode, the modes in turn over
``--rounds`` rounds; rank 0 prints each mode's median and least time over the rounds, the
slowest rank's. A shared VM's speed changes from minute to minute (by 2x here): many short
rounds put every mode in each phase alike, and the least round is the code's cost in the
quietest one.
The plan is what a call adds between its validation and its algorithm (deciding the algorithm
and its wire format); a repeated shape class is what a training loop makes. A plan learn times
(its trials and rechecks, one in 4 of its choice's calls) is followed, inside the timing, by
what the next validation does with its time (``learn.absorb``, here of the call's median, the
same on every rank), so the record moves on as in a loop: its rechecks end.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

from cupycoll._arguments import positive_int
import cupycoll as cc
from cupycoll.sparse import api, learn

MODES = ("explicit", "estimate", "learn")


def prepared_call(comm, n: int, k: int, calls: int = 20):
    """The Prepared of an auto call after ``calls`` calls of its class (learning's trials
    done), and the slowest rank's median seconds of the last half of those calls."""
    seen, seconds = {}, []
    real = api.plan

    def keep(on, prepared, async_op=False):
        seen["prepared"] = prepared
        return real(on, prepared, async_op)

    api.plan = keep
    rng = np.random.default_rng(comm.rank)
    try:
        for _ in range(calls):
            idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
            comm.mpi_comm.Barrier()
            start = time.perf_counter()
            cc.sparse_allreduce(idx, np.ones(k, np.float32), n, comm=comm)
            seconds.append(comm.mpi_comm.allreduce(time.perf_counter() - start, op=_max()))
    finally:
        api.plan = real
    return seen["prepared"], float(np.median(seconds[calls // 2:]))


def time_plan(comm, prepared, reps: int, agreed_us: int) -> float:
    plan_once(comm, prepared, agreed_us)
    start = time.perf_counter()
    for _ in range(reps):
        plan_once(comm, prepared, agreed_us)
    return (time.perf_counter() - start) / reps


def plan_once(comm, prepared, agreed_us: int) -> None:
    """``plan()``; a timed one's time (``agreed_us``) then joins learn's record."""
    planned = api.plan(comm, prepared)
    if planned.timer is not None:
        planned.timer(comm)()
        learn.absorb(comm, agreed_us)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 20)
    p.add_argument("--entries", type=int, default=10_000, help="entries per rank")
    p.add_argument("--reps", type=positive_int, default=200)
    p.add_argument("--rounds", type=positive_int, default=60)
    p.add_argument("--calls", type=int, default=60, help="auto calls made first (timed)")
    args = p.parse_args()
    comm = cc.init("mpi")
    auto_call, call_seconds = prepared_call(comm, args.n, args.entries, args.calls)
    calls = {"explicit": dataclasses.replace(auto_call, algorithm="recursive_doubling"),
             "estimate": dataclasses.replace(auto_call, auto_mode="estimate"),
             "learn": dataclasses.replace(auto_call, auto_mode="learn")}
    seconds = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            seconds[mode].append(time_plan(comm, calls[mode], args.reps,
                                           int(call_seconds * 1e6)))
    slowest = {(mode, stat.__name__): comm.mpi_comm.allreduce(float(stat(s)), op=_max())
               for mode, s in seconds.items() for stat in (np.median, np.min)}
    if comm.rank == 0:
        print(f"# P = {comm.size}, n = {args.n}, {args.entries} entries a rank; plan() in us "
              f"(median / least of {args.rounds} rounds of {args.reps}, slowest rank)")
        print("  ".join(f"{mode} {slowest[mode, 'median'] * 1e6:.1f} / "
                        f"{slowest[mode, 'min'] * 1e6:.1f}" for mode in MODES))
        print(f"# the call itself (auto, its last {args.calls - args.calls // 2} of "
              f"{args.calls}, median): {call_seconds * 1e6:.0f} us")
    return 0


def _max():
    from mpi4py import MPI

    return MPI.MAX


if __name__ == "__main__":
    os.environ.pop("CUPYCOLL_AUTO", None)  # the modes are set per call above
    sys.exit(main())
