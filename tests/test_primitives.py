"""Single-process property tests of the numpy primitives against independent Python references.

References loop in plain Python (dicts, sorted(), exact int/float comparisons) so they share no
code path with the vectorised implementations; reductions fold numpy scalars left to right, which
is the documented order, and are compared bit for bit.
"""

from __future__ import annotations

import math
import subprocess
import sys
import types
from fractions import Fraction

import numpy as np
import pytest

from cupycoll import primitives as P
from cupycoll.primitives import _accel, _numpy_select
from cupycoll._types import ReduceOp
from cupycoll.errors import InvalidArgument, InvalidType

VALUE_DTYPES = ["float16", "float32", "float64", "int32", "int64"]
INDEX_DTYPES = ["int32", "int64"]
OPS = ["sum", "prod", "max", "min"]
UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------

def assert_same(got, want):
    """Bitwise-style equality: dtype, shape, values (NaN == NaN) and the sign of zeros."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)
    if got.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def random_values(rng, dtype, shape, kind="mixed"):
    """Values with ties and both signs; 'mixed' adds continuous floats, 'small' keeps |v| <= 3."""
    dtype = np.dtype(dtype)
    small = rng.integers(-3, 4, size=shape)
    if kind == "small" or dtype.kind == "i":
        if dtype.kind == "i" and kind != "small":
            info = np.iinfo(dtype)
            wide = rng.integers(info.min, info.max, size=shape, endpoint=True)
            return np.where(rng.random(shape) < 0.5, small, wide).astype(dtype)
        return small.astype(dtype)
    cont = rng.standard_normal(shape) * 10.0
    return np.where(rng.random(shape) < 0.3, small, cont).astype(dtype)


def magnitude(v):
    """Exact |v| as a Python number; NaN stays NaN."""
    return abs(int(v)) if isinstance(v, np.integer) else abs(float(v))


def rank_key(x, i):
    """Sort key: larger magnitude first, NaN after every number, then lower index."""
    m = magnitude(x[i])
    return (1, 0.0, i) if m != m else (0, -m, i)


def assert_same_pair(got, want):
    """assert_same on both halves of an (indices, values) result."""
    assert isinstance(got, tuple) and len(got) == 2
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])


def zero_tie_rule(ufunc):
    """``ufunc`` with the documented tie: max(+0, -0) = +0 and min(+0, -0) = -0 in either order."""
    if ufunc not in (np.maximum, np.minimum):
        return ufunc

    def op(a, b):
        out = np.asarray(ufunc(a, b))
        tie = (np.asarray(a) == 0) & (np.asarray(b) == 0)
        if out.dtype.kind == "f" and tie.any():
            negative = np.signbit(a) | np.signbit(b) if ufunc is np.minimum else \
                np.signbit(a) & np.signbit(b)
            out = np.where(tie, np.where(negative, -0.0, 0.0).astype(out.dtype), out)
        return out
    return op


def fold_reference(entries, ufunc, acc=None):
    """dict index -> left fold (in order) of its values, in numpy scalars/rows of dtype ``acc``."""
    out: dict[int, object] = {}
    op = zero_tie_rule(ufunc)
    with np.errstate(all="ignore"):
        for i, v in entries:
            v = np.asarray(v)
            v = v.astype(acc) if acc is not None else v
            out[i] = v if i not in out else op(out[i], v)
    return out


def reference_arrays(ref, idx_dtype, val_dtype, row_shape):
    keys = sorted(ref)
    idx = np.array(keys, dtype=idx_dtype)
    val = np.array([np.asarray(ref[i]).astype(val_dtype) for i in keys], dtype=val_dtype)
    return idx, val.reshape((len(keys),) + row_shape)


def random_coo(rng, n_entries, n, idx_dtype, val_dtype, width=None, kind="mixed"):
    idx = rng.integers(0, n, size=n_entries).astype(idx_dtype)
    shape = (n_entries,) if width is None else (n_entries, width)
    return idx, random_values(rng, val_dtype, shape, kind)


def sorted_part(rng, n_entries, n, idx_dtype, val_dtype, width=None, kind="mixed"):
    idx = np.unique(rng.integers(0, n, size=n_entries))
    shape = (idx.size,) if width is None else (idx.size, width)
    return idx.astype(idx_dtype), random_values(rng, val_dtype, shape, kind)


# ------------------------------------------------------------------------------------------
# count_abs_ge / select_abs_ge
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("n", [0, 1, 2, 37, 1000])
def test_count_select_match_reference(dtype, n):
    rng = np.random.default_rng([1, n, VALUE_DTYPES.index(dtype)])
    x = random_values(rng, dtype, (n,))
    if n and dtype.startswith("float"):
        x[rng.integers(0, n, size=max(1, n // 10))] = np.nan
        x[:1] = -np.inf
    ts = [0, -1.0, 0.5, 1, 2.0, 3, 2.9999, 7.3, -0.0, float("nan"), float("inf"), -float("inf")]
    if n:
        ts += [magnitude(v) for v in x[:5]]
    if dtype.startswith("int"):
        bits = np.dtype(dtype).itemsize * 8
        ts += [2 ** (bits - 1), 2 ** (bits - 1) - 1, 2 ** (bits - 1) + 1, 2.0 ** bits, np.uint64(5)]
    for t in ts:
        want = [i for i in range(n) if magnitude(x[i]) >= t]
        assert P.count_abs_ge(x, t) == len(want), t
        idx, val = P.select_abs_ge(x, t)
        assert idx.dtype == np.int32
        assert_same(idx, np.array(want, np.int32))
        assert_same(val, x[np.array(want, np.int64)] if want else np.empty(0, dtype))


def test_threshold_not_rounded_to_dtype():
    x = np.array([0.1, -0.1, 0.2], np.float16)  # float16(0.1) < 0.1
    assert P.count_abs_ge(x, 0.1) == 1
    assert P.count_abs_ge(x, float(np.float16(0.1))) == 3
    assert P.count_abs_ge(x, np.float64(0.1)) == 1
    assert P.count_abs_ge(np.array([3], np.int32), 2.5) == 1
    assert P.count_abs_ge(np.array([2], np.int32), 2.5) == 0
    # integers and fractions beyond float64's precision: compared exactly, never rounded down
    assert P.count_abs_ge(np.array([2.0**53, -2.0**53]), 2**53 + 1) == 0
    assert P.count_abs_ge(np.array([2.0**53]), np.int64(2**53 + 1)) == 0
    assert P.count_abs_ge(np.array([2.0**53]), 2**53) == 1
    assert P.count_abs_ge(np.array([2.0**63], np.float32), 2**63 + 1) == 0
    assert P.select_abs_ge(np.array([2.0**53, 2.0**54]), 2**53 + 1)[0].tolist() == [1]
    assert P.count_abs_ge(np.array([2**53 + 1], np.int64), Fraction(2**53 + 1, 1) + Fraction(
        1, 3)) == 0
    assert P.count_abs_ge(np.array([1 / 3, -1 / 3, 0.5]), Fraction(1, 3)) == 1  # 1/3 > float


def test_select_zero_d_threshold_and_all_equal():
    x = np.full(50, -2.0, np.float32)
    idx, val = P.select_abs_ge(x, np.array(2.0))
    assert_same(idx, np.arange(50, dtype=np.int32))
    assert_same(val, x)


# ------------------------------------------------------------------------------------------
# kth_abs / topk_abs
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("n,kind", [(1, "mixed"), (2, "small"), (31, "small"), (31, "mixed"),
                                    (500, "small"), (500, "mixed"), (4000, "mixed")])
def test_kth_topk_match_reference(dtype, n, kind):
    rng = np.random.default_rng([2, n, VALUE_DTYPES.index(dtype), kind == "small"])
    x = random_values(rng, dtype, (n,), kind)
    if dtype.startswith("float") and n > 2:
        x[rng.integers(0, n, size=n // 7 + 1)] = np.nan
    order = sorted(range(n), key=lambda i: rank_key(x, i))
    ks = sorted({1, n, max(1, n // 2), max(1, n // 3), int(rng.integers(1, n + 1))})
    for k in ks:
        kth = P.kth_abs(x, k)
        want_kth = magnitude(x[order[k - 1]])
        if np.dtype(dtype).kind == "f":
            assert kth.dtype == np.dtype(dtype)
            assert (math.isnan(want_kth) and np.isnan(kth)) or float(kth) == want_kth
        else:
            assert kth.dtype == np.dtype(f"u{np.dtype(dtype).itemsize}")
            assert int(kth) == want_kth
        idx, val = P.topk_abs(x, k)
        want = np.array(sorted(order[:k]), np.int32)
        assert_same(idx, want)
        assert_same(val, x[want])


def test_topk_ties_go_to_lower_indices_and_int_min():
    x = np.array([1, -2, 2, -2, 2, 0], np.float64)
    idx, val = P.topk_abs(x, 3)
    assert_same(idx, np.array([1, 2, 3], np.int32))
    assert_same(val, np.array([-2.0, 2.0, -2.0]))
    xi = np.array([5, np.iinfo(np.int64).min, -7], np.int64)
    assert P.kth_abs(xi, 1) == np.uint64(2**63)
    assert_same(P.topk_abs(xi, 1)[0], np.array([1], np.int32))


def test_topk_nan_ranks_below_numbers():
    x = np.array([np.nan, 0.0, np.nan, -0.0, 1.0], np.float32)
    assert_same(P.topk_abs(x, 3)[0], np.array([1, 3, 4], np.int32))
    assert_same(P.topk_abs(x, 4)[0], np.array([0, 1, 3, 4], np.int32))
    assert np.isnan(P.kth_abs(x, 4)) and P.kth_abs(x, 3) == 0.0
    assert np.isnan(P.kth_abs(np.full(3, np.nan, np.float16), 1))


def test_select_at_kth_contains_topk():
    rng = np.random.default_rng(3)
    x = random_values(rng, "float32", (3000,), "small")
    for k in (1, 17, 1500, 3000):
        top, _ = P.topk_abs(x, k)
        sel, _ = P.select_abs_ge(x, P.kth_abs(x, k))
        assert np.isin(top, sel).all() and sel.size >= k


# ------------------------------------------------------------------------------------------
# coo_reduce / merge_sorted
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("val_dtype", VALUE_DTYPES)
@pytest.mark.parametrize("idx_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fast", [False, True])
def test_coo_reduce_matches_fold_reference(val_dtype, idx_dtype, op, fast, monkeypatch):
    """Every size through numpy's sort, and with ``fast`` through numba wherever it runs (sums
    in numba's dtypes over a span of at most TABLE_PER_ENTRY slots an entry take its table;
    the 10 entries over 100,000 rows do not)."""
    if fast:
        monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    rng = np.random.default_rng([4, VALUE_DTYPES.index(val_dtype), INDEX_DTYPES.index(idx_dtype),
                                 OPS.index(op)])
    kind = "small" if op == "prod" else "mixed"
    for n_entries, n, width in [(0, 5, None), (1, 1, None), (200, 30, None), (300, 1000, None),
                                (150, 20, 3), (64, 1, None), (10, 100000, 2)]:
        idx, val = random_coo(rng, n_entries, n, idx_dtype, val_dtype, width, kind)
        got = P.coo_reduce(idx, val, op, n=n)
        want = reference_arrays(fold_reference(zip(idx.tolist(), val), UFUNC[op]),
                                idx_dtype, val_dtype, val.shape[1:])
        assert_same(got[0], want[0])
        assert_same(got[1], want[1])
        assert_same(P.coo_reduce(idx, val, ReduceOp(op))[1], want[1])


def test_coo_reduce_accumulate_dtype_casts_once():
    idx = np.zeros(4096, np.int64)
    val = np.full(4096, 1.0, np.float16)  # float16 sum stalls at 2048
    assert P.coo_reduce(idx, val)[1][0] == np.float16(2048)
    got = P.coo_reduce(idx, val, accumulate_dtype=np.float32)[1]
    assert_same(got, np.array([4096.0], np.float16))
    rows = np.ones((4096, 2), np.float16)
    assert_same(P.coo_reduce(idx, rows, "sum", accumulate_dtype="float32")[1],
                np.full((1, 2), 4096.0, np.float16))


def test_coo_reduce_keeps_negative_zero_and_nan():
    idx = np.array([3, 3, 1, 2, 2], np.int32)
    val = np.array([-0.0, -0.0, -0.0, np.nan, 1.0])
    for op in OPS:
        got = P.coo_reduce(idx, val, op)[1]
        assert np.signbit(got[0]) and np.isnan(got[1]), op


def test_coo_reduce_sparse_indices_past_2_pow_40():
    rng = np.random.default_rng(5)
    base = 2**40
    idx = (base + rng.integers(0, 50, size=400) * 2**20).astype(np.int64)
    val = random_values(rng, "float64", (400,))
    got = P.coo_reduce(idx, val, "sum", n=base + 2**27)
    want = reference_arrays(fold_reference(zip(idx.tolist(), val), np.add), "int64", "float64", ())
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])


@pytest.mark.parametrize("val_dtype", VALUE_DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_merge_sorted_matches_fold_and_coo_reduce(val_dtype, op):
    rng = np.random.default_rng([6, VALUE_DTYPES.index(val_dtype), OPS.index(op)])
    for n_parts, n, width, idx_dtypes in [(1, 50, None, ["int32"]), (2, 40, None, ["int32"] * 2),
                                          (4, 300, None, ["int64", "int32", "int64", "int64"]),
                                          (8, 64, 2, ["int32"] * 8), (3, 1, None, ["int64"] * 3)]:
        kind = "small" if op == "prod" else "mixed"
        parts = [sorted_part(rng, int(rng.integers(0, n + 1)), n, d, val_dtype, width, kind)
                 for d in idx_dtypes]
        itype = np.result_type(*idx_dtypes)
        got = P.merge_sorted(parts, op)
        entries = [(i, v) for pi, pv in parts for i, v in zip(pi.tolist(), pv)]
        want = reference_arrays(fold_reference(entries, UFUNC[op]), itype, val_dtype,
                                parts[0][1].shape[1:])
        assert_same(got[0], want[0])
        assert_same(got[1], want[1])
        cat = P.coo_reduce(np.concatenate([pi.astype(itype) for pi, _ in parts]),
                           np.concatenate([pv for _, pv in parts]), op)
        assert_same(got[1], cat[1])


def test_merge_sorted_part_order_defines_the_bits():
    a = (np.array([7], np.int64), np.array([1e16]))
    b = (np.array([7], np.int64), np.array([-1e16]))
    c = (np.array([7], np.int64), np.array([1.0]))
    assert P.merge_sorted([a, b, c])[1][0] == 1.0
    assert P.merge_sorted([a, c, b])[1][0] == 0.0  # (1e16 + 1) - 1e16 rounds away the 1
    parts = [sorted_part(np.random.default_rng(s), 2000, 3000, "int32", "float32")
             for s in range(4)]
    parts = [(i, v + np.float32(0.1) * s) for s, (i, v) in enumerate(parts)]
    first = P.merge_sorted(parts)
    again = P.merge_sorted([(i.copy(), v.copy()) for i, v in parts])
    assert first[1].tobytes() == again[1].tobytes()


def test_merge_sorted_accumulate_and_huge_indices():
    base = 2**40 + 12345
    parts = [(np.array([base, base + 2**35], np.int64), np.full(2, 1.0, np.float16))
             for _ in range(3000)]
    got = P.merge_sorted(parts, "sum", accumulate_dtype=np.float32)
    assert_same(got[0], np.array([base, base + 2**35], np.int64))
    assert_same(got[1], np.full(2, 3000.0, np.float16))
    assert P.merge_sorted(parts[:3])[0].dtype == np.int64


def test_merge_sorted_empty_parts_and_rows():
    e = (np.empty(0, np.int32), np.empty((0, 4), np.float32))
    got = P.merge_sorted([e, e])
    assert got[0].shape == (0,) and got[0].dtype == np.int32 and got[1].shape == (0, 4)
    r = (np.array([2, 5], np.int32), np.arange(8, dtype=np.float32).reshape(2, 4))
    got = P.merge_sorted([e, r, r], "max")
    assert_same(got[1], r[1])


# ------------------------------------------------------------------------------------------
# scatter_reduce / gather / densify
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("val_dtype", VALUE_DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("width", [None, 3])
def test_scatter_reduce_matches_loop(val_dtype, op, width):
    rng = np.random.default_rng([7, VALUE_DTYPES.index(val_dtype), OPS.index(op), width or 0])
    kind = "small" if op == "prod" else "mixed"
    for n, n_entries, idx_dtype, unique in [(1, 5, "int32", False), (40, 0, "int64", False),
                                            (40, 120, "int64", False), (500, 100, "int32", True)]:
        shape = (n,) if width is None else (n, width)
        dense = random_values(rng, val_dtype, shape, kind)
        if unique:
            idx = np.sort(rng.choice(n, size=n_entries, replace=False)).astype(idx_dtype)
        else:
            idx = rng.integers(0, n, size=n_entries).astype(idx_dtype)
        val = random_values(rng, val_dtype, (n_entries,) + shape[1:], kind)
        want = dense.copy()
        with np.errstate(all="ignore"):
            for i, v in zip(idx.tolist(), val):
                want[i] = UFUNC[op](want[i], v)
        got = P.scatter_reduce(dense, idx, val, op)
        assert got is dense
        assert_same(got, want)
        assert_same(P.gather(dense, idx), np.array([dense[i] for i in idx.tolist()],
                                                    val_dtype).reshape((n_entries,) + shape[1:]))


@pytest.mark.parametrize("val_dtype", VALUE_DTYPES)
def test_densify_matches_loop(val_dtype):
    rng = np.random.default_rng([8, VALUE_DTYPES.index(val_dtype)])
    for n, n_entries, width in [(0, 0, None), (1, 3, None), (50, 20, None), (50, 80, 2)]:
        idx, val = random_coo(rng, n_entries, max(n, 1), "int64", val_dtype, width)
        want = np.zeros((n,) + val.shape[1:], val_dtype)
        for i, v in fold_reference(zip(idx.tolist(), val), np.add).items():
            want[i] = v
        assert_same(P.densify(idx, val, n), want)
    idx = np.array([1, 4], np.int32)
    assert_same(P.densify(idx, np.array([-0.0, 2.0]), 5), np.array([0.0, -0.0, 0, 0, 2.0]))


# ------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------

def raises(exc, argument, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert info.value.argument == argument, (info.value.argument, argument)


def test_errors_thresholds_and_topk():
    x = np.ones(5, np.float32)
    raises(InvalidType, "x", P.count_abs_ge, [1.0, 2.0], 1.0)
    raises(InvalidType, "x", P.select_abs_ge, np.ones(3, np.uint8), 1)
    raises(InvalidType, "x", P.kth_abs, np.ones(3, np.complex64), 1)
    raises(InvalidArgument, "x", P.select_abs_ge, np.ones((2, 2), np.float32), 1)
    raises(InvalidType, "t", P.count_abs_ge, x, "1")
    raises(InvalidType, "t", P.select_abs_ge, x, None)
    for fn in (P.kth_abs, P.topk_abs):
        raises(InvalidArgument, "k", fn, x, 0)
        raises(InvalidArgument, "k", fn, x, -1)
        raises(InvalidArgument, "k", fn, x, 6)
        raises(InvalidArgument, "k", fn, np.empty(0, np.float32), 1)
        raises(InvalidType, "k", fn, x, 2.0)
        raises(InvalidType, "k", fn, x, True)


def test_errors_coo_reduce_and_merge_sorted():
    i, v = np.array([0, 3], np.int64), np.ones(2, np.float32)
    raises(InvalidArgument, "values", P.coo_reduce, i, np.ones(3, np.float32))
    raises(InvalidArgument, "indices", P.coo_reduce, np.array([0, -1]), v)
    raises(InvalidArgument, "indices", P.coo_reduce, i, v, "sum", 3)
    raises(InvalidType, "indices", P.coo_reduce, i.astype(np.uint32), v)
    raises(InvalidType, "indices", P.coo_reduce, i.astype(np.float64), v)
    raises(InvalidArgument, "indices", P.coo_reduce, i.reshape(2, 1), v)
    raises(InvalidType, "values", P.coo_reduce, i, v.astype(np.int8))
    raises(InvalidType, "values", P.coo_reduce, i, [1.0, 2.0])
    raises(InvalidArgument, "values", P.coo_reduce, i, np.ones((2, 1, 1), np.float32))
    raises(InvalidArgument, "op", P.coo_reduce, i, v, "avg")
    raises(InvalidArgument, "op", P.coo_reduce, i, v, "bogus")
    raises(InvalidType, "op", P.coo_reduce, i, v, 3)
    raises(InvalidType, "n", P.coo_reduce, i, v, "sum", 4.0)
    raises(InvalidArgument, "n", P.coo_reduce, i, v, "sum", -1)
    raises(InvalidType, "accumulate_dtype", P.coo_reduce, i, v, "sum", None, np.int8)
    raises(InvalidType, "accumulate_dtype", P.coo_reduce, i, v, "sum", None, "nonsense")
    raises(InvalidArgument, "parts", P.merge_sorted, [])
    raises(InvalidType, "parts[0]", P.merge_sorted, (i, v))
    raises(InvalidType, "parts[1]", P.merge_sorted, [(i, v), i])
    raises(InvalidArgument, "parts[1].indices", P.merge_sorted, [(i, v), (i[::-1], v)])
    raises(InvalidArgument, "parts[0].indices", P.merge_sorted, [(np.array([1, 1]), v)])
    raises(InvalidArgument, "parts[0].indices", P.merge_sorted, [(np.array([-1, 1]), v)])
    raises(InvalidArgument, "parts[1].values", P.merge_sorted, [(i, v), (i, v[:1])])
    raises(InvalidType, "parts[1].values", P.merge_sorted, [(i, v), (i, v.astype(np.float64))])
    raises(InvalidArgument, "parts[1].values", P.merge_sorted,
           [(i, v), (i, np.ones((2, 2), np.float32))])
    raises(InvalidArgument, "op", P.merge_sorted, [(i, v)], "avg")


def test_errors_dense_side():
    d = np.zeros(4, np.float32)
    i, v = np.array([0, 3], np.int32), np.ones(2, np.float32)
    raises(InvalidArgument, "indices", P.scatter_reduce, d, np.array([4]), v[:1])
    raises(InvalidArgument, "indices", P.scatter_reduce, d, np.array([-1]), v[:1])
    raises(InvalidArgument, "values", P.scatter_reduce, d, i, v[:1])
    raises(InvalidType, "values", P.scatter_reduce, d, i, v.astype(np.float64))
    raises(InvalidArgument, "values", P.scatter_reduce, np.zeros((4, 2), np.float32), i, v)
    raises(InvalidType, "dense", P.scatter_reduce, d.tolist(), i, v)
    raises(InvalidType, "dense", P.scatter_reduce, d.astype(np.uint16), i, v)
    raises(InvalidArgument, "op", P.scatter_reduce, d, i, v, "avg")
    raises(InvalidArgument, "indices", P.gather, d, np.array([4]))
    raises(InvalidArgument, "indices", P.gather, d, np.array([-4]))
    raises(InvalidType, "indices", P.gather, d, [0])
    raises(InvalidArgument, "indices", P.densify, i, v, 3)
    raises(InvalidArgument, "values", P.densify, i, v[:1], 4)
    raises(InvalidType, "n", P.densify, i, v, None)
    raises(InvalidArgument, "n", P.densify, i, v, -1)
    raises(InvalidType, "values", P.densify, i, v.astype(bool), 4)


def test_errors_are_value_and_type_errors():
    with pytest.raises(ValueError):
        P.topk_abs(np.ones(2), 3)
    with pytest.raises(TypeError):
        P.gather(np.ones(2), np.array([0.0]))


# ------------------------------------------------------------------------------------------
# dispatch
# ------------------------------------------------------------------------------------------

def test_cupy_inputs_route_to_cupy_twin(monkeypatch):
    calls = []

    def twin(name):
        return lambda *a, **kw: calls.append((name, a, kw)) or name

    fake = types.ModuleType("cupycoll.primitives._cupy")
    for name in ("count_abs_ge", "select_abs_ge", "kth_abs", "topk_abs", "coo_reduce",
                 "merge_sorted", "scatter_reduce", "gather", "densify"):
        setattr(fake, name, twin(name))
    monkeypatch.setitem(sys.modules, "cupycoll.primitives._cupy", fake)
    monkeypatch.setattr(P, "_cupy", fake, raising=False)
    Fake = type("ndarray", (), {"__module__": "cupy._core.core"})
    a = Fake()
    assert P.count_abs_ge(a, 1.0) == "count_abs_ge"
    assert P.topk_abs(x=a, k=3) == "topk_abs"
    assert P.merge_sorted([(a, a)], op="max") == "merge_sorted"
    assert P.scatter_reduce(a, a, a, "sum") == "scatter_reduce"
    assert calls[1] == ("topk_abs", (), {"x": a, "k": 3})
    assert calls[2][2] == {"op": "max"}


def test_numpy_use_never_imports_cupy():
    code = ("import sys, numpy as np; from cupycoll import primitives as P; "
            "x = np.arange(10.0); P.topk_abs(x, 3); P.merge_sorted([(np.arange(3), x[:3])]); "
            "P.densify(np.arange(3), x[:3], 5); assert 'cupy' not in sys.modules, 'cupy imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_module_has_all_names():
    for name in ("count_abs_ge", "select_abs_ge", "kth_abs", "topk_abs", "coo_reduce",
                 "merge_sorted", "scatter_reduce", "gather", "densify"):
        assert callable(getattr(P, name)) and name in P.__all__


# ------------------------------------------------------------------------------------------
# large inputs: blocked scans, sampled top-k threshold and its fallback, wide sort keys
# ------------------------------------------------------------------------------------------

def python_topk(x, k):
    order = sorted(range(x.size), key=lambda i: rank_key(x, i))
    return np.array(sorted(order[:k]), np.int32), magnitude(x[order[k - 1]])


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
def test_large_arrays_select_and_topk(dtype):
    rng = np.random.default_rng([9, VALUE_DTYPES.index(dtype)])
    n = (1 << 16) + 4099  # more than one scan block, with a partial last block
    x = random_values(rng, dtype, (n,), "mixed")
    if dtype.startswith("float"):
        x[rng.integers(0, n, size=500)] = np.nan
    mags = [magnitude(v) for v in x]
    for t in (0.5, magnitude(x[7]), 1e3):
        want = np.array([i for i in range(n) if mags[i] >= t], np.int32)
        assert P.count_abs_ge(x, t) == want.size
        assert_same(P.select_abs_ge(x, t)[0], want)
    order = sorted(range(n), key=lambda i: rank_key(x, i))
    for k in (1, 100, n // 5, n // 3, n):  # n // 5 uses the sample, n // 3 the full partition
        want, kth = np.array(sorted(order[:k]), np.int32), magnitude(x[order[k - 1]])
        idx, val = P.topk_abs(x, k)
        assert_same(idx, want)
        assert_same(val, x[want])
        got = P.kth_abs(x, k)
        assert (np.isnan(got) and kth != kth) or got == kth


def test_sampled_threshold_fallback_and_ties(monkeypatch):
    rng = np.random.default_rng(10)
    n = 1 << 17
    x = rng.standard_normal(n).astype(np.float32)
    want, kth = python_topk(x, 300)
    for fake in (lambda x, k: np.float32(np.inf), lambda x, k: None):  # unlucky sample
        monkeypatch.setattr(_numpy_select, "_sample_threshold", fake)
        assert_same(P.topk_abs(x, 300)[0], want)
        assert P.kth_abs(x, 300) == kth
    monkeypatch.undo()
    same = np.where(rng.random(n) < 0.5, -1.5, 1.5).astype(np.float16)
    assert_same(P.topk_abs(same, 1000)[0], np.arange(1000, dtype=np.int32))
    assert P.kth_abs(same, 1000) == np.float16(1.5)


def test_wide_keys_fall_back_to_stable_argsort():
    rng = np.random.default_rng(11)
    top = 2**63 - 1
    idx = np.where(rng.random(300) < 0.5, rng.integers(0, 40, size=300),
                   top - rng.integers(0, 40, size=300)).astype(np.int64)
    val = random_values(rng, "float32", (300,))
    got = P.coo_reduce(idx, val)
    want = reference_arrays(fold_reference(zip(idx.tolist(), val), np.add), "int64", "float32", ())
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])
    parts = [(np.unique(idx[s::3]), random_values(rng, "float64", (np.unique(idx[s::3]).size,)))
             for s in range(3)]
    entries = [(i, v) for pi, pv in parts for i, v in zip(pi.tolist(), pv)]
    want = reference_arrays(fold_reference(entries, np.add), "int64", "float64", ())
    got = P.merge_sorted(parts)
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_signed_zero_ties_do_not_depend_on_order(op, dtype, fast, monkeypatch):
    """+0 and -0 of one index in every order: max gives +0, min -0, unless all zeros share a
    sign; NaN still wins. numpy, numba (fast) and every reduction agree, 1-D and rows."""
    if fast:
        monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    rng = np.random.default_rng(12)
    ufunc = {"max": np.maximum, "min": np.minimum}[op]
    for width in (None, 3):
        idx, val = random_coo(rng, 400, 30, "int64", dtype, width)
        val = np.where(rng.random(val.shape) < 0.8, rng.choice([0.0, -0.0], val.shape),
                       np.where(rng.random(val.shape) < 0.5, -1.0, np.nan)).astype(dtype)
        want = reference_arrays(fold_reference(zip(idx.tolist(), val), ufunc), "int64", dtype,
                                val.shape[1:])
        assert_same_pair(P.coo_reduce(idx, val, op), want)
        parts = [(np.unique(idx[s::2], return_index=True)) for s in (0, 1)]
        parts = [(u, val[s::2][first]) for s, (u, first) in enumerate(parts)]
        entries = [(i, v) for pi, pv in parts for i, v in zip(pi.tolist(), pv)]
        want = reference_arrays(fold_reference(entries, ufunc), "int64", dtype, val.shape[1:])
        assert_same_pair(P.merge_sorted(parts, op), want)
        dense = np.where(rng.random((30,) + val.shape[1:]) < 0.5, 0.0, -0.0).astype(dtype)
        entries = list(enumerate(dense)) + list(zip(idx.tolist(), val))
        want = reference_arrays(fold_reference(entries, ufunc), "int64", dtype, val.shape[1:])
        assert_same(P.scatter_reduce(dense, idx, val, op), want[1])
    a = np.array([0.0, -0.0, -0.0, 0.0, np.nan], dtype)
    b = np.array([-0.0, 0.0, -0.0, 0.0, 0.0], dtype)
    for x, y in ((a, b), (b, a)):
        want = [0.0, 0.0, -0.0, 0.0] if op == "max" else [-0.0, -0.0, -0.0, 0.0]
        got = P.combine(x, y, op)
        assert np.isnan(got[4]) and got[:4].tolist() == want
        assert np.signbit(got[:4]).tolist() == np.signbit(np.array(want)).tolist()


@pytest.mark.parametrize("size", [8, 1000])
@pytest.mark.parametrize("bits", [31, 32, 33, 62, 63, 64])
def test_sort_key_width_edges(bits, size):
    """Keys ``(index - lo) << shift | position`` of exactly ``bits`` bits: int32 up to 31 bits,
    int64 up to 63, a stable argsort beyond; each must sort and fold like the reference."""
    rng = np.random.default_rng(bits * size)
    shift = (size - 1).bit_length()
    lo, span = 5, (1 << (bits - shift)) - 1  # (hi - lo).bit_length() + shift == bits
    offsets = np.concatenate([[0, span, span, span - 1], rng.integers(0, span, size - 4)])
    idx = (lo + rng.permutation(offsets)).astype(np.int64)
    val = random_values(rng, "float64", (size,))
    want = reference_arrays(fold_reference(zip(idx.tolist(), val), np.add), "int64", "float64", ())
    assert_same_pair(P.coo_reduce(idx, val), want)
    halves = [np.unique(idx[s::2]) for s in (0, 1)]
    parts = [(h, rng.standard_normal(h.size)) for h in halves]
    entries = [(i, v) for pi, pv in parts for i, v in zip(pi.tolist(), pv)]
    assert_same_pair(P.merge_sorted(parts), reference_arrays(fold_reference(entries, np.add), "int64",
                                                        "float64", ()))


@pytest.mark.parametrize("idx_dtype,base",
                         [("int32", 2**31 - 2**22), ("int64", 2**40), ("int32", 0)])
def test_blocked_merge_and_coo_reduce_large(idx_dtype, base):
    """Many merge blocks (skewed parts, int32 indices near 2**31) and a large coo_reduce."""
    rng = np.random.default_rng([13, base % 1000])
    span = 2**22 - 1
    parts = [sorted_part(rng, 30000, span, "int64", "float32") for _ in range(3)]
    parts.append(sorted_part(rng, 9000, 5000, "int64", "float32"))  # skewed: all in a corner
    parts.append(sorted_part(rng, 20000, 60000, "int64", "float32", width=None, kind="small"))
    parts = [((i + base).astype(idx_dtype), v) for i, v in parts]
    entries = [(i, v) for pi, pv in parts for i, v in zip(pi.tolist(), pv)]
    want = reference_arrays(fold_reference(entries, np.add), idx_dtype, "float32", ())
    got = P.merge_sorted(parts)
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])
    cat_i = np.concatenate([i for i, _ in parts])
    cat_v = np.concatenate([v for _, v in parts])
    perm = rng.permutation(cat_i.size)
    got = P.coo_reduce(cat_i[perm], cat_v[perm], "max")
    want = reference_arrays(fold_reference(zip(cat_i[perm].tolist(), cat_v[perm]), np.maximum),
                            idx_dtype, "float32", ())
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])


def test_merge_sorted_identical_parts_rows():
    rng = np.random.default_rng(14)
    i, v = sorted_part(rng, 50000, 10**6, "int32", "float64", width=2)
    got = P.merge_sorted([(i, v)] * 8, "prod")
    assert_same(got[0], i)
    want = v.copy()
    for _ in range(7):
        want = want * v
    assert_same(got[1], want)


def test_merge_sorted_many_parts():
    rng = np.random.default_rng(12)
    parts = [sorted_part(rng, 20, 500, "int32", "float32") for _ in range(300)]
    entries = [(i, v) for pi, pv in parts for i, v in zip(pi.tolist(), pv)]
    want = reference_arrays(fold_reference(entries, np.add), "int32", "float32", ())
    got = P.merge_sorted(parts)
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])


def test_threshold_beyond_float_range_is_uniform():
    """A Python int threshold too large for float64 selects nothing; a hugely negative one, all."""
    from cupycoll.primitives import count_abs_ge as count

    x = np.array([1.0, -np.inf, np.nan], np.float32)
    assert count(x, 2 ** 2000) == 1  # only |-inf| >= the huge threshold; NaN never counts
    assert count(x, -(2 ** 2000)) == 2


@pytest.mark.parametrize("dtype", ["float16", "float32", "int32"])
@pytest.mark.parametrize("nonzeros, k", [(50, 40), (50, 400), (0, 10), (500, 100)])
def test_topk_of_a_mostly_zero_vector_against_a_sorted_reference(dtype, nonzeros, k):
    """A vector of 2**20 entries, nearly all zero (an embedding-like gradient): the exact
    top-k (ties to the lower indices, zeros and -0 tied, NaN below every number) equals a
    full sort's, whether k is below or above the count of nonzeros; its candidates are the
    nonzeros and the first zeros, never the whole vector (the sampled threshold is 0 there)."""
    rng = np.random.default_rng(k + nonzeros)
    n = 1 << 20
    x = np.zeros(n, dtype)
    where = rng.choice(n, nonzeros, replace=False)
    x[where] = rng.integers(1, 100, nonzeros) * rng.choice([-1, 1], nonzeros)
    if dtype != "int32":
        x[rng.choice(n, 3)] = -0.0
        x[n - 1] = np.nan
    magnitude = np.abs(x.astype(np.float64))
    magnitude[np.isnan(magnitude)] = -1.0
    want = np.sort(np.lexsort((np.arange(n), -magnitude))[:k])
    idx, val = P.topk_abs(x, k)
    assert np.array_equal(idx, want) and np.array_equal(val, x[want], equal_nan=True)
    assert float(P.kth_abs(x, k)) == float(np.abs(x[want]).min())
    kth, candidates, _ = _numpy_select._kth_candidates(x, k)
    assert candidates is not None and candidates.size <= max(nonzeros, k)


def test_scatter_reduce_refuses_a_read_only_dense_and_leaves_it_as_it_was():
    """numpy's ufunc.at writes read-only arrays (a read-only memory map: a crash): refused."""
    dense = np.zeros(4, np.float32)
    dense.flags.writeable = False
    with pytest.raises(InvalidArgument, match="'dense'.*must be writable"):
        P.scatter_reduce(dense, np.array([1]), np.array([5.0], np.float32))
    assert not dense.any()


