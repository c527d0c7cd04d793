"""Tests written to kill surviving mutants of ``cupycoll/sparse/`` (issue 17, mutation testing).

Each expected value comes from a documented rule worked by hand (rounds or bytes of a
hand-built profile), not from the library's helpers; docs/testing.md names the mutants.
"""

from __future__ import annotations

import pytest

from cupycoll._types import ReduceOp
from cupycoll.sparse import auto
from cupycoll.sparse._cost import Shape
from cupycoll.tuner import Profile

ZERO_WORK = {"merge": 0.0, "row": 0.0, "dense": 0.0, "scan": 0.0}
#: 1 s per sequential round, nothing else.
ROUNDS_ONLY = Profile("rounds", 1.0, 0.0, 1.0, 0.0, ZERO_WORK)
#: 1 s per byte received, nothing else.
BYTES_ONLY = Profile("bytes", 0.0, 1.0, 0.0, 1.0, ZERO_WORK)


def wide(p: int, op: str = "sum") -> Shape:
    """3 of 64 rows of width 8 (float32 values, int32 indices) on every rank."""
    return Shape(p, 64, 8, 4, 4, (3,) * p, op=op)


class _MPI:
    """A host communicator whose broadcast delivers ``profile`` (rank 0's) to every rank."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    def bcast(self, data, root=0):
        return self.profile.as_dict()


class _Comm:
    """Just what ``choose`` reads of a communicator: size, rank, the host MPI communicator."""

    def __init__(self, size: int, profile: Profile) -> None:
        self.size, self.rank, self.mpi_comm = size, 1, _MPI(profile)


# Rounds after validation's one (docs/tuning.md, dense.py): allgather 2 (counts, one exchange);
# dense 1 when presence folds into the allreduce (sum of rows of width >= 8), else 3 (allreduce,
# bitmap exchange, bitmap allgather); recursive doubling at P = 2 also 2; mask 3, split 4+.
# So under ROUNDS_ONLY a summed wide shape goes dense and a max one goes to allgather (first on
# the tie with recursive doubling at P = 2).


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_choose_op_overrides_the_shapes_op(p):
    """``op`` (a name or a ReduceOp) replaces ``shape.op`` before pricing."""
    for op in ("max", ReduceOp.MAX, "min", ReduceOp.PROD):
        assert auto.choose(wide(p, "sum"), ROUNDS_ONLY, op=op) == "allgather", op
    for op in ("sum", ReduceOp.SUM, "avg", ReduceOp.AVG):
        assert auto.choose(wide(p, "max"), ROUNDS_ONLY, op=op) == "dense", op
    assert auto.choose(wide(p, "max"), ROUNDS_ONLY) == "allgather"  # no op: the shape's
    assert auto.choose(wide(p, "sum"), ROUNDS_ONLY) == "dense"


def test_choose_takes_the_profile_given_or_the_communicators():
    """An explicit profile wins; else the communicator's broadcast one (rank 0's). At P = 2,
    bytes only: dense moves floor(2 * 1/2 * 64 * (32 + 4)) = 2,304 bytes, allgather 8 (counts)
    + 3 * 36 = 116 (recursive doubling the same: 8-byte header + 108; the tie goes to
    allgather)."""
    s = wide(2)
    assert auto.choose(s, ROUNDS_ONLY) == "dense" and auto.choose(s, BYTES_ONLY) == "allgather"
    env = pytest.MonkeyPatch()
    env.setenv("CUPYCOLL_RANKS_PER_NODE", "2")  # one node; no collective node detection
    try:
        assert auto.choose(s, comm=_Comm(2, ROUNDS_ONLY)) == "dense"
        assert auto.choose(s, comm=_Comm(2, BYTES_ONLY)) == "allgather"
        assert auto.choose(s, BYTES_ONLY, comm=_Comm(2, ROUNDS_ONLY)) == "allgather"
        assert auto.choose(s, ROUNDS_ONLY, comm=_Comm(2, BYTES_ONLY)) == "dense"
    finally:
        env.undo()


def test_choose_reads_the_nodes_from_the_communicator_only_when_the_shape_has_none(
        monkeypatch):
    """64 ranks, 8 per node, a network between nodes slower than inside (ib400): hierarchical
    wins (tests/test_hierarchical.py); on one node it costs what split costs and the tie goes
    to split. Nodes come from the communicator only when ``shape.nodes`` is None."""
    from cupycoll.tuner.simulate import network_profile

    ib = network_profile("ib400", 64)
    flat = Shape(64, 1 << 24, 0, 4, 4, (1 << 17,) * 64)
    monkeypatch.setenv("CUPYCOLL_RANKS_PER_NODE", "8")
    comm = _Comm(64, ib)
    assert auto.choose(flat, ib) == "split"                     # no comm: one node
    assert auto.choose(flat, ib, comm=comm) == "hierarchical"   # 8 nodes from the comm
    assert auto.choose(flat, comm=comm) == "hierarchical"       # and its profile
    one_node = Shape(**{**flat.__dict__, "nodes": (0,) * 64})
    assert auto.choose(one_node, ib, comm=comm) == "split"      # the shape's nodes kept


def test_call_cost_of_auto_prices_with_the_given_profile():
    """``call_cost("auto", ...)`` books the algorithm chosen under the profile it is given:
    dense's one allreduce under ROUNDS_ONLY, allgather's counts and exchange under BYTES_ONLY
    (both after the validation allreduce)."""
    s = wide(2)
    assert set(auto.call_cost("auto", s, 0, ROUNDS_ONLY).received) == {
        "sparse.validate", "dense.allreduce"}
    assert set(auto.call_cost("auto", s, 0, BYTES_ONLY).received) == {
        "sparse.validate", "allgather.counts", "allgather"}
    assert auto.call_cost("auto", s, 1, BYTES_ONLY).received["allgather"] == 3 * (4 + 32)
