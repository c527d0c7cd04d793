"""What ``CUPYCOLL_AUTO=learn`` adds to a call of a recurring shape class, against ``estimate``
running the same algorithm, in microseconds.

    mpiexec -n 2 python -m mpi4py bench/dev/bench_learn_cost.py
    mpiexec -n 2 python -m mpi4py bench/dev/bench_learn_cost.py --n 3000000 --entries 30000

Three communicators over the same ranks call ``sparse_allreduce`` (``auto``) on the same
inputs each step, timed by ``cupycoll.tuner.calibrate.interleaved`` (a seeded order of their
own per step, each call after a barrier, a sample the slowest rank's time): ``estimate``,
``control`` (estimate again: the measurement's floor) and ``learn``. A sample includes reading
the communicator's call counts (which algorithm ran), the same for all three. Steps where learn
ran another algorithm than estimate (its trials and rechecks) are left out, as are the first
``--skip``; rank 0 prints each one's median and the median of its per-step difference from
``estimate`` (paired: the VM's speed changes from minute to minute, by up to 2x here, and a
pair shares its phase).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import cupycoll as cc
from cupycoll.tuner.calibrate import interleaved

METHODS = {"estimate": "estimate", "control": "estimate", "learn": "learn"}


def method(comm, mode: str, inputs: list, n: int, ran: list):
    """A call of ``sparse_allreduce`` (auto in ``mode``) on ``comm`` taking the next of
    ``inputs`` each time, appending the algorithm it ran (``comm.stats`` counts them) to
    ``ran``."""
    def call():
        before = dict(comm.stats.calls)
        os.environ["CUPYCOLL_AUTO"] = mode
        idx, val = inputs[len(ran)]
        cc.sparse_allreduce(idx, val, n, comm=comm)
        grown = [key for key, count in comm.stats.calls.items() if count > before.get(key, 0)]
        ran.append(grown[0][1])
    return call


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--entries", type=int, default=10_000, help="entries per rank")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--skip", type=int, default=100, help="first steps left out (trials)")
    args = p.parse_args()
    root = cc.init("mpi")
    rng = np.random.default_rng(root.rank)
    inputs = [(np.sort(rng.choice(args.n, args.entries, replace=False)).astype(np.int64),
               np.ones(args.entries, np.float32)) for _ in range(args.steps)]
    ran: dict[str, list[str]] = {name: [] for name in METHODS}
    calls = {name: method(root.dup(), mode, inputs, args.n, ran[name])
             for name, mode in METHODS.items()}
    samples = interleaved(calls, args.steps, 0, root)
    kept = [step for step in range(args.skip, args.steps)
            if len({ran[name][step] for name in METHODS}) == 1]
    if root.rank == 0:
        base = samples["estimate"][kept]
        print(f"# P = {root.size}, n = {args.n}, {args.entries} entries a rank; "
              f"{len(kept)} steps of {args.steps - args.skip} ran one algorithm in all three")
        for name in METHODS:
            delta = np.median(samples[name][kept] - base)
            print(f"{name:9s} median {np.median(samples[name][kept]) * 1e6:7.1f} us   "
                  f"over estimate {delta * 1e6:6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
