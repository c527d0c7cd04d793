"""Every sparse and top-k algorithm under a caller's ``np.errstate(all="raise")`` (run under
mpiexec).

The library meets harmless floating-point events on purpose (inf - inf in a rounding error
that is then dropped, float64 sums beyond float32's range rounded for a bfloat16 wire, NaN
sums): a caller's raising error state must not turn them into a FloatingPointError on one rank
in the middle of a collective (the others would wait). Inputs hold +-inf, NaN, a subnormal and
values whose sum overflows float32; every top-k algorithm with and without a state, coo and
bfloat16 wires, the compressor, and every sparse algorithm and op on 1-D values and rows, coo,
compact and bfloat16 wires. Prints "ok raising error state on P ranks".
"""

from __future__ import annotations

import numpy as np

import cupycoll as cc
from cupycoll.topk import TopkCompressor, TopkState, topk_allreduce


def main() -> None:
    comm = cc.init("mpi")
    rng = np.random.default_rng([0, comm.rank])
    x = rng.standard_normal(3000).astype(np.float32)
    x[[5, 6, 7, 8, 9, 10]] = [np.inf, -np.inf, np.nan, 1e-45, 3e38, 3e38]
    with np.errstate(over="ignore"):  # 3e38 is inf in float16
        xs = {dt: x.astype(dt) for dt in ("float16", "float32", "float64")}
    for alg in cc.algorithms("topk"):
        for dt, xd in xs.items():
            state = TopkState()
            with np.errstate(all="raise"):
                for _ in range(4):
                    topk_allreduce(xd, 30, algorithm=alg, comm=comm, state=state)
                    topk_allreduce(xd, 30, algorithm=alg, comm=comm)
                    if dt != "float16":
                        topk_allreduce(xd, 30, algorithm=alg, comm=comm, wire_values="bfloat16")
        for wire_values in (None, "bfloat16"):
            with np.errstate(all="raise"):
                comp = TopkCompressor(3000, 0.01, algorithm=alg, comm=comm,
                                      wire_values=wire_values)
                for _ in range(4):
                    comp.step(xs["float32"].copy())
    for alg in cc.algorithms("sparse"):
        for op in ("sum", "max", "min", "prod", "avg"):
            idx = np.sort(rng.choice(3000, 300, replace=False))
            for vals in (x[idx], rng.standard_normal((300, 4)).astype(np.float32)):
                with np.errstate(all="raise"):
                    for wire in ("coo", "compact"):
                        cc.sparse_allreduce(idx, vals, 3000, op=op, algorithm=alg, comm=comm,
                                            wire=wire)
                    cc.sparse_allreduce(idx, vals, 3000, op=op, algorithm=alg, comm=comm,
                                        wire_values="bfloat16")
    if comm.rank == 0:
        print(f"ok raising error state on {comm.size} ranks")


if __name__ == "__main__":
    main()
