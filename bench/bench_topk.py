"""Top-k allreduce benchmark: words received per rank and per phase, time per call, selection cost.

    mpiexec -n 4 python -m mpi4py bench/bench_topk.py                      # n = 2^20, density 1%
    mpiexec -n 4 python -m mpi4py bench/bench_topk.py --n 4M --json topk.json

Three parts (rank 0 prints; volumes are the maximum over ranks, from ``comm.stats``; one word =
4 bytes, an int32 index or an fp32 value):

1. Ok-Topk per phase on non-refresh steps, as a ratio to the COO lower bound 2k(P-1)/P
   (target: total <= 2x, i.e. <= 4k(P-1)/P, on balanced inputs; the paper's bound is 3x), on
   balanced inputs (every rank selects the same k indices, k/P per region) and on drifting
   correlated heavy-tailed data.
2. Every algorithm on the drifting data: words received per rank per step (all phases, counts
   included) beside its cost model, and the time per call.
3. Local selection at ``--selection-n`` (default 2^24): Ok-Topk's threshold reuse (one
   ``|x| >= t`` pass) vs the exact top-k (``topk_abs``) (target: >= 10x cheaper).
"""

from __future__ import annotations

import time

import numpy as np
from _common import Table, common_parser, parse_size

import cupycoll as cc
from cupycoll.primitives import topk_abs
from cupycoll.topk import Exact, Threshold, TopkState, cost_model, topk_allreduce

WORD = 4
PHASES = ("oktopk.reduce", "oktopk.balance", "oktopk.allgather")
COLUMNS = ["input", "algorithm", "phase", "P", "n", "k", "words/rank", "bound", "ratio", "model",
           "time(us)"]


def drifting(p: int, r: int, n: int, t: int) -> np.ndarray:
    """Heavy-tailed component shared by all ranks + per-rank noise + a slow drift over steps."""
    shared = np.random.default_rng(1).standard_t(3, n)
    drift = np.random.default_rng([2, t]).standard_normal(n) * 0.05
    own = np.random.default_rng([3, r, t]).standard_normal(n) * 0.3
    return (shared + drift + own).astype(np.float32)


