"""Top-k allreduce family under mpiexec: results, volumes and the residual compressor.

Workers (tests/workers/topk_*.py) regenerate every rank's input from shared seeds and compare
with independent plain-Python references; see their docstrings for what each checks.
"""

import pytest

from tests._mpi import Batch

# one launch per rank count runs these workers in turn
LAUNCHES = Batch({
    "topk_results.py": {**{p: ("full",) for p in (1, 2, 3, 4)}, 5: ("light",), 8: ("light",)},
    "topk_volume.py": {p: () for p in (2, 3, 4, 8)},
    "topk_compressor.py": {p: () for p in (1, 2, 3, 4)},
    "topk_density.py": {p: () for p in (1, 2, 3, 4, 8)},
    "topk_nodes.py": {p: (3,) for p in (3, 4, 8)},
    "raising_errstate.py": {p: () for p in (1, 2, 3)},
}, timeout=300)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_topk_results_match_references(nprocs):
    out = LAUNCHES.output("topk_results.py", nprocs)
    assert "OK" in out


@pytest.mark.parametrize("nprocs", [5, 8])
def test_topk_results_five_and_eight_ranks(nprocs):
    out = LAUNCHES.output("topk_results.py", nprocs)
    assert "OK" in out


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("topk_volume.py"))
def test_topk_volumes(nprocs):
    out = LAUNCHES.output("topk_volume.py", nprocs)
    assert "OK" in out


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("topk_compressor.py"))
def test_topk_compressor_mass_and_errors(nprocs):
    out = LAUNCHES.output("topk_compressor.py", nprocs)
    assert "OK" in out


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("topk_density.py"))
def test_topk_density_under_error_feedback(nprocs):
    """The compressor workload: counts, volume and residuals against the documented rules."""
    out = LAUNCHES.output("topk_density.py", nprocs)
    assert "OK" in out


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("topk_nodes.py"))
def test_oktopk_two_level_allgather(nprocs):
    """1-4 ranks per node: the node-leader allgather equals the flat one, traffic = its model."""
    out = LAUNCHES.output("topk_nodes.py", nprocs)
    assert f"oktopk at 1-4 ranks per node on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("raising_errstate.py"))
def test_every_algorithm_under_a_raising_error_state(nprocs):
    """A caller's np.errstate(all="raise") never raises inside the library (one rank raising
    mid-collective would leave the others waiting)."""
    out = LAUNCHES.output("raising_errstate.py", nprocs)
    assert f"ok raising error state on {nprocs} ranks" in out
