"""The sparse front door's validation (``cupycoll/sparse/_validate.py``) in process: each local rule's exact message on rank 3 (format of ``cupycoll.errors``), the
coalesced input it prepares (numpy reference), how an error travels as a code and what the other
ranks raise for it, and the mismatch message naming every field that differs."""

from __future__ import annotations

import types

import numpy as np
import pytest

import cupycoll as cc
from cupycoll._types import ReduceOp
from cupycoll.primitives import coo_reduce
from cupycoll.errors import ELSEWHERE, InvalidArgument, InvalidType, MismatchError
from cupycoll.sparse import _terms as t
from cupycoll.sparse import _validate as v
from cupycoll.sparse._cost import Shape
from cupycoll.wire._pack import COO, Wire

NAMES = cc.algorithms("sparse")
VALUES = ["float16", "float32", "float64", "int32", "int64"]
IDX, VAL = np.array([4, 1, 4, 7], np.int64), np.array([1.0, 2.0, 3.0, -0.5], np.float32)


def _local(indices=IDX, values=VAL, n=10, op="sum", algorithm="allgather", acc=None,
            alloc_fn=None, completion_fn=None, wire=None, wire_values=None, rank=3,
            output="sparse", out=None):
    comm = types.SimpleNamespace(rank=rank, xp=np)
    return v._local(comm, indices, values, n, op, algorithm, acc, alloc_fn, completion_fn,
                    NAMES, wire, wire_values, output, out)


def _error(**kwargs) -> tuple[type, str]:
    prepared, error = _local(**kwargs)
    assert prepared is None and error is not None, kwargs
    return type(error), str(error)


def test_each_local_rule_raises_its_exact_message():
    t, a = InvalidType, InvalidArgument
    cases = [
        ({"op": "xor"}, a, "invalid argument 'op' on rank 3: unknown op; valid: ['avg', 'max', "
         "'min', 'prod', 'sum'] (got 'xor')"),
        ({"wire": "raw"}, a, "invalid argument 'wire' on rank 3: unknown wire format; valid: "
         "['coo', 'compact', 'auto'] (got 'raw')"),
        ({"wire_values": "int8"}, a, "invalid argument 'wire_values' on rank 3: unknown value "
         "format; valid: [None, 'bfloat16', 'float16'] (got 'int8')"),
        ({"algorithm": "nope"}, a, f"invalid argument 'algorithm' on rank 3: unknown sparse "
         f"algorithm; valid: {NAMES} (got 'nope')"),
        ({"n": 10.0}, t, "argument 'n' on rank 3 must be an int (the dense length), got 'float'"),
        ({"n": True}, t, "argument 'n' on rank 3 must be an int (the dense length), got 'bool'"),
        ({"n": 0}, a, "invalid argument 'n' on rank 3: must be a positive int below 2**62 (the "
         "dense length) (got 0)"),
        ({"n": 2**62}, a, "invalid argument 'n' on rank 3: must be a positive int below 2**62 "
         f"(the dense length) (got {2**62})"),
        ({"indices": [1, 2]}, t, "argument 'indices' on rank 3 must be a numpy/cupy array or "
         "an object with __dlpack__, got 'list'"),
        ({"values": [1.0]}, t, "argument 'values' on rank 3 must be a numpy/cupy array or an "
         "object with __dlpack__, got 'list'"),
        ({"indices": IDX.astype(np.float64)}, t, "argument 'indices' on rank 3 must be an "
         "array of int32 or int64, got dtype('float64')"),
        ({"indices": IDX.astype(np.int16)}, t, "argument 'indices' on rank 3 must be an array "
         "of int32 or int64, got dtype('int16')"),
        ({"indices": IDX.astype(">i8")}, t, "argument 'indices' on rank 3 must be an array "
         "in the machine's byte order, got dtype('>i8')"),
        ({"values": VAL.astype(">f4")}, t, "argument 'values' on rank 3 must be an array in "
         "the machine's byte order, got dtype('>f4')"),
        ({"indices": IDX.reshape(2, 2)}, a,
         "invalid argument 'indices' on rank 3: must be 1-D (got (2, 2))"),
        ({"values": VAL.astype(np.int8)}, t, f"argument 'values' on rank 3 must be an array of "
         f"one of {VALUES}, got dtype('int8')"),
        ({"values": VAL.reshape(4, 1, 1)}, a, "invalid argument 'values' on rank 3: must be "
         "1-D, or 2-D rows (len(indices), width) (got (4, 1, 1))"),
        ({"values": VAL[:3]}, a, "invalid argument 'values' on rank 3: needs one value (row) "
         "per index; there are 4 indices (got (3,))"),
        ({"values": np.zeros((4, 0), np.float32)}, a, "invalid argument 'values' on rank 3: "
         "rows must have width >= 1 (got (4, 0))"),
        ({"acc": "foo"}, t, "argument 'accumulate_dtype' on rank 3 must be a dtype, got 'foo'"),
        ({"acc": np.int8}, t, f"argument 'accumulate_dtype' on rank 3 must be one of {VALUES}, "
         "got dtype('int8')"),
        ({"alloc_fn": "f"}, t, "argument 'alloc_fn' on rank 3 must be a callable or None, got "
         "'str'"),
        ({"completion_fn": 3}, t, "argument 'completion_fn' on rank 3 must be a callable or "
         "None, got 'int'"),
        ({"indices": np.array([4, 1, 10, 7])}, a, "invalid argument 'indices' on "
         "rank 3: index out of range [0, n=10) (got 10)"),
        ({"indices": np.array([0, 1, 10, 7])}, a, "invalid argument 'indices' on "
         "rank 3: index out of range [0, n=10) (got 10)"),
        ({"indices": np.array([4, -2, 12, 7])}, a, "invalid argument 'indices' on "
         "rank 3: index out of range [0, n=10) (got -2)"),
    ]
    for kwargs, cls, text in cases:
        assert _error(**kwargs) == (cls, text), kwargs
    _, error = _local(indices=np.array([4, 1, 10, 7]))
    assert isinstance(error, InvalidArgument) and error.value == 10


