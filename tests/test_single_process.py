"""Without engines or mpiexec (a plain notebook kernel, a script): every call works on one rank.

Runs in the pytest process itself on ``cc.init()``'s default communicator (MPI singleton, one
rank), each result checked against numpy.
"""

import numpy as np
import pytest

import cupycoll as cc


@pytest.fixture(scope="module")
def comm():
    comm = cc.init("mpi")
    assert comm.size == 1 and comm.rank == 0
    return comm


def test_dense_verbs(comm):
    x = np.arange(10, dtype=np.float32)
    assert np.array_equal(cc.allreduce(x), x)
    assert np.array_equal(cc.allreduce(x, op="avg"), x)
    assert np.array_equal(cc.broadcast(x, root=0), x)
    assert np.array_equal(cc.reduce(x, root=0), x)
    assert np.array_equal(cc.allgather(x), x)
    assert np.array_equal(cc.reduce_scatter(x), x)
    out = np.empty_like(x)
    work = cc.allreduce(x, op="max", out=out, async_op=True)
    work.wait()
    assert np.array_equal(out, x)


@pytest.mark.parametrize("algorithm", cc.algorithms("sparse"))
def test_sparse_allreduce(comm, algorithm):
    idx = np.array([7, 3, 7, 0], np.int32)
    val = np.array([1.0, 2.0, 4.0, 8.0], np.float32)
    res = cc.sparse_allreduce(idx, val, 10, algorithm=algorithm)
    assert res.indices.tolist() == [0, 3, 7] and res.values.tolist() == [8.0, 2.0, 5.0]
    work = cc.sparse_allreduce(idx, val, 10, algorithm=algorithm, async_op=True)
    assert np.array_equal(work.wait().to_dense(), np.bincount(idx, val, minlength=10))


@pytest.mark.parametrize("algorithm", cc.algorithms("topk"))
def test_topk_allreduce(comm, algorithm):
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    res = cc.topk_allreduce(x, 10, algorithm=algorithm)
    # gaussiank estimates its threshold, so it may keep a few more or fewer than k: whatever it
    # keeps must be the largest magnitudes, with their exact values; the others keep exactly k.
    m = res.nnz
    assert m == 10 or (algorithm == "gaussiank" and 5 <= m <= 20), m
    expected = np.sort(np.argsort(-np.abs(x), kind="stable")[:m])
    assert res.indices.tolist() == expected.tolist()
    assert np.array_equal(res.values, x[expected])


def test_compressor_keeps_every_bit_of_mass(comm):
    rng = np.random.default_rng(1)
    comp = cc.TopkCompressor(500, 0.02)
    sent = np.zeros(500, np.float64)
    grads = np.zeros(500, np.float64)
    for _ in range(5):
        g = rng.standard_normal(500).astype(np.float32)
        grads += g
        upd = comp.step(g)
        assert upd.nnz <= 3 * comp.k
        sent[upd.indices] += upd.values
    assert np.allclose(sent + comp.residual, grads, atol=1e-5)


def test_a_compressor_loaded_before_any_communicator_makes_none(comm, monkeypatch):
    """Unpickling a compressor in a process that made no communicator yet makes none (a
    collective init on one rank alone would hang): its first step takes the default."""
    import pickle

    import cupycoll.comm as comm_module

    comp = cc.TopkCompressor(100, 0.1)
    comp.step(np.arange(100, dtype=np.float32))
    saved = pickle.dumps(comp)
    with monkeypatch.context() as patched:
        patched.setattr(comm_module, "_default", None)
        patched.setattr(comm_module, "init", lambda *a, **k: pytest.fail("init() in a load"))
        loaded = pickle.loads(saved)
    assert loaded.comm is None and np.array_equal(loaded.residual, comp.residual)
    loaded.step(np.ones(100, np.float32))
    assert loaded.comm is comm


def test_a_comm_that_is_not_a_communicator_is_named(comm):
    """``comm=`` given an mpi4py communicator, a string or a number: InvalidType naming
    ``comm`` from every front door (none falls back to the default for a falsy one)."""
    from mpi4py import MPI

    x = np.ones(4, np.float32)
    calls = [lambda c: cc.allreduce(x, comm=c), lambda c: cc.broadcast(x, 0, comm=c),
             lambda c: cc.reduce(x, 0, comm=c), lambda c: cc.allgather(x, comm=c),
             lambda c: cc.reduce_scatter(x, comm=c),
             lambda c: cc.sparse_allreduce(np.array([1]), x[:1], 4, comm=c),
             lambda c: cc.topk_allreduce(x, 2, comm=c),
             lambda c: cc.TopkCompressor(4, 0.5, comm=c)]
    for bad in (MPI.COMM_WORLD, MPI.COMM_NULL, "x", 3, 0):
        for call in calls:
            with pytest.raises(cc.errors.InvalidType) as info:
                call(bad)
            assert info.value.argument == "comm" and info.value.rank == comm.rank, info.value
            assert "a cupycoll Communicator" in str(info.value), info.value


def test_an_exception_in_completion_fn_reaches_the_caller_as_it_is(comm):
    """The user's completion_fn raising: the call (or its Work's wait) raises that exception,
    and the communicator stays usable (the collective itself completed)."""
    idx, val = np.array([3, 1]), np.array([1.0, 2.0], np.float32)

    def boom(indices, values, ctx):
        raise ZeroDivisionError(f"boom {ctx}")

    with pytest.raises(ZeroDivisionError, match="boom 7"):
        cc.sparse_allreduce(idx, val, 5, completion_fn=boom, fn_ctx=7)
    work = cc.sparse_allreduce(idx, val, 5, completion_fn=boom, fn_ctx=8, async_op=True)
    with pytest.raises(ZeroDivisionError, match="boom 8"):
        work.wait()
    assert cc.sparse_allreduce(idx, val, 5).to_dense().tolist() == [0, 2, 0, 1, 0]
