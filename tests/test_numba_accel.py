"""The numba loops (CUPYCOLL_NUMBA=on) give bitwise the results of the numpy twins (off)."""

from __future__ import annotations

import importlib.util
import time
from typing import Any, Callable

import numpy as np
import pytest

from cupycoll import primitives as P
from cupycoll.primitives import _accel, _common

if importlib.util.find_spec("numba") is None:  # part of the test extra: not a reason to skip
    pytest.fail("numba is missing: install the test extra (pip install '.[test]')",
                pytrace=False)

pytestmark = pytest.mark.numba
VALUE_DTYPES = ["float16", "float32", "float64", "int32", "int64"]
OPS = ["sum", "prod", "max", "min"]


def both(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn()`` with the numpy loops, then with the numba loops (which must be active)."""
    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "off")
    want = fn()
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    assert _accel._fast(0) is not None
    return want, fn()


def same(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()


def values(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random values with ties, zeros of both signs, NaN (floats) and extremes (integers)."""
    if dtype.startswith("int"):
        info = np.iinfo(dtype)
        v = rng.integers(-4, 5, shape).astype(dtype)
        v.flat[rng.random(v.size) < 0.05] = info.min
        v.flat[rng.random(v.size) < 0.05] = info.max
        return v
    v = (rng.standard_normal(shape) * rng.choice([1, 3, 100], shape)).astype(dtype)
    v.flat[rng.random(v.size) < 0.1] = 0.0
    v.flat[rng.random(v.size) < 0.1] = -0.0
    v.flat[rng.random(v.size) < 0.03] = np.nan
    v.flat[rng.random(v.size) < 0.02] = -np.nan
    v.flat[rng.random(v.size) < 0.02] = np.inf
    return v


def test_merge_sorted_matches_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    cases = 0
    for dtype in VALUE_DTYPES:
        for op in OPS:
            for case in range(12):
                nparts = int(rng.integers(2, 7))
                universe = int(rng.choice([4, 50, 5000, 2**40]))
                width = None if case % 3 else int(rng.integers(1, 4))
                parts = []
                for p in range(nparts):
                    size = 0 if rng.random() < 0.2 else int(rng.integers(1, min(universe, 300)))
                    itype = np.int64 if universe > 2**31 or rng.random() < 0.3 else np.int32
                    idx = np.unique(rng.integers(0, universe, size)).astype(itype)
                    shape = (idx.size,) if width is None else (idx.size, width)
                    parts.append((idx, values(rng, dtype, shape)))
                acc = [None, "float32", "float64", "int64"][case % 4]
                want, got = both(monkeypatch, lambda: P.merge_sorted(parts, op, acc))
                same(got, want)
                cases += 1
    empty = [(np.zeros(0, np.int32), np.zeros((0, 2), np.float32))] * 3
    same(*both(monkeypatch, lambda: P.merge_sorted(empty, "max"))[::-1])
    # large enough for several merge blocks
    parts = [(np.sort(rng.choice(2**20, 2**15, replace=False)).astype(np.int32),
              values(rng, "float32", (2**15,))) for _ in range(5)]
    same(*both(monkeypatch, lambda: P.merge_sorted(parts, "sum"))[::-1])
    assert cases == 240


def test_select_and_count_match_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    for dtype in VALUE_DTYPES:
        for size in (0, 1, 63, 64, 65, 1000, 5000):
            x = values(rng, dtype, (size,))
            sample = [float(abs(v)) for v in x[:3].astype(np.float64)]
            for t in [0, -1, 0.5, 1, 2.5, 3, np.nan, np.inf, 2**31, 2**63, 1e300, *sample]:
                same(*both(monkeypatch, lambda: P.select_abs_ge(x, t))[::-1])
                want, got = both(monkeypatch, lambda: P.count_abs_ge(x, t))
                assert got == want and type(got) is type(want)


def test_errors_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    from cupycoll.errors import InvalidArgument, InvalidType

    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    with pytest.raises(InvalidArgument):
        P.merge_sorted([(np.array([2, 1]), np.ones(2)), (np.array([1]), np.ones(1))])
    with pytest.raises(InvalidType):
        P.select_abs_ge(np.ones(3, np.uint8), 1)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "sometimes")
    with pytest.raises(InvalidArgument, match="CUPYCOLL_NUMBA"):
        P.count_abs_ge(np.ones(3), 1)


@pytest.mark.parametrize("threads", ["2", "3", "7"])
def test_threaded_loops_match_numpy(monkeypatch: pytest.MonkeyPatch, threads: str) -> None:
    """Loops cut over several threads (also more pieces than blocks) give the serial results."""
    from cupycoll.primitives import _numba as K

    monkeypatch.setattr(K, "_PIECE", 1)
    monkeypatch.setenv("CUPYCOLL_THREADS", threads)
    assert K.threads() == int(threads)
    rng = np.random.default_rng(int(threads))
    for size in (1, 17, 100, 5000, 70000):
        x = values(rng, "float32", (size,))
        xi = values(rng, "int32", (size,))
        for arr, t in ((x, 1.5), (x, 0), (x, np.inf), (xi, 3), (xi, 2**31)):
            same(*both(monkeypatch, lambda: P.select_abs_ge(arr, t))[::-1])
            want, got = both(monkeypatch, lambda: P.count_abs_ge(arr, t))
            assert got == want
    monkeypatch.setattr(_common, "_MERGE_BLOCK", 256)  # many blocks from small parts
    for universe, nparts, width in ((2**20, 4, None), (3000, 5, None), (2**40, 3, 2), (50, 2, None)):
        parts = []
        for _ in range(nparts):
            idx = np.unique(rng.integers(0, universe, int(rng.integers(0, 2000))))
            shape = (idx.size,) if width is None else (idx.size, width)
            parts.append((idx, values(rng, "float64", shape)))
        for op in OPS:
            same(*both(monkeypatch, lambda: P.merge_sorted(parts, op))[::-1])


