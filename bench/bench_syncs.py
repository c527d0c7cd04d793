"""Host synchronisations per call of every sparse and top-k algorithm, against the GPU budget.

    mpiexec -n 4 python -m mpi4py bench/bench_syncs.py                  # table on rank 0
    mpiexec -n 8 python -m mpi4py bench/bench_syncs.py --json syncs.json

A host synchronisation is any point where the host waits for the device: a device-to-host copy
or scalar read, a result whose size is on the device (nonzero, boolean mask), a wait on an
event. Each one drains the GPU's launch queue, so the budget caps them per call, independent of
P. Calls run on a device namespace that counts them (``--backend``; see
``cupycoll.testing.syncs`` for the hook a backend reports through), after one warm-up call. The
table shows the maximum over ranks and the minimum; a budgeted call must count the same on every rank
(data-dependent loops such as Gaussian-k's corrections legitimately differ). The exit status is
1 when a budgeted call is over budget or differs across ranks.

Backends (``--backend``): ``counting`` (default) -- numpy-backed stand-in for cupy that
reports every sync, the kernels compiled for the CPU, MPI for transport booked as NCCL (a wait
or a fetch is one sync, staging none); ``emulated`` -- the real NCCL backend on the strict
emulation tier (emulated devices, streams and NCCL), every blocking operation of the emulated
CUDA runtime counted. Another backend registers a factory in ``BACKENDS``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

import cupycoll as cc
from cupycoll.testing.syncs import count_host_syncs
from cupycoll.topk import TopkState, topk_allreduce
from _common import Parser, data_out, non_negative_int, positive_int


def _counting() -> Any:
    from cupycoll.testing.sync_counting import SyncCountingCommunicator

    return SyncCountingCommunicator()


def _emulated() -> Any:
    """The real NCCL backend on the strict emulation tier (cupycoll.testing.emulation): every host
    synchronisation the emulated CUDA runtime sees is reported to the same counter."""
    from cupycoll.testing import emulation

    emulation.install()
    return cc.init("nccl")


#: backend name -> factory of a communicator over a counting device namespace.
BACKENDS: dict[str, Callable[[], Any]] = {"counting": _counting, "emulated": _emulated}
#: budget of host syncs per call (the issue's targets), independent of P.
BUDGET = {"allreduce": 1, "sparse_allreduce.split": 8, "sparse_allreduce.allgather": 6,
          "topk_allreduce.oktopk.nonrefresh": 10}
COLUMNS = ("call", "P", "host_syncs", "min", "budget", "status", "kinds")


def _sparse_input(rank: int, n: int, nnz: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([11, rank])
    idx = np.sort(rng.choice(n, nnz, replace=False)).astype(np.int32)
    return idx, rng.standard_normal(nnz).astype(np.float32)


def _topk_input(rank: int, n: int, step: int) -> np.ndarray:
    shared = np.random.default_rng(1).standard_t(3, n)
    own = np.random.default_rng([3, rank, step]).standard_normal(n) * 0.3
    return (shared + own).astype(np.float32)


def calls(comm: Any, n: int, nnz: int, k: int) -> list[tuple[str, Callable[[], Any]]]:
    """(label, call) for every measured call; each call is run twice (warm-up, then counted)."""
    xp, rank = comm.xp, comm.rank
    idx, val = (xp.asarray(a) for a in _sparse_input(rank, n, nnz))
    dense = xp.asarray(np.full(n, rank + 1.0, np.float32))
    out: list[tuple[str, Callable[[], Any]]] = [
        ("allreduce", lambda: cc.allreduce(dense, comm=comm))]
    for name in cc.algorithms("sparse"):
        for op in ("sum", "max"):
            label = f"sparse_allreduce.{name}" + ("" if op == "sum" else f".{op}")
            out.append((label, lambda name=name, op=op: cc.sparse_allreduce(
                idx, val, n, op=op, algorithm=name, comm=comm)))
    for name in cc.algorithms("topk"):
        xs = [xp.asarray(_topk_input(rank, n, t)) for t in range(4)]
        # the budgeted non-refresh step keeps its regions (tau=64); with tau="auto" at this
        # small k Ok-Topk repartitions every step: one more sync (the boundary allreduce)
        states = {"nonrefresh": TopkState(tau=64)}
        if name == "oktopk":
            states["nonrefresh.repartition"] = TopkState(tau=1)
        # steps 0 (refresh, counted after a warm-up on its own state) and 1, 2 (non-refresh)
        out.append((f"topk_allreduce.{name}.refresh",
                    lambda name=name: topk_allreduce(xs[0], k, algorithm=name, comm=comm)))
        for label, state in states.items():
            def step(name: str = name, state: TopkState = state, xs: list = xs) -> Any:
                return topk_allreduce(xs[state.step % len(xs)], k, algorithm=name, comm=comm,
                                      state=state)
            out.append((f"topk_allreduce.{name}.{label}", step))
    return out


def measure(comm: Any, n: int, nnz: int, k: int) -> list[dict[str, Any]]:
    """Count the syncs of each call on every rank; return rank 0's rows (max over ranks)."""
    mpi = MPI.COMM_WORLD
    rows = []
    for label, call in calls(comm, n, nnz, k):
        call()  # warm-up: kernels built, state primed (the non-refresh call's step 0)
        with count_host_syncs() as syncs:
            call()
        counts = mpi.allgather(syncs.total)
        kinds = mpi.allgather(dict(syncs.by_kind))
        budget = BUDGET.get(label)
        worst = max(counts)
        status = "" if budget is None else "ok" if worst <= budget and len(set(counts)) == 1 \
            else "OVER" if worst > budget else "ranks differ"
        rows.append({"call": label, "P": comm.size, "host_syncs": worst, "min": min(counts),
                     "budget": budget, "status": status, "per_rank": counts,
                     "kinds": ",".join(f"{k}:{v}" for k, v in sorted(kinds[0].items()))})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=sorted(BACKENDS), default="counting")
    p.add_argument("--n", type=positive_int, default=1 << 12, help="dense length")
    p.add_argument("--nnz", type=non_negative_int, default=256,
                   help="sparse entries per rank (at most --n)")
    p.add_argument("--k", type=positive_int, default=64, help="top-k k (at most --n)")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON ('-' = stdout)")
    args = p.parse_args(argv)
    if max(args.nnz, args.k) > args.n:
        p.error(f"--nnz {args.nnz} and --k {args.k}: at most --n {args.n}")
    if args.backend == "emulated" and importlib.util.find_spec("cupy") is None:
        p.error("--backend emulated needs CuPy (the emulation tier runs CuPy's code; no GPU "
                "needed): pip install 'cupycoll[gpu-cu12]'")
    comm = BACKENDS[args.backend]()
    rows = measure(comm, args.n, args.nnz, args.k)
    if comm.rank == 0:
        widths = [max(len(c), *(len(str(r[c] if r[c] is not None else "")) for r in rows)) + 2
                  for c in COLUMNS]
        print(f"# host syncs per call, backend {args.backend}, P={comm.size}, n={args.n}, "
              f"nnz/rank={args.nnz}, k={args.k}")
        print("#" + "".join(c.rjust(w) for c, w in zip(COLUMNS, widths)))
        for r in rows:
            print(" " + "".join(str("" if r[c] is None else r[c]).rjust(w)
                                for c, w in zip(COLUMNS, widths)))
        if args.json:
            doc = {"meta": {"backend": args.backend, "P": comm.size, "n": args.n,
                            "nnz": args.nnz, "k": args.k}, "rows": rows}
            if args.json == "-":
                json.dump(doc, data_out(), indent=1)
            else:
                with open(args.json, "w") as fh:
                    json.dump(doc, fh, indent=1)
    over = [r["call"] for r in rows if r["status"] in ("OVER", "ranks differ")]
    if over and comm.rank == 0:
        print(f"# over budget or unequal across ranks: {over}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
