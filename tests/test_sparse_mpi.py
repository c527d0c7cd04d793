"""Multi-rank sparse_allreduce tests: randomized reference, volume vs cost models, errors, delivery.

Each worker runs many cases, and the workers of one rank count share a launch (tests/_mpi.py's
Batch). Case counts give a few thousand randomized cases per run in total (4300), over P in
{1, 2, 3, 4, 5, 8}.
"""

import pytest

from tests._mpi import Batch, run_mpi

CASES = {1: 1000, 2: 1000, 3: 800, 4: 800, 5: 400, 8: 300}
# one launch per rank count runs the workers that need no environment of their own, in turn
LAUNCHES = Batch({
    "sparse_random.py": {p: (1000 + p, cases) for p, cases in CASES.items()},
    "sparse_volume.py": {p: (7,) for p in (1, 2, 3, 4, 5, 8)},
    # (sparse_semantics.py sets its nodes of 2 ranks for hierarchical itself)
    "sparse_semantics.py": {p: (5,) for p in (1, 2, 3, 4)},
    "sparse_errors.py": {3: (), 4: ()},
    "sparse_delivery.py": {1: (11,), 3: (11,)},
    "sparse_arena.py": {p: (13,) for p in (2, 3, 4, 5)},
})


@pytest.mark.parametrize("nprocs, ncases", CASES.items())
def test_random_cases_match_dense_reference(nprocs, ncases):
    out = LAUNCHES.output("sparse_random.py", nprocs)
    assert f"ok {ncases} cases on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", [2, 3])
def test_random_cases_in_threaded_numba_loops(nprocs):
    """Every merge in every rank through the numba loops cut over 3 threads."""
    out = run_mpi(nprocs, "sparse_random.py", 2000 + nprocs, 200, timeout=240,
                  env={"CC_TEST_NUMBA_THREADS": "1", "CUPYCOLL_THREADS": "3",
                       "CUPYCOLL_NUMBA": "on"})
    assert f"ok 200 cases on {nprocs} ranks" in out


def test_recursive_doubling_merges_into_the_block_it_sends():
    """At P = 5 (a fold-in, then two rounds), numba's loops at every size on one thread:
    recursive doubling's float sums whose result is sent on are written by the two-way merge
    straight into the block the next round sends; results against the dense reference, and
    such merges ran."""
    out = run_mpi(5, "sparse_random.py", 4005, 150, "recursive_doubling", timeout=240,
                  env={"CC_TEST_NUMBA_THREADS": "1", "CUPYCOLL_THREADS": "1",
                       "CUPYCOLL_NUMBA": "on"})
    assert "ok 150 cases on 5 ranks" in out
    assert int(out.split("sent next on rank 0: ")[1].split()[0]) > 0, out


def test_recursive_doubling_keeps_its_last_merge_sparse():
    """At P = 2 the one merge is the last: where its union prefers dense it stays sparse (a
    result not sent on is not densified to be read back; results against the dense
    reference), and such merges ran."""
    out = run_mpi(2, "sparse_random.py", 4005, 150, "recursive_doubling", timeout=240)
    assert "ok 150 cases on 2 ranks" in out
    seen = out.split("last merges preferring dense on rank 0: ")[1]
    assert int(seen.split(",")[0]) > 0 and seen.split("made dense: ")[1].split()[0] == "0", out


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("sparse_arena.py"))
def test_recursive_doubling_reads_blocks_in_place_and_keeps_no_result_there(nprocs):
    """Ranks of one node: recursive doubling's sparse blocks are read where their senders
    wrote them (the exchange arena, made again larger when a call outgrows it); every result
    of a sequence of calls equals the dense reference after the sequence, none in the
    window (tests/workers/sparse_arena.py)."""
    assert f"ok 7 arena calls on {nprocs} ranks" in LAUNCHES.output("sparse_arena.py", nprocs)


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("sparse_volume.py"))
def test_volume_equals_cost_models(nprocs):
    out = LAUNCHES.output("sparse_volume.py", nprocs)
    # 7 inputs x 3 dtypes x (6 algorithms + hierarchical at 1, 2, 3 ranks per node + the 6
    # algorithms again with output="dense", and hierarchical at 1, 2, 3 and P ranks per node),
    # and hierarchical at one rank per node on a rail that runs split (sparse and dense output)
    assert f"ok 401 volume checks on {nprocs} ranks" in out


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
    launch = Batch({"sparse_random.py": {nprocs: (3000 + nprocs, 150, "split")},
                    "sparse_volume.py": {nprocs: (11,)}}, env=env)
    assert f"ok 150 cases on {nprocs} ranks" in launch.output("sparse_random.py", nprocs)
    out = launch.output("sparse_volume.py", nprocs)
    assert f"ok 401 volume checks on {nprocs} ranks" in out
    assert int(out.split("as dense regions: ")[1].split()[0]) > 0, out


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("sparse_errors.py"))
def test_bad_input_raises_on_every_rank(nprocs):
    out = LAUNCHES.output("sparse_errors.py", nprocs)
    assert f"ok error cases on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("sparse_delivery.py"))
def test_delivery_alloc_completion_async(nprocs):
    out = LAUNCHES.output("sparse_delivery.py", nprocs)
    assert f"ok delivery on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("sparse_semantics.py"))
def test_nan_inf_signed_zero_same_bits_in_every_algorithm(nprocs):
    out = LAUNCHES.output("sparse_semantics.py", nprocs)
    assert f"x 7 algorithms on {nprocs} ranks" in out
