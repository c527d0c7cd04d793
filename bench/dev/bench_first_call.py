"""A process's first sparse_allreduce: import, init, first and second call, in seconds.

    mpiexec -n 2 python -m mpi4py bench/dev/bench_first_call.py                     # numba: auto
    CUPYCOLL_NUMBA=on mpiexec -n 2 python -m mpi4py bench/dev/bench_first_call.py   # waits for it

Each rank sends ``--entries`` sorted indices of a 2^24 table (float32, its own stride), the
sizes a training loop's first embedding gradient has; rank 0 prints the slowest rank's times.
Run it twice in a row so that numba's on-disk cache is warm (what a user's second job sees).
``--then K`` also times the K calls after those two (where numba's import in the background,
started by the first call, overlaps them: ``--entries 200 --then 200``).
"""

from __future__ import annotations

import argparse
import sys
import time

started = time.perf_counter()
import numpy as np  # noqa: E402

import cupycoll as cc  # noqa: E402

imported = time.perf_counter()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=1 << 16, help="entries per rank")
    p.add_argument("--then", type=int, default=0, help="calls timed after the second")
    args = p.parse_args()
    comm = cc.init("mpi")
    ready = time.perf_counter()
    n = 1 << 24
    idx = np.arange(comm.rank, n, max(n // args.entries, 1), dtype=np.int64)[:args.entries]
    val = np.ones(idx.size, np.float32)
    marks = [started, imported, ready]
    for _ in range(2):
        cc.sparse_allreduce(idx, val, n)
        marks.append(time.perf_counter())
    for _ in range(args.then):
        cc.sparse_allreduce(idx, val, n)
    if args.then:
        marks.append(time.perf_counter())
    spans = np.diff(marks)
    slowest = comm.mpi_comm.allreduce(spans.tolist(), op=_max_each())
    if comm.rank == 0:
        from cupycoll._config import setting

        names = ("import", "init", "first call", "second call", f"next {args.then} calls")
        print(f"# P = {comm.size}, {args.entries} entries a rank, CUPYCOLL_NUMBA="
              f"{setting('CUPYCOLL_NUMBA')}; seconds, slowest rank")
        print("  ".join(f"{name} {s:.3f}" for name, s in zip(names, slowest)))
    return 0


def _max_each():
    """An mpi4py op: the elementwise max of lists."""
    from mpi4py import MPI

    return MPI.Op.Create(lambda a, b, _: [max(x, y) for x, y in zip(a, b)], commute=True)


if __name__ == "__main__":
    sys.exit(main())
