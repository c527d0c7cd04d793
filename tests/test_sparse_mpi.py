"""Multi-rank sparse_allreduce tests: randomized reference, volume vs cost models, errors, delivery.

Each launch runs many cases (mpiexec start-up is the expensive part). Case counts give a few
thousand randomized cases per run in total (4300), over P in {1, 2, 3, 4, 5, 8}.
"""

import pytest

from tests._mpi import run_mpi


@pytest.mark.parametrize("nprocs, ncases", [(1, 1000), (2, 1000), (3, 800), (4, 800), (5, 400),
                                            (8, 300)])
def test_random_cases_match_dense_reference(nprocs, ncases):
    out = run_mpi(nprocs, "sparse_random.py", 1000 + nprocs, ncases, timeout=240)
    assert f"ok {ncases} cases on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", [2, 3])
def test_random_cases_in_threaded_numba_loops(nprocs):
    """Every merge in every rank through the numba loops cut over 3 threads."""
    out = run_mpi(nprocs, "sparse_random.py", 2000 + nprocs, 200, timeout=240,
                  env={"CC_TEST_NUMBA_THREADS": "1", "CUPYCOLL_THREADS": "3",
                       "CUPYCOLL_NUMBA": "on"})
    assert f"ok 200 cases on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5, 8])
def test_volume_equals_cost_models(nprocs):
    out = run_mpi(nprocs, "sparse_volume.py", 7, timeout=180)
    # 7 inputs x 3 dtypes x (6 algorithms + hierarchical at 1, 2, 3 ranks per node + the 6
    # algorithms again with output="dense")
    assert f"ok 315 volume checks on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", [2, 3, 5])
def test_split_gathers_dense_regions_where_bytes_decide(nprocs, tmp_path):
    """Under a profile where only bytes cost, split's owners send their regions dense with a
    presence bit per row wherever n rows and bits are fewer bytes than the union's entries:
    results against the dense reference (every op and dtype, rows, empty ranks) and traffic
    against the model and a numpy count, with the dense-region gather taken on some cases."""
    import json

    profile = tmp_path / "bytes_only.json"
    profile.write_text(json.dumps({"name": "bytes", "alpha_p2p": 0.0, "beta_p2p": 1.0,
                                   "alpha_native": 0.0, "beta_native": 1.0, "gamma": {}}))
    env = {"CUPYCOLL_PROFILE": str(profile)}
    out = run_mpi(nprocs, "sparse_random.py", 3000 + nprocs, 150, "split", timeout=240, env=env)
    assert f"ok 150 cases on {nprocs} ranks" in out
    out = run_mpi(nprocs, "sparse_volume.py", 11, timeout=180, env=env)
    assert f"ok 315 volume checks on {nprocs} ranks" in out
    assert int(out.split("as dense regions: ")[1].split()[0]) > 0, out


@pytest.mark.parametrize("nprocs", [3, 4])
def test_bad_input_raises_on_every_rank(nprocs):
    out = run_mpi(nprocs, "sparse_errors.py", timeout=120)
    assert f"ok error cases on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", [1, 3])
def test_delivery_alloc_completion_async(nprocs):
    out = run_mpi(nprocs, "sparse_delivery.py", 11, timeout=120)
    assert f"ok delivery on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_nan_inf_signed_zero_same_bits_in_every_algorithm(nprocs):
    # hierarchical over nodes of 2 ranks: P = 2 is two one-rank nodes, P = 3 has a short node
    out = run_mpi(nprocs, "sparse_semantics.py", 5, timeout=120,
                  env={"CUPYCOLL_RANKS_PER_NODE": "2"})
    assert f"x 7 algorithms on {nprocs} ranks" in out