class _DeviceArray:
    """An array of a device library (``as_array`` passes it through as cupy's): ``get()``
    copies it to the host, as a cupy array on the MPI backend."""

    __module__ = "cupy.fake"
    __cupycoll_namespace__ = object()

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.dtype, self.ndim, self.shape = a, a.dtype, a.ndim, a.shape

    def get(self) -> np.ndarray:
        return self.a.copy()


def test_local_takes_callbacks_and_device_arrays_to_the_host():
    """Callable callbacks pass; device arrays reach the host communicator as numpy copies."""
    prepared, error = _local(alloc_fn=lambda *a: None, completion_fn=print)
    assert error is None and prepared.indices.tolist() == [1, 4, 7]
    prepared, error = _local(indices=_DeviceArray(IDX), values=_DeviceArray(VAL[:, None]))
    assert error is None and type(prepared.indices) is np.ndarray
    assert prepared.indices.tolist() == [1, 4, 7] and prepared.values.tolist() == [[2.0], [4.0],
                                                                                  [-0.5]]


def test_host_arrays_on_an_nccl_communicator_are_named():
    """An NCCL communicator's indices, values and out are of its array library (a host array
    is refused, as the dense and top-k calls refuse it; it was uploaded)."""
    nccl = types.SimpleNamespace(rank=3, backend="nccl", xp=types.ModuleType("devicelib"))
    for kwargs, argument in (({}, "indices"), ({"indices": _DeviceArray(IDX)}, "indices")):
        _, error = v._local(nccl, kwargs.get("indices", IDX), VAL, 10, "sum", "allgather",
                            None, None, None, NAMES)
        assert type(error) is InvalidType and str(error) == (
            f"argument '{argument}' on rank 3 must be a cupy array (or CUDA DLPack tensor) on "
            f"the nccl backend, got '{type(kwargs.get('indices', IDX)).__name__}'"), error


@pytest.mark.parametrize("name, value", [("CUPYCOLL_NUMBA", "garbage"),
                                         ("CUPYCOLL_THREADS", "0"),
                                         ("CUPYCOLL_RANKS_PER_NODE", "0"),
                                         ("CUPYCOLL_RANKS_PER_NODE", str(2**62)),
                                         ("CUPYCOLL_AUTO", "guess")])
