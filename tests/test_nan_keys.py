"""Float max/min through integer order keys (``sparse/_common.py``, issue 37 item 5).

NCCL's native float max/min drop a NaN, so ``mask``, ``dense`` and ``dense_result`` reduce
float max/min there as integer keys. In process: the key transform against numpy's order of
random bit patterns (normals, subnormals, +-inf, NaN of any sign and payload, +-0) in
float16/32/64; a reduction of keys against the contract's rule computed by numpy (NaN wins, a
+0/-0 tie gives +0 for max and -0 for min, numpy's NaN bits); when keys are used; and the three
algorithms on ranks simulated by threads whose native max/min drop a NaN and whose sum loses
-0 (as NCCL's may), against a numpy reference, their traffic as their cost models say.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from cupycoll._types import ReduceOp
from cupycoll.sparse import _common, dense, mask
from cupycoll.sparse._common import allreduce_values, from_order_keys, order_keys
from cupycoll.sparse._cost import Shape

FLOATS = (np.float16, np.float32, np.float64)
MAX, MIN = ReduceOp.MAX, ReduceOp.MIN


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(f"u{x.dtype.itemsize}")


def _specimens(dtype, count: int, seed: int) -> np.ndarray:
    """Random bit patterns (every class of float, NaNs of both signs and any payload), then
    +-0, +-inf, NaN, -NaN, the least subnormals, the least normals and the largest finite."""
    rng = np.random.default_rng([seed, np.dtype(dtype).itemsize])
    random = np.frombuffer(rng.bytes(count * np.dtype(dtype).itemsize), dtype)
    info = np.finfo(dtype)
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, info.smallest_subnormal,
             -info.smallest_subnormal, info.smallest_normal, -info.smallest_normal, info.max,
             -info.max, 1.0, -1.0]
    return np.concatenate([random, np.array(edges, dtype)])


def _canonical(dtype) -> np.ndarray:
    return _bits(np.array(np.nan, dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_keys_order_floats_as_numpy_with_minus_zero_below_plus_zero(dtype):
    """Sorted by numpy (value, then -0 before +0), the keys strictly increase wherever the
    bits change; every NaN is above every other key for max and below for min."""
    x = _specimens(dtype, 20000, 1)
    plain = x[~np.isnan(x)]
    ordered = plain[np.lexsort((~np.signbit(plain), plain))]
    for op in (MAX, MIN):
        keys = order_keys(ordered.copy(), op).astype(np.int64)
        step = np.diff(keys)
        same = _bits(ordered)[1:] == _bits(ordered)[:-1]
        assert (step[~same] > 0).all() and (step[same] == 0).all()
        nan_keys = order_keys(x[np.isnan(x)].copy(), op).astype(np.int64)
        assert nan_keys.size > 2
        assert (nan_keys > keys.max()).all() if op is MAX else (nan_keys < keys.min()).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_keys_come_back_to_the_same_bits_and_numpys_nan(dtype):
    """32- and 64-bit keys are the values' own bits (in place), 16-bit ones a widened int32
    copy (NCCL has no int16); back from keys every value has its bits, every NaN numpy's."""
    x = _specimens(dtype, 5000, 2)
    for op in (MAX, MIN):
        values = x.copy()
        keys = order_keys(values, op)
        assert keys.dtype == (np.int64 if dtype is np.float64 else np.int32)
        assert np.shares_memory(keys, values) == (dtype is not np.float16)
        back = from_order_keys(keys, values)
        assert back is values
        nan = np.isnan(x)
        assert np.array_equal(_bits(back)[~nan], _bits(x)[~nan])
        assert np.isnan(back[nan]).all() and (_bits(back[nan]) == _canonical(dtype)).all()


def _contract(rows: np.ndarray, op: ReduceOp) -> np.ndarray:
    """The sparse contract's float max/min over ranks (axis 0), from numpy alone: NaN wins
    (numpy's bits), and a result 0 is +0 for max when some rank holds +0 (else -0), -0 for min
    when some rank holds -0 (else +0)."""
    with np.errstate(invalid="ignore"):
        out = (np.maximum if op is MAX else np.minimum).reduce(rows, axis=0)
    zero = out == 0
    plus = ((rows == 0) & ~np.signbit(rows)).any(axis=0)
    minus = ((rows == 0) & np.signbit(rows)).any(axis=0)
    out[zero] = (np.where(plus[zero], 0.0, -0.0) if op is MAX
                 else np.where(minus[zero], -0.0, 0.0))
    out[np.isnan(out)] = np.nan
    return out


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("p", [2, 3, 5])
def test_a_max_or_min_of_keys_is_the_contracts_max_or_min(dtype, p):
    """An integer max (min) over ranks of the keys, turned back, has the bits of the
    contract's float max (min): NaN on one rank wins, +-0 ties follow the rule, subnormals
    and infinities keep their order; the operands' order cannot matter (integers)."""
    rng = np.random.default_rng([p, np.dtype(dtype).itemsize])
    pool = _specimens(dtype, 64, 3)
    pool = np.concatenate([pool, np.array([0.0, -0.0] * 20, dtype)])  # many ties
    rows = rng.choice(pool[~np.isnan(pool)], (p, 4000))
    rows[rng.integers(p), rng.random(4000) < 0.05] = np.nan  # NaN on one rank only
    for op in (MAX, MIN):
        keys = [order_keys(row.copy(), op) for row in rows]
        reduced = (np.maximum if op is MAX else np.minimum).reduce(np.stack(keys), axis=0)
        got = from_order_keys(reduced, np.empty(4000, dtype))
        assert np.array_equal(_bits(got), _bits(_contract(rows, op))), op


