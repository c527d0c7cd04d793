"""The hierarchical algorithm over emulated nodes against the independent dense reference.

Usage: sparse_hier.py SEED NCASES

For every CUPYCOLL_RANKS_PER_NODE in 1, 2, 3, 4 (the last node short when it does not divide
P) and every rail algorithm (each forced in turn, then the time model's choice), NCASES
randomized cases of sparse_random (every op, dtype, width, index dtype, empty ranks, duplicates,
hot/skewed, disjoint and identical patterns, NaN/inf/+-0) are checked against sparse_random's
numpy reference; results must be bitwise identical on every rank. Also checks the topology: with
the setting unset, MPI's shared-memory split puts every rank of this machine on one node.
"""

from __future__ import annotations

import os
import sys

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
    every = MPI.COMM_WORLD.allgather(digests)
    assert all(d == every[0] for d in every), "results differ across ranks"
    if rank == 0:
        print(f"ok {total} hierarchical cases on {size} ranks")


if __name__ == "__main__":
    main()