def test_a_bad_setting_the_algorithms_read_is_a_validation_error(monkeypatch, name, value):
    """Settings read while an algorithm runs are parsed in the local validation, whose error
    every rank raises (a rank with its own bad value no longer raises alone mid-collective)."""
    monkeypatch.setenv(name, value)
    prepared, error = _local(algorithm="auto" if name == "CUPYCOLL_AUTO" else "allgather")
    assert prepared is None and isinstance(error, InvalidArgument) and name in str(error)
    assert error.rank == 3 and "on rank 3" in str(error)  # this rank's own error names it too


@pytest.mark.parametrize("name, keyword", [("CUPYCOLL_ALGORITHM", "algorithm"),
                                           ("CUPYCOLL_WIRE", "wire")])
def test_a_bad_value_from_the_environment_names_the_variable(monkeypatch, name, keyword):
    """A bad algorithm or wire that came from the environment names the variable (the caller
    passed no such keyword); the same value passed as the keyword names the keyword."""
    monkeypatch.setenv(name, "bogus")
    _, error = _local(**{keyword: None})
    assert isinstance(error, InvalidArgument) and error.argument == name and error.rank == 3
    monkeypatch.delenv(name)
    _, error = _local(**{keyword: "bogus"})
    assert isinstance(error, InvalidArgument) and error.argument == keyword


def test_a_dlpack_object_whose_own_methods_fail_is_named():
    class Broken:
        def __dlpack__(self, **kw):
            raise AssertionError("never asked")

        def __dlpack_device__(self):
            raise RuntimeError("boom")

    prepared, error = _local(values=Broken())
    assert prepared is None and str(error) == (
        "invalid argument 'values' on rank 3: must be a tensor DLPack can share with "
        "numpy/cupy (got 'Broken (boom)')")


def test_an_unexpected_failure_still_becomes_an_argument_error(monkeypatch):
    """Anything raised while checking that is not cupycoll's own travels as InvalidArgument
    'arguments' naming the rank (every front door's agreement: ``_agreement.unchecked``)."""
    from cupycoll.sparse import _validate

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(_validate, "_check_range", broken)
    prepared, error = _local()
    assert prepared is None and type(error) is InvalidArgument
    assert str(error) == ("invalid argument 'arguments' on rank 3: could not be checked "
                          "(got 'RuntimeError: boom')")
    assert isinstance(error.__cause__, RuntimeError)


def test_a_tensor_dlpack_cannot_share_is_named():
    """A producer refusing the export (a bfloat16 tensor for numpy, one that requires grad)
    names the argument."""

    class Refusing:
        def __dlpack__(self, **kw):
            raise BufferError("cannot export")

        def __dlpack_device__(self):
            return (1, 0)

    prepared, error = _local(values=Refusing())
    assert prepared is None and str(error) == (
        "invalid argument 'values' on rank 3: must be a tensor DLPack can share with "
        "numpy/cupy (got 'Refusing (cannot export)')")


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "prod"])
def test_local_prepares_the_coalesced_input_in_the_accumulate_dtype(op):
    """Duplicates reduced with the op (avg with sum), ascending indices, values in the
    accumulate dtype; the caller's dtypes and the keywords kept."""
    ufunc = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum,
             "prod": np.multiply}[op]
    for acc, want_acc in ((None, np.float32), (np.float64, np.float64)):
        prepared, error = _local(op=op, acc=acc, n=np.int64(8), wire="compact",
                                 wire_values="bfloat16", algorithm="dense")
        assert error is None
        assert prepared.indices.tolist() == [1, 4, 7]
        assert prepared.values.dtype == want_acc
        want = [2.0, float(ufunc(np.float64(1.0), np.float64(3.0))), -0.5]
        assert prepared.values.tolist() == want
        assert (prepared.n, prepared.op, prepared.algorithm) == (8, ReduceOp(op), "dense")
        assert type(prepared.n) is int
        assert prepared.index_dtype == np.int64 and prepared.value_dtype == np.float32
        assert prepared.accumulate_dtype == want_acc and prepared.width == 0
        assert (prepared.wire, prepared.wire_values) == ("compact", "bfloat16")
    inc = np.array([0, 3, 9], np.int32)
    prepared, _ = _local(indices=inc, values=np.ones((3, 2), np.float16), op=op,
                         wire_values="float16")
    assert prepared.indices.tolist() == [0, 3, 9] and prepared.width == 2
    # float16 travels as it is: wire_values changes nothing, the accumulate dtype stays (an
    # average runs in float32: its float16 sum could overflow where the average does not)
    assert prepared.values.dtype == (np.float32 if op == "avg" else np.float16)
    assert prepared.wire_values is None
    assert prepared.value_dtype == np.float16 and prepared.index_dtype == np.int32
    assert prepared.wire == "auto"
    prepared, _ = _local(indices=np.array([5], np.int32), values=np.array([2], np.int64),
                         n=2**62 - 1)
    assert prepared.n == 2**62 - 1 and prepared.values.dtype == np.int64
    prepared, _ = _local(values=np.asfortranarray(np.ones((4, 3), np.float64)))
    assert prepared.values.flags.c_contiguous and prepared.width == 3
    strided = np.arange(12.0)[::2][:3]  # ascending unique indices: nothing else copies it
    prepared, _ = _local(indices=np.array([0, 3, 9], np.int64), values=strided)
    assert prepared.values.flags.c_contiguous and prepared.values.tolist() == [0.0, 2.0, 4.0]
    prepared, _ = _local(indices=np.arange(8, dtype=np.int32)[::2], values=np.ones(4))
    assert prepared.indices.flags.c_contiguous and prepared.indices.tolist() == [0, 2, 4, 6]
    prepared, error = _local(values=np.ones((4, 1), np.float32))  # rows of width 1
    assert error is None and prepared.width == 1 and prepared.values.shape == (3, 1)


