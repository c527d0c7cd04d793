"""The dense verbs' front doors, in process: which calls take the fast path (one check
function, then the Communicator's ``run``) and which the general path (the call pipeline), the
same results either way, and every bad argument's exact message (the format of
``cupycoll.errors``, naming the rank). Expected values come from numpy and literal texts, never
from the code under test.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from mpi4py import MPI

import cupycoll as cc
from cupycoll import collectives
from cupycoll._types import ReduceOp
from cupycoll.errors import InvalidArgument, InvalidType
from tests._threaded import outcomes
from tests.workers._common import DLPackOnly

X = np.arange(1.0, 5.0, dtype=np.float32)


@pytest.fixture(scope="module")
def comm():
    return cc.init("mpi", mpi_comm=MPI.COMM_SELF)


def test_the_plain_op_root_and_output_rules():
    """``_plain_op``: an op named in lower case or a ReduceOp; ``_plain_root``: an int rank;
    ``_plain_output``: a new array, or ``out`` itself where it fits exactly, of ``x``'s shape
    times ``grow / shrink`` (None: the general path)."""
    for name in ("sum", "prod", "max", "min", "avg"):
        assert collectives._plain_op(name) is ReduceOp(name)
    assert collectives._plain_op(ReduceOp.MAX) is ReduceOp.MAX
    assert [collectives._plain_op(op) for op in ("SUM", MPI.SUM, 1, None)] == [None] * 4
    size4 = types.SimpleNamespace(size=4)
    assert [collectives._plain_root(r, size4) for r in (0, 3)] == [True, True]
    assert not any(collectives._plain_root(r, size4) for r in (4, -1, True, np.int64(0), "0"))
    host = types.SimpleNamespace(xp=np)
    new = collectives._plain_output(X, None, host)
    assert new.shape == (4,) and new.dtype == np.float32 and not np.shares_memory(new, X)
    out = np.empty(4, np.float32)
    assert collectives._plain_output(X, out, host) is out
    for bad in (np.empty(3, np.float32), np.empty(4, np.float64), np.empty(8, np.float32)[::2],
                [0.0] * 4, DLPackOnly(np.empty(4, np.float32))):
        assert collectives._plain_output(X, bad, host) is None
    for x in (np.arange(8.0, dtype=np.float32)[::2], X.astype(np.complex64), list(X)):
        assert collectives._plain_output(x, None, host) is None
    assert collectives._plain_output(X, None, host, grow=4).shape == (16,)
    rows = np.zeros((8, 3), np.float32)
    assert collectives._plain_output(rows, None, host, grow=1, shrink=4).shape == (2, 3)
    assert collectives._plain_output(rows[:7], None, host, grow=1, shrink=4) is None
    assert collectives._plain_output(np.ones((), np.float32), None, host, grow=2) is None


def test_the_plain_path_is_off_under_cupycoll_debug(monkeypatch):
    """CUPYCOLL_DEBUG sends every call to the general path (its agreement), read per call."""
    monkeypatch.setenv("CUPYCOLL_DEBUG", "1")
    assert collectives._plain_output(X, None, types.SimpleNamespace(xp=np)) is None


@pytest.mark.parametrize("text, on", [("", False), ("0", False), ("off", False), ("OFF", False),
                                      ("False", False), (" no ", False), ("1", True),
                                      ("yes", True), ("on", True)])
def test_cupycoll_debug_reads_off_in_any_case(monkeypatch, text, on):
    """The fast path's reading of CUPYCOLL_DEBUG agrees with the setting's parser: "off" (as
    configuration.md's default says) is off, in any case."""
    from cupycoll._config import debug, setting

    monkeypatch.setenv("CUPYCOLL_DEBUG", text)
    assert debug() is on and bool(setting("CUPYCOLL_DEBUG")) is on


def test_plain_calls_take_the_fast_path_and_others_the_pipeline(comm, monkeypatch):
    """Plain arrays never reach the general path, synchronous or not; an op given in upper
    case, an ``out`` of another array type or a root that is not an int do, and give the same
    results (P = 1: the input itself; ``out`` comes back as the caller's object)."""
    taken = []
    real = collectives._general
    monkeypatch.setattr(collectives, "_general",
                        lambda c, verb, *a: taken.append(verb) or real(c, verb, *a))
    plain = {"allreduce": lambda **k: cc.allreduce(X, comm=comm, **k),
             "broadcast": lambda **k: cc.broadcast(X, root=0, comm=comm, **k),
             "reduce": lambda **k: cc.reduce(X, root=0, comm=comm, **k),
             "allgather": lambda **k: cc.allgather(X, comm=comm, **k),
             "reduce_scatter": lambda **k: cc.reduce_scatter(X, comm=comm, **k)}
    for verb, fn in plain.items():
        assert fn().tolist() == X.tolist(), verb
        assert fn(async_op=True).wait().tolist() == X.tolist(), verb
        buf = np.empty(4, np.float32)
        assert fn(out=buf) is buf and buf.tolist() == X.tolist(), verb
    assert taken == []
    general = {"allreduce": lambda **k: cc.allreduce(X, op="SUM", comm=comm, **k),
               "broadcast": lambda **k: cc.broadcast(X, root=np.int64(0), comm=comm, **k),
               "reduce": lambda **k: cc.reduce(X, root=0, op="SUM", comm=comm, **k),
               "allgather": lambda **k: cc.allgather(X, comm=comm,
                                                     out=DLPackOnly(np.empty(4, np.float32))),
               "reduce_scatter": lambda **k: cc.reduce_scatter(X, op="SUM", comm=comm, **k)}
    for verb, fn in general.items():
        got = fn()
        assert np.asarray(getattr(got, "a", got)).tolist() == X.tolist(), verb
        assert verb in taken
    mine = DLPackOnly(np.empty(4, np.float32))
    assert cc.allreduce(X, op="SUM", comm=comm, out=mine) is mine and mine.a.tolist() == \
        X.tolist()
    assert cc.reduce_scatter(X, op="SUM", comm=comm, async_op=True).wait().tolist() == \
        X.tolist()
    for verb, fn in plain.items():  # "no" is not taken as true
        with pytest.raises(InvalidType, match="'async_op' on rank 0 must be True or False"):
            fn(async_op="no")


def _raised(cls, fn):
    with pytest.raises(cls) as info:
        fn()
    return str(info.value)


def test_every_bad_argument_is_named_exactly(comm):
    """The general path's checks, each with its documented text and the rank."""
    assert _raised(InvalidArgument, lambda: cc.allreduce(X, comm=comm, out=np.empty(3, np.float32))
                   ) == "invalid argument 'out' on rank 0: shape must be (4,) (got (3,))"
    assert _raised(InvalidType, lambda: cc.allreduce(X, comm=comm, out=np.empty(4, np.float64))
                   ) == ("argument 'out' on rank 0 must be an array of dtype float32 (the "
                         "input's), got dtype('float64')")
    assert _raised(InvalidArgument, lambda: cc.broadcast(
        X, comm=comm, out=np.empty(8, np.float32)[::2])) == (
        "invalid argument 'out' on rank 0: must be C-contiguous (got 'non-contiguous array')")
    assert _raised(InvalidType, lambda: cc.broadcast(X, root="0", comm=comm)) == (
        "argument 'root' on rank 0 must be an int rank, got '0'")
    assert _raised(InvalidType, lambda: cc.reduce(X, root=True, comm=comm)) == (
        "argument 'root' on rank 0 must be an int rank, got True")
    assert _raised(InvalidArgument, lambda: cc.reduce(X, root=1, comm=comm)) == (
        "invalid argument 'root' on rank 0: must be a rank in [0, 1) (got 1)")
    assert _raised(InvalidArgument, lambda: cc.allgather(np.ones((), np.float32), comm=comm)) == (
        "invalid argument 'x' on rank 0: needs at least one dimension (axis 0 is split or "
        "concatenated) (got '0-d array')")
    assert _raised(InvalidArgument, lambda: cc.reduce(X, op="xor", comm=comm)).startswith(
        "invalid argument 'op' on rank 0: unknown op")
    nccl = types.SimpleNamespace(rank=2, backend="nccl", xp=object())
    assert _raised(InvalidType, lambda: collectives._input(X, nccl)) == (
        "argument 'x' on rank 2 must be a cupy array (or CUDA DLPack tensor) on the nccl "
        "backend, got 'ndarray'")
    mpi = types.SimpleNamespace(rank=2, backend="mpi", xp=object())
    assert collectives._input(X, mpi) is X  # another library is fine on MPI


def test_arrays_the_verbs_cannot_use_are_named(comm):
    """A read-only ``out`` (in place too), an array of the other byte order and a tensor DLPack
    cannot hand to numpy raise the library's errors naming the argument before anything moves;
    a read-only input out of place is fine."""
    readonly = X.copy()
    readonly.flags.writeable = False
    for call in (lambda: cc.allreduce(readonly, comm=comm, out=readonly),
                 lambda: cc.allgather(X, comm=comm, out=readonly),
                 lambda: cc.broadcast(X, comm=comm, out=readonly),
                 lambda: cc.reduce(X, comm=comm, out=readonly)):
        assert _raised(InvalidArgument, call) == (
            "invalid argument 'out' on rank 0: must be writable (got 'read-only array')")
    np.testing.assert_array_equal(cc.allreduce(readonly, comm=comm), X)
    swapped = X.astype(">f4")
    for call in (lambda: cc.allreduce(swapped, comm=comm), lambda: cc.reduce(swapped, comm=comm),
                 lambda: cc.reduce_scatter(swapped, comm=comm),
                 lambda: cc.broadcast(swapped, comm=comm)):
        assert _raised(InvalidType, call) == (
            "argument 'x' on rank 0 must be an array in the machine's byte order, got "
            "dtype('>f4')")
    torch = pytest.importorskip("torch")
    for tensor in (torch.ones(4, dtype=torch.bfloat16), torch.ones(4, requires_grad=True)):
        assert _raised(InvalidArgument, lambda: cc.allreduce(tensor, comm=comm)).startswith(
            "invalid argument 'x' on rank 0: must be a tensor DLPack can share with numpy/cupy "
            "(got ")


def test_unsigned_32_and_64_bit_integers_reduce_like_the_others(comm):
    """uint32 and uint64 are dense dtypes (NCCL has them): P = 1 sums to the input, avg
    divides by one, max keeps values above int64's range."""
    for dtype in (np.uint32, np.uint64):
        x = np.array([0, 7, np.iinfo(dtype).max], dtype)
        for op in ("sum", "avg", "max", "min", "prod"):
            got = cc.allreduce(x, op, comm=comm)
            assert got.dtype == dtype and np.array_equal(got, x)
        np.testing.assert_array_equal(cc.allgather(x, comm=comm), x)


def test_reduce_scatter_names_an_axis_the_ranks_do_not_divide():
    """On 3 ranks, 7 rows: every rank raises before anything moves, naming itself."""
    errors = outcomes(3, lambda c: cc.reduce_scatter(np.ones(7, np.float32), comm=c))
    assert [str(e) for e in errors] == [
        f"invalid argument 'x' on rank {r}: axis 0 (7) must be divisible by the number of "
        "ranks (3) (got (7,))" for r in range(3)]


class _RaisingIndex:
    """A root whose own ``__index__`` raises something that is not a TypeError."""

    def __index__(self):
        raise ZeroDivisionError("index boom")


@pytest.mark.parametrize("verb, bad", [
    ("allreduce", {"async_op": "yes"}), ("broadcast", {"async_op": 1}),
    ("reduce", {"async_op": None}), ("allgather", {"async_op": "no"}),
    ("reduce_scatter", {"async_op": []}), ("broadcast", {"root": _RaisingIndex()})])
def test_under_debug_a_bad_argument_on_one_rank_raises_on_every_rank(monkeypatch, verb, bad):
    """CUPYCOLL_DEBUG: a bad ``async_op`` or a root whose ``__index__`` raises on rank 2
    alone is that rank's error and MismatchError naming rank 2 on the others (no rank waits
    for a collective the bad rank never joins)."""
    from cupycoll.errors import MismatchError

    monkeypatch.setenv("CUPYCOLL_DEBUG", "1")
    call = getattr(cc, verb)
    errors = outcomes(3, lambda c: call(np.ones(3, np.float32), comm=c,
                                        **(bad if c.rank == 2 else {})))
    assert isinstance(errors[2], InvalidType) and errors[2].rank == 2
    assert errors[2].argument == next(iter(bad))
    for error in errors[:2]:
        assert isinstance(error, MismatchError) and "rank 2 passed bad arguments" in str(error)


def test_under_debug_dtypes_numpy_calls_equal_agree(monkeypatch):
    """``longlong`` and the dtype of its own type string (``int64`` on Linux: the same dtype
    to numpy, another type number) agree."""
    monkeypatch.setenv("CUPYCOLL_DEBUG", "1")
    twin = np.dtype(np.dtype(np.longlong).str)
    assert twin == np.dtype(np.longlong)
    got = outcomes(3, lambda c: cc.allreduce(
        np.arange(4, dtype=np.longlong if c.rank == 2 else twin), comm=c))
    for result in got:
        np.testing.assert_array_equal(result, 3 * np.arange(4))


@pytest.mark.parametrize("dtype, bits, nans", [
    (np.float32, np.uint32, [0xFFC00000, 0x7FC12345]),
    (np.float64, np.uint64, [0xFFF8000000000000, 0x7FF8000000012345])])
def test_a_lone_rank_gives_numpys_nan_in_max_and_min(comm, dtype, bits, nans):
    """P = 1 (MPI calls no user op for one rank): max and min still give numpy's NaN whatever
    NaN came in (a negative one, one with a payload), as at P >= 2, in place or not."""
    odd = np.concatenate([np.array(nans, bits).view(dtype), np.array([1.5, -0.0], dtype)])
    assert np.isnan(odd[:2]).all()
    want = np.array([np.nan, np.nan, 1.5, -0.0], dtype).view(bits)
    for op in ("max", "min"):
        for got in (cc.allreduce(odd, op, comm=comm), cc.reduce(odd, 0, op, comm=comm),
                    cc.reduce_scatter(odd, op, comm=comm)):
            np.testing.assert_array_equal(got.view(bits), want)
        inplace = odd.copy()
        cc.allreduce(inplace, op, comm=comm, out=inplace)
        np.testing.assert_array_equal(inplace.view(bits), want)
