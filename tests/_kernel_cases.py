"""Seeded inputs for the kernel-backed primitives and a bitwise comparison with the numpy twins.

Shared by tests/test_kernels_cpu.py (kernels compiled for the CPU) and
tests/test_gpu_primitives.py (the same primitives on a CUDA device).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

VALUE_DTYPES = ("float16", "float32", "float64", "int32", "int64")
INDEX_DTYPES = ("int32", "int64")
OPS = ("sum", "prod", "max", "min")


def values(rng: np.random.Generator, dtype: str, shape: Any, special: bool = True) -> np.ndarray:
    """Random values with repeated magnitudes, and (``special``) NaN, +-0, inf or INT_MIN mixed in."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        x = (rng.integers(-8, 9, shape) * 0.25 + rng.standard_normal(shape) * (rng.random(shape) < 0.5))
        x = x.astype(dt)
        if special and x.size >= 6:
            flat = x.reshape(-1)
            pos = rng.choice(flat.size, 5, replace=False)
            flat[pos] = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf], dt)
        return x
    x = rng.integers(-20, 21, shape).astype(dt)
    if special and x.size >= 3:
        flat = x.reshape(-1)
        info = np.iinfo(dt)
        flat[rng.choice(flat.size, 2, replace=False)] = [info.min, info.max]
    return x


def threshold_cases() -> Iterator[tuple[str, str, tuple, dict]]:
    """(primitive, id, args, kwargs) for count_abs_ge / select_abs_ge."""
    rng = np.random.default_rng(1)
    for dtype in VALUE_DTYPES:
        for n in (0, 1, 7, 300):
            x = values(rng, dtype, n)
            finite = np.abs(x[np.isfinite(x)].astype(np.float64)) if n else np.zeros(0)
            ts = [0, 0.7, np.float32(0.7), 2.5, np.int64(3), -1.0, float("nan"), float("inf"),
                  -float("inf"), 2**31, 2**31 + 1, 2**63 + 5, 1e300, np.array(0.25)]
            if finite.size:
                ts += [float(np.median(finite)), float(finite.max())]
            for t in ts:
                for name in ("count_abs_ge", "select_abs_ge"):
                    yield name, f"{dtype}-n{n}-t{t}", (x, t), {}


