"""A toy sparse algorithm registered at run time is priced, listed, measured and accounted for
like the shipped ones, with no other edit (docs/architecture.md, "Adding an algorithm").

Usage: toy_algorithm.py SEED

``toy`` densifies every rank's entries and its presence and sums both with two native
allreduces (sum only). Registered with its traffic and work models, it is: run by
``sparse_allreduce(algorithm="toy")`` and exact against a dense numpy reference; booked in
``comm.stats`` exactly as its model says; priced by ``auto`` (and picked where it is the
cheapest, on P > 1 ranks); listed by ``simulate``; measured by ``tune`` (its fixed cost); and gone after
``unregister``.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import check_result, rng_for, union_reference, unique

import cupycoll as cc
from cupycoll._registry import priced, register, unregister
from cupycoll.sparse import auto
from cupycoll.sparse._cost import Cost, Shape
from cupycoll.tuner import Profile
from cupycoll.tuner.calibrate import tune
from cupycoll.tuner.simulate import sparse_rows

SEED = int(sys.argv[1])


def toy(comm, indices, values, n, op, accumulate_dtype=None, wire=None):
    """Sum the densified entries and their presence; return the union's rows."""
    xp, row = comm.xp, tuple(values.shape[1:])
    full = xp.zeros((n,) + row, values.dtype)
    full[indices] = values
    present = xp.zeros(n, np.int32)
    present[indices] = 1
    comm.stream_order(comm.allreduce(full, full, op, op_name="toy.values"))
    comm.stream_order(comm.allreduce(present, present, "sum", op_name="toy.presence"))
    union = xp.flatnonzero(present).astype(indices.dtype)
    return union, full[union]


def cost(shape: Shape, rank: int, profile=None) -> Cost:
    return (Cost().allreduce("toy.values", shape.size, shape.n * shape.row_bytes)
            .allreduce("toy.presence", shape.size, 4 * shape.n))


def work(shape: Shape, rank: int, profile=None) -> dict:
    return {"dense": shape.n * max(shape.width, 1), "scan": shape.n}


def main() -> None:
    comm = cc.init("mpi")
    rank, size = comm.rank, comm.size
    register("sparse", "toy", toy, cost=cost, work=work)
    assert "toy" in cc.algorithms("sparse") and "toy" in priced("sparse")
    for case, (n, k, width) in enumerate(((1000, 50, 0), (300, 40, 3), (64, 0, 0))):
        parts = [(unique(rng_for(SEED, r, case).integers(0, n, k if r else k // 2))
                  .astype(np.int32), None) for r in range(size)]
        parts = [(i, rng_for(SEED, r, case, 1).integers(-9, 10, (i.size, width) if width
                                                        else i.size).astype(np.float32))
                 for r, (i, _) in enumerate(parts)]
        comm.stats.reset()
        check_result(cc.sparse_allreduce(*parts[rank], n, algorithm="toy", comm=comm, wire="coo"),
                     union_reference(parts, n, width))
        shape = Shape.from_inputs([i for i, _ in parts], n, width, 4, 4)
        model = auto.call_cost("toy", shape, rank)
        got = {op: (s.bytes_received, s.messages_received) for op, s in comm.stats.by_op.items()
               if s.bytes_received or s.messages_received}
        assert got == {op: (model.received[op], model.messages[op]) for op in model.received}, \
            (rank, got, model)
    shape = Shape(size, 1000, 0, 4, 4, (50,) * size)
    times = auto.predicted_times(shape)
    assert "toy" in times and times["toy"] > 0
    others = Profile("toy wins", 1e-6, 1e-9, 1e-6, 1e-9, {"dense": 1e-12, "scan": 1e-12},
                     fixed={name: 1.0 for name in priced("sparse") if name != "toy"})
    assert auto.choose(shape, others) == ("toy" if size > 1 else "allgather")  # P = 1: a copy
    assert {r["algorithm"] for r in sparse_rows([size, 64], ["ib400"], 1 << 16, 0.01, 0)} \
        == set(priced("sparse"))
    measured = tune(comm, repeats=1)
    assert "toy" in measured.fixed and measured.fixed["toy"] >= 0
    unregister("sparse", "toy")
    assert "toy" not in cc.algorithms("sparse")
    print(f"ok toy algorithm on {size} ranks" if rank == 0 else "", flush=True)


if __name__ == "__main__":
    main()