class _Recording:
    """A one-rank-of-P stand-in: records what ``allreduce`` was given, reduces nothing."""

    def __init__(self, backend: str, **traits) -> None:
        self.backend, self.size, self.seen = backend, 2, []
        self.__dict__.update(traits)

    def allreduce(self, send, recv, op, op_name):
        self.seen.append((send.dtype, op, op_name))
        return self

    def stream_order(self, work):
        pass


def test_keys_replace_only_float_max_min_where_the_native_ones_drop_nan():
    """NCCL (by default, or by its ``native_minmax_drops_nan``) reduces float max/min as keys;
    MPI, sums, products and integers go to the native allreduce as they are."""
    cases = [("mpi", {}, np.float32, MAX, np.float32), ("nccl", {}, np.float32, MAX, np.int32),
             ("nccl", {}, np.float16, MIN, np.int32), ("nccl", {}, np.float64, MIN, np.int64),
             ("nccl", {}, np.float32, ReduceOp.SUM, np.float32),
             ("nccl", {}, np.float32, ReduceOp.PROD, np.float32),
             ("nccl", {}, np.int32, MAX, np.int32),
             ("nccl", {"native_minmax_drops_nan": False}, np.float32, MAX, np.float32),
             ("mpi", {"native_minmax_drops_nan": True}, np.float64, MAX, np.int64)]
    for backend, traits, dtype, op, sent in cases:
        comm = _Recording(backend, **traits)
        buf = np.array([1, 0, 2], dtype)
        allreduce_values(comm, buf, op, "x.allreduce")
        assert comm.seen == [(np.dtype(sent), op, "x.allreduce")], (backend, traits, dtype, op)
        assert np.array_equal(buf, np.array([1, 0, 2], dtype))  # back from keys
    assert _common.native_keeps_minus_zero(_Recording("mpi"))
    assert not _common.native_keeps_minus_zero(_Recording("nccl"))
    assert _common.native_keeps_minus_zero(_Recording("nccl", native_sum_keeps_minus_zero=True))


def _nccl_shape(*args) -> Shape:
    """A cost model's shape of a call on NCCL (its traits as the communicator has them)."""
    return dataclasses.replace(Shape.from_inputs(*args), native_minmax_drops_nan=True,
                               native_sum_keeps_minus_zero=False)


def _nccl_like(monkeypatch) -> None:
    """Simulated ranks reduce as NCCL may: float max/min drop a NaN, a sum of 0 is +0."""
    from tests import _threaded

    def flushed_sum(a, b):
        with np.errstate(invalid="ignore"):  # inf + -inf: NaN, as on the device
            out = np.add(a, b)
        if out.dtype.kind == "f":
            out[out == 0] = 0
        return out

    monkeypatch.setitem(_threaded._REDUCE, ReduceOp.MAX, np.fmax)
    monkeypatch.setitem(_threaded._REDUCE, ReduceOp.MIN, np.fmin)
    monkeypatch.setitem(_threaded._REDUCE, ReduceOp.SUM, flushed_sum)


def _inputs(p: int, n: int, width: int, dtype, seed: int, nan: bool):
    """Each rank's sorted unique entries, values from +-0, +-1, +-inf, a subnormal, and NaN
    on rank 0 only (``nan``)."""
    pool = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf,
                     float(np.finfo(dtype).smallest_subnormal)], dtype)
    out = []
    for r in range(p):
        rng = np.random.default_rng([seed, r, p, width])
        idx = np.flatnonzero(rng.random(n) < 0.6).astype(np.int64)
        val = rng.choice(pool, (idx.size,) + ((width,) if width else ()))
        if nan and r == 0:
            val[rng.random(val.shape) < 0.2] = np.nan
        out.append((idx, val))
    return out


