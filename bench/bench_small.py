"""Small calls end to end: sparse_allreduce of a few entries and topk_allreduce of a short vector,
next to a pickled mpi4py ``allgather`` of the same (index, value) pairs (run under mpiexec).

Small tensors are common (per-layer buckets, small embedding tables), and there the fixed cost
of a call (argument checks, the one validation allreduce, algorithm choice, delivery) is all
there is. With ``auto`` (the default) a call whose entries fit in the validation allreduce's
slots is finished by that one collective (docs/sparse.md, "Small calls"); the
``algorithm=allgather`` row shows the same call on the normal path (validation + algorithm).
Two raw rows bound what any call that validates can cost: the validation round's own MAX
allreduce (the agreement vector, its length set by P alone), and a dense ``Allreduce`` of the
same n (what ``auto`` is compared with; raise ``--length`` to see where the round stops
mattering). Calls are interleaved, one of each per round; a time is the median over rounds of the
slowest rank. ``--block B`` times instead blocks of B calls of one kind back to back (as a
training loop repeats one call), one block of each call per round (``-n`` rounds, each in an
order of its own, after warm-up blocks of at least ``-w`` calls of each); a time is then a
block's seconds / B, the median over rounds of the slowest rank.

    mpiexec -n 2 python -m mpi4py bench/bench_small.py -n 2000
    mpiexec -n 2 python -m mpi4py bench/bench_small.py -n 5 --block 500
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from _common import (Parser, interleaved, non_negative_int, parse_length, positive_int,
                     print_medians)
from mpi4py import MPI

import cupycoll as cc
from cupycoll._agreement import length


def blocked(calls: dict[str, Callable[[], Any]], rounds: int, block: int, warmup: int,
            comm: Any) -> dict[str, Any]:
    """Seconds per call of each call run ``block`` times back to back: ``interleaved`` over
    blocks (warm-up blocks of at least ``warmup`` calls each, then one block of each per round,
    each round in an order of its own; a sample is the slowest rank's), each sample divided by
    ``block``."""
    runs = {name: (lambda f=f: [f() for _ in range(block)]) for name, f in calls.items()}
    return {name: seconds / block
            for name, seconds in interleaved(runs, rounds, -(-warmup // block), comm).items()}


def main() -> None:
    parser = Parser(description=__doc__)
    parser.add_argument("-n", "--iters", type=positive_int, default=2000)
    parser.add_argument("-w", "--warmup_iters", type=non_negative_int, default=50)
    parser.add_argument("--entries", type=non_negative_int, default=10,
                        help="sparse entries per rank (at most --length)")
    parser.add_argument("--length", type=parse_length, default=1000, help="n of both calls")
    parser.add_argument("-k", type=positive_int, default=10,
                        help="k of topk_allreduce (at most --length)")
    parser.add_argument("--block", type=non_negative_int, default=0,
                        help="time blocks of this many calls of one kind (0: interleaved)")
    args = parser.parse_args()
    if max(args.entries, args.k) > args.length:
        parser.error(f"--entries {args.entries} and -k {args.k}: at most --length "
                     f"{args.length}")
    comm = cc.init("mpi")
    rng = np.random.default_rng([7, comm.rank])
    idx = np.sort(rng.choice(args.length, args.entries, replace=False)).astype(np.int64)
    val = rng.standard_normal(args.entries).astype(np.float32)
    dense = rng.standard_normal(args.length).astype(np.float32)
    agreement = np.zeros(length(comm.size), np.int64)  # the validation round's vector
    reduced, dense_out = np.empty_like(agreement), np.empty_like(dense)
    calls = {
        "mpi4py allgather (pickled pairs)": lambda: comm.mpi_comm.allgather((idx, val)),
        f"MPI Allreduce MAX {agreement.nbytes} B (validation)": lambda: (
            comm.mpi_comm.Allreduce(agreement, reduced, op=MPI.MAX)),
        f"MPI Allreduce of n={args.length} float32": lambda: comm.mpi_comm.Allreduce(
            dense, dense_out),
        "sparse_allreduce": lambda: cc.sparse_allreduce(idx, val, args.length, comm=comm),
        "sparse_allreduce(algorithm=allgather)": lambda: cc.sparse_allreduce(
            idx, val, args.length, comm=comm, algorithm="allgather"),
        f"topk_allreduce(k={args.k})": lambda: cc.topk_allreduce(dense, args.k, comm=comm),
    }
    if args.block:
        samples = blocked(calls, args.iters, args.block, args.warmup_iters, comm)
    else:
        samples = interleaved(calls, args.iters, args.warmup_iters, comm)
    if comm.rank == 0:
        how = f"blocks of {args.block}" if args.block else "interleaved"
        print(f"# ranks={comm.size}  entries/rank={args.entries}  n={args.length}  "
              f"iters={args.iters}  {how}  time = median of the slowest rank")
        print_medians(samples, "mpi4py allgather (pickled pairs)", "call", "x_allgather")


if __name__ == "__main__":
    main()
