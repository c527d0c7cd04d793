"""Benchmark the numpy primitives against plain-numpy references, side by side in one run.

Single process, CPU. Every case and its reference run interleaved (one of each per repetition)
and the table reports medians and the speedup = reference time / primitive time:

    python bench/dev/bench_primitives.py                 # n = 2**24 float32, density 1 %
    python bench/dev/bench_primitives.py --json out.json
    python bench/dev/bench_primitives.py --impl numpy   # only the numpy twins (default: both)

Each primitive is measured with the numpy loops (CUPYCOLL_NUMBA=off) and, when numba is
installed, with the numba loops on one thread (impl ``numba1``: CUPYCOLL_THREADS=1) and on the
default threads (impl ``numba``: CUPYCOLL_THREADS=auto, all CPUs of a process alone on its node),
interleaved in the same repetitions.

The ``dense pass`` rows time the ``dense`` sparse algorithm's host work at 1/10/50% density
against the plain-numpy fill, scan and gather it replaced (docs/tuning.md); the ``densify``
rows the dense output's write of sorted entries into zeros (``sparse.dense.densify_into``) at
1/10/25/50% against a numpy fill and fancy assignment; the ``average`` rows an average's
division with its NaN check (``canonical_nan(values, P)``) at P = 2, 3, 4 against numpy's; the
``nan check`` rows a sum's check of its result (``canonical_nan(values)``) against
``isnan(values).any()``; the ``positions_in`` rows mask's lookup of one rank's indices in the
union of P ranks' (each 5% of n) against ``searchsorted``.

Targets (issue 3): select_abs_ge <= 3x the time of x.copy() (speedup >= 0.33) and >= 10x faster
than an np.argpartition top-k; merge_sorted of 4 x 2**18 parts >= 3x faster than
np.unique(np.concatenate(...), return_inverse=True) + np.add.at.
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from _common import (IMPLS, Parser, Table, implementations, measure, positive_int,  # noqa: E402
                     under)
from cupycoll import primitives as P  # noqa: E402

COLUMNS = ["primitive", "impl", "case", "time(ms)", "reference", "ref(ms)", "speedup", "target",
           "#wrong"]


def argpartition_topk(x: np.ndarray, k: int) -> np.ndarray:
    """The usual numpy top-k: indices of the k largest |x| (unordered)."""
    return np.argpartition(np.abs(x), x.size - k)[x.size - k:]


def unique_coalesce(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The usual numpy coalescing: np.unique with inverse, then np.add.at."""
    idx = np.concatenate([i for i, _ in parts])
    val = np.concatenate([v for _, v in parts])
    uniq, inverse = np.unique(idx, return_inverse=True)
    out = np.zeros((uniq.size, *val.shape[1:]), val.dtype)
    np.add.at(out, inverse, val)
    return uniq, out


def sorted_parts(rng: np.random.Generator, n_parts: int, k: int, universe: int,
                 dtype: np.dtype) -> list[tuple[np.ndarray, np.ndarray]]:
    parts = []
    for _ in range(n_parts):
        idx = np.sort(rng.choice(universe, size=k, replace=False)).astype(np.int32)
        parts.append((idx, rng.standard_normal(k).astype(dtype)))
    return parts


