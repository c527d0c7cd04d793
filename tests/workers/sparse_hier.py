"""The hierarchical algorithm over emulated nodes against the independent dense reference.

Usage: sparse_hier.py SEED NCASES

For every CUPYCOLL_RANKS_PER_NODE in 1, 2, 3, 4 (the last node short when it does not divide
P) and every rail algorithm (each forced in turn, then the time model's choice), NCASES
randomized cases of sparse_random (every op, dtype, width, index dtype, empty ranks, duplicates,
hot/skewed, disjoint and identical patterns, NaN/inf/+-0) are checked against sparse_random's
numpy reference; results must be bitwise identical on every rank. Also checks the topology: with
the setting unset, MPI's shared-memory split puts every rank of this machine on one node. And a
change of the setting on one rank while a call runs (another thread's, made here at the moment
the algorithm reads the nodes) leaves the call on the layout its validation agreed (before: that
rank ran another layout and the call failed or hung), synchronous and asynchronous alike.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from _common import digest
from mpi4py import MPI
from sparse_random import case_params, check, rank_input, same_bits

from cupycoll.comm._topology import topology
from cupycoll.comm.mpi import MPICommunicator
from cupycoll.sparse import hierarchical, sparse_allreduce

RAILS = [("allgather",), ("split",), hierarchical.RAIL_ALGORITHMS]


def main() -> None:
    seed, ncases = int(sys.argv[1]), int(sys.argv[2])
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=60)
    size, rank = comm.size, comm.rank
    os.environ.pop("CUPYCOLL_RANKS_PER_NODE", None)
    assert topology(comm).nodes == (0,) * size, topology(comm)
    digests, total = [], 0
    for per_node in (1, 2, 3, 4):
        os.environ["CUPYCOLL_RANKS_PER_NODE"] = str(per_node)
        assert topology(comm).nodes == tuple(r // per_node for r in range(size))
        for forced, rails in enumerate(RAILS):
            hierarchical.RAIL_ALGORITHMS = rails
            for case in range(ncases):
                key = seed + 1000 * per_node + 100 * forced
                prm = case_params(key, case, size, ["hierarchical"])
                inputs = [rank_input(key, case, r, size, prm) for r in range(size)]
                idx, val = inputs[rank]
                keep = (idx.copy(), val.copy())
                res = sparse_allreduce(idx, val, prm["n"], op=prm["op"],
                                       algorithm="hierarchical", comm=comm,
                                       accumulate_dtype=prm["acc"])
                assert same_bits(idx, keep[0]) and same_bits(val, keep[1]), "input modified"
                check(res, dict(prm, ranks_per_node=per_node, rails=rails), inputs, size, case)
                digests.append(digest(res.indices, res.values))
                total += 1
    changed_mid_call(comm)
    every = MPI.COMM_WORLD.allgather(digests)
    assert all(d == every[0] for d in every), "results differ across ranks"
    if rank == 0:
        print(f"ok {total} hierarchical cases on {size} ranks")


def changed_mid_call(comm) -> None:
    """The last rank's CUPYCOLL_RANKS_PER_NODE goes from 2 to 1 just as the algorithm reads
    the nodes, and back after: the call runs on nodes of 2 ranks on every rank."""
    size, rank = comm.size, comm.rank
    os.environ["CUPYCOLL_RANKS_PER_NODE"] = "2"
    hierarchical.RAIL_ALGORITHMS = RAILS[-1]
    read = hierarchical.topology

    def flipped(on):
        if rank == size - 1:
            os.environ["CUPYCOLL_RANKS_PER_NODE"] = "1"
        try:
            found = read(on)
        finally:
            os.environ["CUPYCOLL_RANKS_PER_NODE"] = "2"
        assert found.nodes == tuple(r // 2 for r in range(size)), found.nodes
        return found

    hierarchical.topology = flipped
    try:
        n, mine = 1000, np.arange(rank, 1000, 3)
        want = np.unique(np.concatenate([np.arange(q, n, 3) for q in range(size)]))
        for async_op in (False, True):
            res = sparse_allreduce(mine, np.ones(mine.size), n, algorithm="hierarchical",
                                   comm=comm, async_op=async_op)
            res = res.wait() if async_op else res
            assert np.array_equal(res.indices, want), (async_op, res.indices[:8])
    finally:
        hierarchical.topology = read


if __name__ == "__main__":
    main()
