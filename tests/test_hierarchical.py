"""The node-aware ``hierarchical`` sparse allreduce: topology, region ownership, exactness on
emulated nodes (P = 1..8, 1-4 ranks per node, the last node short), setting validation.

Its traffic model is checked exactly against ``comm.stats`` by
``test_sparse_mpi.py::test_volume_equals_cost_models`` (ranks per node 1, 2, 3).
"""

import numpy as np
import pytest

from cupycoll._config import setting
from cupycoll.comm._topology import Topology
from cupycoll.errors import InvalidArgument
from cupycoll.sparse._cost import Shape
from cupycoll.sparse.hierarchical import cost, link_costs, owned, owner
from tests._mpi import Batch

CASES = {1: 10, 2: 25, 3: 20, 4: 20, 5: 15, 8: 10}
# one launch per rank count runs these workers in turn
LAUNCHES = Batch({
    "sparse_hier.py": {p: (300 + p, cases) for p, cases in CASES.items()},
    "hier_wire.py": {4: (), 5: ()},
}, timeout=600)


@pytest.mark.parametrize("nprocs, ncases", CASES.items())
def test_exact_on_emulated_nodes(nprocs, ncases):
    # ncases x 4 node sizes x 3 rail choices per launch
    out = LAUNCHES.output("sparse_hier.py", nprocs)
    assert f"ok {ncases * 12} hierarchical cases on {nprocs} ranks" in out


@pytest.mark.parametrize("regions", [1, 2, 3, 4, 7, 8])
def test_every_region_has_exactly_one_owner_per_node(regions):
    for size in range(1, regions + 1):
        got = [j for local in range(size) for j in owned(regions, size, local)]
        assert got == list(range(regions)), (regions, size)
        for j in range(regions):
            assert j in owned(regions, size, owner(regions, size, j))


def test_topology_renumbers_and_groups():
    topo = Topology.of([5, 5, 2, 2, 9])
    assert topo.nodes == (0, 0, 1, 1, 2)
    assert topo.members == [(0, 1), (2, 3), (4,)] and topo.width == 2 and topo.count == 3


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5", str(2**62), str(10**20)])
def test_ranks_per_node_must_be_a_positive_integer(monkeypatch, text):
    monkeypatch.setenv("CUPYCOLL_RANKS_PER_NODE", text)
    with pytest.raises(InvalidArgument, match="CUPYCOLL_RANKS_PER_NODE"):
        setting("CUPYCOLL_RANKS_PER_NODE")


def test_one_node_moves_what_split_moves_and_one_rank_per_node_has_no_node_phase():
    from cupycoll.sparse import split

    rng = np.random.default_rng(0)
    inputs = [np.unique(rng.integers(0, 5000, 300 + 40 * r)) for r in range(6)]
    shape = Shape.from_inputs(inputs, 5000, 0, 4, 4)
    for r in range(6):
        assert cost(shape, r) == split.cost(shape, r)
        intra, inter, rails = link_costs(
            Shape(**{**shape.__dict__, "nodes": tuple(range(6))}), r)
        assert intra.bytes_received == 0 and len(rails) == 1 and inter.bytes_received > 0


def test_auto_picks_it_only_where_the_network_between_nodes_is_slower():
    from cupycoll.sparse.auto import choose
    from cupycoll.tuner.profile import default_profile
    from cupycoll.tuner.simulate import network_profile

    def shape(p, per_node):
        return Shape(p, 1 << 24, 0, 4, 4, (1 << 17,) * p,
                     nodes=tuple(r // per_node for r in range(p)))

    assert choose(shape(64, 8), network_profile("ib400", 64)) == "hierarchical"
    assert choose(shape(256, 8), network_profile("ib400", 256)) == "hierarchical"
    # this machine's profile has no link prices: nodes emulated here never make it win
    for p, per_node in ((4, 2), (8, 2), (8, 4), (5, 2)):
        assert choose(shape(p, per_node), default_profile()) != "hierarchical"
    assert choose(shape(8, 8), network_profile("nvlink", 8)) == "split"  # one node: the tie


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("hier_wire.py"))
def test_compact_and_rounded_wires_on_emulated_nodes(nprocs):
    # 3 inputs x 3 node sizes x (compact, coo+bfloat16, compact+bfloat16, coo+float16)
    out = LAUNCHES.output("hier_wire.py", nprocs)
    assert f"ok 36 hierarchical wire cases on {nprocs} ranks" in out