def bench_threshold(table: Table, x: np.ndarray, k: int, reps: int, check: bool,
                    impls: list[str]) -> None:
    t = P.kth_abs(x, k)
    fns: dict[str, Callable[[], Any]] = {"copy": x.copy,
                                         "argpartition": lambda: argpartition_topk(x, k)}
    for impl in impls:
        fns.update({f"select {impl}": under(impl, lambda: P.select_abs_ge(x, t)),
                    f"count {impl}": under(impl, lambda: P.count_abs_ge(x, t)),
                    f"topk {impl}": under(impl, lambda: P.topk_abs(x, k)),
                    f"kth {impl}": under(impl, lambda: P.kth_abs(x, k))})
    times = measure(fns, reps)
    case = f"n=2^{int(np.log2(x.size))} {x.dtype} k={k}"
    for impl in impls:
        wrong_select = wrong_topk = 0
        if check:
            want = np.flatnonzero(np.abs(x) >= t)
            wrong_select = int(not np.array_equal(under(impl, lambda: P.select_abs_ge(x, t))()[0],
                                                  want))
            got = under(impl, lambda: P.topk_abs(x, k))()[0]
            wrong_topk = int(not np.array_equal(got, np.sort(argpartition_topk(x, k))))
        rows = [("select_abs_ge", "copy", times[f"select {impl}"], times["copy"],
                 ">= 0.33 (<= 3x copy)", wrong_select),
                ("select_abs_ge", "argpartition", times[f"select {impl}"], times["argpartition"],
                 ">= 10", wrong_select),
                ("count_abs_ge", "copy", times[f"count {impl}"], times["copy"], "", 0),
                ("kth_abs", "argpartition", times[f"kth {impl}"], times["argpartition"], "", 0),
                ("topk_abs", "argpartition", times[f"topk {impl}"], times["argpartition"], "",
                 wrong_topk)]
        for name, ref, mine, theirs, target, wrong in rows:
            table.add({"primitive": name, "impl": impl, "case": case, "time(ms)": mine * 1e3,
                       "reference": ref, "ref(ms)": theirs * 1e3, "speedup": theirs / mine,
                       "target": target, "#wrong": wrong})


def bench_merge(table: Table, rng: np.random.Generator, n_parts: int, k: int, universe: int,
                reps: int, check: bool, impls: list[str]) -> None:
    parts = sorted_parts(rng, n_parts, k, universe, np.dtype(np.float32))
    fns = {impl: under(impl, lambda: P.merge_sorted(parts)) for impl in impls}
    times = measure({**fns, "unique": lambda: unique_coalesce(parts)}, reps)
    for impl in impls:
        wrong = 0
        if check:
            got, want = fns[impl](), unique_coalesce(parts)
            wrong = int(not (np.array_equal(got[0], want[0])
                             and np.allclose(got[1], want[1], rtol=1e-5, atol=1e-5)))
        table.add({"primitive": "merge_sorted", "impl": impl,
                   "case": f"P={n_parts} k=2^{int(np.log2(k))} in 2^{int(np.log2(universe))}",
                   "time(ms)": times[impl] * 1e3, "reference": "unique+add.at",
                   "ref(ms)": times["unique"] * 1e3, "speedup": times["unique"] / times[impl],
                   "target": ">= 3" if n_parts == 4 and universe > n_parts * k else "",
                   "#wrong": wrong})


def bench_positions(table: Table, rng: np.random.Generator, parts: int, k: int, universe: int,
                    reps: int, check: bool, impls: list[str]) -> None:
    """mask's lookup of one rank's indices in the union of ``parts`` ranks' (``positions_in``)
    against numpy's ``searchsorted``."""
    from cupycoll.sparse._common import positions_in

    sets = [idx for idx, _ in sorted_parts(rng, parts, k, universe, np.dtype(np.float32))]
    union = np.unique(np.concatenate(sets))
    fns = {impl: under(impl, lambda: positions_in(union, sets[0])) for impl in impls}
    times = measure({**fns, "searchsorted": lambda: np.searchsorted(union, sets[0])}, reps)
    for impl in impls:
        wrong = int(check and not np.array_equal(fns[impl](), np.searchsorted(union, sets[0])))
        table.add({"primitive": "positions_in", "impl": impl,
                   "case": f"P={parts} k=2^{int(np.log2(k))} in 2^{int(np.log2(universe))}",
                   "time(ms)": times[impl] * 1e3, "reference": "searchsorted",
                   "ref(ms)": times["searchsorted"] * 1e3,
                   "speedup": times["searchsorted"] / times[impl], "target": "",
                   "#wrong": wrong})


