"""Selftest worker: Ok-Topk steps on NCCL with several overlap buckets, bit for bit the MPI path.

    mpiexec -n P python -m mpi4py -m cupycoll.testing.selftest._w_oktopk [--emulate D] [--throttle T]

Ok-Topk's split-and-reduce posts its P steps in buckets of ``min(THROTTLE, P)``
(``cupycoll.topk._oktopk_phases.THROTTLE``) and, on NCCL, scatter-adds bucket b-1 on a side
stream while bucket b is in flight. With ``--throttle 1`` every step is its own bucket, so P >= 3
ranks run three or more buckets (the default THROTTLE reaches that only from P > 8). Each step
runs on ``cc.init("nccl")`` with cupy arrays and on ``MPICommunicator()`` with numpy arrays,
each with its own state; indices and values must be equal bit for bit at every step (refresh
and non-refresh steps; docs/gpu.md, "Ok-Topk's overlap on a GPU").
"""

from __future__ import annotations

import numpy as np

from ._w_common import (check_logs, device_namespace, gather_failures, host, parser, report,
                        same_bits)
from ._w_compare import topk_input


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--throttle", type=int, default=1, help="Ok-Topk steps per overlap bucket")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--n", type=int, default=1 << 15)
    p.add_argument("--density", type=float, default=0.01)
    args = p.parse_args()
    cupy, emu = device_namespace(args.emulate)
    from mpi4py import MPI

    import cupycoll as cc
    from cupycoll.comm.mpi import MPICommunicator
    from cupycoll.topk import _oktopk_phases

    _oktopk_phases.THROTTLE = args.throttle
    nccl, mpi = cc.init("nccl"), MPICommunicator()
    size = nccl.size
    buckets = -(-size // min(args.throttle, size))
    k = max(1, int(args.n * args.density))
    states = cc.TopkState(tau_prime=2), cc.TopkState(tau_prime=2)  # refresh every other step
    failures, refresh = [], []
    for step in range(args.steps):
        x = topk_input(nccl.rank, step, args.n)
        got = cc.topk_allreduce(cupy.asarray(x), k, algorithm="oktopk", comm=nccl,
                                state=states[0])
        twin = cc.topk_allreduce(x, k, algorithm="oktopk", comm=mpi, state=states[1])
        refresh.append(bool(states[0].last.get("refresh")))
        if not isinstance(got.values, cupy.ndarray):
            failures.append(f"step {step}: result is {type(got.values).__name__}, not cupy")
        elif not (same_bits(got.indices, twin.indices) and same_bits(got.values, twin.values)):
            failures.append(f"step {step}: NCCL and MPI results differ ({host(got.indices).size}"
                            f" vs {np.asarray(twin.indices).size} entries)")
    check_logs(emu)
    lines = gather_failures(MPI.COMM_WORLD, failures)
    report(MPI.COMM_WORLD, {"ok": not lines, "P": size, "buckets": buckets,
                            "throttle": args.throttle, "steps": args.steps, "k": k,
                            "refresh_steps": refresh, "failures": lines[:20],
                            "emulated": bool(args.emulate)})


if __name__ == "__main__":
    main()