def test_threads_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto divides this process's CPUs among the MPI ranks of the node; bad values raise."""
    import os

    from cupycoll.primitives import _numba as K
    from cupycoll.errors import InvalidArgument

    cpus = len(os.sched_getaffinity(0))
    monkeypatch.delenv("CUPYCOLL_THREADS", raising=False)
    for name in K._LOCAL_RANKS:
        monkeypatch.delenv(name, raising=False)
    assert K.threads() == cpus
    monkeypatch.setenv("MPI_LOCALNRANKS", str(2 * cpus))
    assert K.threads() == 1
    monkeypatch.setenv("CUPYCOLL_THREADS", "3")
    assert K.threads() == 3
    monkeypatch.setenv("CUPYCOLL_THREADS", "8")  # pieces of at least 2**17 entries
    assert [K.piece_count(1 << e) for e in (10, 17, 18, 19, 20, 24)] == [1, 1, 2, 4, 8, 8]
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("CUPYCOLL_THREADS", bad)
        with pytest.raises(InvalidArgument, match="CUPYCOLL_THREADS"):
            K.threads()


def test_threaded_loops_after_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked child (as a DataLoader worker) gets its own thread pool instead of hanging."""
    import os

    from cupycoll.primitives import _numba as K

    monkeypatch.setattr(K, "_PIECE", 1)
    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setenv("CUPYCOLL_THREADS", "2")
    x = np.arange(-5000, 5000, dtype=np.float32)
    assert P.count_abs_ge(x, 10) == 9981  # the parent's pool now exists
    pid = os.fork()
    if pid == 0:  # child: exit 0 only if the threaded loop answers right
        os._exit(0 if P.count_abs_ge(x, 10) == 9981 else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    pytest.fail("the forked child hung in a threaded loop")


@pytest.mark.parametrize("kept", [0, 1 << 22])
def test_merge_temporaries_kept_or_not(monkeypatch: pytest.MonkeyPatch, kept: int) -> None:
    """Kept temporaries are reused (and freed by free_scratch); results are the same either way,
    also when a later, larger merge outgrows them."""
    from cupycoll.primitives import _numba as K
    from cupycoll.primitives import _numpy_few

    monkeypatch.setattr(K, "_SCRATCH_KEPT", kept)
    monkeypatch.setattr(_numpy_few, "TWO_WAY", False)  # three parts: the k-way loop
    rng = np.random.default_rng(kept)
    P.free_scratch()
    for size in (3000, 300, 9000):
        indices = [np.unique(rng.integers(0, 50_000, size)) for _ in range(3)]
        parts = [(i, values(rng, "float32", (i.size,))) for i in indices]
        same(*both(monkeypatch, lambda: P.merge_sorted(parts, "sum"))[::-1])
        assert hasattr(K._SCRATCH, "idx") == bool(kept)
    P.free_scratch()
    assert not hasattr(K._SCRATCH, "idx")


def test_cached_loops_are_keyed_by_plain_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba's on-disk cache keys a compiled loop by its argument types: a numba function
    passed as an argument (as hit_masks' test once was) makes a key no later process matches,
    so every process compiled again, the index grew, and saving it could fail with
    "underlying object has vanished" (``tune`` at P = 4 did). Every signature compiled by the
    selection and the dense union must be made of plain types."""
    from numba.core import types

    from cupycoll.primitives import _numba as K
    from cupycoll.primitives import _numba_dense

    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    assert _accel.ready() is not None  # numba imported: the selection below runs its loops
    rng = np.random.default_rng(3)
    for dtype in ("float32", "float64", "int32", "int64"):
        P.select_abs_ge(values(rng, dtype, (5000,)), 1)
    x = np.full(5000, 7, np.uint32)
    x[::7] = 1
    K.select_unequal(x, 7, np.dtype(np.int32))
    K.select_unequal_rows(x.reshape(-1, 5), 7, np.dtype(np.int32))
    for fn in (_numba_dense.hit_masks, _numba_dense.copy_hits, _numba_dense.copy_unequal,
               _numba_dense.row_hits, _numba_dense.copy_hit_rows):
        assert fn.signatures, fn
        for signature in fn.signatures:
            assert not any(isinstance(t, (types.Dispatcher, types.Function)) for t in signature)


