"""nccl-tests-style benchmark of cupycoll's dense collectives (run under mpiexec; rank 0 prints).

    mpiexec -n 4 python -m mpi4py bench/bench_dense.py -b 8 -e 64M -f 2 -n 20 -w 3
    mpiexec -n 4 python -m mpi4py bench/bench_dense.py --collective all --json dense.json
"""

from __future__ import annotations

import sys

import numpy as np
from _common import (DENSE_COLUMNS, Table, bandwidths, common_parser, progress, sample_stats, sizes,
                     time_collective)

import cupycoll as cc
from cupycoll.comm import bus_factor

COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter")


def expected(name: str, count: int, rank: int, size: int, root: int, dtype) -> np.ndarray:
    """What the output must hold when rank r's input is full(r + 1) (nccl-tests' idea)."""
    total = size * (size + 1) // 2
    if name in ("allreduce", "reduce"):
        return np.full(count, total, dtype)
    if name == "broadcast":
        return np.full(count, root + 1, dtype)
    if name == "allgather":
        return np.repeat(np.arange(1, size + 1), count // size).astype(dtype)
    return np.full(count // size, total, dtype)


def run_one(name: str, nbytes: int, args, comm, table: Table) -> None:
    dtype = np.dtype(args.datatype)
    p, rank, root = comm.size, comm.rank, args.root
    count = max(1, nbytes // dtype.itemsize)
    if name in ("allgather", "reduce_scatter"):
        count = max(p, count // p * p)  # P equal blocks
    local = count // p if name == "allgather" else count
    x = np.full(local, rank + 1, dtype)
    calls = {
        "allreduce": lambda: cc.allreduce(x, comm=comm),
        "broadcast": lambda: cc.broadcast(x, root=root, comm=comm),
        "reduce": lambda: cc.reduce(x, root=root, comm=comm),
        "allgather": lambda: cc.allgather(x, comm=comm),
        "reduce_scatter": lambda: cc.reduce_scatter(x, comm=comm),
    }
    samples = time_collective(calls[name], args.iters, args.warmup_iters, comm.mpi_comm)
    wrong = 0
    if args.check:
        out = calls[name]()
        if out is not None:
            wrong = int(np.count_nonzero(out != expected(name, count, rank, p, root, dtype)))
        wrong = int(comm.mpi_comm.allreduce(wrong))
    seconds = float(np.median(samples))
    size_bytes = count * dtype.itemsize
    algbw, busbw = bandwidths(size_bytes, seconds, bus_factor(name, p))
    table.add({"size(B)": size_bytes, "count": count, "type": dtype.name, "redop": args.op
               if name in ("allreduce", "reduce", "reduce_scatter") else "none",
               "root": root if name in ("broadcast", "reduce") else -1,
               "time(us)": seconds * 1e6, "algbw(GB/s)": algbw, "busbw(GB/s)": busbw,
               "#wrong": wrong, "collective": name, **sample_stats(samples)})


def main() -> int:
    parser = common_parser(__doc__)
    parser.add_argument("--collective", default="allreduce", choices=COLLECTIVES + ("all",))
    parser.add_argument("--root", type=int, default=0)
    args = parser.parse_args()
    comm = cc.init("mpi")
    names = COLLECTIVES if args.collective == "all" else (args.collective,)
    table = Table(DENSE_COLUMNS, comm.rank)
    jobs = [(n, s) for n in names for s in sizes(args.minbytes, args.maxbytes, args.stepfactor)]
    for i, (name, nbytes) in enumerate(progress(jobs, len(jobs), comm.rank, not args.no_progress)):
        if i == 0 or jobs[i - 1][0] != name:
            table.header(f"{name}  ranks={comm.size}  backend={comm.backend}  "
                         f"iters={args.iters} warmup={args.warmup_iters}  time = median")
        run_one(name, nbytes, args, comm, table)
    return table.finish(args, {"ranks": comm.size, "backend": comm.backend},
                        plot=("size(B)", "time(us)", "collective"))


if __name__ == "__main__":
    sys.exit(main())
