"""``cupycoll/sparse/`` in process: the branches the multi-rank suite reaches only at scale.

Each expected value comes from a documented rule worked by hand (rounds or bytes of a
hand-built profile), not from the library's helpers; docs/testing.md names the mutants.
"""

from __future__ import annotations

import types

import pytest

from cupycoll._types import ReduceOp
from cupycoll.sparse import auto
from cupycoll.sparse._cost import Shape
from cupycoll.tuner import Profile

ZERO_WORK = {"merge": 0.0, "row": 0.0, "dense": 0.0, "scan": 0.0}
#: 1 s per native collective round, 2 s per point-to-point round, nothing else.
ROUNDS_ONLY = Profile("rounds", 2.0, 0.0, 1.0, 0.0, ZERO_WORK)
#: 1 s per byte received, nothing else.
BYTES_ONLY = Profile("bytes", 0.0, 1.0, 0.0, 1.0, ZERO_WORK)


def wide(p: int, op: str = "sum") -> Shape:
    """3 of 64 rows of width 8 (float32 values, int32 indices) on every rank."""
    return Shape(p, 64, 8, 4, 4, (3,) * p, op=op)


class _MPI:
    """A host communicator whose broadcast delivers ``profile`` (rank 0's) to every rank, and
    whose node detection finds every rank on node 0 with this rank's settings."""

    def __init__(self, profile: Profile, size: int) -> None:
        self.profile, self.size = profile, size

    def bcast(self, data, root=0):
        return self.profile.as_dict()

    def Get_rank(self):
        return 1

    def Split_type(self, split_type, key=0):
        return types.SimpleNamespace(bcast=lambda data, root=0: 0, Free=lambda: None)

    def allgather(self, item):
        return [item] * self.size


class _Comm:
    """Just what ``choose`` reads of a communicator: size, rank, the host MPI communicator."""

    def __init__(self, size: int, profile: Profile) -> None:
        self.size, self.rank, self.mpi_comm = size, 1, _MPI(profile, size)

    def host_arrival(self, op_name: str) -> None:
        """Every rank is here (the wait a Communicator takes before its once-only MPI calls)."""

    def host_bcast(self, obj, op_name: str):
        """Rank 0's ``obj`` (the host communicator's broadcast: the profile)."""
        return self.mpi_comm.bcast(obj, root=0)


# Rounds after validation's one native round (docs/tuning.md, dense.py), priced by ROUNDS_ONLY:
# allgather one exchange (2 s: the validation told the counts); dense one native allreduce (1 s)
# when presence folds into it (a sum), else allreduce, bitmap exchange and bitmap allgather
# (4 s); mask an index exchange and an allreduce (3 s); recursive doubling two exchanges per
# pairwise round but one where the partner's count is known (2 s at P = 2: ties allgather, which
# MODELS lists first); split 6 s or more. So under ROUNDS_ONLY a summed wide shape
# goes dense (2 s in all) and a max one goes to allgather (3 s).


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
    bytes only: dense moves floor(2 * 1/2 * 64 * (32 + 4)) = 2,304 bytes, allgather 3 * 36 =
    108 (the counts came with the validation), recursive doubling the same (its one round's
    header is known too); the tie goes to allgather, first in MODELS."""
    s = wide(2)
    assert auto.choose(s, ROUNDS_ONLY) == "dense" and auto.choose(s, BYTES_ONLY) == "allgather"
    env = pytest.MonkeyPatch()
    env.setenv("CUPYCOLL_RANKS_PER_NODE", "2")  # one node
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
    dense's one allreduce under ROUNDS_ONLY, allgather's exchange under BYTES_ONLY (both after
    the validation allreduce, which told allgather the counts). Rows of width 96, so the
    entries do not fit in the validation's slots (wide(2)'s do: ``small``, the validation
    alone)."""
    assert set(auto.call_cost("auto", wide(2), 0, ROUNDS_ONLY).received) == {"sparse.validate"}
    s = Shape(2, 64, 96, 4, 4, (3, 3))
    assert set(auto.call_cost("auto", s, 0, ROUNDS_ONLY).received) == {
        "sparse.validate", "dense.allreduce"}
    assert set(auto.call_cost("auto", s, 0, BYTES_ONLY).received) == {
        "sparse.validate", "allgather"}
    assert auto.call_cost("auto", s, 1, BYTES_ONLY).received["allgather"] == 3 * (4 + 4 * 96)