def test_select_abs_ge_of_every_element_returns_copies():
    """t <= 0 on integers selects every element: the values are copies, as documented."""
    x = np.array([1, -3, 0, 7])
    _, got = P.select_abs_ge(x, 0)
    got[0] = 99
    assert x.tolist() == [1, -3, 0, 7]


@pytest.mark.parametrize("dtype, t, want", [
    ("float64", np.longdouble(1) + np.longdouble(2) ** -60, 1),  # not rounded to 1.0
    ("int64", np.longdouble(2**62) + np.longdouble(0.5), 1),
    ("int64", Fraction(10**400, 3), 0), ("int32", -Fraction(10**400, 3), 3),
    ("float16", 65504.5, 0), ("float32", float(np.finfo(np.float32).max) * 1.5, 0)])
def test_thresholds_of_any_precision_and_range_are_compared_exactly(dtype, t, want):
    """A long double, a Fraction beyond float64's range, a threshold just past the dtype's
    largest value: exact counts, no OverflowError, nothing raised under errstate(raise)."""
    if np.finfo(np.longdouble).nmant <= 52 and isinstance(t, np.longdouble):
        want = {"float64": 3, "int64": 2}[dtype]  # a long double that is a double: rounded
    x = {"float64": np.array([1.0, -1.0, 2.0]), "int64": np.array([2**62 + 1, 2**62, 1]),
         "int32": np.array([1, -3, 0], np.int32), "float16": np.array([1, 2, 3], np.float16),
         "float32": np.array([1, 2, 3], np.float32)}[dtype]
    with np.errstate(all="raise"):
        assert P.count_abs_ge(x, t) == want


def test_combine_names_a_bad_operand():
    """A list or a mismatched shape is named; a 0-d array (a CuPy reduction's result) is a
    scalar."""
    assert P.combine(np.array([1.0, -0.0, 3.0]), np.array(0.0), "max").tolist() == [1, 0, 3]
    with pytest.raises(InvalidType, match="'a'"):
        P.combine([1, 2], [3, 4], "sum")
    with pytest.raises(InvalidArgument, match="'b'"):
        P.combine(np.ones(3), np.ones(2), "sum")