def balanced(p: int, r: int, n: int, k: int) -> np.ndarray:
    """Every rank: the same k evenly spaced indices carry the large values."""
    x = np.random.default_rng([4, r]).random(n).astype(np.float32) * 1e-3
    x[np.arange(k) * (n // k)] = 2 + np.arange(k, dtype=np.float32) / k
    return x


def phase_words(comm, ops) -> float:
    """Max over ranks of the words received under the given operation names."""
    mine = sum(comm.stats.by_op[o].bytes_received for o in ops if o in comm.stats.by_op) / WORD
    return float(comm.mpi_comm.allreduce(mine, op=_max()))


def _max():
    from mpi4py import MPI

    return MPI.MAX


def run_sequence(comm, algorithm: str, inputs, k: int, tau_prime: int):
    """Run the steps with one state; return per non-refresh step {op: words}, and mean time."""
    state = TopkState(tau_prime=tau_prime)
    per_step, times = [], []
    for x in inputs:
        comm.stats.reset()
        comm.mpi_comm.Barrier()
        t0 = time.perf_counter()
        topk_allreduce(x, k, algorithm=algorithm, comm=comm, state=state)
        times.append(time.perf_counter() - t0)
        ops = sorted(set().union(*comm.mpi_comm.allgather(set(comm.stats.by_op))))
        words = {op: phase_words(comm, [op]) for op in ops}
        words["total"] = phase_words(comm, ops)
        if not state.last["refresh"] or algorithm != "oktopk":
            per_step.append(words)
    slowest = comm.mpi_comm.allreduce(float(np.median(times)), op=_max())
    return per_step, slowest


def oktopk_phases(comm, table: Table, name: str, inputs, n: int, k: int, tau_prime: int) -> None:
    p = comm.size
    bound = 2 * k * (p - 1) / p
    steps, seconds = run_sequence(comm, "oktopk", inputs, k, tau_prime)
    models = {"reduce": bound, "balance": 2 * bound, "allgather": bound, "3 phases": 3 * bound}
    for phase, model in models.items():
        ops = PHASES if phase == "3 phases" else ("oktopk." + phase,)
        words = max(sum(s.get(o, 0.0) for o in ops) for s in steps)
        table.add({"input": name, "algorithm": "oktopk", "phase": phase, "P": p, "n": n, "k": k,
                   "words/rank": words, "bound": bound, "ratio": words / bound if bound else 0.0,
                   "model": model, "time(us)": seconds * 1e6 if phase == "3 phases" else ""})
    extra = max(s["total"] - sum(s.get(o, 0.0) for o in PHASES) for s in steps)
    table.add({"input": name, "algorithm": "oktopk", "phase": "counts+ctl", "P": p, "n": n,
               "k": k, "words/rank": extra, "bound": bound,
               "ratio": extra / bound if bound else 0.0, "model": "", "time(us)": ""})


def all_algorithms(comm, table: Table, inputs, n: int, k: int, tau_prime: int) -> None:
    p = comm.size
    bound = 2 * k * (p - 1) / p
    for alg in cc.algorithms("topk"):
        steps, seconds = run_sequence(comm, alg, inputs, k, tau_prime)
        words = float(np.mean([s["total"] for s in steps]))
        table.add({"input": "drifting", "algorithm": alg, "phase": "all", "P": p,
                   "n": n, "k": k, "words/rank": words, "bound": bound,
                   "ratio": words / bound if bound else 0.0,
                   "model": cost_model(alg, p, k, n).words, "time(us)": seconds * 1e6})


def selection_cost(comm, n: int, density: float, repeats: int) -> dict:
    """Time (rank 0) the exact top-k and a reused-threshold selection on one vector of length n."""
    if comm.rank != 0:  # wait without spinning, so rank 0 has the cores to itself
        request = comm.mpi_comm.Ibarrier()
        while not request.Test():
            time.sleep(0.01)
        return {}
    k = max(1, int(density * n))
    x = np.random.default_rng(5).standard_t(3, n).astype(np.float32)
    thr = Threshold()
    thr.select(x, k, refresh=True)
    drifted = x * np.float32(1.001)
    timings = {}
    for name, fn in (("exact topk_abs", lambda: topk_abs(x, k)),
                     ("Exact selector", lambda: Exact().select(x, k)),
                     ("Threshold reuse", lambda: thr.select(drifted, k, refresh=False)),
                     ("argsort top-k", lambda: np.sort(np.argsort(-np.abs(x))[:k]))):
        fn()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        timings[name] = float(np.median(samples))
    comm.mpi_comm.Ibarrier().Wait()
    return {"n": n, "k": k, "seconds": timings,
            "speedup": timings["exact topk_abs"] / timings["Threshold reuse"]}


def main() -> None:
    p = common_parser("Top-k allreduce volumes per phase and selection cost")
    p.add_argument("--n", type=parse_size, default=parse_size("1M"), help="vector length")
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--tau-prime", type=int, default=4)
    p.add_argument("--selection-n", type=parse_size, default=1 << 24,
                   help="vector length of the selection timing (0: skip it)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    comm = cc.init("mpi")
    size, rank, n = comm.size, comm.rank, args.n
    k = max(size, int(args.density * n)) // size * size
    table = Table(COLUMNS, rank)
    table.header(f"top-k allreduce on {size} ranks: n={n}, k={k}; words received per rank "
                 f"(max over ranks), bound = 2k(P-1)/P; non-refresh steps")
    oktopk_phases(comm, table, "balanced", [balanced(size, rank, n, k)] * 2, n, k, 32)
    inputs = [drifting(size, rank, n, t) for t in range(args.steps)]
    oktopk_phases(comm, table, "drifting", inputs, n, k, args.tau_prime)
    all_algorithms(comm, table, inputs, n, k, args.tau_prime)
    sel = selection_cost(comm, args.selection_n, args.density, args.repeats) \
        if args.selection_n > 0 else {}
    if rank == 0 and sel:
        print(f"# selection at n={sel['n']}, k={sel['k']} (rank 0, median of {args.repeats}):")
        for name, sec in sel["seconds"].items():
            print(f"#   {name:16s} {sec * 1e3:9.2f} ms")
        print(f"#   threshold reuse is {sel['speedup']:.1f}x cheaper than the exact top-k "
              f"(target >= 10x); argsort top-k (what a sort-based top-k costs) is shown only "
              f"for reference")
    table.finish(args, {"P": size, "n": n, "k": k, "selection": sel})


if __name__ == "__main__":
    main()
