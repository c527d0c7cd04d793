"""The sparse front door's own steps, in process.

What ``sparse_allreduce`` does around the algorithm: the avg division and the single cast back
(``_sparse_result``), the copy of a result that aliases the input (``_run``). (Delivery and the
call's name: tests/test_pipeline.py.) Expected values come from numpy and Python integers, and error texts
from the documented format of ``cupycoll.errors``, never from the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import cupycoll as cc
from cupycoll._types import ReduceOp
from cupycoll.errors import InvalidType
from cupycoll.sparse import api
from cupycoll.sparse._validate import Prepared
from cupycoll.wire._pack import Wire


class _Size:
    """Only what ``_sparse_result`` reads of a communicator: its size."""

    def __init__(self, size: int) -> None:
        self.size = size


def _prepared(op: ReduceOp, index_dtype, value_dtype, acc=None, idx=None, val=None) -> Prepared:
    acc = np.dtype(acc or value_dtype)
    return Prepared(idx, val, 100, op, "allgather", np.dtype(index_dtype), np.dtype(value_dtype),
                    acc, 0)


@pytest.fixture(scope="module")
def comm():
    return cc.init("mpi", mpi_comm=MPI.COMM_SELF)


@pytest.mark.parametrize("p", [2, 3, 7])
def test_finish_divides_only_avg_by_p_truncating_integers(p):
    """avg: the sum over P ranks divided by P (integers toward zero, like C); every other op
    leaves the reduced values alone."""
    totals = [-7, 7, 6, -5, 0, 13, -1, 2**40 + 1]
    idx = np.arange(len(totals), dtype=np.int64)
    want = [abs(t) // p * (1 if t >= 0 else -1) for t in totals]  # Python ints, toward zero
    _, got = api._sparse_result(_Size(p), _prepared(ReduceOp.AVG, np.int64, np.int64),
                         idx.copy(), np.array(totals, np.int64))
    assert got.tolist() == want
    f = np.array([1.0, -2.0, 3.5, 1e300], np.float64)
    _, got = api._sparse_result(_Size(p), _prepared(ReduceOp.AVG, np.int64, np.float64), idx[:4].copy(),
                         f.copy())
    assert np.array_equal(got, f / np.float64(p))
    for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PROD):
        _, got = api._sparse_result(_Size(p), _prepared(op, np.int64, np.int64), idx.copy(),
                             np.array(totals, np.int64))
        assert got.tolist() == totals, op


def test_finish_casts_back_to_the_callers_dtypes_once():
    """Indices come back in the caller's index dtype, values in the caller's value dtype (from
    the accumulate dtype, one rounding), NaNs with numpy's NaN bits."""
    idx = np.array([1, 4, 9], np.int64)
    acc = np.array([1.0 + 2.0**-12, np.nan, -3.0], np.float32)
    acc[1] = np.array([0xFFC00123], np.uint32).view(np.float32)[0]  # a negative NaN, payload
    out_i, out_v = api._sparse_result(_Size(2), _prepared(ReduceOp.SUM, np.int32, np.float16, np.float32),
                               idx, acc.copy())
    assert out_i.dtype == np.int32 and out_i.tolist() == [1, 4, 9]
    assert out_v.dtype == np.float16
    want = np.array([1.0, np.nan, -3.0], np.float16)  # 1 + 2^-12 rounds to 1 in float16
    assert out_v.view(np.uint16).tolist() == want.view(np.uint16).tolist()