def test_prepared_shape_and_fields():
    prepared, _ = _local(acc=np.float64, algorithm="mask", wire="coo", op="max")
    prepared.nnz = (3, 5)
    mpi = types.SimpleNamespace(size=2, backend="mpi", xp=np)  # (no MPICommunicator: copies)
    assert prepared.shape(mpi) == Shape(2, 10, 0, 8, 8, (3, 5), wire=COO, float_values=True,
                                        result_bytes=4, host=True, in_place=False)  # float32
    # values summed in float64
    nccl = types.SimpleNamespace(size=4, backend="nccl", xp=types)  # device arrays
    assert prepared.shape(nccl, Wire(True, None)).wire == Wire(True, None)
    traits = prepared.shape(nccl)  # NCCL's max/min drop NaN, its sum need not keep -0
    assert traits.native_minmax_drops_nan and not traits.native_sum_keeps_minus_zero
    assert not traits.host and not traits.in_place
    assert prepared.reduce_op is ReduceOp.MAX
    ints, _ = _local(values=VAL.astype(np.int32), op="avg")
    assert ints.shape(mpi).float_values is False and ints.reduce_op is ReduceOp.SUM
    half, _ = _local(values=VAL.astype(np.float16))
    assert half.shape(mpi).float_values is False
    single, _ = _local()
    assert single.shape(mpi).float_values is True and single.shape(mpi).value_bytes == 4
    assert prepared.fields(NAMES) == (10, 1, 1, 0, 2, NAMES.index("mask"), 2, 0, 0)
    dense, _ = _local(output="dense")
    assert dense.fields(NAMES)[-1] == 1 and dense.shape(mpi).output == "dense"
    assert ints.fields(NAMES) == (10, 1, 3, 0, 4, NAMES.index("allgather"), 3, 6, 0)