@pytest.mark.parametrize("dtype", ["uint32", "uint64"])
def test_select_unequal_is_flatnonzero_and_take(dtype):
    """The dense algorithm's union scan (a copy per hit below BITS_UP_TO hits, else per
    element): positions and bits of the elements that are not -0, against numpy's flatnonzero
    on the comparison; empty, full, ragged, threaded lengths, hits on either side of the
    switch and at the ends (the per-element copy stops at the last hit)."""
    from cupycoll.primitives import _numba

    rng = np.random.default_rng(len(dtype))
    minus_zero = np.dtype(dtype).type(1 << (8 * np.dtype(dtype).itemsize - 1))
    for size, density in ((0, 0.0), (1, 1.0), (37, 0.0), (1001, 1.0), (300_001, 0.02),
                          (1 << 19, 0.3), (1 << 19, 0.7), (4097, 0.53), (4097, 0.57),
                          (200, 0.9)):
        x = np.full(size, minus_zero, dtype)
        hit = rng.random(size) < density
        x[hit] = rng.integers(0, np.iinfo(dtype).max, int(hit.sum()), dtype=dtype)
        x[hit & (rng.random(size) < 0.1)] = 0  # +0 is present
        for itype in (np.dtype(np.int32), np.dtype(np.int64)):
            want = np.flatnonzero(x != minus_zero)
            for reset in (False, True):
                before = x.copy()
                idx, raw = _numba.select_unequal(x, minus_zero, itype, reset=reset)
                assert idx.dtype == itype and np.array_equal(idx, want), size
                assert raw.dtype == x.dtype and raw.tobytes() == before[want].tobytes()
                assert (x == minus_zero).all() if reset else np.array_equal(x, before)
                x[...] = before


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_select_unequal_rows_is_any_flatnonzero_and_take(dtype):
    """The ``dense`` algorithm's union of rows: the positions and bits of the rows with an
    element that is not -0, against numpy's ``any`` of the comparison, ``flatnonzero`` and
    ``take``: each hit row differs from -0 in one random column only (first, last, middle),
    some of them by a +0; empty, one row, ragged, threaded sizes (two pieces of rows); with
    ``reset``, every row is -0 after, else nothing is written."""
    from cupycoll.primitives import _numba

    rng = np.random.default_rng(len(dtype))
    minus_zero = np.dtype(dtype).type(1 << (8 * np.dtype(dtype).itemsize - 1))
    for rows, width, density in ((0, 4, 0.0), (1, 3, 1.0), (1000, 16, 0.1), (77, 5, 0.5),
                                 (300_001, 2, 0.3), (40_000, 16, 0.9), (5000, 1, 0.2)):
        x = np.full((rows, width), minus_zero, dtype)
        hit = np.flatnonzero(rng.random(rows) < density)
        column = rng.integers(0, width, hit.size)
        x[hit, column] = rng.integers(0, np.iinfo(dtype).max, hit.size, dtype=dtype)
        x[hit[::7], column[::7]] = 0  # +0 is present
        want = np.flatnonzero((x != minus_zero).any(axis=1))
        for itype in (np.dtype(np.int32), np.dtype(np.int64)):
            for reset in (False, True):
                before = x.copy()
                idx, raw = _numba.select_unequal_rows(x, minus_zero, itype, reset=reset)
                assert idx.dtype == itype and np.array_equal(idx, want), (rows, width)
                assert raw.shape == (want.size, width)
                assert raw.dtype == x.dtype and raw.tobytes() == before[want].tobytes()
                assert (x == minus_zero).all() if reset else np.array_equal(x, before)
                x[...] = before


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int64"])
def test_scatter_into_is_numpys_fancy_assignment(monkeypatch, dtype):
    """``dense`` and ``mask`` write a rank's rows into a dense or union buffer with
    ``scatter_into``: the numba loop (bits moved, rows of any width, unsorted unique indices
    of any integer type) leaves exactly what numpy's ``out[idx] = val`` does, other rows
    untouched; with numba off it is numpy's assignment."""
    from cupycoll.sparse.dense import scatter_into

    rng = np.random.default_rng(len(dtype))
    for n, row, k in ((50, (), 7), (1000, (3,), 400), (300, (4, 5), 300), (20_000, (), 0)):
        for itype in (np.int32, np.int64, np.uint16):
            idx = rng.permutation(n)[:k].astype(itype)
            val = values(rng, dtype, (k,) + row)
            before = values(rng, dtype, (n,) + row)
            want = before.copy()
            want[idx] = val
            got = both(monkeypatch, lambda: scatter_into(before.copy(), idx, val))
            for out in got:
                assert out.dtype == want.dtype and out.tobytes() == want.tobytes(), (n, row)


