"""nccl-tests-style benchmark of cupycoll's dense collectives (run under mpiexec; rank 0 prints).

    mpiexec -n 4 python -m mpi4py bench/bench_dense.py -b 8 -e 64M -f 2 -n 20 -w 3
    mpiexec -n 4 python -m mpi4py bench/bench_dense.py --collective all --json dense.json
    mpiexec -n 2 python -m mpi4py bench/bench_dense.py --vs-mpi --collective all \\
        --sizes 8,1K,256K,16M -n 20

``--vs-mpi`` times each cupycoll verb next to mpi4py's blocking call on the same buffers, in
three ways (in place; ``out=`` a preallocated buffer; out of place, a fresh output per call);
each way is timed on its own, the two calls interleaved (alternating which goes first); a time
is the median over rounds of the slowest rank.
It prints one row per verb and way, a column per size: cupycoll us / mpi4py us = ratio. The
mpi4py twins: Allreduce, Bcast, Reduce, Allgather, Reduce_scatter_block (``MPI.IN_PLACE`` for
the in-place way; Bcast is in place by nature, so its ``out=`` and fresh twins copy root's input
into the output first, as NCCL's out-of-place broadcast must).
Sizes below 1 MiB run 10x the ``-n`` rounds.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import (DENSE_COLUMNS, NOT_CHECKED, Table, bandwidths, common_parser,
                     interleaved, listed, non_negative_int, parse_size, progress, run_meta,
                     sample_stats, sizes, time_collective)
from mpi4py import MPI

import cupycoll as cc
from cupycoll.comm import bus_factor

COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter")


#: the ops a run can time (``-o``); each one's reduction over the ranks' (exact) inputs
REDUCTIONS = {"sum": np.sum, "max": np.max, "min": np.min, "avg": None}


def _average(inputs: np.ndarray, dtype) -> np.ndarray:
    """avg as the library computes it: the exact sum divided by P in float32 (float64 for
    float64; integers truncate toward zero)."""
    total, size = np.sum(inputs, axis=0), inputs.shape[0]
    if np.dtype(dtype).kind in "iu":
        return np.trunc(total / size)
    wide = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    return total.astype(wide) / wide(size)


def rank_input(count: int, rank: int, dtype) -> np.ndarray:
    """Rank ``rank``'s input: small integers that depend on the element and the rank (so a
    block in the wrong place, or a permuted one, is wrong; every sum is exact in float16)."""
    return ((np.arange(count) + 3 * rank) % 13 + rank + 1).astype(dtype)


def expected(name: str, count: int, rank: int, size: int, root: int, dtype, op: str = "sum"
             ) -> np.ndarray:
    """What the output must hold, from every rank's :func:`rank_input` (nccl-tests' idea)."""
    local = count // size if name == "allgather" else count
    inputs = np.stack([rank_input(local, r, np.float64) for r in range(size)])
    if name == "broadcast":
        return inputs[root].astype(dtype)
    if name == "allgather":
        return inputs.reshape(-1).astype(dtype)
    reduced = _average(inputs, dtype) if op == "avg" else REDUCTIONS[op](inputs, axis=0)
    block = count // size
    return (reduced if name != "reduce_scatter" else
            reduced[rank * block:(rank + 1) * block]).astype(dtype)


def run_one(name: str, nbytes: int, args, comm, table: Table) -> None:
    dtype = np.dtype(args.datatype)
    p, rank, root = comm.size, comm.rank, args.root
    count = max(1, nbytes // dtype.itemsize)
    if name in ("allgather", "reduce_scatter"):
        count = max(p, count // p * p)  # P equal blocks
    local = count // p if name == "allgather" else count
    x, op = rank_input(local, rank, dtype), args.op
    calls = {
        "allreduce": lambda: cc.allreduce(x, op=op, comm=comm),
        "broadcast": lambda: cc.broadcast(x, root=root, comm=comm),
        "reduce": lambda: cc.reduce(x, root=root, op=op, comm=comm),
        "allgather": lambda: cc.allgather(x, comm=comm),
        "reduce_scatter": lambda: cc.reduce_scatter(x, op=op, comm=comm),
    }
    samples = time_collective(calls[name], args.iters, args.warmup_iters, comm)
    wrong = NOT_CHECKED
    if args.check:
        out = calls[name]()
        bad = 0 if out is None else int(np.count_nonzero(
            out != expected(name, count, rank, p, root, dtype, op)))
        wrong = int(comm.mpi_comm.allreduce(bad))
    seconds = float(np.median(samples))
    size_bytes = count * dtype.itemsize
    algbw, busbw = bandwidths(size_bytes, seconds, bus_factor(name, p))
    table.add({"size(B)": size_bytes, "count": count, "type": dtype.name, "redop": args.op
               if name in ("allreduce", "reduce", "reduce_scatter") else "none",
               "root": root if name in ("broadcast", "reduce") else -1,
               "time(us)": seconds * 1e6, "algbw(GB/s)": algbw, "busbw(GB/s)": busbw,
               "#wrong": wrong, "collective": name, **sample_stats(samples)})


WAYS = ("in-place", "out=", "fresh")


#: nccl-tests' flags --vs-mpi does not honour: (flag, argparse's dest)
VS_MPI_IGNORES = (("-b", "minbytes"), ("-e", "maxbytes"), ("-f", "stepfactor"), ("-c", "check"),
                  ("-d", "datatype"), ("-o", "op"))


def vs_count(nbytes: int, p: int) -> int:
    """float32 elements of --vs-mpi's buffers for a size of ``nbytes``: P equal blocks of at
    least one element."""
    return max(p, nbytes // 4 // p * p)


def twins(name: str, nbytes: int, comm, root: int) -> dict:
    """(cupycoll call, mpi4py call) of ``name`` in each way, over float32 buffers of
    ``vs_count(nbytes, P)`` elements."""
    p, rank, mc = comm.size, comm.rank, comm.mpi_comm
    count = vs_count(nbytes, p)
    local = count // p if name == "allgather" else count
    x, whole = np.ones(local, np.float32), np.ones(count, np.float32)
    out = np.empty(count // p if name == "reduce_scatter" else count, np.float32)
    fresh = lambda: np.empty_like(out)  # noqa: E731
    block = out[rank * local:(rank + 1) * local]
    inplace = MPI.IN_PLACE
    if name == "allreduce":
        return {"in-place": (lambda: cc.allreduce(whole, out=whole, comm=comm),
                             lambda: mc.Allreduce(inplace, whole)),
                "out=": (lambda: cc.allreduce(x, out=out, comm=comm),
                         lambda: mc.Allreduce(x, out)),
                "fresh": (lambda: cc.allreduce(x, comm=comm), lambda: mc.Allreduce(x, fresh()))}
    if name == "broadcast":
        def bcast_into(buf):  # NCCL's out-of-place semantics: root's output gets its input too
            if rank == root:
                buf[...] = x
            mc.Bcast(buf, root)
        return {"in-place": (lambda: cc.broadcast(whole, root, out=whole, comm=comm),
                             lambda: mc.Bcast(whole, root)),
                "out=": (lambda: cc.broadcast(x, root, out=out, comm=comm),
                         lambda: bcast_into(out)),
                "fresh": (lambda: cc.broadcast(x, root, comm=comm),
                          lambda: bcast_into(fresh()))}
    if name == "reduce":
        at_root = rank == root
        return {"in-place": (lambda: cc.reduce(whole, root, out=whole, comm=comm),
                             lambda: mc.Reduce(inplace if at_root else whole,
                                               whole if at_root else None, root=root)),
                "out=": (lambda: cc.reduce(x, root, out=out, comm=comm),
                         lambda: mc.Reduce(x, out if at_root else None, root=root)),
                "fresh": (lambda: cc.reduce(x, root, comm=comm),
                          lambda: mc.Reduce(x, fresh() if at_root else None, root=root))}
    if name == "allgather":
        return {"in-place": (lambda: cc.allgather(block, out=out, comm=comm),
                             lambda: mc.Allgather(inplace, out)),
                "out=": (lambda: cc.allgather(x, out=out, comm=comm),
                         lambda: mc.Allgather(x, out)),
                "fresh": (lambda: cc.allgather(x, comm=comm), lambda: mc.Allgather(x, fresh()))}
    return {"in-place": (lambda: cc.reduce_scatter(whole, out=whole[rank * out.size:
                                                                     (rank + 1) * out.size],
                                                   comm=comm),
                         lambda: mc.Reduce_scatter_block(inplace, whole)),
            "out=": (lambda: cc.reduce_scatter(whole, out=out, comm=comm),
                     lambda: mc.Reduce_scatter_block(whole, out)),
            "fresh": (lambda: cc.reduce_scatter(whole, comm=comm),
                      lambda: mc.Reduce_scatter_block(whole, fresh()))}


def side_by_side(args, comm, names) -> None:
    """Print and (--json) write cupycoll vs mpi4py per verb, way and size (see the docstring)."""
    rows = []
    ran = [4 * vs_count(nbytes, comm.size) for nbytes in args.sizes]
    for name in names:
        for nbytes in args.sizes:
            iters = args.iters * (10 if nbytes < 1 << 20 else 1)
            for way, (ours, theirs) in twins(name, nbytes, comm, args.root).items():
                # one way at a time: a call right after one that freed a fresh large output
                # is slower (measured up to 2x at 16 MiB), whichever library makes it
                samples = interleaved({"cc": ours, "mpi": theirs}, iters, args.warmup_iters,
                                      comm)
                ours, theirs = (float(np.median(samples[who])) * 1e6 for who in ("cc", "mpi"))
                rows.append({"collective": name, "way": way,
                             "size(B)": 4 * vs_count(nbytes, comm.size),
                             "cupycoll(us)": ours, "mpi4py(us)": theirs, "ratio": ours / theirs})
    if comm.rank == 0:
        print(f"# ranks={comm.size}  float32 sum  root={args.root}  median of the slowest rank; "
              "cell: cupycoll us / mpi4py us = ratio")
        head = "".join(f"{s:>28}" for s in ran)
        print(f"# {'collective':<15}{'way':<9}{head}")
        for name in names:
            for way in WAYS:
                cells = "".join(f"{r['cupycoll(us)']:>10.1f} /{r['mpi4py(us)']:>8.1f} ="
                                f"{r['ratio']:>5.2f}x" for r in rows
                                if r["collective"] == name and r["way"] == way)
                print(f"  {name:<15}{way:<9}{cells}", flush=True)
    table = Table(list(rows[0]) if rows else [], comm.rank)
    table.rows = rows
    table.write_json(args.json, run_meta(args, ranks=comm.size, mode="vs-mpi"))
    table.write_csv(args.csv)


def main() -> int:
    parser = common_parser(__doc__, plots=True)
    parser.add_argument("--collective", default="allreduce", choices=COLLECTIVES + ("all",))
    parser.add_argument("--root", type=non_negative_int, default=0,
                        help="root rank of broadcast and reduce (below the number of ranks)")
    parser.add_argument("--vs-mpi", action="store_true",
                        help="cupycoll next to mpi4py's blocking call (see the docstring)")
    parser.add_argument("--sizes", type=listed(parse_size), default=None,
                        help="sizes of --vs-mpi (comma list; default 8,1K,256K,16M)")
    args = parser.parse_args()
    if args.op not in REDUCTIONS:
        parser.error(f"-o/--op: one of {', '.join(REDUCTIONS)} (got {args.op!r})")
    if args.vs_mpi:
        if args.plot:
            parser.error("--plot: --vs-mpi draws nothing (its table, --json and --csv hold it)")
        given = [flag for flag, dest in VS_MPI_IGNORES
                 if getattr(args, dest) != parser.get_default(dest)]
        if given:
            parser.error(f"{', '.join(given)}: --vs-mpi times float32 sum at --sizes and checks "
                         "nothing")
        args.sizes = args.sizes or listed(parse_size)("8,1K,256K,16M")
    elif args.sizes is not None:
        parser.error("--sizes: the sizes of --vs-mpi (the sweep's are -b, -e and -f)")
    comm = cc.init("mpi")
    if args.root >= comm.size:  # every rank alike: each one exits with the message
        parser.error(f"--root {args.root}: must be below the number of ranks, {comm.size}")
    names = COLLECTIVES if args.collective == "all" else (args.collective,)
    if args.vs_mpi:
        side_by_side(args, comm, names)
        return 0
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
