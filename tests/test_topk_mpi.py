"""Top-k allreduce family under mpiexec: results, volumes and the residual compressor.

Workers (tests/workers/topk_*.py) regenerate every rank's input from shared seeds and compare
with independent plain-Python references; see their docstrings for what each checks.
"""

import pytest

from tests._mpi import run_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_topk_results_match_references(nprocs):
    out = run_mpi(nprocs, "topk_results.py", "full", timeout=180)
    assert "OK" in out


@pytest.mark.parametrize("nprocs", [5, 8])
def test_topk_results_five_and_eight_ranks(nprocs):
    out = run_mpi(nprocs, "topk_results.py", "light", timeout=240)
    assert "OK" in out


@pytest.mark.parametrize("nprocs", [2, 3, 4, 8])
def test_topk_volumes(nprocs):
    out = run_mpi(nprocs, "topk_volume.py", timeout=240)
    assert "OK" in out


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_topk_compressor_mass_and_errors(nprocs):
    out = run_mpi(nprocs, "topk_compressor.py", timeout=180)
    assert "OK" in out


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 8])
def test_topk_density_under_error_feedback(nprocs):
    """The compressor workload: counts, volume and residuals against the documented rules."""
    out = run_mpi(nprocs, "topk_density.py", timeout=300)
    assert "OK" in out


@pytest.mark.parametrize("nprocs", [3, 4, 8])
def test_oktopk_two_level_allgather(nprocs):
    """1-4 ranks per node: the node-leader allgather equals the flat one, traffic = its model."""
    out = run_mpi(nprocs, "topk_nodes.py", 3, timeout=300)
    assert f"oktopk at 1-4 ranks per node on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_every_algorithm_under_a_raising_error_state(nprocs):
    """A caller's np.errstate(all="raise") never raises inside the library (one rank raising
    mid-collective would leave the others waiting)."""
    out = run_mpi(nprocs, "raising_errstate.py", timeout=300)
    assert f"ok raising error state on {nprocs} ranks" in out