def bench_coo(table: Table, rng: np.random.Generator, cases: list[tuple[str, np.ndarray,
              np.ndarray]], reps: int, check: bool, impls: list[str]) -> None:
    """``coo_reduce`` of unsorted entries with duplicates against numpy's unique + add.at."""
    for label, idx, val in cases:
        fns = {impl: under(impl, lambda: P.coo_reduce(idx, val)) for impl in impls}
        times = measure({**fns, "unique": lambda: unique_coalesce([(idx, val)])}, reps)
        for impl in impls:
            wrong = 0
            if check:
                got, want = fns[impl](), unique_coalesce([(idx, val)])
                wrong = int(not (np.array_equal(got[0], want[0])
                                 and np.allclose(got[1], want[1], rtol=1e-5, atol=1e-5)))
            table.add({"primitive": "coo_reduce", "impl": impl, "case": label,
                       "time(ms)": times[impl] * 1e3, "reference": "unique+add.at",
                       "ref(ms)": times["unique"] * 1e3, "speedup": times["unique"] / times[impl],
                       "target": "", "#wrong": wrong})


def coo_cases(rng: np.random.Generator, count: int, universe: int) -> list:
    """Uniform entries over the whole range, and an embedding gradient's: 16,768 Zipf rows of
    64 float32 over 2^18 rows (a quarter of them distinct)."""
    uniform = (rng.integers(0, universe, size=count).astype(np.int32),
               rng.standard_normal(count).astype(np.float32))
    rows = 1 << 18
    zipf = rng.permutation(rows)[np.minimum(rng.zipf(1.1, 16768), rows) - 1].astype(np.int64)
    return [(f"{count} unsorted in 2^{int(np.log2(universe))}", *uniform),
            ("16768x64 zipf in 2^18", zipf,
             rng.standard_normal((zipf.size, 64)).astype(np.float32))]


def fill_scan_take(idx: np.ndarray, val: np.ndarray, n: int) -> np.ndarray:
    """The plain-numpy host pass of a sparse-as-dense call: fill -0, scatter, find the entries
    that are not -0, gather them."""
    full = np.full(n, -0.0, val.dtype)
    full[idx] = val
    union = np.flatnonzero(full.view(np.uint32) != np.uint32(1 << 31))
    np.take(full, union)
    return union


def bench_dense_pass(table: Table, rng: np.random.Generator, n: int, reps: int, check: bool,
                     impls: list[str]) -> None:
    """The ``dense`` sparse algorithm's host work (``sparse.dense.local_pass``: densify into the
    kept -0 buffer, union scan, restore) against the plain-numpy fill, scan and gather."""
    from cupycoll.sparse.dense import local_pass

    for density in (0.01, 0.1, 0.5):
        idx = np.sort(rng.choice(n, int(n * density), replace=False)).astype(np.int32)
        val = rng.standard_normal(idx.size).astype(np.float32)
        fns = {impl: under(impl, lambda: local_pass(idx, val, n)) for impl in impls}
        times = measure({**fns, "plain": lambda: fill_scan_take(idx, val, n)}, reps)
        for impl in impls:
            wrong = int(check and not np.array_equal(fns[impl](), idx))
            table.add({"primitive": "dense pass", "impl": impl,
                       "case": f"{density:.0%} of 2^{int(np.log2(n))}",
                       "time(ms)": times[impl] * 1e3, "reference": "fill+scan+take",
                       "ref(ms)": times["plain"] * 1e3, "speedup": times["plain"] / times[impl],
                       "target": "", "#wrong": wrong})


def fill_assign(out: np.ndarray, idx: np.ndarray, val: np.ndarray) -> None:
    """The plain-numpy densify: zeros, then a fancy assignment."""
    out.fill(0)
    out[idx] = val