def topk_cases() -> Iterator[tuple[str, str, tuple, dict]]:
    """(primitive, id, args, kwargs) for kth_abs / topk_abs, with ties, NaN and all-equal inputs."""
    rng = np.random.default_rng(2)
    for dtype in VALUE_DTYPES:
        dt = np.dtype(dtype)
        inputs = {"random": values(rng, dtype, 300), "one": values(rng, dtype, 1),
                  "equal": np.where(rng.random(40) < 0.5, 3, -3).astype(dt)}
        if dt.kind == "f":
            inputs["nan"] = np.array([np.nan, 1, np.nan, -2, 0, np.nan], dt)
        for label, x in inputs.items():
            for k in sorted({1, 2, x.size // 2, x.size - 1, x.size} & set(range(1, x.size + 1))):
                for name in ("kth_abs", "topk_abs"):
                    yield name, f"{dtype}-{label}-k{k}", (x, k), {}


def _coo(rng: np.random.Generator, dtype: str, itype: str, m: int, n: int, width: int):
    idx = rng.integers(0, n, m).astype(itype)
    shape = (m,) if width == 0 else (m, width)
    return idx, values(rng, dtype, shape)


def reduce_cases() -> Iterator[tuple[str, str, tuple, dict]]:
    """(primitive, id, args, kwargs) for coo_reduce and merge_sorted."""
    rng = np.random.default_rng(3)
    for dtype in VALUE_DTYPES:
        for op in OPS:
            for width in (0, 3):
                for itype in INDEX_DTYPES:
                    idx, val = _coo(rng, dtype, itype, 200, 40, width)
                    yield "coo_reduce", f"{dtype}-{op}-w{width}-{itype}", (idx, val), \
                        {"op": op, "n": 40}
                    parts = []
                    for p in range(3):
                        ptype = itype if itype == "int32" else INDEX_DTYPES[p % 2]  # mixed
                        i, v = _coo(rng, dtype, ptype, 30, 60, width)
                        keep = np.unique(i, return_index=True)[1]
                        parts.append((i[keep], v[keep]))
                    yield "merge_sorted", f"{dtype}-{op}-w{width}-{itype}", (parts,), {"op": op}
        idx, val = _coo(rng, dtype, "int64", 0, 5, 0)
        yield "coo_reduce", f"{dtype}-empty", (idx, val), {}
    for dtype in ("float16", "float32", "float64"):  # +0/-0 ties in every order
        for op in ("max", "min"):
            idx = rng.integers(0, 12, 120).astype("int32")
            zeros = rng.choice(np.array([0.0, -0.0, -0.0, np.nan], dtype), 120,
                               p=[.45, .45, .05, .05])
            yield "coo_reduce", f"{dtype}-{op}-signed-zeros", (idx, zeros), {"op": op}
            dense = rng.choice(np.array([0.0, -0.0], dtype), 12)
            yield "scatter_reduce", f"{dtype}-{op}-signed-zeros", (dense, idx, zeros), {"op": op}
            yield "scatter_reduce", f"{dtype}-{op}-signed-zeros-unique", \
                (dense, np.arange(12, dtype="int64"), zeros[:12]), {"op": op}
    for dtype in ("float16", "float32", "float64"):  # sums whose bits depend on the fold order
        idx = rng.integers(0, 4, 400).astype("int64")
        val = (rng.standard_normal(400) * 10.0 ** rng.uniform(-3, 3, 400)).astype(dtype)
        yield "coo_reduce", f"{dtype}-sum-fold-order", (idx, val), {}
    for dtype, acc in (("float16", "float32"), ("int32", "int64"), ("float32", "float64")):
        idx, val = _coo(rng, dtype, "int32", 300, 10, 0)
        yield "coo_reduce", f"{dtype}-acc-{acc}", (idx, val), {"accumulate_dtype": acc}


def _hot_lengths(block: int, hot: int) -> list[int]:
    """Run lengths in sorted-index order around the kernel's long-run cut (4 per thread of a
    ``block``-thread block), long runs side by side across tile boundaries, and one ``hot`` run."""
    cut = 4 * block
    return [1, 2, cut, cut + 1, cut - 1, hot, 3, cut, cut + 2, 1, 2 * cut + 5, block, cut - 2]


def _hot_values(rng: np.random.Generator, dtype: str, op: str, shape: tuple,
                variant: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if variant == "zeros":  # +-0 only: the sign of a folded max/min depends on every element
        return rng.choice(np.array([0.0, -0.0], dt), shape, p=[0.001, 0.999])
    if op == "prod":  # odd integers wrap without collapsing to 0; float products stay finite-ish
        if dt.kind == "i":
            return (2 * rng.integers(-4, 4, shape) + 1).astype(dt)
        return rng.choice(np.array([1.0, -1.0, 0.5, 2.0, 1.25, 0.8], dt), shape)
    return values(rng, dtype, shape, special=variant == "special")


def hot_cases(block: int = 3, hot: int = 100_000) -> Iterator[tuple[str, str, tuple, dict]]:
    """(primitive, id, args, kwargs): one hot index repeated ``hot`` times among runs just below,
    at and above the length where a block folds a run together, in shuffled input order, for
    coo_reduce, scatter_reduce and merge_sorted, every dtype and op."""
    rng = np.random.default_rng(7)
    lengths = _hot_lengths(block, hot)
    keys = 3 * np.arange(len(lengths)) + 2
    for dtype in VALUE_DTYPES:
        variants = ("special", "plain", "zeros") if dtype.startswith("float") else ("plain",)
        for op in OPS:
            for variant in variants if op in ("max", "min") else ("plain",):
                for width in (0, 3):
                    n = 0 if width == 0 else min(hot, 5000)  # rows: a shorter hot run
                    lens = [n if length == hot and n else length for length in lengths]
                    idx = rng.permutation(np.repeat(keys, lens)).astype("int64")
                    shape = (idx.size,) + ((width,) if width else ())
                    val = _hot_values(rng, dtype, op, shape, variant)
                    label = f"{dtype}-{op}-{variant}-w{width}"
                    yield "coo_reduce", label, (idx, val), {"op": op}
                    dense = _hot_values(rng, dtype, op, (int(keys[-1]) + 1,) + shape[1:], variant)
                    yield "scatter_reduce", label, (dense, idx.astype("int32"), val), {"op": op}
                parts = []
                for p in range(4 * block + 3):  # key 5 in every part: a run of that many
                    i = np.unique(np.append(rng.integers(0, 40, 6), 5))
                    parts.append((i, _hot_values(rng, dtype, op, (i.size,), variant)))
                yield "merge_sorted", f"{dtype}-{op}-{variant}", (parts,), {"op": op}


def dense_cases() -> Iterator[tuple[str, str, tuple, dict]]:
    """(primitive, id, args, kwargs) for scatter_reduce, gather and densify."""
    rng = np.random.default_rng(4)
    for dtype in VALUE_DTYPES:
        for itype in INDEX_DTYPES:
            for width in (0, 2):
                rows = () if width == 0 else (width,)
                dense = values(rng, dtype, (50,) + rows)
                for op in OPS:
                    for order in ("unique", "repeated"):
                        if order == "unique":
                            idx = np.sort(rng.choice(50, 20, replace=False)).astype(itype)
                        else:
                            idx = rng.integers(0, 50, 120).astype(itype)
                        val = values(rng, dtype, (idx.size,) + rows)
                        yield "scatter_reduce", f"{dtype}-{itype}-w{width}-{op}-{order}", \
                            (dense.copy(), idx, val), {"op": op}
                idx = rng.integers(0, 50, 30).astype(itype)
                yield "gather", f"{dtype}-{itype}-w{width}", (dense, idx), {}
                yield "densify", f"{dtype}-{itype}-w{width}", \
                    (idx, values(rng, dtype, (30,) + rows)), {"n": 50}
        # non-contiguous dense arrays: every-other element, every-third row, every-other column
        for label, dense in (("strided", values(rng, dtype, 40)[::2]),
                             ("row-strided", values(rng, dtype, (30, 3))[::3]),
                             ("column-strided", values(rng, dtype, (12, 6))[:, ::2])):
            idx = np.array([3, 1, 3, 0, 9, 3], "int64")
            for op in OPS:
                val = values(rng, dtype, (idx.size,) + dense.shape[1:], special=False)
                yield "scatter_reduce", f"{dtype}-{label}-dense-{op}", (dense, idx, val), \
                    {"op": op}
            uniq = np.array([0, 4, 7], "int32")
            yield "scatter_reduce", f"{dtype}-{label}-dense-unique", \
                (dense, uniq, values(rng, dtype, (3,) + dense.shape[1:])), {"op": "max"}
            yield "gather", f"{dtype}-{label}-dense", (dense, idx), {}


def error_cases() -> Iterator[tuple[str, str, tuple, dict]]:
    """(primitive, id, args, kwargs) that every implementation must reject with the same error."""
    x = np.arange(5, dtype=np.float32)
    idx, val = np.array([0, 3], np.int64), np.ones(2, np.float32)
    yield "kth_abs", "k0", (x, 0), {}
    yield "topk_abs", "k-too-big", (x, 6), {}
    for name, arg in (("kth_abs", 1), ("topk_abs", 1), ("count_abs_ge", 1.0),
                      ("select_abs_ge", 1.0)):  # every selection names its argument
        yield name, "bad-dtype", (x.astype(np.int8), arg), {}
        yield name, "2-d", (x.reshape(1, 5), arg), {}
    yield "coo_reduce", "length-mismatch", (idx, np.ones(3, np.float32)), {}
    yield "coo_reduce", "avg", (idx, val), {"op": "avg"}
    yield "coo_reduce", "out-of-range", (idx, val), {"n": 3}
    yield "coo_reduce", "negative", (np.array([-1, 2]), val), {}
    yield "coo_reduce", "float-indices", (idx.astype(np.float16), val), {}
    yield "merge_sorted", "unsorted-part", ([(np.array([2, 1]), val)],), {}
    yield "merge_sorted", "dtype-mismatch", ([(idx, val), (idx, val.astype(np.float64))],), {}
    yield "scatter_reduce", "out-of-range", (np.zeros(3, np.float32), idx, val), {}
    yield "scatter_reduce", "dtype-mismatch", (np.zeros(5, np.float64), idx, val), {}
    yield "gather", "out-of-range", (x, np.array([5])), {}
    yield "gather", "bad-dtype", (x.astype(np.int8), np.array([1])), {}
    yield "gather", "bad-indices", (x, np.array([1.0])), {}
    yield "densify", "out-of-range", (idx, val, 2), {}


def assert_same(got: Any, want: Any, where: str = "") -> None:
    """Assert identical results: same types, dtypes, shapes and bits (any NaN matches any NaN)."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), where
        for g, w in zip(got, want):
            assert_same(g, w, where)
        return
    if isinstance(want, int):
        assert type(got) is int and got == want, f"{where}: {got!r} != {want!r}"
        return
    got_a, want_a = np.asarray(got), np.asarray(want)
    assert type(got) is type(want) or isinstance(want, np.ndarray), \
        f"{where}: type {type(got)} != {type(want)}"
    assert got_a.dtype == want_a.dtype, f"{where}: dtype {got_a.dtype} != {want_a.dtype}"
    assert got_a.shape == want_a.shape, f"{where}: shape {got_a.shape} != {want_a.shape}"
    if want_a.dtype.kind == "f":
        nan = np.isnan(want_a)
        assert np.array_equal(np.isnan(got_a), nan), f"{where}: NaN positions differ"
        got_a, want_a = got_a[~nan], want_a[~nan]
        bits = f"u{want_a.dtype.itemsize}"
        got_a, want_a = got_a.view(bits), want_a.view(bits)
    bad = np.flatnonzero(got_a.reshape(-1) != want_a.reshape(-1))
    assert bad.size == 0, (f"{where}: {bad.size} elements differ, first at {bad[0]}: "
                           f"{got_a.reshape(-1)[bad[0]]!r} != {want_a.reshape(-1)[bad[0]]!r}")
