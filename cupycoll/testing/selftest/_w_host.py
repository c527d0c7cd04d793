"""Selftest worker: host time per call on the NCCL backend, blocking and enqueue-only.

    mpiexec -n 1 python -m mpi4py -m cupycoll.testing.selftest._w_host [--emulate D] [--iters 300]

On ``cc.init("nccl")`` (one rank on one GPU): every dense verb on 256 float32 with ``out=``
preallocated, a ``sparse_allreduce`` of 10 entries and a ``topk_allreduce`` of n = 1000, k = 10.
``blocking_us`` is the median time of the call as the caller sees it (the front doors wait for
the device); ``enqueue_us`` that of the ``async_op=True`` call alone (what the host spends before
it can queue more work; the wait is untimed). On the emulation tier the figures are the
emulator's, not a GPU's: the check there only runs the code path. Compare with
``python bench/dev/bench_host.py`` in the source tree (the same calls over a null NCCL,
docs/benchmarks.md).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from ._w_common import device_namespace, host, parser, report


def median_us(fn: Callable[[], Any], after: Callable[[Any], Any], iters: int) -> float:
    """Median microseconds of ``fn`` alone; ``after(result)`` runs untimed after each call."""
    after(fn())
    times = np.empty(iters)
    for i in range(iters):
        t0 = time.perf_counter()
        res = fn()
        times[i] = time.perf_counter() - t0
        after(res)
    return float(np.median(times)) * 1e6


def calls(cc: Any, comm: Any, cupy: Any) -> dict[str, Callable[..., Any]]:
    """name -> call(async_op) of every timed call."""
    x = cupy.ones(256, cupy.float32)
    out, gathered = cupy.empty_like(x), cupy.empty(256 * comm.size, cupy.float32)
    block = cupy.empty(256 // comm.size, cupy.float32)
    rng = np.random.default_rng(7)
    idx = cupy.asarray(np.sort(rng.choice(1000, 10, replace=False)).astype(np.int64))
    val = cupy.asarray(rng.standard_normal(10).astype(np.float32))
    dense = cupy.asarray(rng.standard_normal(1000).astype(np.float32))
    return {
        "allreduce": lambda a: cc.allreduce(x, out=out, comm=comm, async_op=a),
        "broadcast": lambda a: cc.broadcast(x, out=out, comm=comm, async_op=a),
        "reduce": lambda a: cc.reduce(x, out=out, comm=comm, async_op=a),
        "allgather": lambda a: cc.allgather(x, out=gathered, comm=comm, async_op=a),
        "reduce_scatter": lambda a: cc.reduce_scatter(x, out=block, comm=comm, async_op=a),
        "sparse_allreduce (10 entries)": lambda a: cc.sparse_allreduce(
            idx, val, 1000, comm=comm, async_op=a),
        "topk_allreduce (n=1000, k=10)": lambda a: cc.topk_allreduce(dense, 10, comm=comm),
    }


def _wait(result: Any) -> None:
    """Wait for an async call's Work; read a small piece of a result back (the device idles)."""
    if hasattr(result, "wait"):
        result = result.wait()
    values = getattr(result, "values", result)
    if values is not None:
        host(values[:1])


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=300)
    args = p.parse_args()
    cupy, _ = device_namespace(args.emulate)
    from mpi4py import MPI

    import cupycoll as cc

    comm = cc.init("nccl")
    table = []
    for name, call in calls(cc, comm, cupy).items():
        blocking = median_us(lambda: call(False), _wait, args.iters)
        enqueue = None
        if not name.startswith("topk"):  # topk_allreduce has no async_op
            enqueue = round(median_us(lambda: call(True), _wait, args.iters), 1)
        table.append({"call": name, "blocking_us": round(blocking, 1), "enqueue_us": enqueue})
    report(MPI.COMM_WORLD, {"ok": True, "rows": table, "P": comm.size, "iters": args.iters,
                            "emulated": bool(args.emulate)})


if __name__ == "__main__":
    main()
