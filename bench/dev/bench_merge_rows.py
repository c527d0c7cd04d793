"""recursive_doubling's merge of two ranks' entries, measured against the time model, by row width.

Single process, CPU. For each row width (0 = 1-D values), two sorted index sets of ``k`` entries
each (drawn from ``n``) with float32 rows are merged and summed as recursive doubling merges
them at P = 2 (``sparse._common.reduce_parts``, the numba loops when numba runs), and the model
prices the same merge (``recursive_doubling``'s merge units at P = 2, ``MERGE_UNITS``, times
the profile's gamma: ``tuner.predict.local_time``):

    python bench/dev/bench_merge_rows.py                       # k = 8192, n = 409600
    python bench/dev/bench_merge_rows.py --widths 0,1,4,16,64 --k 65536
    CUPYCOLL_PROFILE=prof.json python bench/dev/bench_merge_rows.py

``meas/model`` divided by the 1-D row's (``x 1-D``) cancels the machine's speed against the
profile's: where it is above 1 the model prices that width's merge low relative to a 1-D merge,
below 1 high. ``k-way`` and ``2-way``: numba's two loops on the same parts (the k-way loop
and the two-way merge ``merge_sorted`` chooses between, ``_numpy_few.chained_first``).
Medians (``--stat min``: minima) of ``--repeats`` calls, after the numba loops are loaded.
``--parts 3`` (up to ``CHAIN_PARTS``) times the two loops on that many parts, the two-way
merge chained in part order (``_numpy_few.two_summed``), and prints no model (the model's merge
is recursive doubling's, of two parts):

    CUPYCOLL_THREADS=1 python bench/dev/bench_merge_rows.py --parts 3 --widths 2,4,16,64
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from cupycoll._arguments import positive_int
from cupycoll._config import setting
from cupycoll._types import ReduceOp
from cupycoll.primitives import _accel
from cupycoll.primitives._numpy_few import CHAIN_PARTS, two_summed
from cupycoll.sparse._common import reduce_parts
from cupycoll.sparse._cost import Shape
from cupycoll.tuner.predict import local_time, work
from cupycoll.tuner.profile import load_profile


#: the units of recursive doubling's work model that price its merge (``row`` is its pack).
MERGE_UNITS = ("merge2", "fold2")


def loops_ready(seconds: float = 60.0) -> str:
    """Wait for numba's loops (imported in the background under CUPYCOLL_NUMBA=auto)."""
    end = time.monotonic() + (seconds if setting("CUPYCOLL_NUMBA") != "off" else 0.0)
    while _accel.loops() is None and time.monotonic() < end:
        time.sleep(0.1)
    return "numba" if _accel.loops() is not None else "numpy"


def ranks_parts(k: int, n: int, width: int, rng, count: int = 2
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` ranks' entries: ``k`` sorted indices of ``n`` each, float32 rows of
    ``width``."""
    row = (k, width) if width else (k,)
    return [(np.sort(rng.choice(n, k, replace=False)).astype(np.int32),
             rng.standard_normal(row).astype(np.float32)) for _ in range(count)]


def seconds(call, sets: list, repeats: int, stat=np.median) -> float:
    """``stat`` (median, or min on a busy machine) of ``call(parts)``'s seconds over
    ``repeats`` calls, cycling through ``sets`` (each one call's arguments)."""
    times = []
    for i in range(repeats):
        parts = sets[i % len(sets)]
        start = time.perf_counter()
        call(parts)
        times.append(time.perf_counter() - start)
    return float(stat(times))


def loop_seconds(sets: list, repeats: int, stat=np.median) -> tuple[float, float] | None:
    """Seconds (``stat`` of ``repeats`` calls over ``sets`` of parts) of numba's k-way loop
    and of its two-way merge (chained in part order beyond two parts), the two loops
    ``merge_sorted`` chooses between, or None without numba."""
    loops = _accel.loops()
    if loops is None:
        return None
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    split = [([i for i, _ in parts], [v for _, v in parts]) for parts in sets]  # untimed
    return (seconds(lambda both: loops.merge(*both, np.add, f32, i32), split, repeats, stat),
            seconds(lambda both: two_summed(*both, f32, i32), split, repeats, stat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", default="0,1,2,4,8,16,32,64")
    parser.add_argument("--k", type=positive_int, default=8192, help="entries of each rank")
    parser.add_argument("--n", type=positive_int, default=409600, help="dense length (rows)")
    parser.add_argument("--repeats", type=positive_int, default=40)
    parser.add_argument("--sets", type=positive_int, default=8,
                        help="draws of the parts the calls cycle through")
    parser.add_argument("--stat", choices=("median", "min"), default="median",
                        help="of the repeats (min: the least disturbed call)")
    parser.add_argument("--parts", type=int, default=2, choices=range(2, CHAIN_PARTS + 1),
                        help="ranks' parts merged (as many as the chain takes)")
    args = parser.parse_args()
    stat = np.median if args.stat == "median" else np.min
    if args.k > args.n:  # k distinct indices of n
        parser.error(f"--k ({args.k}) must be at most --n ({args.n})")
    profile = load_profile(None, size=2)
    rng = np.random.default_rng(0)
    print(f"# loops: {loops_ready()}, profile: {profile.name}, k = {args.k}, n = {args.n}, "
          f"parts = {args.parts}")
    print(f"# {'width':>5} {'meas(us)':>10} {'model(us)':>10} {'meas/model':>11} {'x 1-D':>7}"
          f" {'k-way(us)':>10} {'2-way(us)':>10}")
    base = None
    for width in (int(w) for w in args.widths.split(",")):
        sets = [ranks_parts(args.k, args.n, width, rng, args.parts) for _ in range(args.sets)]
        measured = seconds(lambda parts: reduce_parts(parts, ReduceOp.SUM, np.dtype(np.float32)),
                           sets, args.repeats, stat)
        loops = loop_seconds(sets, args.repeats, stat)
        both = " ".join(f"{t * 1e6:10.0f}" for t in loops) if loops else f"{'-':>10} {'-':>10}"
        if args.parts != 2:
            print(f"  {width:5d} {measured * 1e6:10.0f} {'-':>10} {'-':>11} {'-':>7} {both}")
            continue
        shape = Shape(2, args.n, width, 4, 4, (args.k, args.k))
        units = work("recursive_doubling", shape, 0, profile)
        model = local_time({k: units[k] for k in MERGE_UNITS}, profile)
        ratio = measured / model
        if width == 0 and base is None:  # the 1-D merge: the unit of ``x 1-D``
            base = ratio
        relative = f"{ratio / base:7.2f}" if base else "      -"
        print(f"  {width:5d} {measured * 1e6:10.0f} {model * 1e6:10.0f} {ratio:11.2f} {relative}"
              f" {both}")


if __name__ == "__main__":
    main()