def test_run_passes_the_prepared_call_and_copies_an_aliased_result(comm):
    """The algorithm runs with the prepared arguments (avg as a sum); a result that is the
    input itself comes back as a copy, and avg is divided. (That it runs under the verb
    ``sparse_allreduce``: tests/test_pipeline.py.)"""
    idx, val = np.array([2, 5], np.int64), np.array([4.0, -6.0], np.float64)
    prepared = _prepared(ReduceOp.AVG, np.int64, np.float64, idx=idx, val=val)
    wire = Wire(True, "bfloat16")
    seen = {}

    def algorithm(on, indices, values, n, op, accumulate_dtype, wire):
        seen.update(args=(on, indices, values, n, op, accumulate_dtype, wire))
        return indices, values  # aliases the prepared input

    out_i, out_v = api._run(comm, prepared, "tested", algorithm, val, wire)
    assert seen["args"] == (comm, idx, val, 100, ReduceOp.SUM, np.dtype(np.float64), wire)
    assert out_i.tolist() == [2, 5] and out_v.tolist() == [4.0, -6.0]  # P = 1: avg = sum
    assert not np.may_share_memory(out_i, idx) and not np.may_share_memory(out_v, val)


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_uncoalesced_rows_reach_the_algorithms_that_fold_them_unsummed(comm, monkeypatch, op):
    """A host sum's duplicate rows go to ``mask`` as Unfolded rows (summed where they land),
    to ``recursive_doubling`` so too (folded at P = 1: nothing to send) and to every other
    algorithm coalesced; any other op coalesces first. Every algorithm
    returns the input-order sums (Python floats)."""
    from cupycoll.primitives import _accel
    from cupycoll.primitives._unfolded import Unfolded
    from cupycoll.sparse import mask

    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    kinds = []
    real = mask.scatter_into
    monkeypatch.setattr(mask, "scatter_into", lambda out, at, values: (
        kinds.append(type(values)), real(out, at, values))[1])
    idx = np.array([7, 2, 7, 9, 2, 7])
    val = np.array([[1.5, -0.0], [2.0, 3.0], [0.25, -0.0], [4.0, 5.0], [8.0, 1.0], [1.0, -0.0]])
    for name in cc.algorithms("sparse"):
        got = cc.sparse_allreduce(idx, val, 10, op=op, algorithm=name, comm=comm)
        assert got.indices.tolist() == [2, 7, 9], name
        want = [[10.0, 4.0], [2.75, -0.0], [4.0, 5.0]] if op != "max" else \
            [[8.0, 3.0], [1.5, -0.0], [4.0, 5.0]]
        assert got.values.tolist() == want and np.signbit(got.values[1, 1]), name
    assert kinds == [Unfolded if op != "max" else np.ndarray]


def test_front_door_validates_under_its_name_and_returns_on_the_given_comm(comm, monkeypatch):
    """Validation runs under the verb ``sparse_allreduce`` on the communicator passed in."""
    seen = []
    real = api.prepare

    def prepare(on, *args, **kwargs):
        seen.append((on, on._verb))
        return real(on, *args, **kwargs)

    monkeypatch.setattr(api, "prepare", prepare)
    res = cc.sparse_allreduce(np.array([3, 1, 3], np.int32), np.array([1.0, 2.0, 4.0]), 8,
                              comm=comm, algorithm="allgather")
    assert seen == [(comm, "sparse_allreduce")]
    assert res.indices.tolist() == [1, 3] and res.values.tolist() == [2.0, 5.0]


def test_front_door_checks_the_callbacks_it_is_given(comm):
    """A callback that is not callable is an InvalidType naming it, before anything runs."""
    for arg in ("alloc_fn", "completion_fn"):
        with pytest.raises(InvalidType) as info:
            cc.sparse_allreduce(np.array([1], np.int32), np.ones(1), 4, comm=comm,
                                **{arg: "not callable"})
        assert info.value.argument == arg and info.value.got == "str"


def test_front_door_prices_auto_with_the_call_as_asked(comm, monkeypatch):
    """``auto`` (entries too many for the validation's slots) prices the call's shape under
    the wire asked for, with the call's op and communicator; the wire is then chosen for the
    algorithm picked, from the call's own wire keywords (the same Shape: ``choose_wire``
    prices each wire itself)."""
    seen = {}
    real = api._auto.choose_wire

    def choose(shape, profile=None, *, comm=None, op=None):
        seen["choose"] = (shape.size, shape.n, shape.nnz, shape.wire, comm, op)
        return "allgather"

    def choose_wire(name, shape, request, values=None, profile=None, *, comm=None):
        seen["wire"] = (name, shape.size, shape.nnz, shape.wire, request, values, comm)
        return real(name, shape, request, values, profile, comm=comm)

    monkeypatch.setattr(api._auto, "choose", choose)
    monkeypatch.setattr(api._auto, "choose_wire", choose_wire)
    m = 4096  # more than any slot holds
    idx = np.arange(m, dtype=np.int32)
    for wire, compact in (("compact", True), ("coo", False), ("auto", False)):
        seen.clear()
        res = cc.sparse_allreduce(idx, np.ones(m, np.float32), m, op="max", comm=comm,
                                  wire=wire, wire_values="bfloat16")
        assert res.indices.tolist() == idx.tolist() and np.all(res.values == 1.0)
        assert seen["choose"] == (1, m, (m,), Wire(compact, "bfloat16"), comm, ReduceOp.MAX)
        assert seen["wire"] == ("allgather", 1, (m,), Wire(compact, "bfloat16"), wire,
                                "bfloat16", comm)  # the same Shape: the choice sets each wire