def bench_densify(table: Table, rng: np.random.Generator, n: int, reps: int, check: bool,
                  impls: list[str]) -> None:
    """A dense output's densify pass (``sparse.dense.densify_into``) against numpy's."""
    from cupycoll.sparse.dense import densify_into

    out, ref = np.empty(n, np.float32), np.empty(n, np.float32)
    for density in (0.01, 0.1, 0.25, 0.5):
        idx = np.sort(rng.choice(n, int(n * density), replace=False)).astype(np.int32)
        val = rng.standard_normal(idx.size).astype(np.float32)
        fns = {impl: under(impl, lambda: densify_into(out, idx, val)) for impl in impls}
        times = measure({**fns, "plain": lambda: fill_assign(ref, idx, val)}, reps)
        for impl in impls:
            fns[impl]()
            wrong = int(check and not np.array_equal(out, ref))
            table.add({"primitive": "densify", "impl": impl,
                       "case": f"{density:.0%} of 2^{int(np.log2(n))}",
                       "time(ms)": times[impl] * 1e3, "reference": "fill+assign",
                       "ref(ms)": times["plain"] * 1e3, "speedup": times["plain"] / times[impl],
                       "target": "", "#wrong": wrong})


def divided(out: np.ndarray, src: np.ndarray, size: int) -> None:
    """numpy's average: a fresh copy of ``src`` divided by ``size`` in place."""
    np.copyto(out, src)
    out /= size


