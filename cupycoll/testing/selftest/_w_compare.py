"""Selftest worker: every sparse and top-k algorithm on CuPy arrays against the same call on numpy.

    mpiexec -n P python -m mpi4py -m cupycoll.testing.selftest._w_compare [--emulate D] [--quick]

The ranks share one device and run the MPI backend twice: ``MPICommunicator(xp=cupy)`` (the
primitives run the CUDA kernels, MPI moves host-staged copies) and ``MPICommunicator()`` on numpy.
For every algorithm of ``cc.algorithms("sparse")`` and ``cc.algorithms("topk")``:

* the cupy call returns cupy arrays and equals the numpy call **bit for bit** (docs/gpu.md: the
  GPU path's results equal the numpy path's; docs/primitives.md: the kernels fold in the same
  order as the numpy twins);
* sparse results also equal the dense numpy reference of the gathered inputs (absent = 0):
  indices exactly, max/min and integer sums exactly, float sums within the rounding bound of
  docs/testing.md: (P - 1) half-ulps of the dtype at the sum of |terms| plus half an ulp of the
  result;
* top-k results are sorted unique indices in [0, n), the same bits on every rank, three steps of
  one state (Ok-Topk's refresh and non-refresh steps).

Mismatches are collected, not raised (every rank keeps calling the same collectives), and
printed in the result line; an exception of the library aborts the job.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._w_common import (check_logs, device_namespace, digest, gather_failures, host, parser,
                        report, same_bits)

N = 3000
#: (op, value dtype, row width or None) of the sparse cases; quick runs the first two
SPARSE_CASES = (("sum", "float32", None), ("max", "float32", None), ("sum", "int64", None),
                ("min", "float64", 3), ("sum", "float16", None))
_FOLD = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def sparse_input(seed: int, rank: int, dtype: str, width: int | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s (indices, values): a shared hot set plus its own, nnz differing by rank
    (rank 2, where there is one, holds nothing)."""
    rng = np.random.default_rng([seed, rank])
    hot = np.random.default_rng(seed).choice(N, 40, replace=False)
    own = rng.choice(N, 50 + 90 * rank, replace=False)
    idx = np.unique(np.concatenate([hot, own])).astype(np.int32)
    if rank == 2:
        idx = idx[:0]
    shape = (idx.size,) if width is None else (idx.size, width)
    if np.dtype(dtype).kind == "i":
        return idx, rng.integers(-50, 50, shape).astype(dtype)
    return idx, rng.standard_normal(shape).astype(dtype)