def test_a_peers_error_comes_back_naming_the_rank_argument_and_every_bad_rank():
    """``_peer_error`` rebuilds from a travelled :class:`Failure` the error the other ranks
    raise: the same type naming the rank, the argument ("arguments" where it named none) and
    every bad rank; an index out of range shows its value and this rank's n (which the peer's
    n is not where the index is inside it)."""
    from types import SimpleNamespace

    from cupycoll._agreement import Failure

    args = ("indices", "values", "n", "op", "algorithm", "accumulate_dtype", "alloc_fn",
            "completion_fn", "async_op", "wire", "wire_values", "output", "out")
    draft = SimpleNamespace(context=SimpleNamespace(n=10))
    for name in args:
        e = t._peer_error(Failure(2, InvalidType, name, None, [2]), draft)
        assert type(e) is InvalidType and e.argument == name and e.rank == 2
        assert e.got is ELSEWHERE and str(e) == (
            f"argument {name!r} on rank 2 must be valid on every rank (rank 2 raised the "
            "precise error)")
        e = t._peer_error(Failure(1, InvalidArgument, name, None, [1, 4]), draft)
        assert type(e) is InvalidArgument and e.argument == name
        assert e.value is ELSEWHERE and str(e) == (
            f"invalid argument {name!r} on rank 1: rank 1 passed an invalid {name}; ranks with "
            "bad input: [1, 4]")
    e = t._peer_error(Failure(0, InvalidArgument, "indices", 12, [0]), draft)
    assert str(e) == ("invalid argument 'indices' on rank 0: index out of range [0, n=10) on "
                      "rank 0 (got 12)")
    draft.context.n = 7
    e = t._peer_error(Failure(1, InvalidArgument, "indices", -3, [1, 2]), draft)
    assert str(e) == ("invalid argument 'indices' on rank 1: index out of range [0, n=7) on "
                      "rank 1; ranks with bad input: [1, 2] (got -3)")
    e = t._peer_error(Failure(3, InvalidArgument, "indices", 4, [3]), draft)  # rank 3's n <= 4
    assert str(e) == ("invalid argument 'indices' on rank 3: index out of range [0, n) on rank "
                      "3, whose n is at most 4 (n = 7 here) (got 4)")
    e = t._peer_error(Failure(5, InvalidArgument, None, None, [5]), draft)
    assert e.argument == "arguments" and "rank 5 passed invalid arguments (that rank's error " \
        "names them)" in str(e)
    e = t._peer_error(Failure(5, InvalidType, None, None, [5]), draft)
    assert type(e) is InvalidType and e.argument == "arguments"


def test_mismatch_names_every_field_that_differs():
    """Agreement fields decoded by name (dtypes, op, algorithm, wire keywords)."""
    assert t._decode("index_dtype", 1) == "int64" and t._decode("value_dtype", 0) == "float16"
    assert t._decode("accumulate_dtype", 4) == "int64" and t._decode("op", 4) == "avg"
    assert t._decode("algorithm", 2) == NAMES[2] and t._decode("wire", 4) == "compact/bfloat16"
    assert t._decode("n", 12) == "12" and t._decode("async_op", 1) == "1"
    assert t._decode("output", 0) == "sparse" and t._decode("output", 1) == "dense"
    from types import SimpleNamespace

    from cupycoll._agreement import Differ

    lows = [10, 0, 1, 0, 0, 0, 1, 0, 0, 0]  # per field: n, index/value dtype, width, op, ...
    highs = [12, 0, 2, 0, 2, 3, 1, 5, 1, 1]
    differs = [Differ(field, lo, lo, hi, (lo, hi, lo, lo)) for field, lo, hi
               in zip(t.TERMS.fields, lows, highs) if lo != hi]
    assert t._mismatch(differs, SimpleNamespace(rank=1, size=4)) == (
        f"ranks disagree on n (10 on ranks 0, 2-3; 12 on rank 1), value_dtype (float32 on "
        f"ranks 0, 2-3; float64 on rank 1), op (sum on ranks 0, 2-3; max on rank 1), algorithm "
        f"({NAMES[0]} on ranks 0, 2-3; {NAMES[3]} on rank 1), wire (coo/None on ranks 0, 2-3; "
        f"compact/float16 on rank 1), output (sparse on ranks 0, 2-3; dense on rank 1), "
        f"async_op (0 on ranks 0, 2-3; 1 on rank 1) (seen on rank 1 of 4); every rank must "
        f"pass the same value")
    names = len(NAMES)  # the algorithm's code: name + names * (mode + 3 * ranks per node)
    auto = NAMES.index("auto")
    pair = Differ("algorithm", auto + names * 2, auto, auto + names * (2 + 3 * 4),
                  (auto, auto + names * (2 + 3 * 4)))
    assert t._mismatch([pair], SimpleNamespace(rank=1, size=2)).startswith(
        "ranks disagree on the algorithm's settings (auto (CUPYCOLL_AUTO=estimate, "
        "CUPYCOLL_RANKS_PER_NODE="
        "unset) on rank 0; auto (CUPYCOLL_AUTO=learn, CUPYCOLL_RANKS_PER_NODE=4) on rank 1)")
    dense = NAMES.index("dense")  # an algorithm named on rank 1: no mode of auto shown for it
    pair = Differ("algorithm", auto + names * 2, auto + names * 2, dense,
                  (auto + names * 2, dense))
    assert t._mismatch([pair], SimpleNamespace(rank=1, size=2)).startswith(
        "ranks disagree on algorithm (auto (CUPYCOLL_AUTO=learn) on rank 0; dense on rank 1)")