def bench_average(table: Table, rng: np.random.Generator, n: int, reps: int, check: bool,
                  impls: list[str]) -> None:
    """An average's division with the NaN check (``canonical_nan(values, P)``, a fresh copy of
    the values each call) against numpy's copy and ``/=``, at P = 2, 3, 4: a power of two
    multiplies by its inverse (the same bits)."""
    from cupycoll.primitives._numpy_reduce import canonical_nan

    src = rng.standard_normal(n // 8).astype(np.float32)
    out, ref = np.empty_like(src), np.empty_like(src)
    for size in (2, 3, 4):
        fns = {impl: under(impl, lambda: canonical_nan(np.copyto(out, src) or out, size))
               for impl in impls}
        times = measure({**fns, "plain": lambda: divided(ref, src, size)}, reps)
        for impl in impls:
            fns[impl]()
            wrong = int(check and out.tobytes() != ref.tobytes())
            table.add({"primitive": "average", "impl": impl,
                       "case": f"2^{int(np.log2(src.size))} / {size}",
                       "time(ms)": times[impl] * 1e3, "reference": "copy+/=",
                       "ref(ms)": times["plain"] * 1e3, "speedup": times["plain"] / times[impl],
                       "target": "", "#wrong": wrong})


def bench_nan_check(table: Table, rng: np.random.Generator, n: int, reps: int, check: bool,
                    impls: list[str]) -> None:
    """A sum's NaN check of its result (``canonical_nan(values)``: a read of the bits, no NaN
    here, so nothing written) against numpy's ``isnan(values).any()``, on rows of 64 float32
    (a reduced embedding gradient's: 2^12 to 2^15 of them)."""
    from cupycoll.primitives._numpy_reduce import canonical_nan

    for log2rows in (12, 15):
        src = rng.standard_normal((1 << log2rows, 64)).astype(np.float32)
        fns = {impl: under(impl, lambda: canonical_nan(src)) for impl in impls}
        times = measure({**fns, "plain": lambda: bool(np.isnan(src).any())}, reps)
        for impl in impls:
            wrong = int(check and canonical_nan(src) is not src)
            table.add({"primitive": "nan check", "impl": impl, "case": f"2^{log2rows} x 64",
                       "time(ms)": times[impl] * 1e3, "reference": "isnan.any",
                       "ref(ms)": times["plain"] * 1e3, "speedup": times["plain"] / times[impl],
                       "target": "", "#wrong": wrong})


def table_grid(reps: int) -> int:
    """``coo_reduce``'s two sum paths side by side over index spans 2^14-2^24, 1-256 slots an
    entry, widths 1-64 (the data of ``_numpy_reduce.TABLE_*``): the table / the sort."""
    from cupycoll.primitives import _numpy_reduce as R

    rng, kept = np.random.default_rng(0), (R.TABLE_SPAN, R.TABLE_PER_ENTRY)
    print(f"{'span':>10} {'entries':>9} {'width':>5} {'table(ms)':>10} {'sort(ms)':>9} "
          f"{'table/sort':>10}")
    try:
        for width, span_log, per in itertools.product((1, 2, 8, 64), range(14, 25, 2),
                                                      (1, 2, 4, 16, 64, 256)):
            span, entries = 1 << span_log, (1 << span_log) // per
            if entries < 1 << 14 or entries * width > 1 << 24:
                continue
            idx = rng.integers(0, span, entries)
            val = rng.standard_normal((entries, width)[:1 + (width > 1)]).astype(np.float32)
            times = measure({"table": lambda: bounded(1 << 40, idx, val),
                             "sort": lambda: bounded(0, idx, val)}, reps)
            print(f"{span:>10} {entries:>9} {width:>5} {times['table'] * 1e3:>10.2f} "
                  f"{times['sort'] * 1e3:>9.2f} {times['table'] / times['sort']:>10.2f}")
    finally:
        R.TABLE_SPAN, R.TABLE_PER_ENTRY = kept
    return 0


def bounded(bound: int, idx: np.ndarray, val: np.ndarray) -> Any:
    """``coo_reduce`` with every table bound set to ``bound`` (0: the sort path only)."""
    from cupycoll.primitives import _numpy_reduce as R

    R.TABLE_SPAN = R.TABLE_PER_ENTRY = bound
    return P.coo_reduce(idx, val)


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--log2n", type=int, default=24, help="dense length n = 2**log2n (float32)")
    p.add_argument("--density", type=float, default=0.01, help="k / n of the threshold cases")
    p.add_argument("--log2k", type=int, default=18, help="entries per merged part, 2**log2k")
    p.add_argument("--reps", type=positive_int, default=7, help="repetitions (median reported)")
    p.add_argument("-c", "--check", type=int, default=1, help="check results (1) or not (0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--impl", choices=("both", *IMPLS), default="both",
                   help="numpy loops, numba loops (numba1: on one thread), or all side by side")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON to PATH ('-' = stdout)")
    p.add_argument("--csv", metavar="PATH", help="write the rows as CSV to PATH ('-' = stdout)")
    p.add_argument("--coo-table-grid", action="store_true",
                   help="only coo_reduce's table and sort paths over a grid of spans and widths")
    args = p.parse_args(argv)
    if args.coo_table_grid:
        return table_grid(args.reps)

    rng = np.random.default_rng(args.seed)
    n, k = 1 << args.log2n, 1 << args.log2k
    x = rng.standard_normal(n).astype(np.float32)
    table = Table(COLUMNS, rank=0)
    table.widths = [14, 7, 28, 10, 15, 10, 9, 22, 7]
    impls = implementations(args.impl)
    table.header(f"cupycoll primitives, numpy {np.__version__}, median of {args.reps}; "
                 "speedup = ref(ms) / time(ms)")
    bench_threshold(table, x, max(1, int(n * args.density)), args.reps, bool(args.check), impls)
    for n_parts in (4, 8):
        bench_merge(table, rng, n_parts, k, n, args.reps, bool(args.check), impls)
    for n_parts in (4, 8):
        bench_merge(table, rng, n_parts, k, 2 * k, args.reps, bool(args.check), impls)
    bench_coo(table, rng, coo_cases(rng, 4 * k, n), args.reps, bool(args.check), impls)
    for parts in (2, 4):
        bench_positions(table, rng, parts, k, 20 * k, args.reps, bool(args.check), impls)
    bench_dense_pass(table, rng, n, args.reps, bool(args.check), impls)
    bench_densify(table, rng, n, args.reps, bool(args.check), impls)
    bench_average(table, rng, n, args.reps, bool(args.check), impls)
    bench_nan_check(table, rng, n, args.reps, bool(args.check), impls)
    return table.finish(args, {"n": n, "density": args.density, "k_per_part": k,
                               "reps": args.reps, "impls": impls, "cpus": os.cpu_count()})


if __name__ == "__main__":
    sys.exit(main())