def _coded_profile(beta: float, code: float) -> Profile:
    return Profile("wire", 0.0, beta, 0.0, beta, {**ZERO_WORK, "code": code})


def test_choose_wire_fixed_requests_and_what_never_codes():
    """coo stays coo; compact is taken as asked; dense (no entries travel) and P = 1 (nothing
    travels) stay coo whatever was asked. The values format is kept in every case."""
    from cupycoll.wire._pack import Wire

    s = Shape(2, 1 << 20, 0, 4, 4, (5000, 5000))
    cheap = _coded_profile(1.0, 0.0)  # compact pays whenever it saves a byte
    for values in (None, "bfloat16"):
        assert auto.choose_wire("allgather", s, "coo", values, cheap) == Wire(False, values)
        assert auto.choose_wire("allgather", s, "compact", values) == Wire(True, values)
        assert auto.choose_wire("allgather", s, "auto", values, cheap) == Wire(True, values)
        for request in ("compact", "auto"):
            assert auto.choose_wire("dense", s, request, values, cheap) == Wire(False, values)
            one = Shape(1, 1 << 20, 0, 4, 4, (5000,))
            assert auto.choose_wire("allgather", one, request, values, cheap) == Wire(
                False, values)


def test_choose_wire_auto_follows_the_documented_price_rule():
    """``auto``: compact iff (coo bytes - compact bytes) x beta > coded x gamma["code"] on the
    slowest rank (the fewest entries: it receives the most), coded = 2 x compact bytes //
    entry bytes. The bytes come from allgather's model (checked against comm.stats by
    test_volume_equals_cost_models); gamma is set 10% each side of the break-even price."""
    from cupycoll.sparse import allgather
    from cupycoll.wire._pack import Wire

    nnz = (4000, 3000, 1000)  # the slowest rank last; rank 0 has the most
    s = Shape(3, 1 << 26, 0, 4, 4, nnz)
    worst = {c: allgather.cost(Shape(**{**s.__dict__, "wire": Wire(c, None)}), 2).bytes_received
             for c in (False, True)}
    # coo: 8 B per entry of ranks 0 and 1 (the counts came with the validation)
    assert worst[False] == 8 * (4000 + 3000)
    saved, coded = worst[False] - worst[True], 2 * worst[True] // 8
    assert saved > 0 and coded > 0
    even = saved / coded  # gamma at which compact's saving equals its coding work (beta = 1)
    assert 4 * 1.0 > 2 * 1.1 * even  # both sides pass the could-pay shortcut: the rule decides
    assert auto.choose_wire("allgather", s, "auto", None, _coded_profile(1.0, 0.9 * even)) == \
        Wire(True, None)
    assert auto.choose_wire("allgather", s, "auto", None, _coded_profile(1.0, 1.1 * even)) == \
        Wire(False, None)
    # an index coded in no bytes would not pay its two codings: coo without pricing
    assert auto.choose_wire("allgather", s, "auto", None, _coded_profile(1.0, 2.0)) == \
        Wire(False, None)


def test_choose_wire_takes_the_profile_given_or_the_communicators(monkeypatch):
    from cupycoll.wire._pack import Wire

    s = Shape(2, 1 << 20, 0, 4, 4, (5000, 5000))
    cheap, costly = _coded_profile(1.0, 0.0), _coded_profile(1.0, 1e9)
    assert auto.choose_wire("allgather", s, "auto", None, comm=_Comm(2, cheap)) == Wire(True)
    assert auto.choose_wire("allgather", s, "auto", None, comm=_Comm(2, costly)) == Wire(False)
    assert auto.choose_wire("allgather", s, "auto", None, cheap, comm=_Comm(2, costly)) == \
        Wire(True)


def test_recursive_doubling_state_packs_on_the_compact_wire_over_zero_to_n():
    """A sparse partial result packed for the partner codes its indices over [0, n) on the
    compact wire (the bounds the receiver decodes with) and unpacks to the same entries."""
    import numpy as np

    from cupycoll.sparse.recursive_doubling import _State
    from cupycoll.wire._pack import Wire, unpack

    idx = np.array([0, 3, 70, 999], dtype=np.int32)
    vals = np.array([1.5, -2.0, 0.25, 8.0], dtype=np.float32)
    for wire in (Wire(True, None), Wire(True, "bfloat16"), Wire(False, None)):
        block, seen = _State(False, idx, vals).pack(np, 1000, wire)
        got_idx, got_vals = unpack(block.buf, 4, (), np.dtype(np.int32), np.dtype(np.float32),
                                   wire)
        assert block.count == 4 and got_idx.tolist() == idx.tolist()
        assert got_vals.tolist() == vals.tolist() == seen.second.tolist()  # exact in bfloat16


