"""Selftest worker: what a first call compiles, and how long that takes (cold or cached).

    CUPY_CACHE_DIR=DIR mpiexec -n 1 python -m mpi4py -m cupycoll.testing.selftest._w_compile
        [--emulate D] [--arch sm_90] [--all]

Runs a first ``sparse_allreduce`` (split, float32, duplicate indices) and a first Ok-Topk step
on cupy arrays (one rank, the MPI backend), timing the call and the time spent in
``cupycoll._kernels.compiled`` (NVRTC of each instantiation launched, or its disk-cache hit; see
docs/gpu.md "Lazy, cached compilation"), and counts the files it added to
``$CUPY_CACHE_DIR/cupycoll``. ``--arch`` compiles for that architecture instead of the device's
(the emulation tier runs the kernels on the CPU whatever they were compiled for, so NVRTC for
sm_90 needs no GPU); ``--all`` then compiles every instantiation of every kernel file alone.
The selftest runs it twice on one empty cache folder: cold, then cached (nothing compiled).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from ._w_common import device_namespace, host, parser, report


def spy_compiled(kernels: Any, arch: str | None) -> dict:
    """Wrap ``kernels.compiled``: count calls, time them, and force ``arch`` when given."""
    stats = {"calls": 0, "seconds": 0.0, "arch": arch, "launched": []}
    original = kernels.compiled

    def compiled(name: str, expr: str, device_arch: str) -> Any:
        stats["arch"] = arch or device_arch
        start = time.perf_counter()
        try:
            return original(name, expr, arch or device_arch)
        finally:
            stats["calls"] += 1
            stats["seconds"] += time.perf_counter() - start
            stats["launched"].append(f"{name}: {expr}")

    kernels.compiled = compiled
    return stats


def first_calls(cc: Any, cupy: Any) -> float:
    """Seconds of a first sparse_allreduce and a first Ok-Topk step (results on the host)."""
    from cupycoll.comm.mpi import MPICommunicator

    comm = MPICommunicator(xp=cupy)
    rng = np.random.default_rng(0)
    idx = np.sort(rng.choice(1 << 12, 300, replace=False)).astype(np.int32)
    val = rng.standard_normal(300).astype(np.float32)
    start = time.perf_counter()
    res = cc.sparse_allreduce(cupy.asarray(np.concatenate([idx, idx[:5]])),
                              cupy.asarray(np.concatenate([val, val[:5]])), 1 << 12,
                              algorithm="split", comm=comm)
    x = cupy.asarray(rng.standard_normal(1 << 12).astype(np.float32))
    top = cc.topk_allreduce(x, 64, algorithm="oktopk", comm=comm, state=cc.TopkState())
    host(res.values), host(top.values)
    return time.perf_counter() - start


def compile_all(kernels: Any, arch: str) -> tuple[int, float]:
    """Compile (or find cached) every instantiation of every kernel file alone."""
    count, start = 0, time.perf_counter()
    for file in kernels.KERNEL_FILES:
        for expr in kernels.name_expressions(file):
            kernels.compiled(file, expr, arch)
            count += 1
    return count, time.perf_counter() - start


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--arch", help="compile for this architecture (default: the device's)")
    p.add_argument("--all", action="store_true", help="also every instantiation, each alone")
    args = p.parse_args()
    cupy, _ = device_namespace(args.emulate)
    from mpi4py import MPI

    import cupycoll as cc
    from cupycoll import _kernels

    folder = _kernels.cache_dir()
    before = modules(folder)
    stats = spy_compiled(_kernels, args.arch)
    seconds = first_calls(cc, cupy)
    result = {"ok": stats["calls"] > 0, "first_call_s": round(seconds, 3),
              "compile_s": round(stats["seconds"], 3), "instantiations": stats["calls"],
              "arch": stats["arch"], "launched": stats["launched"], "cache": str(folder)}
    result["compiled"] = len(modules(folder) - before)
    if args.all:
        count, spent = compile_all(_kernels, stats["arch"])
        result.update(all_instantiations=count, all_s=round(spent, 3),
                      all_compiled=len(modules(folder) - before) - result["compiled"])
    report(MPI.COMM_WORLD, result)


def modules(folder: Path) -> set[Path]:
    """The compiled modules (cubin or PTX) in the kernel cache folder."""
    return set(folder.glob("*.cubin")) | set(folder.glob("*.ptx"))


if __name__ == "__main__":
    main()
