"""Ok-Topk's two-level allgather (node gather, leaders' allgatherv, node broadcast), exactly.

Usage: topk_nodes.py SEED

For 1..4 ranks per node (``CUPYCOLL_RANKS_PER_NODE``; 1 and P per node run the flat phase):

- the phase alone on random balanced blocks (empty blocks included; int32 indices with float32
  and float64 values, so slots need alignment padding): every rank holds the concatenation of
  every rank's block in rank order, built with numpy from the regenerated inputs, and receives
  exactly the bytes and messages of ``allgather_nodes_cost`` per step (or the flat phase's);
- whole Ok-Topk steps (refresh, then non-refresh) on random data: bitwise the flat result, the
  same on every rank, and the allgather steps' traffic equal to the model for the blocks of the
  step's global count.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from _common import assert_identical_across_ranks, rng_for
from mpi4py import MPI

from cupycoll.comm._topology import Topology, topology
from cupycoll.comm.mpi import MPICommunicator
from cupycoll.topk import TopkState, topk_allreduce
from cupycoll.topk._oktopk_nodes import OPS, allgather_nodes_cost, two_level
from cupycoll.topk._oktopk_phases import allgather_blocks, block_sizes
from cupycoll.wire._pack import COO


def block_of(seed: int, r: int, case: int, count: int, n: int, vtype: str):
    rng = rng_for(seed, r, case)
    return (np.sort(rng.choice(n, count, replace=False)).astype(np.int32),
            rng.standard_normal(count).astype(vtype))


def traffic(comm) -> dict:
    return {op: (s.bytes_received, s.messages_received) for op, s in comm.stats.by_op.items()
            if s.bytes_received or s.messages_received}


def model(topo: Topology, blocks, rank: int, vtype: str) -> dict:
    entry = lambda c: c * (4 + np.dtype(vtype).itemsize)  # noqa: E731 (coo: index + value)
    if two_level(topo, COO):
        return allgather_nodes_cost(topo, blocks, rank, entry)
    others = [int(b) for r, b in enumerate(blocks) if r != rank and b]
    return {"oktopk.allgather": (entry(sum(others)), len(others))} if others else {}


def check_phase(comm, seed: int) -> int:
    p, rank, n, checked = comm.size, comm.rank, 5000, 0
    for case, (total, vtype) in enumerate([(97, "float32"), (3, "float64"), (p * 40, "float32"),
                                           (0 if p == 1 else 1, "float64")]):
        blocks = block_sizes(total, p)
        topo = topology(comm)
        inputs = [block_of(seed, r, case, int(blocks[r]), n, vtype) for r in range(p)]
        comm.stats.reset()
        got_i, got_v = allgather_blocks(comm, *inputs[rank], blocks, n, padded=False, wire=COO,
                                        topo=topo)
        want_i = np.concatenate([i for i, _ in inputs])
        want_v = np.concatenate([v for _, v in inputs])
        label = f"rank {rank} case {case} nodes {topo.nodes}"
        assert np.array_equal(got_i, want_i) and got_i.dtype == np.int32, label
        assert np.array_equal(got_v.view(np.uint8), want_v.view(np.uint8)), label
        assert traffic(comm) == model(topo, blocks, rank, vtype), \
            f"{label}: {traffic(comm)} != {model(topo, blocks, rank, vtype)}"
        checked += 1
    return checked


def oktopk_steps(comm, seed: int, n: int, k: int):
    state, out = TopkState(), []
    for step in range(2):
        x = rng_for(seed, comm.rank, 50 + step).standard_normal(n).astype(np.float32)
        comm.stats.reset()
        res = topk_allreduce(x, k, comm=comm, state=state, algorithm="oktopk")
        out += [res.indices, res.values]
    return out, state


def check_oktopk(comm, seed: int, per_node: int, flat: list) -> None:
    got, state = oktopk_steps(comm, seed, 4096, 64)
    for a, b in zip(got, flat):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), \
            f"rank {comm.rank} {per_node} per node: differs from the flat phase"
    assert not state.last["refresh"]
    blocks = block_sizes(state.last["global_count"], comm.size)
    topo = topology(comm)
    names = set(OPS) | {"oktopk.allgather"}
    seen = {op: v for op, v in traffic(comm).items() if op in names}
    assert seen == model(topo, blocks, comm.rank, "float32"), (per_node, seen)
    assert_identical_across_ranks(*got)


def main() -> None:
    seed = int(sys.argv[1])
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=120)
    os.environ.pop("CUPYCOLL_RANKS_PER_NODE", None)
    flat, _ = oktopk_steps(comm, seed, 4096, 64)
    checked = 0
    for per_node in (1, 2, 3, 4):
        os.environ["CUPYCOLL_RANKS_PER_NODE"] = str(per_node)
        checked += check_phase(comm, seed)
        check_oktopk(comm, seed, per_node, flat)
    os.environ.pop("CUPYCOLL_RANKS_PER_NODE", None)
    if comm.rank == 0:
        print(f"ok {checked} phase cases, oktopk at 1-4 ranks per node on {comm.size} ranks")


if __name__ == "__main__":
    main()
