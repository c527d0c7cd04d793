"""Selftest worker: the kernels' throughput against the device's memory bandwidth.

    mpiexec -n 1 python -m mpi4py -m cupycoll.testing.selftest._w_throughput [--emulate D] [--log2n 26]

Times each cupy primitive (count and select by threshold, the radix select of the k-th magnitude,
top-k, the merge of sorted parts, the scatter-add, the COO reduction, the wire codec) and a plain
``x.copy()`` for scale, the device synchronised after each call, median of ``--reps``. ``GB/s``
is the least memory traffic the operation needs (its inputs read once, its outputs written
once) over the time, and ``% of peak`` that against the device's peak bandwidth (memory clock
x bus width x 2, from the device attributes). Every result is compared with the numpy twin
(``#wrong``); the check fails on any wrong result, not on speed. On the emulation tier the times
are the CPU's and there is no peak: only the code paths and the comparisons count there.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ._device import peak_bandwidth
from ._w_common import device_namespace, host, median_seconds, parser, report


def _equal(got: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        return all(_equal(g, w) for g, w in zip(got, want))
    got, want = host(np.asarray(got) if np.isscalar(got) else got), np.asarray(want)
    return got.shape == want.shape and np.array_equal(got, want)


class Case:
    """One timed row: the device call, and the pair of calls whose results must be equal."""

    def __init__(self, kernel: str, case: str, timed: Callable, twin: Callable, nbytes: int,
                 checked: Callable | None = None) -> None:
        self.kernel, self.case, self.timed, self.twin = kernel, case, timed, twin
        self.checked, self.nbytes = checked or timed, nbytes


def _fresh_scatter(xp: Any, n: int, idx: Any, val: Any) -> Any:
    """A scatter-add into new zeros (the timed one adds into the same buffer again and again)."""
    from cupycoll import primitives as P

    dense = xp.zeros(n, np.float32)
    P.scatter_reduce(dense, idx, val)
    return dense


def cases(cupy: Any, n: int) -> list[Case]:
    """Every timed row; ``nbytes`` is the least traffic: inputs read once, outputs written once."""
    from cupycoll import primitives as P
    from cupycoll import wire

    rng = np.random.default_rng(3)
    x = rng.standard_normal(n).astype(np.float32)
    k = max(1, n // 100)
    t = P.kth_abs(x, k)
    dx = cupy.asarray(x)
    m = max(4, n // 64)
    parts = [(np.sort(rng.choice(n, m, replace=False)).astype(np.int32),
              rng.standard_normal(m).astype(np.float32)) for _ in range(4)]
    dparts = [(cupy.asarray(i), cupy.asarray(v)) for i, v in parts]
    union = np.unique(np.concatenate([i for i, _ in parts])).size
    ddense = cupy.zeros(n, np.float32)
    coo = rng.integers(0, n // 4, m).astype(np.int32), rng.standard_normal(m).astype(np.float32)
    d_coo, coo_u = (cupy.asarray(coo[0]), cupy.asarray(coo[1])), np.unique(coo[0]).size
    stream = np.flatnonzero(rng.random(n) < 0.01).astype(np.int32)
    enc = wire.encode_indices(stream, 0, n)
    dstream, denc = cupy.asarray(stream), cupy.asarray(enc)
    return [
        Case("copy", f"n=2^{n.bit_length() - 1} float32", dx.copy, x.copy, 2 * x.nbytes),
        Case("count_abs_ge", "1% above", lambda: P.count_abs_ge(dx, t),
             lambda: P.count_abs_ge(x, t), x.nbytes),
        Case("select_abs_ge", "1% above", lambda: P.select_abs_ge(dx, t),
             lambda: P.select_abs_ge(x, t), x.nbytes + k * 8),
        Case("kth_abs (radix)", f"k={k}", lambda: P.kth_abs(dx, k), lambda: t, x.nbytes),
        Case("topk_abs", f"k={k}", lambda: P.topk_abs(dx, k), lambda: P.topk_abs(x, k),
             x.nbytes + k * 8),
        Case("merge_sorted", f"4 x {m} sum", lambda: P.merge_sorted(dparts),
             lambda: P.merge_sorted(parts), 4 * m * 8 + union * 8),
        Case("scatter_reduce", f"{m} unique into {n}",
             lambda: P.scatter_reduce(ddense, *dparts[0]),
             lambda: _fresh_scatter(np, n, *parts[0]), m * 16,
             checked=lambda: _fresh_scatter(cupy, n, *dparts[0])),
        Case("coo_reduce", f"{m} unsorted, {coo_u} unique", lambda: P.coo_reduce(*d_coo),
             lambda: P.coo_reduce(*coo), m * 8 + coo_u * 8),
        Case("wire encode", f"{stream.size} indices", lambda: wire.encode_indices(dstream, 0, n),
             lambda: enc, stream.nbytes + enc.nbytes),
        Case("wire decode", f"{enc.nbytes} bytes", lambda: wire.decode_indices(denc, np.int32),
             lambda: stream, stream.nbytes + enc.nbytes),
    ]


def rows(cupy: Any, n: int, reps: int, peak: float | None) -> list[dict]:
    """One table row per case, ``vs copy`` = its time over the copy's."""
    sync = cupy.cuda.Device().synchronize
    out, copy_s = [], None
    for c in cases(cupy, n):
        wrong = int(not _equal(c.checked(), c.twin()))
        seconds = median_seconds(c.timed, sync, reps)
        copy_s = copy_s or seconds
        rate = c.nbytes / seconds
        out.append({"kernel": c.kernel, "case": c.case, "time_ms": round(seconds * 1e3, 4),
                    "GB/s": round(rate / 1e9, 2),
                    "% of peak": None if peak is None else round(100 * rate / peak, 1),
                    "vs copy": round(seconds / copy_s, 2), "#wrong": wrong})
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--log2n", type=int, default=26, help="elements of the timed vector, 2**")
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    cupy, _ = device_namespace(args.emulate)
    from mpi4py import MPI

    peak = None if args.emulate else peak_bandwidth(cupy)
    table = rows(cupy, 1 << args.log2n, args.reps, peak)
    wrong = [r["kernel"] for r in table if r["#wrong"]]
    report(MPI.COMM_WORLD, {"ok": not wrong, "wrong": wrong, "rows": table,
                            "peak_gbs": None if peak is None else round(peak / 1e9, 1),
                            "n": 1 << args.log2n, "emulated": bool(args.emulate)})


if __name__ == "__main__":
    main()
