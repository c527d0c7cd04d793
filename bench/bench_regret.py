"""The regret of ``auto`` in a recurring loop: every explicit algorithm, auto priced by the model
(estimate) and auto that learns (learn), side by side over the same drifting steps.

    mpiexec -n 2 python -m mpi4py bench/bench_regret.py
    mpiexec -n 2 python -m mpi4py bench/bench_regret.py --steps 100 --repeats 1 \
        --cases 200000/0.05/0

A case is ``n/density/width``: each rank draws ``density * n`` random indices a step, the
density drifting by up to +-10% from step to step (a training loop's gradient). Every step runs
every method once, in an order of its own (a seeded shuffle, the same on every rank: a rotation
would keep each method after the same one), after a barrier; a sample is the slowest rank's time,
with Python's garbage collector off during the call (:func:`no_collection`). A case runs
``--repeats`` such loops, each with draws of its own and learn's records cleared (a loop is a
new training run): a loop's first 100 steps are few samples of a noisy time, and the repeats
add up. Per case: each method's cumulative time over the first 100 steps of every loop (all of
a shorter loop), over the best explicit algorithm's there (``cum/best``; ``cum(ms)`` is a
loop's mean), its median per-step time over steps 31 to the end of every loop (``late(ms)``),
and the median over those steps of its time over that of the explicit algorithm of least
median time in them, in the same step (``late/best``). Every algorithm runs before a loop on its
first step and on its steps of fewest and most entries in all (imports and compiled loops are
not the loop's).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import os
import sys

import numpy as np
from _common import (Table, common_parser, fraction, listed, non_negative_int, parse_length,
                     positive_int)
from mpi4py import MPI

import cupycoll as cc
from cupycoll.sparse import learn

COLUMNS = ["case", "method", "cum(ms)", "cum/best", "late(ms)", "late/best", "late ran",
           "#wrong"]
CASES = "200000/0.05/0,3000000/0.01/0,50000/0.2/16,400000/0.02/4"
LATE = 30
#: the steps whose cumulative time ``cum/best`` compares
CUMULATIVE = 100
#: further methods (name -> factory(n) of a call with a ``comm`` attribute, the communicator
#: whose stats say what ran), e.g. a variant of learn in bench/dev/bench_learn_rule.py
EXTRA: dict = {}


def late_start(steps: int) -> int:
    """The first step of the late window: :data:`LATE`, or 0 for a loop no longer than that."""
    return LATE if steps > LATE else 0


def draws(comm, n: int, density: float, width: int, steps: int, seed: int) -> list:
    """This rank's (indices, values) of every step, the density drifting."""
    rng = np.random.default_rng([seed, comm.rank])
    out, d = [], density
    for _ in range(steps):
        d = min(max(d * rng.uniform(0.9, 1.1), density / 2), min(2 * density, 1.0))
        idx = np.sort(rng.choice(n, max(int(d * n), 1), replace=False)).astype(np.int32)
        shape = (idx.size, width) if width else (idx.size,)
        out.append((idx, rng.integers(-4, 5, shape).astype(np.float32)))
    return out


def warm_steps(comm, steps_data: list) -> list[int]:
    """The steps run before the loop: the first and those of fewest and most entries in all
    (a loop whose density drifts crosses the sizes where compiled loops take over: their
    first load from numba's cache is not the loop's)."""
    totals = comm.mpi_comm.allreduce(np.array([idx.size for idx, _ in steps_data]))
    return [0, int(totals.argmin()), int(totals.argmax())]


def method_call(comm, method: str, n: int):
    """The call of ``method``: an algorithm name, ``estimate`` or ``learn`` (auto's modes)."""
    algorithm = "auto" if method in ("estimate", "learn") else method

    def call(idx, val):
        os.environ["CUPYCOLL_AUTO"] = method if algorithm == "auto" else "estimate"
        return cc.sparse_allreduce(idx, val, n, algorithm=algorithm, comm=comm)
    return call


def reference(comm, idx, val, n: int) -> tuple:
    """A step's sum from every rank's entries, in numpy: the union and its values."""
    parts = comm.mpi_comm.allgather((idx, val))
    union = np.unique(np.concatenate([i for i, _ in parts]))
    total = np.zeros((union.size,) + val.shape[1:], np.float64)
    for i, v in parts:
        np.add.at(total, np.searchsorted(union, i), v)
    return union, total


def count_wrong(res, want: tuple) -> int:
    """Values of ``res`` off the reference (small integers: exact in every algorithm)."""
    union, total = want
    if not np.array_equal(res.indices, union):
        return max(union.size, 1)
    return int(np.count_nonzero(res.values != total))


@contextlib.contextmanager
def no_collection():
    """Python's cyclic garbage collector off for a timed call, as :mod:`timeit` has it: a
    collection runs when any code's allocations reach a threshold, so it lands in whichever
    method runs then (one of 0.1-40 ms in a call of 0.4 ms); every method allocates alike."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def case(text: str) -> tuple[str, int, float, int]:
    """argparse's type of a case ``n/density/width``: (text, n, density, width)."""
    parts = text.split("/")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"a case is n/density/width, got {text!r}")
    return text, parse_length(parts[0]), fraction(parts[1]), non_negative_int(parts[2])