def test_ranks_are_written_as_spans():
    from cupycoll._agreement import Differ, ranks_text

    assert ranks_text([3]) == "rank 3" and ranks_text([0, 1, 2, 5]) == "ranks 0-2, 5"
    assert ranks_text([0, 2, 4, 5]) == "ranks 0, 2, 4-5"
    assert Differ("n", 1, 1, 2, (2, 1, 1, 2, 1)).by_rank() == "1 on ranks 1-2, 4; 2 on ranks 0, 3"


def _outcomes(p, call):
    from tests._threaded import outcomes

    return outcomes(p, call)


@pytest.mark.parametrize("p", [2, 3])
def test_ranks_raise_together_on_bad_input_or_a_disagreement(p):
    """``prepare`` on simulated ranks: the bad rank raises its own error, the others the same
    type naming the lowest bad rank (and every bad rank), an index out of range with its value;
    ranks that disagree raise MismatchError naming every differing field."""
    def call(indices=None, values=None, n=None, op=None, async_op=None, wire_values=None):
        def fn(comm):
            r = comm.rank
            return v.prepare(comm, (indices or {}).get(r, IDX), (values or {}).get(r, VAL),
                             (n or {}).get(r, 10), op=(op or {}).get(r, "sum"),
                             algorithm="allgather", accumulate_dtype=None, alloc_fn=None,
                             completion_fn=None, async_op=(async_op or {}).get(r, False),
                             wire="coo", wire_values=(wire_values or {}).get(r))
        return _outcomes(p, fn)

    last = p - 1
    got = call(indices={last: np.array([3, 12])}, values={last: VAL[:2]})
    assert str(got[last]) == ("invalid argument 'indices' on rank %d: index out of range "
                              "[0, n=10) (got 12)" % last)
    for e in got[:last]:
        assert str(e) == (f"invalid argument 'indices' on rank {last}: index out of range "
                          f"[0, n=10) on rank {last} (got 12)")
    got = call(values={0: VAL.astype(np.int8)}, n={last: 10.0})
    assert got[0].argument == "values" and got[last].argument == "n"
    also = f"; ranks with bad input: [0, {last}]"
    for e in got[1:last]:
        assert type(e) is InvalidType and str(e) == (
            "argument 'values' on rank 0 must be valid on every rank (rank 0 raised the "
            f"precise error{also})")
    got = call(wire_values={0: "bfloat16"})
    for r, e in enumerate(got):
        wires = ("coo/None on ranks 1-2; coo/bfloat16 on rank 0" if p == 3
                 else "coo/bfloat16 on rank 0; coo/None on rank 1")
        assert type(e) is MismatchError and str(e) == (
            f"ranks disagree on wire ({wires}) (seen on rank {r} of {p}); every rank must pass "
            "the same value"), (r, e)
    got = call(n={1: 12}, op={1: "max"}, async_op={0: True})
    for r, e in enumerate(got):
        others = "ranks 0, 2" if p == 3 else "rank 0"
        async_ops = "0 on ranks 1-2; 1 on rank 0" if p == 3 else "1 on rank 0; 0 on rank 1"
        assert type(e) is MismatchError and str(e) == (
            f"ranks disagree on n (10 on {others}; 12 on rank 1), op (sum on {others}; max on "
            f"rank 1), async_op ({async_ops}) (seen on rank {r} of {p}); every rank must pass "
            "the same value"), (r, e)
    got = call(async_op={last: "no"})  # not taken as true
    for e in got:
        assert type(e) is InvalidType and e.argument == "async_op" and e.rank == last, e
    assert str(got[last]) == (f"argument 'async_op' on rank {last} must be True or False, got "
                              "'str'")
    got = call()
    for prepared in got:
        assert prepared.nnz == (3,) * p and prepared.indices.tolist() == [1, 4, 7]


