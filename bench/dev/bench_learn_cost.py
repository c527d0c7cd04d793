"""What ``CUPYCOLL_AUTO=learn`` adds to a call of a recurring shape class, against ``estimate``
running the same algorithm, in microseconds.

    mpiexec -n 2 python -m mpi4py bench/dev/bench_learn_cost.py
    mpiexec -n 2 python -m mpi4py bench/dev/bench_learn_cost.py --n 3000000 --entries 30000

Three communicators over the same ranks call ``sparse_allreduce`` (``auto``) on the same
inputs each step, in a seeded order of their own per step, after a barrier: ``estimate``,
``control`` (estimate again: the measurement's floor) and ``learn``. A sample is the slowest
rank's time. Steps where learn ran another algorithm than estimate (its trials and rechecks)
are left out, as are the first ``--skip``; rank 0 prints each one's median and the median of
its per-step difference from ``estimate`` (paired: the VM's speed changes from minute to
minute, by up to 2x here, and a pair shares its phase).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import cupycoll as cc

METHODS = {"estimate": "estimate", "control": "estimate", "learn": "learn"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--entries", type=int, default=10_000, help="entries per rank")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--skip", type=int, default=100, help="first steps left out (trials)")
    args = p.parse_args()
    world = MPI.COMM_WORLD
    root = cc.init("mpi")
    comms = {name: root.dup() for name in METHODS}
    rng, order = np.random.default_rng(root.rank), np.random.default_rng(0)
    samples: dict[str, list[float]] = {name: [] for name in METHODS}
    for step in range(args.steps):
        idx = np.sort(rng.choice(args.n, args.entries, replace=False)).astype(np.int64)
        val = np.ones(args.entries, np.float32)
        row, algorithm = {}, {}
        for name in order.permutation(list(METHODS)):
            comm, before = comms[name], dict(comms[name].stats.calls)
            os.environ["CUPYCOLL_AUTO"] = METHODS[name]
            world.Barrier()
            start = time.perf_counter()
            cc.sparse_allreduce(idx, val, args.n, comm=comm)
            row[name] = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
            grown = [key for key, count in comm.stats.calls.items() if count > before.get(key, 0)]
            algorithm[name] = grown[0][1]
        if step >= args.skip and len(set(algorithm.values())) == 1:
            for name in METHODS:
                samples[name].append(row[name])
    if root.rank == 0:
        base = np.array(samples["estimate"])
        print(f"# P = {root.size}, n = {args.n}, {args.entries} entries a rank; "
              f"{base.size} steps of {args.steps - args.skip} ran one algorithm in all three")
        for name in METHODS:
            delta = np.median(np.array(samples[name]) - base)
            print(f"{name:9s} median {np.median(samples[name]) * 1e6:7.1f} us   "
                  f"over estimate {delta * 1e6:6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