def _reference(inputs, n: int, op: ReduceOp):
    """The union, and the dense result (absent entries +0) by :func:`_contract` or a sum."""
    row = inputs[0][1].shape[1:]
    stack = np.zeros((len(inputs), n) + row, inputs[0][1].dtype)
    for r, (idx, val) in enumerate(inputs):
        stack[r, idx] = val
    union = np.unique(np.concatenate([idx for idx, _ in inputs]))
    if op is ReduceOp.SUM:
        with np.errstate(invalid="ignore"):  # inf + -inf: NaN
            return union, stack.sum(axis=0)
    return union, _contract(stack, op)


def _on_nccl_like(p: int, fn):
    from tests._threaded import on_communicators

    def traits(comm):
        comm.native_minmax_drops_nan, comm.native_sum_keeps_minus_zero = True, False
        return fn(comm)

    return on_communicators(p, traits)


def _booked(p: int, nbytes: int) -> int:
    """Bytes a rank receives in a native allreduce of ``nbytes``: floor(2(P-1)/P bytes)."""
    return math.floor(2 * (p - 1) / p * nbytes)


def _allreduced(log, name: str) -> list[int]:
    return [nbytes for entry, nbytes in log if entry == name]


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("width", [0, 3])
def test_mask_and_dense_keep_nan_and_ties_where_native_max_min_drop_nan(monkeypatch, p, width):
    """float16/32/64 max and min, NaN on rank 0 only: mask (sparse), dense (sparse) and
    dense_result give the reference's bits on every rank; the values' allreduce moves keys
    (16-bit floats' as int32), as mask.cost and dense.cost say."""
    _nccl_like(monkeypatch)
    n = 50
    for dtype in FLOATS:
        inputs = _inputs(p, n, width, dtype, 11, nan=True)
        for op in (MAX, MIN):
            union, want = _reference(inputs, n, op)

            def run(comm, inputs=inputs, op=op):
                idx, val = inputs[comm.rank]
                return (mask.mask(comm, idx, val, n, op), dense.dense(comm, idx, val, n, op),
                        dense.dense_result(comm, idx, val, n, op))

            shape = _nccl_shape([i for i, _ in inputs], n, width, 8,
                                           np.dtype(dtype).itemsize)
            shape = dataclasses.replace(shape, op=op.value,
                                        float_values=dtype is not np.float16)
            key_row = (4 if dtype is not np.float64 else 8) * max(width, 1)
            for (by_mask, by_dense, full), log in _on_nccl_like(p, run):
                for got_idx, got_val in (by_mask, by_dense):
                    assert np.array_equal(got_idx, union), (dtype, op)
                    assert np.array_equal(_bits(got_val), _bits(want[union])), (dtype, op)
                assert np.array_equal(_bits(full), _bits(want)), (dtype, op)
                assert _allreduced(log, "mask.allreduce") == [union.size * key_row]
                assert _allreduced(log, "dense.allreduce") == [n * key_row] * 2
                assert mask.cost(shape, 0).received["mask.allreduce"] == _booked(
                    p, union.size * key_row)
                assert dense.cost(shape, 0).received["dense.allreduce"] == _booked(
                    p, n * key_row)


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("width", [0, 3, 8])
def test_dense_union_stays_exact_where_the_sum_loses_minus_zero(monkeypatch, p, width):
    """A network sum that turns -0 + -0 into +0 would make every absent row of a -0 fill
    look present; where the native sum does not keep -0 the dense algorithm reads presence
    from a count tail (width 8) or a bitmap instead: the exact union, values equal up to the
    sign of zero, its traffic as dense.cost says."""
    _nccl_like(monkeypatch)
    n = 60
    for dtype in (np.float32, np.float64):
        inputs = _inputs(p, n, width, dtype, 12, nan=False)
        union, want = _reference(inputs, n, ReduceOp.SUM)

        def run(comm, inputs=inputs):
            idx, val = inputs[comm.rank]
            return dense.dense(comm, idx, val, n, ReduceOp.SUM)

        shape = _nccl_shape([i for i, _ in inputs], n, width, 8,
                                       np.dtype(dtype).itemsize)
        cost = dense.cost(shape, 0).received
        row = np.dtype(dtype).itemsize * max(width, 1)
        tail = np.dtype(dtype).itemsize if width >= dense.FOLD_WIDTH else 0
        for (got_idx, got_val), log in _on_nccl_like(p, run):
            assert np.array_equal(got_idx, union), dtype
            assert np.array_equal(got_val, want[union], equal_nan=True), dtype
            assert _allreduced(log, "dense.allreduce") == [n * (row + tail)]
            assert cost["dense.allreduce"] == _booked(p, n * (row + tail))
            assert ("dense.union" in cost) == (not tail) == bool(_allreduced(log, "dense.union"))
