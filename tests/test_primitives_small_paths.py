"""Small, fast tests of paths of the numpy primitives that the regular suite reaches only with
large arrays (the blocked numpy merge, the sampled top-k threshold): thresholds lowered by
monkeypatch, results compared with the Python fold references of tests/test_primitives.py.
Written for mutation testing (tests/mutation/run.py), whose primitives selection drops the
large-array tests."""

from __future__ import annotations

import numpy as np
import pytest

from cupycoll import primitives as P
from cupycoll.primitives import _common

from .test_primitives import assert_same_pair, fold_reference, reference_arrays, sorted_part


@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("width", [None, 2])
def test_numpy_merge_in_many_small_blocks(monkeypatch, op, width):
    """The numpy merge (numba off) cut into blocks of ~64 entries: skewed, empty and one-entry
    parts, int32 and int64 indices; equal to the left fold of the parts in part order."""
    monkeypatch.setenv("CUPYCOLL_NUMBA", "off")
    monkeypatch.setattr(_common, "_MERGE_BLOCK", 64)
    rng = np.random.default_rng([21, width or 0, op == "max"])
    ufunc = {"sum": np.add, "max": np.maximum}[op]
    for itype in ("int32", "int64"):
        parts = [sorted_part(rng, 300, 2000, itype, "float32", width) for _ in range(3)]
        parts.append(sorted_part(rng, 80, 40, itype, "float32", width))  # all in a corner
        parts.append((np.zeros(0, itype), np.zeros((0,) + ((width,) if width else ()),
                                                    np.float32)))
        parts.append((np.array([1999], itype), np.ones((1,) + ((width,) if width else ()),
                                                       np.float32)))
        entries = [(i, v) for pi, pv in parts for i, v in zip(pi.tolist(), pv)]
        want = reference_arrays(fold_reference(entries, ufunc), itype, "float32",
                                () if width is None else (width,))
        assert_same_pair(P.merge_sorted(parts, op), want)


@pytest.mark.parametrize("itype", ["int32", "int64"])
def test_numba_merge_dtypes_and_fallbacks(monkeypatch, itype):
    """The numba merge (threshold lowered to 0) on int and float values, with and without an
    accumulation dtype, and its fallbacks to numpy (float16 accumulation, keys beyond 62 bits):
    equal to the left fold in the accumulation dtype, cast back once."""
    from cupycoll.primitives import _accel

    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setattr(_common, "_MERGE_BLOCK", 128)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    rng = np.random.default_rng([22, itype == "int64"])
    big = 2**62 if itype == "int64" else 2**31 - 5000
    for vtype, acc, base in (("int32", None, 0), ("int32", "int64", 0), ("float16", None, 0),
                             ("float16", "float32", 0), ("float64", None, big),
                             ("float32", "float64", 0)):
        parts = [sorted_part(rng, 400, 3000, "int64", vtype, kind="small") for _ in range(3)]
        parts = [((i + base).astype(itype), v) for i, v in parts]
        for op, ufunc in (("sum", np.add), ("prod", np.multiply), ("min", np.minimum)):
            entries = [(i, v) for pi, pv in parts for i, v in zip(pi.tolist(), pv)]
            want = reference_arrays(fold_reference(entries, ufunc, acc), itype, vtype, ())
            assert_same_pair(P.merge_sorted(parts, op, acc), want)


def test_gather_names_dense_in_its_errors():
    from cupycoll.errors import InvalidArgument, InvalidType

    idx = np.array([0], np.int32)
    with pytest.raises(InvalidType, match="'dense'") as info:
        P.gather(np.ones(3, np.uint8), idx)
    assert info.value.argument == "dense"
    with pytest.raises(InvalidArgument, match="'dense'"):
        P.gather(np.ones((1, 1, 1), np.float32), idx)


def test_combine_runs_in_the_namespace_of_its_operands():
    """combine computes with the operands' own namespace (cupy on a GPU): here a recording
    wrapper of numpy named by ``__cupycoll_namespace__``; the result is still the ±0 rule."""
    import types

    calls = []

    def recorded(name):
        def call(*args, **kwargs):
            calls.append(name)
            return getattr(np, name)(*args, **kwargs)
        return call

    ns = types.SimpleNamespace(**{n: recorded(n) for n in ("add", "maximum", "minimum", "where")})
    Dev = type("Dev", (np.ndarray,), {"__cupycoll_namespace__": ns})
    a = np.array([0.0, -0.0, 1.0]).view(Dev)
    b = np.array([-0.0, 0.0, 2.0]).view(Dev)
    got = np.asarray(P.combine(a, b, "max"))
    assert calls == ["maximum", "where"]
    assert got.tolist() == [0.0, 0.0, 2.0] and not np.signbit(got).any()


