"""The algorithm registry: one record per algorithm (run, traffic and work models, flags),
read by the front door and the tuner alone; a toy algorithm added at run time is priced,
listed, measured and accounted for with no other edit (tests/workers/toy_algorithm.py)."""

from __future__ import annotations

import numpy as np
import pytest

import cupycoll as cc
from cupycoll import algorithms
from cupycoll._registry import Algorithm, lookup, priced, record, register, unregister
from cupycoll.errors import InvalidArgument
from cupycoll.sparse import auto
from cupycoll.sparse._cost import Cost, Shape

from ._mpi import run_mpi


def test_every_shipped_algorithm_has_one_record_with_its_models():
    sparse = priced("sparse")
    assert list(sparse) == ["allgather", "dense", "mask", "recursive_doubling", "split",
                            "hierarchical"]  # auto breaks ties in this order
    shape = Shape(4, 10_000, 8, 4, 4, (100, 200, 300, 400))
    for name, found in sparse.items():
        assert found.family == "sparse" and found.name == name
        assert isinstance(found.cost(shape, 1, None), Cost)
        assert found.work is not None and all(v >= 0 for v in found.work(shape, 1).values())
    assert record("sparse", "auto").cost is None  # listed, never priced
    assert [n for n, a in sparse.items() if a.counts] == ["allgather", "mask",
                                                          "recursive_doubling"]
    assert [n for n, a in sparse.items() if a.dense_output] == ["dense", "split"]
    assert [n for n, a in sparse.items() if not a.coded] == ["dense"]
    for name in algorithms("topk"):
        found = record("topk", name)
        assert found.selector is not None and found.cost(8, 100, 10_000).words > 0


def test_records_replace_remove_and_order_ties():
    def run(*args, **kwargs):
        return None

    try:
        register("sparse", "toy_late", run, cost=lambda s, r, p=None: Cost(), tie=-1)
        register("sparse", "toy_counts", run, cost=lambda s, r, p=None: Cost(), counts=True)
        assert list(priced("sparse"))[0] == "toy_late"  # a lower tie goes first
        assert list(priced("sparse"))[-2:] == ["toy_counts", "hierarchical"]  # tie 0, then 1
        assert lookup("sparse", "toy_late", counts=(1, 2)) is run  # takes no counts
        assert lookup("sparse", "toy_counts", counts=(1, 2)).keywords == {"counts": (1, 2)}
        assert auto.predicted_times(Shape(2, 100, 0, 4, 4, (5, 5))).keys() >= {"toy_late"}
    finally:
        unregister("sparse", "toy_late")
        unregister("sparse", "toy_counts")
    assert "toy_late" not in algorithms("sparse")
    with pytest.raises(InvalidArgument, match="toy_late"):
        record("sparse", "toy_late", rank=3)
    assert isinstance(record("sparse", "mask"), Algorithm)


def test_a_record_registered_again_runs_in_place_of_the_one_a_communicator_bound():
    """The front door keeps each algorithm's bound run function per communicator; a name
    registered again (a plug-in replaced at run time) runs its new function from the next
    call, and a removed one is refused naming it."""
    comm = cc.init("mpi")
    idx, val = np.array([4, 1], np.int64), np.array([2.0, 3.0], np.float32)

    def scaled(factor):
        def run(comm, indices, values, n, op, accumulate_dtype=None, wire=None):
            return indices, values * factor
        return run

    try:
        register("sparse", "toy_swap", scaled(10), cost=lambda s, r, p=None: Cost())
        first = cc.sparse_allreduce(idx, val, 8, algorithm="toy_swap", comm=comm)
        register("sparse", "toy_swap", scaled(100), cost=lambda s, r, p=None: Cost())
        again = cc.sparse_allreduce(idx, val, 8, algorithm="toy_swap", comm=comm)
    finally:
        unregister("sparse", "toy_swap")
    assert first.indices.tolist() == [1, 4] and first.values.tolist() == [30.0, 20.0]
    assert again.values.tolist() == [300.0, 200.0]
    with pytest.raises(InvalidArgument, match="toy_swap"):
        cc.sparse_allreduce(idx, val, 8, algorithm="toy_swap", comm=comm)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_a_toy_algorithm_added_at_run_time_is_priced_listed_measured_and_accounted(nprocs):
    out = run_mpi(nprocs, "toy_algorithm.py", 31 + nprocs, timeout=300)
    assert f"ok toy algorithm on {nprocs} ranks" in out
