"""Dense collectives and the MPI communicator on 1, 2, 3, 4 (and 8) real MPI ranks."""

import pytest

from tests._mpi import run_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_dense_collectives_match_numpy(nprocs):
    out = run_mpi(nprocs, "dense_worker.py", 1000 + nprocs, timeout=240)
    assert out.count("dense cases ok") == nprocs


def test_dense_collectives_eight_ranks():
    out = run_mpi(8, "dense_worker.py", 77, timeout=300)
    assert out.count("dense cases ok") == 8


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_comm_stats_errors_timeouts(nprocs):
    out = run_mpi(nprocs, "comm_worker.py", timeout=120)
    assert out.count("comm ok") == nprocs


@pytest.mark.parametrize("nprocs", [2, 3])
def test_debug_mode_catches_mismatched_calls_on_every_rank(nprocs):
    out = run_mpi(nprocs, "debug_worker.py", timeout=120, env={"CUPYCOLL_DEBUG": "1"})
    assert out.count("debug ok") == nprocs