def run_case(comm, table: Table, text: str, n: int, density: float, width: int, steps: int,
             seed: int, repeats: int = 1) -> None:
    explicit = [a for a in cc.algorithms("sparse") if a != "auto"]
    methods = explicit + ["estimate", "learn"] + list(EXTRA)
    loops = [run_loop(comm, methods, explicit,
                      draws(comm, n, density, width, steps, seed + r), n, seed + r)
             for r in range(repeats)]
    times = {m: np.concatenate([loop[0][m] for loop in loops]) for m in methods}
    start = late_start(steps)
    late_steps = np.concatenate([np.arange(r * steps + start, (r + 1) * steps)
                                 for r in range(repeats)])
    cum = {m: sum(float(loop[0][m][:CUMULATIVE].sum()) for loop in loops) for m in methods}
    best = min(explicit, key=cum.__getitem__)
    best_late = min(explicit, key=lambda m: np.median(times[m][late_steps]))
    for m in methods:
        ran = sum((loop[1][m] for loop in loops), collections.Counter())
        wrong = sum(loop[2][m] for loop in loops)
        table.add({"case": text, "method": m, "cum(ms)": cum[m] / repeats * 1e3,
                   "cum/best": cum[m] / cum[best],
                   "late(ms)": float(np.median(times[m][late_steps])) * 1e3,
                   "late/best": float(np.median(times[m][late_steps]
                                                / times[best_late][late_steps])),
                   "late ran": _most(ran), "#wrong": wrong})


def run_loop(comm, methods: list[str], explicit: list[str], steps_data: list, n: int,
             seed: int) -> tuple[dict, dict, dict]:
    """One loop over ``steps_data``, every method once a step, learn's records cleared first:
    each method's agreed seconds per step, what it ran in the late window and its wrong
    values."""
    learn.records(comm).clear()
    calls = {m: EXTRA[m](n) if m in EXTRA else method_call(comm, m, n) for m in methods}
    for step in warm_steps(comm, steps_data):  # every code path the loop reaches, once
        for m in explicit:
            calls[m](*steps_data[step])
    steps = len(steps_data)
    times = {m: np.empty(steps) for m in methods}
    wrong = dict.fromkeys(methods, 0)
    ran = {m: collections.Counter() for m in methods}
    orders = np.random.default_rng([seed, len(methods)])  # the same draws on every rank
    start = late_start(steps)
    for i, (idx, val) in enumerate(steps_data):
        order = [methods[j] for j in orders.permutation(len(methods))]
        want = reference(comm, idx, val, n)
        for m in order:
            stats = getattr(calls[m], "comm", comm).stats
            before = collections.Counter(stats.calls)
            comm.barrier()
            with no_collection():
                t0 = MPI.Wtime()
                res = calls[m](idx, val)
                elapsed = MPI.Wtime() - t0
            times[m][i] = comm.mpi_comm.allreduce(elapsed, op=MPI.MAX)
            if i >= start:
                ran[m].update(key[1] for key in stats.calls - before)
            wrong[m] += count_wrong(res, want)
    return times, ran, {m: int(comm.mpi_comm.allreduce(w)) for m, w in wrong.items()}


def _most(counter: collections.Counter) -> str:
    """The algorithm run most (and its share of the calls, where it is not all of them)."""
    name, count = counter.most_common(1)[0]
    share = count / sum(counter.values())
    return name if share == 1 else f"{name} {share:.0%}"


def main(argv: list[str] | None = None) -> int:
    p = common_parser(__doc__.splitlines()[0], flags="")
    p.add_argument("--cases", type=listed(case), default=CASES,
                   help="comma-separated n/density/width")
    p.add_argument("--steps", type=positive_int, default=200,
                   help="calls of each method per loop")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="loops per case, each with fresh draws and learn's records cleared")
    p.add_argument("--seed", type=non_negative_int, default=0)
    args = p.parse_args(argv)
    comm = cc.init("mpi")
    table = Table(COLUMNS, rank=comm.rank)
    table.widths = [16, 20, 10, 10, 10, 10, 24, 7]
    table.header(f"P = {comm.size}, {args.repeats} loops of {args.steps} steps a case; cum = "
                 f"steps 1-{min(args.steps, CUMULATIVE)} over the explicit algorithm of least "
                 f"time there; late = median over steps {late_start(args.steps) + 1}-"
                 f"{args.steps} over the explicit algorithm of least median there")
    for text, n, density, width in args.cases:
        run_case(comm, table, text, n, density, width, args.steps, args.seed,
                 args.repeats)
    return table.finish(args, {"steps": args.steps, "repeats": args.repeats,
                               "cases": ",".join(text for text, *_ in args.cases)})


if __name__ == "__main__":
    sys.exit(main())