@pytest.mark.parametrize("p", [2, 3])
def test_an_accumulate_dtype_of_the_other_byte_order_is_its_native_twin(p):
    """``accumulate_dtype=">f8"`` names float64 arithmetic: every rank reduces in native
    float64, a rank that wrote ``np.float64`` agrees with it, and the sums are the float64 sums
    of the numbers (reference: np.add.at); the primitives take it the same way."""
    orders = {0: ">f8", 1: np.float64, 2: "<f8"}

    def fn(comm):
        return v.prepare(comm, IDX, VAL, 10, op="sum", algorithm="allgather",
                         accumulate_dtype=orders[comm.rank], alloc_fn=None, completion_fn=None,
                         async_op=False, wire="coo")

    want = np.zeros(10)
    np.add.at(want, IDX, VAL.astype(np.float64))
    for prepared in _outcomes(p, fn):
        assert not isinstance(prepared, Exception), prepared
        assert prepared.accumulate_dtype == np.dtype(np.float64)
        assert prepared.accumulate_dtype.isnative
        assert np.array_equal(prepared.values, want[prepared.indices])
    for order in (">f8", "<f8"):
        idx, val = coo_reduce(IDX, VAL, accumulate_dtype=order)
        assert idx.tolist() == [1, 4, 7] and val.dtype == np.float32
        assert np.array_equal(val, want[[1, 4, 7]].astype(np.float32))


def test_a_rank_in_another_verb_stops_the_validation():
    """A rank in topk_allreduce while the others validate a sparse call: every rank raises
    MismatchError naming both verbs and its own; the validation is booked ``sparse.validate``."""
    from tests._threaded import assert_mixed_verbs

    assert_mixed_verbs(
        1, lambda comm: cc.topk_allreduce(np.ones(4, np.float32), 2, comm=comm,
                                          algorithm="dense"),
        lambda comm: cc.sparse_allreduce(IDX, VAL, 10, comm=comm))


def test_dense_output_arguments_are_checked_on_the_calling_rank():
    """``output`` and ``out``: each bad value raises naming the argument, the rank and what is
    wanted; a good ``out`` comes back as the same memory."""
    assert _error(output="coo") == (InvalidArgument, _error(output="coo")[1])
    assert "'output'" in _error(output="coo")[1] and "rank 3" in _error(output=1)[1]
    kind, text = _error(out=np.zeros(10, np.float64))
    assert kind is InvalidArgument and "only for output='dense'" in text
    kind, text = _error(output="dense", out=np.zeros(11, VAL.dtype))
    assert kind is InvalidArgument and "(10,)" in text and str(VAL.dtype) in text
    kind, text = _error(output="dense", out=np.zeros(10, np.float16))
    assert kind is InvalidArgument and "dtype" in text
    kind, text = _error(output="dense", out=np.zeros(20, VAL.dtype)[::2])
    assert kind is InvalidArgument and "C-contiguous" in text
    kind, text = _error(output="dense", out=np.broadcast_to(VAL.dtype.type(0), (10,)))
    assert kind is InvalidArgument and "writable" in text
    kind, text = _error(output="dense", out=[0.0] * 10)
    assert kind is InvalidType and "'out'" in text
    kind, text = _error(output="dense", alloc_fn=lambda *a: None)
    assert kind is InvalidArgument and "'alloc_fn'" in text and "out=" in text
    rows = np.zeros((IDX.size, 3), VAL.dtype)
    kind, _ = _error(values=rows, output="dense", out=np.zeros(10, VAL.dtype))
    assert kind is InvalidArgument
    buf = np.zeros((10, 3), VAL.dtype)
    prepared, error = _local(values=rows, output="dense", out=buf)
    assert error is None and prepared.output == "dense" and np.shares_memory(prepared.out, buf)