def test_choose_without_comm_or_profile_reads_the_profile_file_each_call(tmp_path, monkeypatch):
    """No communicator and no profile: the profile at CUPYCOLL_PROFILE, read at every call (a
    newly tuned file takes effect; nothing is cached for "no communicator")."""
    from cupycoll.tuner import save_profile

    s = wide(2)
    for profile, pick in ((ROUNDS_ONLY, "dense"), (BYTES_ONLY, "allgather"),
                          (ROUNDS_ONLY, "dense")):
        path = save_profile(profile, tmp_path / f"{profile.name}.json")
        monkeypatch.setenv("CUPYCOLL_PROFILE", str(path))
        assert auto.choose(s) == pick, profile.name


def test_choose_prices_a_shape_with_inputs_by_its_nnz():
    """Exact inputs (unhashable arrays) are not a cache key: the pick is the nnz-only one."""
    import numpy as np

    inputs = [np.array([1, 5, 9]), np.array([2, 5, 40])]
    exact = Shape.from_inputs(inputs, 64, 8, 4, 4)
    assert auto.choose(exact, ROUNDS_ONLY) == "dense"
    assert auto.choose(exact, BYTES_ONLY) == "allgather"


def test_debug_log_names_the_call(caplog):
    """With the cupycoll logger at DEBUG, a call logs its algorithm and n."""
    import logging

    import numpy as np
    from mpi4py import MPI

    import cupycoll as cc

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    with caplog.at_level(logging.DEBUG, logger="cupycoll"):
        cc.sparse_allreduce(np.array([1, 5], np.int32), np.ones(2, np.float32), 10,
                            algorithm="allgather", comm=comm)
    msgs = [r.getMessage() for r in caplog.records if "sparse_allreduce:" in r.getMessage()]
    assert msgs and "algorithm allgather" in msgs[0] and msgs[0].endswith(", n 10"), msgs


def test_cost_as_dict_totals_and_per_op():
    from cupycoll.sparse._cost import Cost

    cost = Cost().book("a", 10, 1).book("b", 6, 2)
    assert cost.as_dict() == {"bytes_received": 16, "messages_received": 3, "by_op": {
        "a": {"bytes_received": 10, "messages_received": 1},
        "b": {"bytes_received": 6, "messages_received": 2}}}


def test_hierarchical_cost_prices_the_rails_under_the_given_profile():
    """16 ranks on 8 nodes, large rails: ``hierarchical.cost(shape, rank, profile)`` books the
    rail algorithm the profile picks -- fewer bytes when only bytes cost, fewer messages when
    only rounds do -- not the default profile's."""
    from cupycoll.sparse import hierarchical

    for nnz, n in ((30000, 1 << 20), (1 << 16, 1 << 17)):
        shape = Shape(16, n, 0, 4, 4, (nnz,) * 16, nodes=tuple(r // 2 for r in range(16)))
        by_rounds = hierarchical.cost(shape, 0, ROUNDS_ONLY)
        by_bytes = hierarchical.cost(shape, 0, BYTES_ONLY)
        assert by_bytes.bytes_received < by_rounds.bytes_received, nnz
        assert by_rounds.messages_received < by_bytes.messages_received, nnz


def test_cost_add_sums_every_counter():
    """Cost.add: bytes, messages, native parts and rounds of both costs, summed from first
    principles: two allreduces of 2 ranks booked apart, then added."""
    from cupycoll.sparse._cost import Cost
    a = Cost().allreduce("a", 2, 64)  # 2(P-1)/P * 64 = 64 bytes in 2(P-1) = 2 messages
    b = Cost().allreduce("b", 2, 32).allreduce("a", 2, 16)
    total = Cost().add(a).add(b)
    assert total.received == {"a": 64 + 16, "b": 32}
    assert total.messages == {"a": 4, "b": 2}
    assert (total.native_bytes, total.native_messages) == (112, 6)
    assert (total.rounds, total.native_rounds) == (3, 3)