def sparse_reference(inputs: list, op: str, dtype: np.dtype
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(union of indices, float64 reduction over ranks with absent = 0, sum of |terms|)."""
    union = np.unique(np.concatenate([i for i, _ in inputs]))
    rows = (union.size,) + inputs[0][1].shape[1:]
    acc, mag = None, np.zeros(rows)
    for idx, val in inputs:
        dense = np.zeros(rows)
        dense[np.searchsorted(union, idx)] = val
        acc = dense if acc is None else _FOLD[op](acc, dense)
        mag += np.abs(dense)
    return union, acc, mag


def sparse_mismatch(got: Any, inputs: list, op: str, p: int, acc: str | None) -> str | None:
    """Why ``got`` is not the dense reference of ``inputs`` (sums accumulated in ``acc``, else
    in the values' dtype), or None."""
    dtype = host(got.values).dtype
    union, want, mag = sparse_reference(inputs, op, dtype)
    if not np.array_equal(host(got.indices), union):
        return f"indices differ from the union ({host(got.indices).size} vs {union.size})"
    values = host(got.values).astype(np.float64)
    if op != "sum" or dtype.kind == "i":
        exact = want.astype(dtype).astype(np.float64)
        return None if np.array_equal(values, exact) else "values differ from numpy's"
    bound = (p - 1) * 0.5 * np.spacing(mag.astype(acc or dtype)).astype(np.float64) \
        + 0.5 * np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
    worst = float(np.max(np.abs(values - want) - bound, initial=-1.0))
    return None if worst <= 0 else f"a sum is off by {worst:g} beyond the rounding bound"


def check_sparse(cc: Any, gpu: Any, cpu: Any, xp: Any, quick: bool) -> tuple[list, list, int]:
    """Every sparse algorithm on every case; return (failures, digests, calls)."""
    failures, digests, calls = [], [], 0
    for alg in cc.algorithms("sparse"):
        for op, dtype, width in SPARSE_CASES[:2] if quick else SPARSE_CASES:
            inputs = [sparse_input(11, r, dtype, width) for r in range(gpu.size)]
            idx, val = inputs[gpu.rank]
            acc = "float32" if dtype == "float16" else None
            got = cc.sparse_allreduce(xp.asarray(idx), xp.asarray(val), N, op=op, algorithm=alg,
                                      comm=gpu, accumulate_dtype=acc)
            twin = cc.sparse_allreduce(idx, val, N, op=op, algorithm=alg, comm=cpu,
                                       accumulate_dtype=acc)
            calls += 1
            what = f"sparse {alg} {op} {dtype} width={width}"
            failures += differences(what, got, twin, xp)
            why = sparse_mismatch(got, inputs, op, gpu.size, acc)
            if why:
                failures.append(f"{what}: {why}")
            digests.append(digest(host(got.indices), host(got.values)))
    return failures, digests, calls


def differences(what: str, got: Any, twin: Any, xp: Any) -> list[str]:
    """Why the device result ``got`` is not the host result ``twin`` bit for bit (none if it
    is), or not in the device's array type."""
    if not isinstance(got.values, xp.ndarray):
        return [f"{what}: result is {type(got.values).__name__}, not cupy"]
    if same_bits(got.indices, twin.indices) and same_bits(got.values, twin.values):
        return []
    return [f"{what}: cupy and numpy results differ ({host(got.indices).size} vs "
            f"{twin.indices.size} entries)"]


def topk_input(rank: int, step: int, n: int) -> np.ndarray:
    """A gradient-like vector: a component shared by every rank plus the rank's own."""
    shared = np.random.default_rng([5, step]).standard_t(3, n)
    own = np.random.default_rng([6, rank, step]).standard_normal(n) * 0.3
    return (shared + own).astype(np.float32)


def check_topk(cc: Any, gpu: Any, cpu: Any, xp: Any, quick: bool) -> tuple[list, list, int]:
    """Every top-k algorithm, several steps of one state; return (failures, digests, calls)."""
    failures, digests, calls = [], [], 0
    n, k = 4000, 40
    for alg in cc.algorithms("topk"):
        states = cc.TopkState(), cc.TopkState()
        for step in range(2 if quick else 3):
            x = topk_input(gpu.rank, step, n)
            got = cc.topk_allreduce(xp.asarray(x), k, algorithm=alg, comm=gpu, state=states[0])
            twin = cc.topk_allreduce(x, k, algorithm=alg, comm=cpu, state=states[1])
            calls += 1
            what = f"topk {alg} step {step}"
            gi = host(got.indices)
            failures += differences(what, got, twin, xp)
            if gi.size and (np.any(np.diff(gi) <= 0) or gi[0] < 0 or gi[-1] >= n):
                failures.append(f"{what}: indices not sorted, unique and in [0, {n})")
            digests.append(digest(gi, host(got.values)))
    return failures, digests, calls


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two sparse cases, two top-k steps")
    args = p.parse_args()
    cupy, emu = device_namespace(args.emulate)
    from mpi4py import MPI

    import cupycoll as cc
    from cupycoll.comm.mpi import MPICommunicator

    gpu, cpu = MPICommunicator(xp=cupy), MPICommunicator()
    failures, digests, calls = check_sparse(cc, gpu, cpu, cupy, args.quick)
    more, topk_digests, topk_calls = check_topk(cc, gpu, cpu, cupy, args.quick)
    failures += more
    every = MPI.COMM_WORLD.allgather(digests + topk_digests)
    if any(d != every[0] for d in every):
        failures.append("results differ across ranks")
    check_logs(emu)
    lines = gather_failures(MPI.COMM_WORLD, failures)
    report(MPI.COMM_WORLD, {"ok": not lines, "P": gpu.size, "sparse_calls": calls,
                            "topk_calls": topk_calls, "failed": len(lines),
                            "failures": lines[:20], "sparse": cc.algorithms("sparse"),
                            "topk": cc.algorithms("topk"), "emulated": bool(args.emulate)})


if __name__ == "__main__":
    main()
