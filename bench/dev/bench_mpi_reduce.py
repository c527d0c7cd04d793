"""Which MPI calls a cupycoll ``reduce``, ``reduce_scatter`` or ``allreduce`` should post, raw
mpi4py side by side per size, float32 sum (run under mpiexec; nonblocking calls are tested in a
loop that yields the core every 8 tests, as cupycoll's wait does).

``reduce`` (onto rank 0): ``Reduce`` (blocking), ``Ireduce``, ``Iallreduce``, and a pairwise
reduce-scatter followed by a gather of the folded blocks at the root, which cupycoll's MPI
backend runs from ``CUPYCOLL_REDUCE_PAIRWISE`` bytes (else as an allreduce from
``CUPYCOLL_REDUCE_AS_ALLREDUCE`` bytes). ``--cupycoll`` adds ``cc.reduce`` on two communicators,
one with the pairwise reduce and one with it off (as an allreduce), timed in the same rounds.
``--verb reduce_scatter`` (the size is the whole input, P blocks): ``Reduce_scatter_block``
(blocking), ``Ireduce_scatter_block``, and a pairwise exchange (``Isend``/``Irecv`` of the
blocks, then numpy adds them in rank order), which cupycoll runs from
``CUPYCOLL_REDUCE_SCATTER_PAIRWISE`` bytes a block. ``--verb allreduce``: ``Allreduce``,
``Iallreduce``, and the pairwise reduce-scatter followed by every folded block sent to every
rank, which cupycoll runs from ``CUPYCOLL_ALLREDUCE_PAIRWISE`` bytes where P is not a power of
two; ``--cupycoll`` adds ``cc.allreduce`` with it and with it off. See docs/dense.md. A time is the median
over rounds of the slowest rank (each call after a barrier), the lesser of two passes of
each call run back to back.

    mpiexec -n 2 python -m mpi4py bench/dev/bench_mpi_reduce.py --sizes 64K,128K,256K,16M
    mpiexec -n 4 python -m mpi4py bench/dev/bench_mpi_reduce.py --sizes 256K,1M,4M,16M --cupycoll
    mpiexec -n 4 python -m mpi4py bench/dev/bench_mpi_reduce.py --verb reduce_scatter \
        --sizes 64K,128K,256K,1M,16M
    mpiexec -n 3 python -m mpi4py bench/dev/bench_mpi_reduce.py --verb allreduce --cupycoll \
        --sizes 256K,512K,1M,4M,16M
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from _common import parse_size  # noqa: E402
from mpi4py import MPI  # noqa: E402
from cupycoll._arguments import positive_int


def tested(*requests: MPI.Request) -> None:
    """Complete the requests by tests, yielding the core every 8 (cupycoll's wait loop)."""
    if not requests:
        return
    test = requests[0].Test if len(requests) == 1 else functools.partial(MPI.Request.Testall,
                                                                          list(requests))
    polls = 0
    while not test():
        polls += 1
        if polls % 8 == 0:
            os.sched_yield()


def pairwise(comm: MPI.Comm, x: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
    """Reduce-scatter by a pairwise exchange: block j of ``x`` to rank j, every rank's block
    of this rank into ``scratch`` (P rows), then a sum in rank order into ``out``."""
    size, rank = comm.size, comm.rank
    blocks = x.reshape(size, -1)
    requests = []
    for step in range(1, size):
        source, dest = (rank - step) % size, (rank + step) % size
        requests.append(comm.Irecv(scratch[source], source, 9))
        requests.append(comm.Isend(blocks[dest], dest, 9))
    tested(*requests)
    parts = [blocks[r] if r == rank else scratch[r] for r in range(size)]
    if size == 1:  # one rank: its own block
        np.copyto(out, parts[0])
        return
    np.add(parts[0], parts[1], out=out)
    for part in parts[2:]:
        np.add(out, part, out=out)


def scatter_gather(comm: MPI.Comm, x: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
    """Reduce onto rank 0 as a pairwise reduce-scatter, then every block sent to the root
    (Rabenseifner's reduce; ``x.size`` a multiple of P)."""
    size, rank = comm.size, comm.rank
    blocks = out.reshape(size, -1)
    mine = blocks[rank] if rank == 0 else scratch[-1]
    pairwise(comm, x, mine, scratch[:size])
    tested(*([comm.Irecv(blocks[r], r, 8) for r in range(1, size)] if rank == 0
             else [comm.Isend(mine, 0, 8)]))


def scatter_allgather(comm: MPI.Comm, x: np.ndarray, out: np.ndarray,
                      scratch: np.ndarray) -> None:
    """Allreduce as a pairwise reduce-scatter, then every folded block sent to every rank
    (``x.size`` a multiple of P)."""
    size, rank = comm.size, comm.rank
    blocks = out.reshape(size, -1)
    pairwise(comm, x, blocks[rank], scratch[:size])
    requests = []
    for step in range(1, size):
        source, dest = (rank - step) % size, (rank + step) % size
        requests += [comm.Irecv(blocks[source], source, 8), comm.Isend(blocks[rank], dest, 8)]
    tested(*requests)


def allreduce_calls(comm: MPI.Comm, count: int, ours: dict | None = None) -> dict:
    """The allreduce twins on ``count`` float32 elements (and cupycoll's on each communicator
    of ``ours``)."""
    count = max(comm.size, count // comm.size * comm.size)
    x, out = np.ones(count, np.float32), np.empty(count, np.float32)
    rows = np.empty((comm.size, count // comm.size), np.float32)
    return {"Allreduce": lambda: comm.Allreduce(x, out),
            "Iallreduce": lambda: tested(comm.Iallreduce(x, out)),
            "scatter+allgather": lambda: scatter_allgather(comm, x, out, rows),
            **{name: functools.partial(cc_allreduce, x, out, on)
               for name, on in (ours or {}).items()}}


def cc_allreduce(x: np.ndarray, out: np.ndarray, comm) -> None:
    import cupycoll as cc

    cc.allreduce(x, out=out, comm=comm)


def reduce_calls(comm: MPI.Comm, count: int, ours: dict | None = None) -> dict:
    """The reduce twins on ``count`` float32 elements (and cupycoll's on each communicator of
    ``ours``)."""
    at_root = comm.rank == 0
    count = max(comm.size, count // comm.size * comm.size)
    x, out, scratch = (np.ones(count, np.float32) for _ in range(3))
    rows = np.empty((comm.size + 1, count // comm.size), np.float32)
    return {"Reduce": lambda: comm.Reduce(x, out if at_root else None, root=0),
            "Ireduce": lambda: tested(comm.Ireduce(x, out if at_root else None, root=0)),
            "Iallreduce": lambda: tested(comm.Iallreduce(x, out if at_root else scratch)),
            "scatter+gather": lambda: scatter_gather(comm, x, out, rows),
            **{name: functools.partial(cc_reduce, x, out if at_root else None, on)
               for name, on in (ours or {}).items()}}


def cc_reduce(x: np.ndarray, out: np.ndarray | None, comm) -> None:
    import cupycoll as cc

    cc.reduce(x, 0, out=out, comm=comm)


def cupycoll_comms(verb: str) -> dict:
    """cupycoll communicators: ``verb`` (reduce or allreduce) as a pairwise exchange and
    gather (allgather), and with that off (reduce: as an allreduce; allreduce: MPI's)."""
    from cupycoll.comm.mpi import MPICommunicator

    variable = "CUPYCOLL_ALLREDUCE_PAIRWISE" if verb == "allreduce" else "CUPYCOLL_REDUCE_PAIRWISE"
    comms = {}
    for name, value in (("cc pairwise", "0"), ("cc " + ("native" if verb == "allreduce" else
                                                        "as-allreduce"), "off")):
        os.environ[variable] = value
        comms[name] = MPICommunicator()
    del os.environ[variable]
    return comms


def reduce_scatter_calls(comm: MPI.Comm, count: int) -> dict:
    """The reduce_scatter twins on an input of about ``count`` float32 elements (P blocks)."""
    block = max(1, count // comm.size)
    x = np.ones(block * comm.size, np.float32)
    out, scratch = np.empty(block, np.float32), np.empty((comm.size, block), np.float32)
    if comm.size > 1:  # the pairwise sum is the reduce-scatter
        want = np.empty_like(out)
        comm.Reduce_scatter_block(x, want)
        pairwise(comm, x, out, scratch)
        assert np.array_equal(out, want)
    return {"Reduce_scatter_block": lambda: comm.Reduce_scatter_block(x, out),
            "Ireduce_scatter_block": lambda: tested(comm.Ireduce_scatter_block(x, out)),
            "pairwise": lambda: pairwise(comm, x, out, scratch) if comm.size > 1 else None}


def median_of_slowest(comm: MPI.Comm, call, rounds: int) -> float:
    for _ in range(max(3, rounds // 10)):
        call()
    times = []
    for _ in range(rounds):
        comm.Barrier()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(np.max(comm.allgather(np.array(times)), axis=0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--verb", choices=("reduce", "reduce_scatter", "allreduce"),
                        default="reduce")
    parser.add_argument("--sizes", default="64K,128K,256K,1M,16M")
    parser.add_argument("--cupycoll", action="store_true", help="also time cc.reduce (or "
                        "cc.allreduce) both ways")
    parser.add_argument("-n", "--rounds", type=positive_int, default=300, help="rounds below 1 MiB "
                        "(a tenth from 1 MiB)")
    args = parser.parse_args()
    if args.cupycoll and args.verb == "reduce_scatter":
        parser.error("--cupycoll: with --verb reduce or allreduce only")
    comm = MPI.COMM_WORLD
    ours = cupycoll_comms(args.verb) if args.cupycoll else None
    make = {"reduce": functools.partial(reduce_calls, ours=ours), "reduce_scatter":
            reduce_scatter_calls, "allreduce": functools.partial(allreduce_calls, ours=ours)
            }[args.verb]
    header = False
    for text in args.sizes.split(","):
        count = parse_size(text) // 4
        calls = make(comm, count)
        if comm.rank == 0 and not header:
            header = True
            where = {"reduce": "onto rank 0", "allreduce": "onto every rank"}.get(
                args.verb, "of the whole input")
            print(f"# ranks={comm.size}  float32 sum {where}  median of the slowest rank, us")
            print(f"# {'size':>10}" + "".join(f"{name:>23}" for name in calls))
        rounds = args.rounds if count * 4 < 1 << 20 else max(5, args.rounds // 10)
        best = {name: min(median_of_slowest(comm, call, rounds) for _ in range(2))
                for name, call in calls.items()}
        if comm.rank == 0:
            print(f"  {text:>10}" + "".join(f"{t * 1e6:>23.1f}" for t in best.values()),
                  flush=True)


if __name__ == "__main__":
    main()