@pytest.mark.parametrize("fast", [False, True])
def test_reductions_overflow_and_inf_minus_inf_without_warnings(monkeypatch, fast):
    """Overflow to inf and inf - inf = NaN are results, as in any float reduction: no primitive
    warns (numpy would, outside their errstate); the values are numpy's."""
    import warnings

    from cupycoll.primitives import _accel

    if fast:
        monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    big = np.array([6e4, np.inf, 3.0], np.float16)
    other = np.array([6e4, -np.inf, 0.0], np.float16)
    idx = np.array([0, 1, 2], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.asarray(P.combine(big, other, "sum")).tolist()[0] == np.inf
        assert np.isnan(P.combine(big, other, "sum")[1])
        for acc in (None, "float32"):
            i, v = P.coo_reduce(np.concatenate([idx, idx]), np.concatenate([big, other]),
                                "sum", accumulate_dtype=acc)
            assert v[0] == np.inf and np.isnan(v[1]) and v[2] == 3.0
            i, v = P.merge_sorted([(idx, big), (idx, other)], "sum", acc)
            assert v[0] == np.inf and np.isnan(v[1]) and v[2] == 3.0
        dense = big.copy()
        P.scatter_reduce(dense, idx, other, "sum")
        assert dense[0] == np.inf and np.isnan(dense[1])
        d = P.densify(np.concatenate([idx, idx]), np.concatenate([big, other]), 3)
        assert d[0] == np.inf and np.isnan(d[1])
        # int32 sums beyond int32 in a float64 accumulator: the cast back is numpy's (invalid)
        top = np.full(3, 2**31 - 1, np.int32)
        with np.errstate(invalid="ignore"):
            want = (top.astype(np.float64) * 2).astype(np.int32)
        for fn in (lambda: P.merge_sorted([(idx, top), (idx, top)], "sum", "float64"),
                   lambda: P.coo_reduce(np.concatenate([idx, idx]), np.concatenate([top, top]),
                                        "sum", accumulate_dtype="float64")):
            i, v = fn()
            assert v.dtype == np.int32 and v.tolist() == want.tolist()
        top = np.full(3, 2**63 - 1, np.int64)  # one part: cast to float64 and back once
        with np.errstate(invalid="ignore"):
            want = top.astype(np.float64).astype(np.int64)
        assert P.merge_sorted([(idx, top)], "sum", "float64")[1].tolist() == want.tolist()


def test_numba_merge_of_2_to_the_j_plus_1_entries(monkeypatch):
    """The numba merge packs keys as ``index << shift | position``, positions up to total - 1:
    totals of 2^j + 1 entries (the last position needs the top bit of the shift) and their
    neighbours merge to the left fold, every index once."""
    from cupycoll.primitives import _accel

    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    rng = np.random.default_rng(23)
    for total in (2, 3, 4, 5, 9, 16, 17, 33, 65, 129):
        cut = int(rng.integers(0, total + 1))
        parts = [(np.sort(rng.choice(300, size, replace=False)).astype(np.int64),
                  rng.integers(1, 100, size).astype(np.float64)) for size in (cut, total - cut)]
        entries = [(i, v) for pi, pv in parts for i, v in zip(pi.tolist(), pv)]
        want = reference_arrays(fold_reference(entries, np.add, None), "int64", "float64", ())
        assert_same_pair(P.merge_sorted(parts, "sum"), want)


def test_pool_threads_are_named_cupycoll():
    """The numba loops' helper threads carry the library's name (visible in profilers)."""
    import threading

    from cupycoll.primitives import _numba

    names = _numba._in_threads([lambda: threading.current_thread().name] * 2)
    assert names[1].startswith("cupycoll_"), names


def test_indices_of_a_wrong_dtype_name_the_expected_dtypes():
    from cupycoll.errors import InvalidType

    with pytest.raises(InvalidType, match="must be an array of int32 or int64, got"):
        P.coo_reduce(np.array([0, 1], np.float32), np.ones(2, np.float32), "sum")


def test_primitives_reject_lists_naming_what_they_take():
    """A list where an array belongs: InvalidType naming the argument and 'a numpy or cupy
    array' (the documented message), for values and indices alike."""
    from cupycoll.errors import InvalidType
    with pytest.raises(InvalidType, match="must be a numpy or cupy array, got 'list'") as info:
        P.gather([1.0, 2.0], np.array([0]))
    assert info.value.argument == "dense"
    with pytest.raises(InvalidType, match="must be a numpy or cupy array") as info:
        P.gather(np.ones(3, np.float32), [0, 1])
    assert info.value.argument == "indices"


#: (LOOP_SUM, TINY, SMALL) that send a few-entry sum down each path: numba's pass (numpy's
#: sums without numba), the Python fold, the one stable sort, the general path.
PATHS = [(1024, 64, 4096), (0, 64, 4096), (0, 0, 4096), (0, 0, 0)]


@pytest.mark.parametrize("loop, tiny, small", PATHS)
@pytest.mark.parametrize("dtype,acc", [("float32", None), ("float16", None),
                                       ("float16", "float32"), ("float64", None),
                                       ("int32", None), ("int64", None)])
@pytest.mark.parametrize("width", [None, 3])
def test_tiny_sum_merge_equals_a_dense_fold(monkeypatch, loop, tiny, small, dtype, acc, width):
    """Merges of a few entries (numba's pass below ``LOOP_SUM``, the Python fold below
    ``TINY``, the one stable sort below ``SMALL`` and the general numpy path, each taken by
    setting the bounds before it to 0): the same bits as a dense left fold in part order from
    -0, cast back once -- -0, NaN, +-inf, integer wraparound, float16 rounding, rows, empty
    parts. (A NaN's sign depends on the operands' order, e.g. inf - inf; the sparse verbs make
    NaNs canonical.)"""
    from cupycoll.primitives import _numpy_few

    monkeypatch.setattr(_numpy_few, "LOOP_SUM", loop)
    monkeypatch.setattr(_numpy_few, "TINY", tiny)
    monkeypatch.setattr(_numpy_few, "SMALL", small)
    monkeypatch.setattr(_numpy_few, "TWO_WAY", False)  # the chain: its own tests below
    rng = np.random.default_rng([31, width or 0, len(dtype)])
    row = (width,) if width else ()
    work = np.dtype(acc or dtype)
    special = ([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 1e-3] if work.kind == "f"
               else [np.iinfo(work).max, np.iinfo(work).min, -1, 0])
    for itype in ("int32", "int64"):
        parts, n = [], 12
        for size in (5, 0, 7, 12, 1):
            idx = np.sort(rng.choice(n, size, replace=False)).astype(itype)
            val = np.asarray(rng.choice(special, (size,) + row)).astype(dtype)
            parts.append((idx, val))
        sum_is_a_dense_fold(parts, n, row, dtype, acc, itype)


def sum_is_a_dense_fold(parts: list, n: int, row: tuple, dtype: str, acc: str | None,
                        itype: str) -> None:
    """``merge_sorted(parts, "sum", acc)`` has the bits of a dense left fold in part order
    from -0 (integers from 0) in ``acc``, cast back to ``dtype`` once (NaNs made canonical:
    a NaN's sign depends on the operands' order, e.g. inf - inf)."""
    work = np.dtype(acc or dtype)
    dense = np.full((n,) + row, -0.0 if work.kind == "f" else 0, work)
    present = np.zeros(n, bool)
    with np.errstate(all="ignore"):
        for idx, val in parts:
            dense[idx] = dense[idx] + val.astype(work)
            present[idx] = True
        want_v = dense[present].astype(dtype)
    got_i, got_v = P.merge_sorted(parts, "sum", acc)
    canonical = lambda v: (np.where(np.isnan(v), np.nan, v).astype(v.dtype)  # noqa: E731
                           if v.dtype.kind == "f" else v)
    assert_same_pair((got_i, canonical(got_v)),
                     (np.flatnonzero(present).astype(itype), canonical(want_v)))


@pytest.mark.parametrize("two_way", [False, True])
@pytest.mark.parametrize("loop, tiny, small", PATHS)
@pytest.mark.parametrize("parts, size, width", [(3, 20, 0), (5, 150, 0), (3, 300, 4),
                                                (4, 9000, 0)])
def test_merge_sums_shared_indices_in_part_order(monkeypatch, two_way, loop, tiny, small, parts,
                                                 size, width):
    """Continuous float32 values of mixed magnitudes, most indices shared by several parts:
    their sums depend on the order of the additions, and every path (numba's pass, Python
    fold, one-sort, general, and for two to four parts the chained two-way merges) adds them
    in part order, as a dense left fold from -0 does."""
    from cupycoll.primitives import _numpy_few

    monkeypatch.setattr(_numpy_few, "LOOP_SUM", loop)
    monkeypatch.setattr(_numpy_few, "TINY", tiny)
    monkeypatch.setattr(_numpy_few, "SMALL", small)
    monkeypatch.setattr(_numpy_few, "TWO_WAY", two_way)  # two to four parts: the chain
    rng, n, row = np.random.default_rng([size, parts]), size * 5 // 4, (width,) if width else ()
    pairs = []
    for _ in range(parts):
        idx = np.sort(rng.choice(n, size, replace=False)).astype(np.int32)
        scale = 10.0 ** rng.integers(-4, 5, (size,) + row)
        pairs.append((idx, (rng.standard_normal((size,) + row) * scale).astype(np.float32)))
    dense = np.full((n,) + row, -0.0, np.float32)
    present = np.zeros(n, bool)
    for idx, val in pairs:
        dense[idx] += val
        present[idx] = True
    reversed_fold = np.full_like(dense, -0.0)
    for idx, val in reversed(pairs):
        reversed_fold[idx] += val
    assert (reversed_fold != dense).any()  # the order of the additions shows in the bits
    got = P.merge_sorted(pairs, "sum")
    assert_same_pair(got, (np.flatnonzero(present).astype(np.int32), dense[present]))
    one_shared = P.merge_sorted([(np.array([1, 5], np.int32), np.float32([1, 2])),
                                 (np.array([5, 9], np.int32), np.float32([3, 4]))], "sum")
    assert one_shared[0].tolist() == [1, 5, 9] and one_shared[1].tolist() == [1, 5, 4]


@pytest.mark.parametrize("size, width, path", [(20, 0, "loop"), (500, 0, "loop"),
                                               (520, 0, "sorted"), (60, 8, "loop"),
                                               (70, 8, "sorted"), (8000, 0, "sorted"),
                                               (9000, 0, "loops"), (1000, 8, "sorted"),
                                               (3000, 8, "loops")])
@pytest.mark.parametrize("numba", ["on", "off"])
def test_merge_path_is_chosen_by_value_elements(monkeypatch, size, width, path, numba):
    """Sums below LOOP_SUM value elements (entries x row width) take numba's pass where numba
    runs (else the Python fold up to TINY entries, or one sort), below SMALL one sort, above
    the loops (numba's from the same bound): 2 parts of 500 entries are 1,000 elements, of
    520 1,040; 60 rows of 8 960, 70 rows 1,120; of 8000 16,000, of 9000 18,000; 1000 rows of 8
    16,000, 3000 rows of 8 48,000 (docs/primitives.md)."""
    from cupycoll.primitives import _numpy_few

    assert (_numpy_few.LOOP_SUM, _numpy_few.SMALL) == (1 << 10, 1 << 14)
    monkeypatch.setenv("CUPYCOLL_NUMBA", numba)
    monkeypatch.setattr(_numpy_few, "TWO_WAY", False)  # two parts: the next test's path
    if numba == "off" and path == "loop":
        path = "tiny" if 2 * size <= _numpy_few.TINY else "sorted"
    taken = []
    for name in ("tiny_sum", "sorted_sum", "loop_sum"):
        monkeypatch.setattr(_numpy_few, name, lambda *a, f=getattr(_numpy_few, name),
                            k=name: taken.append(k.split("_")[0]) or f(*a))
    rows = (size, width) if width else (size,)
    parts = [(np.arange(r, 2 * size, 2), np.ones(rows, np.float32)) for r in range(2)]
    idx, val = P.merge_sorted(parts)
    assert taken == ([] if path == "loops" else [path])
    assert idx.tolist() == list(range(2 * size)) and (val == 1).all()


@pytest.mark.parametrize("two_way", [True, False])
@pytest.mark.parametrize("dtype,acc", [("float32", None), ("float16", "float32"),
                                       ("float64", None), ("int32", None), ("int64", None)])
@pytest.mark.parametrize("width", [None, 3])
def test_chained_sums_equal_a_dense_fold(monkeypatch, two_way, dtype, acc, width):
    """Sums of two to five parts (numba's two-way merges chained in part order up to
    CHAIN_PARTS, or the other paths with it off), few and many entries (through both of
    merge_sorted's branches), int32 and int64 indices mixed, empty and one-sided parts: the
    bits of a dense left fold from -0 in part order, cast back once (-0, NaN, +-inf, integer
    wraparound; shared indices summed in part order, as the values' magnitudes show)."""
    from cupycoll.primitives import _numpy_few

    monkeypatch.setattr(_numpy_few, "TWO_WAY", two_way)
    rng = np.random.default_rng([7, width or 0, len(dtype), two_way])
    row = (width,) if width else ()
    work = np.dtype(acc or dtype)
    special = ([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.25, 3e-4, 6e4] if work.kind == "f"
               else [np.iinfo(work).max, np.iinfo(work).min, -1, 0, 7])
    cases = [(12, (5, 7)), (12, (0, 6)), (12, (6, 0)), (40000, (15000, 9000)),
             (12, (5, 0, 9)), (30, (20, 25, 18, 22)), (30000, (9000, 12000, 7000)),
             (20000, (6000, 5000, 7000, 8000, 4000))]
    for n, sizes in cases:
        parts = []
        for p, size in enumerate(sizes):
            idx = np.sort(rng.choice(n, size, replace=False)).astype(("int32", "int64")[p % 2])
            parts.append((idx, np.asarray(rng.choice(special, (size,) + row)).astype(dtype)))
        sum_is_a_dense_fold(parts, n, row, dtype, acc, "int64")


@pytest.mark.parametrize("size, width, threads, chained", [
    (20, 0, 1, 4), (9000, 0, 1, 4), (30000, 0, 1, 4), (500, 4, 1, 4), (3000, 1, 2, 4),
    (3000, 8, 1, 3), (3000, 8, 2, 3), (140000, 2, 1, 3), (140000, 2, 2, 0)])
def test_two_to_four_parts_take_the_chained_two_way_merge(monkeypatch, size, width, threads,
                                                          chained):
    """With numba, up to ``chained`` parts take the two-way merge, chained (one merge per part
    after the first): every 1-D sum and rows of one element, and rows below numba's bound
    (500 rows of 4), four parts; wider sums of rows (3000 rows of 8 a part: 48,000 elements
    and more) three parts while numba's k-way loop would run in one piece (one thread, or
    fewer than two pieces' entries), else none; five parts take the k-way loop; without numba
    nothing does."""
    from cupycoll.primitives import _accel, _numba

    calls = []
    monkeypatch.setattr(_numba, "sum_two", lambda *a, f=_numba.sum_two: calls.append(1) or f(*a))
    monkeypatch.setenv("CUPYCOLL_THREADS", str(threads))
    rows = (size, width) if width else (size,)
    parts = [(np.arange(r, 5 * size, 5), np.ones(rows, np.float32)) for r in range(5)]
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    assert _accel.loops() is _numba
    for count in (2, 3, 4, 5):
        calls.clear()
        idx, val = P.merge_sorted(parts[:count])
        assert len(calls) == (count - 1 if count <= chained else 0)
        assert np.array_equal(idx, np.sort(np.concatenate([i for i, _ in parts[:count]])))
        assert val.shape == (count * size,) + rows[1:] and (val == 1).all()
    monkeypatch.setenv("CUPYCOLL_NUMBA", "off")
    calls.clear()
    P.merge_sorted(parts[:2])
    assert calls == []


@pytest.mark.parametrize("width", [2, 3, 4, 7, 16, 48])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_two_way_merge_of_rows_is_a_before_b(width, dtype):
    """numba's two-way merge of two parts' rows (``sum_two``): the ascending union, a row of
    one part copied, a shared row a's plus b's element by element (NaN, inf and -0 among the
    values), bit for bit against numpy on the same parts."""
    from cupycoll.primitives import _numba

    rng = np.random.default_rng(width)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.25, 3.0])
    a, b = (np.sort(rng.choice(400, size, replace=False)) for size in (150, 170))
    va, vb = (rng.choice(special, (i.size, width)).astype(dtype) if dtype != "int64"
              else rng.integers(-9, 10, (i.size, width)) for i in (a, b))
    with np.errstate(invalid="ignore"):
        union = np.union1d(a, b)
        want = np.zeros((union.size, width), dtype)
        in_a, in_b = np.isin(union, a), np.isin(union, b)
        both = in_a & in_b
        want[in_a & ~in_b] = va[np.isin(a, union[in_a & ~in_b])]
        want[in_b & ~in_a] = vb[np.isin(b, union[in_b & ~in_a])]
        want[both] = va[np.isin(a, union[both])] + vb[np.isin(b, union[both])]
    idx, val = _numba.sum_two(a, va, b, vb, np.dtype(dtype), np.dtype("int64"))
    assert np.array_equal(idx, union)
    assert val.shape == want.shape and val.tobytes() == want.tobytes()