def test_kept_filled_writes_only_what_is_not_known():
    """A kept buffer marked filled is reused as is (its restored state) for the same dtype
    and fill; another dtype, fill, a larger size, or no mark refill it."""
    _accel.free_scratch()
    a = _accel.kept_filled(100, np.float32, -0.0)
    assert np.signbit(a).all() and (a == 0).all()
    a[:10] = 5.0  # written, not restored, not marked: the next call refills
    b = _accel.kept_filled(100, np.float32, -0.0)
    assert np.signbit(b).all() and (b == 0).all()
    b[3] = 7.0  # a stray value left in place while marked: proves nothing is rewritten
    _accel.mark_filled(b, -0.0)
    g = _accel.kept_filled(100, np.float32, -0.0)
    assert g[3] == 7.0
    _accel.mark_filled(g, -0.0)
    _accel.mark_filled(_accel.kept_filled(50, np.float32, -0.0), -0.0)
    c = _accel.kept_filled(100, np.float32, -0.0)  # 50 known: the rest written
    assert c[3] == 7.0 and np.signbit(c[50:]).all()
    _accel.mark_filled(c, -0.0)
    d = _accel.kept_filled(100, np.float32, 0.0)  # another fill: everything rewritten
    assert d[3] == 0.0 and not np.signbit(d).any()
    _accel.mark_filled(d, 0.0)
    e = _accel.kept_filled(25, np.float64, 0.0)  # another dtype: rewritten
    assert (e == 0).all()
    _accel.mark_filled(np.zeros(10, np.float64), 0.0)  # not the kept buffer: ignored
    f = _accel.kept_filled(10_000, np.float64, 1.0)  # larger: a new buffer, filled
    assert (f == 1.0).all()
    _accel.free_scratch()


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("width", [0, 1, 3, 4097])
@pytest.mark.parametrize("itype", ["int32", "int64"])
def test_densify_into_equals_fill_then_scatter(monkeypatch, dtype, width, itype):
    """``dense.densify_into`` (output="dense"): the numba pass, block by block, writes exactly
    a zero fill followed by the scatter, over garbage in ``out``: -0, NaN payloads and extremes
    kept bit for bit; no rows, the first and last rows, every row, runs across block edges and
    rows wider than a block."""
    from cupycoll.sparse.dense import densify_into

    rng = np.random.default_rng([width, len(dtype), len(itype)])
    n = 20_000 if width < 100 else 9
    row = (width,) if width else ()
    for case in ("none", "ends", "all", "random", "runs"):
        idx = {"none": np.array([], int), "ends": np.array([0, n - 1]), "all": np.arange(n),
               "random": np.flatnonzero(rng.random(n) < 0.1),
               "runs": np.flatnonzero((np.arange(n) // 700) % 3 == 0)}[case].astype(itype)
        val = values(rng, dtype, (idx.size,) + row)
        out = values(rng, dtype, (n,) + row)
        want, got = both(monkeypatch, lambda: densify_into(out.copy(), idx, val))
        same((got,), (want,))
        assert not np.delete(want, idx, axis=0).view(np.uint8).any(), case


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("width", [0, 1, 5])
def test_add_into_equals_numpy_scatter_add(monkeypatch, dtype, width):
    """``dense.add_into`` (split's region block): the numba loop adds exactly what numpy's
    ``out[idx - lo] += val`` adds (NaN, -0, integer wraparound), offset by ``lo``; float16
    keeps numpy's loop."""
    from cupycoll.sparse.dense import add_into

    rng = np.random.default_rng([width, len(dtype)])
    n, lo, row = 5000, 1234, ((width,) if width else ())
    for itype in ("int32", "int64"):
        idx = (lo + np.flatnonzero(rng.random(n) < 0.4)).astype(itype)
        val = values(rng, dtype, (idx.size,) + row)
        base = values(rng, dtype, (n,) + row)

        def run():
            out = base.copy()
            with np.errstate(all="ignore"):
                add_into(out, idx, lo, val)
            return out

        want, got = both(monkeypatch, run)
        same((got,), (want,))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_special_values_flags_nan_inf_and_minus_zero(dtype):
    """The dense output's value flags from bits: NaN (any payload, either sign), +-inf, -0; not
    +0, the largest finite values or subnormals."""
    from cupycoll.primitives import _numba

    info = np.finfo(dtype)
    plain = np.array([0.0, 1.5, -2.0, info.max, -info.max, info.smallest_subnormal,
                      -info.smallest_subnormal], dtype)
    assert _numba.special_values(plain) == (False, False)
    nan = np.array(np.nan, dtype).view(f"u{info.bits // 8}") | 1  # another payload
    for special, flags in ((np.inf, (True, False)), (-np.inf, (True, False)),
                           (nan.view(dtype), (True, False)), (-nan.view(dtype), (True, False)),
                           (-0.0, (False, True))):
        for at in (0, 3, plain.size):
            values = np.insert(plain, at, np.array(special, dtype))
            assert _numba.special_values(values) == flags, (special, at)
            assert _numba.special_values(values.reshape(-1, 1)) == flags
            # without the -0 search: the first flag alone, the second always False
            assert _numba.special_values(values, minus_zero=False) == (flags[0], False)
    assert _numba.special_values(np.array([-0.0, np.inf], dtype)) == (True, True)
    limit = 2.0 ** (info.maxexp // 2)  # a magnitude at or above it flagged, NaN too
    for values, large in (([limit], True), ([-limit], True), ([np.nextafter(limit, 0, dtype=dtype)],
                          False), ([1.0, np.nan], True), ([np.inf], True)):
        assert _numba.special_values(np.array(values, dtype), limit)[0] is large, values
        assert _numba.special_values(np.array(values, dtype), limit, False) == (large, False)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", ["sum", "avg", "prod", "max", "min"])
def test_dense_output_flags_values_whose_reduction_can_overflow(dtype, op):
    """A dense output settles its NaN bits when P ranks' values may overflow under the op
    (then inf - inf or inf * 0 can make a NaN): just below the limit P of the largest values
    stay finite, on numba's pass and on the array namespace's alike."""
    from cupycoll._types import ReduceOp
    from cupycoll.primitives import _numba
    from cupycoll.sparse._validate import _overflowing

    for p in (1, 2, 3, 4, 7, 8):
        limit = _overflowing(np.dtype(dtype), ReduceOp(op), p)
        if op in ("max", "min"):
            assert limit == np.inf
            continue
        below = np.nextafter(np.array(limit, dtype), np.array(0, dtype))
        with np.errstate(over="raise"):  # P of the largest values below the limit: finite
            if op == "prod":
                np.prod(np.full(p, below, dtype))
            else:
                np.sum(np.full(p, below, dtype), dtype=dtype)
        assert _numba.special_values(np.array([below], dtype), limit)[0] is False
        assert _numba.special_values(np.array([limit], dtype), limit)[0] is True


@pytest.mark.parametrize("itype", ["int32", "int64"])
def test_index_stats_equal_numpys(monkeypatch, itype):
    """The validation's one read of indices: (min, max, strictly increasing) the same with the
    numba pass as with numpy, for sorted, sorted with a repeat, descending, one unsorted pair
    at either end, and a single index."""
    from cupycoll.primitives._checks import _index_stats

    rng = np.random.default_rng(len(itype))
    base = np.sort(rng.choice(1 << 20, 1000, replace=False)).astype(itype)
    cases = [base, np.insert(base, 500, base[500]), base[::-1].copy(),
             np.concatenate([base[1:2], base[:1], base[2:]]),
             np.concatenate([base[:-2], base[-1:], base[-2:-1]]), base[:1]]
    for idx in cases:
        want, got = both(monkeypatch, lambda: _index_stats(idx))
        assert got == want and type(got[0]) is int and type(got[2]) is bool


@pytest.mark.parametrize("itype,dtype", [("int32", "int32"), ("int64", "int64"),
                                          ("int64", "int32")])
def test_union_of_index_sets_is_numpys_unique(monkeypatch, itype, dtype):
    """mask's union of every rank's indices: the numba tree of two-way unions and the merge
    it replaces both give numpy's sorted unique concatenation, for 1-9 sets (odd counts leave
    one set a level), empty sets, shared and disjoint ranges, on both sides of WALK_FROM."""
    from cupycoll.sparse import _common

    rng = np.random.default_rng(len(itype) * 3 + len(dtype))
    for p in range(1, 10):
        for n, k in ((10, 3), (300, 40), (5000, 900)):
            sets = [np.sort(rng.choice(n, rng.integers(0, k + 1), replace=False)).astype(itype)
                    for _ in range(p)]
            sets[rng.integers(p)] = np.sort(rng.choice(n, k, replace=False)).astype(itype)
            if p > 2:
                sets[1] = sets[0].copy()  # two ranks with the same indices
                sets[2] = sets[2][:0]  # and one with none
            want = np.unique(np.concatenate(sets)).astype(dtype)
            for got in both(monkeypatch, lambda: _common.union_of(sets, dtype)):
                assert got.dtype == np.dtype(dtype) and np.array_equal(got, want)


@pytest.mark.parametrize("utype,wtype", [("int32", "int32"), ("int64", "int64"),
                                         ("int64", "int32")])
def test_positions_in_a_union_are_numpys_searchsorted(monkeypatch, utype, wtype):
    """mask's lookup of its rows in the union: the numba walk gives numpy's ``searchsorted``
    positions (int64) for subsets of every size (none, one, all, the ends, dense and sparse
    runs), on both sides of ``WALK_FROM``, and without numba the same."""
    from cupycoll.sparse import _common

    rng = np.random.default_rng(len(utype) + len(wtype))
    for size in (1, 2, 63, 64, 65, 1000, 40000):
        union = np.sort(rng.choice(4 * size + 3, size, replace=False)).astype(utype)
        subsets = [union[:0], union[:1], union[-1:], union, union[::3],
                   np.sort(rng.choice(union, (size + 1) // 2, replace=False))]
        for wanted in subsets:
            wanted = wanted.astype(wtype)
            want = np.searchsorted(union, wanted)
            got = both(monkeypatch, lambda: _common.positions_in(union, wanted))
            for g in got:
                assert g.dtype == np.int64 and np.array_equal(g, want)


def _dense_sum(parts: list, n: int, row: tuple, dtype: str, absent_zero: bool) -> tuple:
    """The reference of a sum of parts: a dense left fold in part order from -0 (integers
    from 0); ``absent_zero``: then +0 added where some part lacks the index."""
    work = np.dtype(dtype)
    dense = np.full((n,) + row, -0.0 if work.kind == "f" else 0, work)
    held = np.zeros(n, np.int64)
    with np.errstate(all="ignore"):
        for idx, val in parts:
            dense[idx] = dense[idx] + val
            held[idx] += 1
        if absent_zero:
            partial = (held > 0) & (held < len(parts))
            dense[partial] = dense[partial] + work.type(0)
    return np.flatnonzero(held), dense[held > 0]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("width", [0, 3])
@pytest.mark.parametrize("absent_zero", [False, True])
def test_sum_parts_is_a_dense_left_fold(dtype: str, width: int, absent_zero: bool) -> None:
    """numba's small sum (a small call's merge): every index's rows added in part order, an
    index some part lacks given +0 with ``absent_zero`` (a -0 sum becomes +0), against a dense
    fold: -0, NaN, inf, integer wraparound, rows, empty parts, 2-8 parts, both index types."""
    from cupycoll.primitives import _numba

    rng = np.random.default_rng([width, len(dtype), absent_zero])
    row = (width,) if width else ()
    for nparts in (2, 3, 5, 8):
        for itype in (np.dtype(np.int32), np.dtype(np.int64)):
            parts = [(np.sort(rng.choice(30, size, replace=False)).astype(itype),
                      values(rng, dtype, (size,) + row)) for size in rng.integers(0, 14, nparts)]
            counts = [int(i.size) for i, _ in parts]
            starts = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
            got = _numba.sum_parts(np.concatenate([i for i, _ in parts]),
                                   np.concatenate([v for _, v in parts]).reshape(-1), starts,
                                   [s * max(width, 1) for s in starts], counts, row, itype,
                                   absent_zero)
            want_idx, want_val = _dense_sum(parts, 30, row, dtype, absent_zero)
            same(got, (want_idx.astype(itype), want_val))


@pytest.mark.parametrize("dtype, acc", [("float32", None), ("float64", None), ("int32", None),
                                        ("int64", None), ("float16", "float32"),
                                        ("float32", "float64")])
def test_reduce_parts_loop_is_the_numpy_sum(monkeypatch: pytest.MonkeyPatch, dtype: str,
                                            acc: str | None) -> None:
    """reduce_parts below LOOP_SUM elements (through merge_sorted's few-entry sums): numba's
    pass (CUPYCOLL_NUMBA=on) and numpy's sums (off) give the same bits, casts back from the accumulate dtype and the -0
    rule of absent entries included; both equal a dense fold with that rule."""
    from cupycoll._types import ReduceOp
    from cupycoll.primitives import _numpy_few
    from cupycoll.sparse._common import reduce_parts

    taken: list[str] = []
    for name in ("tiny_sum", "sorted_sum"):
        monkeypatch.setattr(_numpy_few, name, lambda *a, f=getattr(_numpy_few, name):
                            taken.append("numpy") or f(*a))
    rng = np.random.default_rng([len(dtype), 5])
    for nparts, width in ((2, 0), (3, 4), (6, 0), (8, 2)):
        row = (width,) if width else ()
        parts = [(np.sort(rng.choice(40, size, replace=False)).astype(np.int32),
                  values(rng, dtype, (size,) + row)) for size in rng.integers(0, 20, nparts)]
        results = []
        for mode in ("off", "on"):
            monkeypatch.setenv("CUPYCOLL_NUMBA", mode)
            taken.clear()
            results.append(reduce_parts(parts, ReduceOp.SUM, acc))
            assert taken == (["numpy"] if mode == "off" else [])
        same(results[1], results[0])
        if acc is None:
            want_idx, want_val = _dense_sum(parts, 40, row, dtype, True)
            same(results[1], (want_idx.astype(np.int32), want_val))


@pytest.mark.parametrize("dtype, acc", [("float32", None), ("float64", None), ("int32", None),
                                        ("float16", "float32")])
@pytest.mark.parametrize("nparts, width", [(2, 0), (2, 1), (2, 5), (3, 0), (3, 4), (4, 0)])
def test_reduce_parts_two_way_merge_gives_absent_entries_their_zero(
        monkeypatch: pytest.MonkeyPatch, dtype: str, acc: str | None, nparts: int,
        width: int) -> None:
    """reduce_parts' sums through numba's chained two-way merge: a float sum in its own dtype
    gets the +0 of absent entries in the merge's pass (no ``fill_absent`` scan after it), any
    other (integers, a cast back from the accumulate dtype) through ``fill_absent``; each is
    the dense left fold with absent entries counting +0 (-0 only where every part adds -0)."""
    from cupycoll._types import ReduceOp
    from cupycoll.primitives import _numba
    from cupycoll.sparse import _common as sparse_common
    from cupycoll.sparse._common import reduce_parts

    merges, scans = [], []
    monkeypatch.setattr(_numba, "sum_two", lambda *a, f=_numba.sum_two: merges.append(a[-1])
                        or f(*a))
    monkeypatch.setattr(sparse_common, "fill_absent", lambda *a, f=sparse_common.fill_absent:
                        scans.append(1) or f(*a))
    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    monkeypatch.setenv("CUPYCOLL_THREADS", "1")
    rng = np.random.default_rng([nparts, width, len(dtype)])
    row = (width,) if width else ()
    for itype in (np.int32, np.int64):
        parts = [(np.sort(rng.choice(300, size, replace=False)).astype(itype),
                  values(rng, dtype, (size,) + row)) for size in rng.integers(0, 200, nparts)]
        merges.clear(), scans.clear()
        got = reduce_parts(parts, ReduceOp.SUM, acc)
        settles = acc is None and dtype.startswith("float")
        assert merges == [settles] * (nparts - 1) and scans == ([] if settles else [1])
        work = acc or dtype  # summed in the accumulate dtype, cast back, then +0 where absent
        want_idx, want_val = _dense_sum([(i, v.astype(work)) for i, v in parts], 300, row,
                                        work, False)
        held = sum(np.isin(want_idx, i).astype(int) for i, _ in parts)
        with np.errstate(all="ignore"):
            want_val = want_val.astype(dtype)
            want_val[held < nparts] += np.dtype(dtype).type(0)
        same(got, (want_idx.astype(itype), want_val))


@pytest.mark.parametrize("size", [2, 3, 4, 8])
def test_small_merge_loop_reads_the_slots_pack_wrote(monkeypatch: pytest.MonkeyPatch,
                                                     size: int) -> None:
    """A small call's blocks written by ``small.pack`` into the agreement vector and merged
    from it by numba's pass (its own offsets into the slots) or by the numpy path over
    ``small.blocks``: the same bits, for every index and value dtype, 1-D and rows."""
    from types import SimpleNamespace

    from cupycoll import _agreement as agreement
    from cupycoll._types import ReduceOp
    from cupycoll.sparse import small

    rng = np.random.default_rng(size)
    words = agreement.slot_words(size)
    for itype in (np.dtype(np.int32), np.dtype(np.int64)):
        for dtype in ("float32", "float64", "int32", "int64"):
            for width in (0, 2):
                row_bytes = np.dtype(dtype).itemsize * max(width, 1)
                fit = max(1, words * 8 // (itype.itemsize + row_bytes) - 1)
                vec = np.full(agreement.length(size), np.iinfo(np.int64).min, np.int64)
                nnz = []
                for r in range(size):
                    count = int(rng.integers(0, min(fit, 12) + 1))
                    idx = np.sort(rng.choice(24, count, replace=False)).astype(itype)
                    val = values(rng, dtype, (count, width) if width else (count,))
                    comm = SimpleNamespace(size=size, xp=np)
                    small.pack(comm, vec, agreement.slot_start(size, r), idx, val, None)
                    nnz.append(count)
                assert small.fits_all(size, nnz, itype.itemsize, row_bytes)
                slots = vec[agreement.slot_start(size, 0):]
                merged = []
                for mode in ("off", "on"):
                    monkeypatch.setenv("CUPYCOLL_NUMBA", mode)
                    merged.append(small.merge(np, slots, nnz, itype, np.dtype(dtype), width,
                                              ReduceOp.SUM))
                same(merged[1], merged[0])


def test_loops_are_whole_when_two_threads_reach_them_first() -> None:
    """Two threads asking for the numba loops while numba is still importing (an async call's
    thread and the caller's, first calls of a process): each gets the finished module, never
    the half-made one that ``sys.modules`` holds during the import (a fresh interpreter)."""
    import os
    import subprocess
    import sys

    code = """if True:
        import threading, time
        from cupycoll.primitives import _accel
        got, errors = [], []
        def ask():
            try:
                got.append(_accel.loops().SUM_DTYPES)
            except Exception as exc:
                errors.append(repr(exc))
        threads = [threading.Thread(target=ask) for _ in range(4)]
        for t in threads:
            t.start()
            time.sleep(0.02)
        for t in threads:
            t.join()
        assert not errors and len(got) == 4, errors
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CUPYCOLL_NUMBA": "on"})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_numba_cache_saves_of_two_signatures_at_once_keep_both(tmp_path, monkeypatch):
    """Two ranks compiling a loop for different argument types save at once: each must end
    under its own data file. Rank A stops inside its save (data file chosen) until rank B's
    save is done, or 0.5 s: under the lock B waits for A and takes the next file; without it B
    takes A's number and one signature is lost or loads the other's code."""
    import threading

    from cupycoll.primitives import _numba_cache

    first, second = (_numba_cache._LockedCacheFile(str(tmp_path), "loop-7.py311", "stamp")
                     for _ in range(2))
    inside, second_done = threading.Event(), threading.Event()
    save_data = _numba_cache._LockedCacheFile._save_data

    def held(self, name, data):
        if self is first:
            inside.set()
            second_done.wait(0.5)
        save_data(self, name, data)

    monkeypatch.setattr(_numba_cache._LockedCacheFile, "_save_data", held)
    saving = threading.Thread(target=first.save, args=("float32 rows", ("code A",)))
    saving.start()
    assert inside.wait(10)
    second.save("int64 rows", ("code B",))
    second_done.set()
    saving.join(10)
    assert first.load("float32 rows") == ("code A",)
    assert second.load("int64 rows") == ("code B",)
    assert first.load("int64 rows") == ("code B",)  # one index for both


#: a process that compiles a cached loop under make_process_safe once a start file exists and
#: prints how many times it compiled (numba's cache misses) and loaded (hits)
COMPILE_ONCE_CHILD = """
import os, sys, time
import numpy as np
from numba import njit
from cupycoll.primitives._numba_cache import make_process_safe

@njit(cache=True)
def loop(a):
    total = 0.0
    for v in a:
        total += v * v
    return total

make_process_safe(globals())
while not os.path.exists(sys.argv[1]):
    time.sleep(0.001)
assert loop(np.arange(10.0)) == 285.0
print(sum(loop.stats.cache_misses.values()), sum(loop.stats.cache_hits.values()))
"""


def test_ranks_needing_one_new_signature_compile_it_once(tmp_path):
    """Three processes that need the same signature of an uncompiled cached loop at the same
    moment (a job's ranks after an install): one compiles it, the others wait for its compile
    and load it from the cache (without the compile lock each compiles: three misses)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    start, child = tmp_path / "start", tmp_path / "child.py"
    child.write_text(COMPILE_ONCE_CHILD)  # numba caches loops defined in files
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # this cupycoll
    children = [subprocess.Popen([sys.executable, str(child), str(start)], env=env,
                                 stdout=subprocess.PIPE, text=True) for _ in range(3)]
    time.sleep(3)  # every child imported numba and waits for the start file
    start.touch()
    counts = [tuple(map(int, c.communicate(timeout=120)[0].split())) for c in children]
    assert all(c.returncode == 0 for c in children)
    assert sorted(counts) == [(0, 1), (0, 1), (1, 0)], counts


HOLD_CHILD = COMPILE_ONCE_CHILD.replace("""assert loop(np.arange(10.0)) == 285.0
""", """import fcntl, numba
from cupycoll.primitives._numba_cache import _lock_path
arg = np.arange(10.0).astype(sys.argv[2])
if sys.argv[3] == "hold":  # a compile of this signature in progress elsewhere, for 10 s
    lock = open(_lock_path(loop._cache._cache_file._index_path, (numba.typeof(arg),)), "a+b")
    fcntl.flock(lock, fcntl.LOCK_EX)
    open(sys.argv[1] + ".held", "w").close()
    time.sleep(10)
    lock.close()
else:
    while not os.path.exists(sys.argv[1] + ".held"):
        time.sleep(0.001)
    started = time.monotonic()
    assert loop(arg) == 285.0
    print(round(time.monotonic() - started, 2), file=sys.stderr)
""")


def test_a_compile_waits_only_for_its_own_signature(tmp_path):
    """While one process holds the compile lock of a loop's float64 signature, a process that
    needs that signature waits for it, and one that needs the int64 signature compiles it
    meanwhile (a lock per signature, not one for the whole cache)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    start, child = tmp_path / "start", tmp_path / "child.py"
    child.write_text(HOLD_CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    runs = [("float64", "hold"), ("float64", "call"), ("int64", "call")]
    children = [subprocess.Popen([sys.executable, str(child), str(start), dtype, role], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for dtype, role in runs]
    time.sleep(3)  # every child imported numba and waits for the start file
    start.touch()
    outs = [c.communicate(timeout=120) for c in children]
    assert all(c.returncode == 0 for c in children), [err[-2000:] for _, err in outs]
    same, other = (float(outs[i][1].split()[-1]) for i in (1, 2))
    assert same >= 8.0, (same, other)  # waited for the held lock (10 s from before it started)
    assert other < same - 2.0, (same, other)  # compiled while the float64 lock was held


def test_auto_imports_numba_in_the_background_and_numpy_runs_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CUPYCOLL_NUMBA=auto: the first large call starts numba's import in a thread and returns
    at once through the numpy loops (the same bits); once the import is done, the numba loops
    run. ``ready()`` and CUPYCOLL_NUMBA=on wait for the import instead."""
    import threading

    real, gate = _accel._load, threading.Event()

    def held() -> Any:  # the import, held until the test lets it finish
        assert gate.wait(60)
        return real()

    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setattr(_accel, "_load", held)
    for name, value in (("_LOADED", None), ("_FAILED", False), ("_LOADER", None)):
        monkeypatch.setattr(_accel, name, value)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "auto")
    rng = np.random.default_rng(3)
    parts = [(np.sort(rng.choice(1000, 300, replace=False)), rng.standard_normal(300))
             for _ in range(3)]
    monkeypatch.setenv("CUPYCOLL_NUMBA", "off")
    want = P.merge_sorted(parts)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "auto")
    assert _accel.loops() is None and _accel._LOADER.is_alive()  # importing, not waited for
    same(P.merge_sorted(parts), want)
    loader = _accel._LOADER
    assert _accel.loops() is None and _accel._LOADER is loader  # one import thread
    gate.set()
    loader.join(60)
    assert _accel.loops() is not None and _accel._fast(0) is _accel.loops()
    same(P.merge_sorted(parts), want)
    monkeypatch.setattr(_accel, "_LOADED", None)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    assert _accel.loops() is not None  # on: imported here, waited for
    monkeypatch.setattr(_accel, "_LOADED", None)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "auto")
    assert _accel.ready() is not None and _accel._LOADED is not None


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("row", [(), (1,), (5,), (2, 3)])
def test_unfolded_rows_fold_where_they_land(monkeypatch, dtype, row):
    """Entries with duplicates, left unfolded: their keys are the sorted distinct indices;
    ``into`` writes each key's rows, the first copied and the others added in input order
    (-0 kept; NaN bits aside, which the sparse allreduce makes canonical), at its slot of a larger buffer and leaves every other
    row as it was; ``folded`` is coo_reduce's sum bit for bit."""
    from cupycoll.primitives import _unfolded

    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    rng = np.random.default_rng(len(row))
    idx = rng.zipf(1.3, 3000).clip(max=400) + 50  # hot rows repeat; span [51, 450]
    val = values(rng, dtype, (idx.size,) + row)
    unfolded = _unfolded.unfold(idx, val, np.dtype(dtype))
    sums: dict = {}
    with np.errstate(all="ignore"):
        for i, v in zip(idx.tolist(), val):
            sums[i] = sums[i] + v if i in sums else v.copy()
    keys = sorted(sums)
    assert unfolded.keys.tolist() == keys and unfolded.shape == (len(keys),) + row
    union = np.union1d(keys, np.arange(0, 600, 7))
    slots = np.searchsorted(union, keys)
    out = np.full((union.size,) + row, 7, dtype)
    assert unfolded.into(out, slots) is out
    want = np.full_like(out, 7)
    want[slots] = np.stack([sums[k] for k in keys])
    assert canonical(out).tobytes() == canonical(want).tobytes()
    flat = val.reshape(idx.size, -1) if row else val
    keys, summed = P.coo_reduce(idx, flat)
    same((unfolded.keys, unfolded.folded().reshape(summed.shape)), (keys, summed))
    assert _unfolded.unfold(idx[:0], val[:0], np.dtype(dtype)) is None
    assert _unfolded.unfold(np.array([0, 1 << 30]), val[:2], np.dtype(dtype)) is None


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_division_finding_specials_is_numpys_division(dtype):
    """An average's division and NaN check in one pass: numpy's ``/=`` bits; flags a NaN or an
    infinity among the quotients."""
    from cupycoll.primitives import _numba

    rng = np.random.default_rng(3)
    for special in (None, np.nan, -np.inf):
        v = values(rng, dtype, (999,))
        v[~np.isfinite(v)] = 1.0
        if special is not None:
            v[500] = special
        got, want = v.copy(), v.copy()
        assert _numba.divide_finding_specials(got, 3) == (special is not None)
        want /= 3
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("size", [2, 3, 4, 5, 8, 64, 1024, 1 << 20])
def test_division_by_a_power_of_two_is_numpys_division(dtype, size):
    """A power of two divides by multiplying with its inverse: numpy's ``/=`` bits all the same,
    on quotients that round to subnormals or to 0, on the largest and least values, +-0, NaN
    and infinities."""
    from cupycoll.primitives import _numba

    info = np.finfo(dtype)
    rng = np.random.default_rng([size, len(dtype)])
    tiny = (rng.random(400) * 2.0 ** -rng.integers(0, 60, 400)) * float(info.tiny)
    edges = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, float(info.max), -float(info.max),
             float(info.tiny), float(info.smallest_subnormal), -3 * float(info.smallest_subnormal)]
    v = np.concatenate([tiny, -tiny, values(rng, dtype, (400,)), edges]).astype(dtype)
    got, want = v.copy(), v.copy()
    assert _numba.divide_finding_specials(got, size)
    want /= size
    assert got.tobytes() == want.tobytes()


def canonical(a: np.ndarray) -> np.ndarray:
    """``a`` with every NaN as numpy's (its sign and payload follow the order of operands)."""
    return np.where(np.isnan(a), np.nan, a) if a.dtype.kind == "f" else a


def test_free_scratch_frees_what_every_thread_keeps():
    """The background worker of asynchronous calls keeps its own buffers (thread-local):
    free_scratch() in the caller's thread frees them too, not only its own; a thread's are let
    go with its Thread object."""
    import gc
    import threading

    from cupycoll.primitives import _numba as K

    loaded = _accel.ready() is not None  # numba's loops in use: free_scratch frees theirs too

    def worker_call() -> None:
        _accel.kept_buffer(1000, np.float32)
        if loaded:
            K._SCRATCH.idx = np.empty(10)  # as a merge on that thread keeps its temporaries

    def kept() -> int:
        every = _accel._KEPT._every[id(_accel._KEPT)].values()
        return sum(d.get("buffer") is not None for d in every) + sum(
            "idx" in d for d in K._SCRATCH._every.get(id(K._SCRATCH), {}).values())

    _accel.free_scratch()
    for _ in range(2):
        thread = threading.Thread(target=worker_call)
        thread.start()
        thread.join()
        _accel.kept_buffer(10, np.float32)
        assert kept() == 2 + loaded
        if _ == 0:
            del thread  # the thread's attributes go with its Thread object
            gc.collect()
            assert kept() == 1
    _accel.free_scratch()
    assert kept() == 0


def test_read_only_inputs_and_rows_of_no_element_take_the_numba_loops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only x (np.frombuffer) through the numba scans and the sampled top-k (their copy
    loop never writes x), and a merge of rows of no element, as the numpy loops give them."""
    rng = np.random.default_rng(5)
    x = np.frombuffer(values(rng, "float32", (70_000,)).tobytes(), np.float32)
    assert not x.flags.writeable
    for fn in (lambda: P.select_abs_ge(x, 2.0), lambda: P.topk_abs(x, 300),
               lambda: (P.kth_abs(x, 300),)):
        want, got = both(monkeypatch, fn)
        same(got, want)
    parts = [np.array([0, 2]), np.array([1, 2, 3])]
    rows = [np.zeros((2, 0), np.float32), np.zeros((3, 0), np.float32)]
    want, got = both(monkeypatch, lambda: P.merge_sorted(list(zip(parts, rows)), "sum"))
    same(got, want)
    assert got[0].tolist() == [0, 1, 2, 3] and got[1].shape == (4, 0)
