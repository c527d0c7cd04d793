"""Selftest worker: every dense verb on the NCCL backend against numpy.

    mpiexec -n 1 python -m mpi4py -m cupycoll.testing.selftest._w_dense [--emulate D]

``cc.init("nccl")`` (with mpi4py's COMM_WORLD, of size 1 on one GPU), then allreduce, reduce
(every root), reduce_scatter with every op, broadcast (every root) and allgather, for every dense
dtype; each out of place, in place (``out=x``) and with ``async_op=True``; odd lengths and 0.
Inputs are small integers (unsigned: 0..2, signed: -2..2), rebuilt on every rank from a seed,
so every sum, product, max and min is exact in every dtype at P <= 8 and the numpy reference
must match bit for bit; ``avg`` of floats may round once more (NCCL premultiplies by 1/P), so it
is held to P ulps of the result. Prints the number of calls checked and any mismatch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._w_common import check_logs, device_namespace, gather_failures, host, parser, report

OPS = ("sum", "prod", "max", "min", "avg")
DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")
_FOLD = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def rank_input(seed: int, rank: int, dtype: str, n: int) -> np.ndarray:
    """Rank ``rank``'s input: n small integers in ``dtype`` (any rank can rebuild any other's)."""
    low = 0 if np.dtype(dtype).kind == "u" else -2
    rng = np.random.default_rng([seed, rank, n, np.dtype(dtype).num])
    return rng.integers(low, 3, n).astype(dtype)


def reference(stack: np.ndarray, op: str) -> np.ndarray:
    """numpy's reduction over ranks (axis 0) in the inputs' dtype; avg: sum / P, integers
    truncated toward zero (NCCL's rule)."""
    if op != "avg":
        return _FOLD[op].reduce(stack, axis=0, dtype=stack.dtype)
    total = np.add.reduce(stack.astype(np.float64), axis=0)
    return (np.trunc(total / stack.shape[0]) if stack.dtype.kind in "iu"
            else total / stack.shape[0]).astype(stack.dtype)


def matches(got: Any, want: np.ndarray, op: str, p: int) -> bool:
    got = host(got)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if op == "avg" and want.dtype.kind == "f":
        return bool(np.all(np.abs(got.astype(np.float64) - want) <= p * np.spacing(
            np.abs(want).astype(want.dtype)).astype(np.float64)))
    return got.tobytes() == want.tobytes()


def calls(cc: Any, comm: Any, xp: Any, seed: int, sizes: tuple[int, ...]):
    """Yield (label, result or None, expected or None, op) for every call of every verb."""
    p, r = comm.size, comm.rank
    for dtype in DTYPES:
        for n in sizes:
            per_rank = [rank_input(seed, q, dtype, n * p) for q in range(p)]
            stack = np.stack(per_rank)
            for op in OPS:
                want = reference(stack, op)
                for how in ("new", "in_place", "async"):
                    x = xp.asarray(per_rank[r])
                    kw = {"out": x} if how == "in_place" else {"async_op": how == "async"}
                    label = f"{dtype} n={n * p} {op} {how}"
                    yield f"allreduce {label}", _done(cc.allreduce(x, op, comm=comm, **kw)), \
                        want, op
                    x = xp.asarray(per_rank[r])
                    kw_rs = {"out": x[r * n:(r + 1) * n]} if how == "in_place" else kw
                    yield f"reduce_scatter {label}", _done(cc.reduce_scatter(
                        x, op, comm=comm, **kw_rs)), want[r * n:(r + 1) * n], op
                    for root in range(p):
                        x = xp.asarray(per_rank[r])
                        got = _done(cc.reduce(x, root, op, comm=comm, **kw))
                        yield f"reduce root={root} {label}", got, \
                            (want if r == root else None), op
            for how in ("new", "in_place", "async"):
                kw = {"async_op": how == "async"}
                for root in range(p):
                    x = xp.asarray(per_rank[r])
                    yield f"broadcast root={root} {dtype} n={n * p} {how}", _done(cc.broadcast(
                        x, root, comm=comm, **({"out": x} if how == "in_place" else kw))), \
                        per_rank[root], "copy"
                whole = xp.asarray(np.concatenate([np.zeros_like(a) for a in per_rank]))
                x = whole[r * n * p:(r + 1) * n * p]  # in place: this rank's block of out
                x[...] = xp.asarray(per_rank[r])
                yield f"allgather {dtype} n={n * p} {how}", _done(cc.allgather(
                    x, comm=comm, **({"out": whole} if how == "in_place" else kw))), \
                    np.concatenate(per_rank), "copy"


def _done(result: Any) -> Any:
    """The result of a call, waited for when it is a Work (async_op=True)."""
    return result.wait() if hasattr(result, "wait") else result


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--sizes", default="0,37", help="elements per rank, comma-separated")
    args = p.parse_args()
    cupy, emu = device_namespace(args.emulate)
    from mpi4py import MPI

    import cupycoll as cc

    comm = cc.init("nccl")
    assert comm.backend == "nccl" and comm.xp is cupy, (comm.backend, comm.xp)
    failures, count = [], 0
    sizes = tuple(int(s) for s in args.sizes.split(","))
    for label, got, want, op in calls(cc, comm, cupy, args.seed, sizes):
        count += 1
        if want is None:
            if got is not None:
                failures.append(f"{label}: a non-root got {type(got).__name__}, not None")
            continue
        if not isinstance(got, cupy.ndarray):
            failures.append(f"{label}: result is {type(got).__name__}, not a cupy array")
        elif not matches(got, want, op, comm.size):
            failures.append(f"{label}: got {host(got)[:8]}, numpy says {want[:8]}")
    check_logs(emu)
    every = gather_failures(MPI.COMM_WORLD, failures)
    report(MPI.COMM_WORLD, {"ok": not every, "calls": count, "P": comm.size,
                            "failures": every[:20], "failed": len(every),
                            "device": comm.device_id, "emulated": bool(args.emulate)})


if __name__ == "__main__":
    main()