def test_debug_log_names_the_small_path_and_its_wire(comm, caplog):
    """A call whose entries came with the validation logs algorithm ``small`` and the coo wire
    with the values' rounding asked for (nothing else travels)."""
    import logging

    with caplog.at_level(logging.DEBUG, logger="cupycoll"):
        res = cc.sparse_allreduce(np.array([5, 2], np.int64), np.array([1.0, 3.0], np.float32),
                                  10, comm=comm, wire="compact", wire_values="bfloat16")
    assert res.indices.tolist() == [2, 5] and res.values.tolist() == [3.0, 1.0]
    msgs = [r.getMessage() for r in caplog.records if "sparse_allreduce:" in r.getMessage()]
    assert msgs == [f"sparse_allreduce: algorithm small, wire {Wire(False, 'bfloat16')!s}, "
                    "nnz (2,), n 10"]


def test_async_call_on_a_stream_ordered_communicator_names_its_device_work(comm, monkeypatch):
    """On a communicator that orders work on a stream (NCCL), async_op runs the call in the
    calling thread and its Work waits for the device work queued under ``sparse_allreduce``."""
    names = []

    class Done:
        def wait(self):
            return None

        def is_completed(self):
            return True

    def stream_work(op_name):
        names.append(op_name)
        return Done()

    monkeypatch.setattr(comm, "stream_work", stream_work, raising=False)
    work = cc.sparse_allreduce(np.array([4, 1], np.int32), np.array([2.0, 3.0]), 6, comm=comm,
                               algorithm="allgather", async_op=True)
    assert names == ["sparse_allreduce"]
    res = work.wait()
    assert res.indices.tolist() == [1, 4] and res.values.tolist() == [3.0, 2.0]


@pytest.mark.parametrize("itype, vtype, width, fits", [(np.int32, np.float32, 0, 256),
                                                       (np.int64, np.float64, 0, 128),
                                                       (np.int32, np.float32, 2, 170)])
def test_entries_filling_the_whole_slot_come_with_the_validation(comm, caplog, itype, vtype,
                                                                 width, fits):
    """One rank's slot holds 256 int64 words (sparse/small.py): entries of exactly that many
    words (indices, then values, each padded to 8 bytes) come back with the validation (the
    ``small`` path), one more entry goes to an algorithm; both equal the input, sorted."""
    import logging

    rng = np.random.default_rng(7)
    for nnz, path in ((fits, "small"), (fits + 2, "allgather")):
        idx = rng.choice(1000, nnz, replace=False).astype(itype)
        val = rng.standard_normal((nnz, width) if width else nnz).astype(vtype)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="cupycoll"):
            res = cc.sparse_allreduce(idx, val, 1000, comm=comm)
        order = np.argsort(idx)
        assert res.indices.tolist() == idx[order].tolist()
        assert res.values.tobytes() == val[order].tobytes()
        msgs = [r.getMessage() for r in caplog.records if "sparse_allreduce:" in r.getMessage()]
        assert len(msgs) == 1 and msgs[0].startswith(f"sparse_allreduce: algorithm {path},")


def test_small_path_rounds_values_on_the_wire_like_allgather():
    """Two simulated ranks, entries that fit the validation's slots, ``wire_values``: each
    rank's values travel rounded to bfloat16 (nearest even), as on the allgather path, and the
    result is the same on both ranks."""
    from tests._threaded import on_communicators

    x = np.float32(1.0 + 2.0**-10)  # not a bfloat16: rounds to 1.0 (nearest even)

    def call(comm):
        return cc.sparse_allreduce(np.array([comm.rank, 5], np.int32), np.array([x, x]), 8,
                                   comm=comm, wire_values="bfloat16")

    for res, _ in on_communicators(2, call):
        assert res.indices.tolist() == [0, 1, 5] and res.values.dtype == np.float32
        assert res.values.tolist() == [1.0, 1.0, 2.0]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("size", [5, 1 << 15])
def test_canonical_nan_gives_every_nan_numpys_bits(dtype, size):
    """Results' NaNs get numpy's NaN bits whatever their sign and payload, below and above the
    size from which a numba read skips arrays without NaN or infinity; other values keep
    their bits (an infinity alone is not a NaN; an array without specials is untouched)."""
    from cupycoll.sparse._common import canonical_nan

    rng = np.random.default_rng(size)
    ints = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    nan_bits = np.array([np.nan], dtype).view(ints)[0]
    plain = rng.standard_normal(size).astype(dtype)
    odd = plain.copy()
    at = rng.choice(size, 3, replace=False)
    odd[at[0]] = -np.array(np.nan, dtype)  # a negative NaN
    odd.view(ints)[at[1]] = nan_bits | ints(1)  # a NaN with a payload
    odd[at[2]] = np.inf
    for values in (plain, odd):
        want = values.view(ints).copy()
        want[np.isnan(values)] = nan_bits
        got = canonical_nan(values.copy())
        assert got.view(ints).tolist() == want.tolist()
