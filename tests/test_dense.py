"""Dense collectives and the MPI communicator on 1, 2, 3, 4 (and 8) real MPI ranks."""

import pytest

from tests._mpi import Batch, run_mpi

# one launch per rank count runs these workers in turn
LAUNCHES = Batch({
    "dense_worker.py": {p: (1000 + p,) for p in (1, 2, 3, 4)},
    "comm_worker.py": {p: () for p in (1, 2, 3, 4)},
})


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("dense_worker.py"))
def test_dense_collectives_match_numpy(nprocs):
    out = LAUNCHES.output("dense_worker.py", nprocs)
    assert out.count("dense cases ok") == nprocs


@pytest.mark.ranks(8)
def test_dense_collectives_eight_ranks():
    out = run_mpi(8, "dense_worker.py", 77, timeout=300)
    assert out.count("dense cases ok") == 8


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("comm_worker.py"))
def test_comm_stats_errors_timeouts(nprocs):
    out = LAUNCHES.output("comm_worker.py", nprocs)
    assert out.count("comm ok") == nprocs


@pytest.mark.parametrize("nprocs", [2, 3])
def test_debug_mode_catches_mismatched_calls_on_every_rank(nprocs):
    out = run_mpi(nprocs, "debug_worker.py", timeout=120, env={"CUPYCOLL_DEBUG": "1"})
    assert out.count("debug ok") == nprocs
