"""Recursive doubling with its blocks read in place (the exchange arena) against copied, by size.

For each number of entries a rank, 1-D float32 sums over n = 10 x entries (random indices):
recursive doubling with every call taking the arena (``_mpi_arena.FROM`` = 0), the same with
none taking it (blocks copied by MPI), and allgather, timed interleaved
(``tuner.calibrate.interleaved``: each round in its own shuffled order, after a barrier; a
sample is the slowest rank's time). Rank 0 prints the medians in microseconds, the arena's
bound of a call's bytes (``arena_bytes``) and in place over copied; where that ratio crosses 1
is where ``_mpi_arena.FROM`` belongs::

    mpiexec -n 2 python -m mpi4py bench/dev/bench_arena.py --entries 2K,8K,32K,128K
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import parse_size  # noqa: E402

from cupycoll._arguments import positive_int  # noqa: E402
import cupycoll as cc  # noqa: E402
from cupycoll.comm import _mpi_arena  # noqa: E402
from cupycoll.sparse import sparse_allreduce  # noqa: E402
from cupycoll.sparse.recursive_doubling import arena_bytes  # noqa: E402
from cupycoll.tuner.calibrate import interleaved  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", default="2K,8K,32K,128K,512K", help="entries a rank, comma-separated")
    p.add_argument("-n", "--iters", type=positive_int, default=40)
    p.add_argument("-w", "--warmup", type=int, default=5)
    args = p.parse_args()
    comm = cc.init("mpi")
    least = _mpi_arena.FROM
    if comm.rank == 0:
        print(f"# P = {comm.size}; us, median of the slowest rank; FROM = {least} bytes")
        print(f"{'entries':>9} {'bound(B)':>10} {'in_place':>9} {'copied':>9} {'allgather':>9}"
              f" {'in/copied':>9}")
    for entries in (parse_size(e) for e in args.entries.split(",")):
        n = 10 * entries
        rng = np.random.default_rng([comm.rank, entries])
        idx = np.sort(rng.choice(n, entries, replace=False)).astype(np.int32)
        val = rng.standard_normal(entries, dtype=np.float32)

        def run(algorithm: str, from_bytes: int) -> None:
            _mpi_arena.FROM = from_bytes
            sparse_allreduce(idx, val, n, comm=comm, algorithm=algorithm)

        calls = {"in_place": lambda: run("recursive_doubling", 0),
                 "copied": lambda: run("recursive_doubling", _mpi_arena.MOST + 1),
                 "allgather": lambda: run("allgather", least)}
        times = {k: float(np.median(v)) * 1e6
                 for k, v in interleaved(calls, args.iters, args.warmup, comm).items()}
        _mpi_arena.FROM = least
        if comm.rank == 0:
            bound = arena_bytes([entries] * comm.size, n, 4, 4)
            print(f"{entries:>9} {bound:>10} {times['in_place']:>9.1f} {times['copied']:>9.1f} "
                  f"{times['allgather']:>9.1f} {times['in_place'] / times['copied']:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
