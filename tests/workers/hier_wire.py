"""hierarchical on the compact wire and with rounded values, on emulated nodes (1-3 ranks per
node, a short last node among them): the result against the dense numpy sum of the inputs
(exact for compact, within the rounding for bfloat16 and float16; the same bytes on every
rank), and compact's traffic against the cost
model per operation name; an asynchronous call runs the node layout its validation agreed
on, whatever the environment says when it runs.

Usage: hier_wire.py
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
from mpi4py import MPI
from _common import unique
from cupycoll.comm.mpi import MPICommunicator
from cupycoll.sparse import sparse_allreduce
from cupycoll.sparse._cost import Shape
from cupycoll.sparse.auto import call_cost
from cupycoll.wire._pack import Wire
from sparse_volume import measured


def main() -> None:
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=60)
    size, rank = comm.size, comm.rank
    checked = 0
    for c, (n, k, width) in enumerate([(4000, 300, 0), (1 << 20, 5000, 3), (64, 40, 0)]):
        inputs = []
        for r in range(size):
            rng = np.random.default_rng([c, r])
            idx = unique(rng.integers(0, n, k)).astype(np.int32)
            shape = (idx.size, width) if width else (idx.size,)
            inputs.append((idx, rng.integers(-9, 10, shape).astype(np.float32)))
        dense = np.zeros((n, width) if width else n, np.float32)
        for i, v in inputs:
            dense[i] += v
        # rounded wires: values no 16-bit format holds, so a rank that rounds differently shows
        fine = [(i, v + np.float32(1 / 3)) for i, v in inputs]
        fine_dense = dense.copy()
        for i, _ in inputs:
            fine_dense[i] += np.float32(1 / 3)
        base = Shape.from_inputs([i for i, _ in inputs], n, width, 4, 4)
        for per_node in (1, 2, 3):
            for wire, values in (("compact", None), ("coo", "bfloat16"), ("compact", "bfloat16"),
                                 ("coo", "float16")):
                os.environ["CUPYCOLL_RANKS_PER_NODE"] = str(per_node)
                comm.stats.reset()
                res = sparse_allreduce(*(inputs if values is None else fine)[rank], n,
                                       algorithm="hierarchical", comm=comm, wire=wire,
                                       wire_values=values)
                os.environ.pop("CUPYCOLL_RANKS_PER_NODE")
                oi, ov = np.asarray(res.indices), np.asarray(res.values)
                allv = MPI.COMM_WORLD.allgather(ov.tobytes())
                assert len(set(allv)) == 1, "ranks differ"
                ref_i = unique(np.concatenate([i for i, _ in inputs]))
                assert np.array_equal(oi, ref_i), (per_node, wire)
                if values is None:
                    assert np.array_equal(ov, dense[ref_i]), (per_node, wire)
                    nodes = tuple(r // per_node for r in range(size))
                    shape = dataclasses.replace(base, nodes=nodes, wire=Wire(True, None))
                    model = call_cost("hierarchical", shape, rank)
                    want = {op: (model.received[op], model.messages[op]) for op in model.received}
                    got = measured(comm)
                    assert got == want, (rank, per_node, n, sorted(got.items()),
                                         sorted(want.items()))
                else:
                    assert np.allclose(ov, fine_dense[ref_i], rtol=0.05, atol=0.5), \
                        (per_node, wire)
                checked += 1
    comm.stats.reset()
    async_setting_changed(comm, inputs)
    if rank == 0:
        print(f"ok {checked} hierarchical wire cases on {size} ranks")


def async_setting_changed(comm, inputs) -> None:
    """An asynchronous call made with CUPYCOLL_RANKS_PER_NODE=2 on every rank, queued behind
    other work on the background worker; rank 0 removes the variable at once, the others once
    their call is done: every rank runs the nodes of 2 the validation agreed on (before: rank
    0's run read the variable again and ran split while the others ran nodes of 2: a timeout
    on every rank, each in another step)."""
    from cupycoll._background import runner

    n, rank, timeout = 64, comm.rank, comm.timeout
    comm.timeout = 10
    os.environ["CUPYCOLL_RANKS_PER_NODE"] = "2"
    runner(comm).submit(time.sleep, 0.3)  # the call runs after rank 0's change
    work = sparse_allreduce(*inputs[rank], n, algorithm="hierarchical", comm=comm,
                            async_op=True)
    if rank == 0:
        os.environ.pop("CUPYCOLL_RANKS_PER_NODE")
    got = work.wait()
    os.environ.pop("CUPYCOLL_RANKS_PER_NODE", None)
    comm.timeout = timeout
    assert np.array_equal(got.indices, unique(np.concatenate([i for i, _ in inputs])))
    if rank ^ 1 < comm.size:  # on a node of 2: a node phase (split has none)
        assert any(op.startswith("hierarchical.node") for op in measured(comm)), measured(comm)


if __name__ == "__main__":
    main()
