"""recursive_doubling's merge of two ranks' entries, measured against the time model, by row width.

Single process, CPU. For each row width (0 = 1-D values), two sorted index sets of ``k`` entries
each (drawn from ``n``) with float32 rows are merged and summed as recursive doubling merges
them at P = 2 (``sparse._common.reduce_parts``, the numba loops when numba runs), and the model
prices the same merge (``recursive_doubling``'s work units at P = 2 times the profile's gamma:
``tuner.predict.local_time``):

    python bench/dev/bench_merge_rows.py                       # k = 8192, n = 409600
    python bench/dev/bench_merge_rows.py --widths 0,1,4,16,64 --k 65536
    CUPYCOLL_PROFILE=prof.json python bench/dev/bench_merge_rows.py

``meas/model`` divided by the 1-D row's (``x 1-D``) cancels the machine's speed against the
profile's: where it is above 1 the model prices that width's merge low relative to a 1-D merge,
below 1 high. Medians of ``--repeats`` calls, after the numba loops are loaded.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from cupycoll._config import setting
from cupycoll._types import ReduceOp
from cupycoll.primitives import _accel
from cupycoll.sparse._common import reduce_parts
from cupycoll.sparse._cost import Shape
from cupycoll.tuner.predict import local_time, work
from cupycoll.tuner.profile import load_profile


def loops_ready(seconds: float = 60.0) -> str:
    """Wait for numba's loops (imported in the background under CUPYCOLL_NUMBA=auto)."""
    end = time.monotonic() + (seconds if setting("CUPYCOLL_NUMBA") != "off" else 0.0)
    while _accel.loops() is None and time.monotonic() < end:
        time.sleep(0.1)
    return "numba" if _accel.loops() is not None else "numpy"


def merge_seconds(k: int, n: int, width: int, repeats: int, rng) -> float:
    """Median seconds of one two-way merge-and-sum of k + k entries with rows of ``width``."""
    row = (k, width) if width else (k,)
    parts = [(np.sort(rng.choice(n, k, replace=False)).astype(np.int32),
              rng.standard_normal(row).astype(np.float32)) for _ in range(2)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        reduce_parts(parts, ReduceOp.SUM, np.dtype(np.float32))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", default="0,1,2,4,8,16,32,64")
    parser.add_argument("--k", type=int, default=8192, help="entries of each rank")
    parser.add_argument("--n", type=int, default=409600, help="dense length (rows)")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    profile = load_profile(None, size=2)
    rng = np.random.default_rng(0)
    print(f"# loops: {loops_ready()}, profile: {profile.name}, k = {args.k}, n = {args.n}")
    print(f"# {'width':>5} {'meas(us)':>10} {'model(us)':>10} {'meas/model':>11} {'x 1-D':>7}")
    base = None
    for width in (int(w) for w in args.widths.split(",")):
        measured = merge_seconds(args.k, args.n, width, args.repeats, rng)
        shape = Shape(2, args.n, width, 4, 4, (args.k, args.k))
        model = local_time(work("recursive_doubling", shape, 0, profile), profile)
        ratio = measured / model
        if width == 0 and base is None:  # the 1-D merge: the unit of ``x 1-D``
            base = ratio
        relative = f"{ratio / base:7.2f}" if base else "      -"
        print(f"  {width:5d} {measured * 1e6:10.0f} {model * 1e6:10.0f} {ratio:11.2f} {relative}")


if __name__ == "__main__":
    main()
