"""Top-k allreduce benchmark: words per rank and phase, density under error feedback, selection.

    mpiexec -n 4 python -m mpi4py bench/bench_topk.py                      # n = 2^20, density 1%
    mpiexec -n 4 python -m mpi4py bench/bench_topk.py --n 4M --json topk.json
    mpiexec -n 4 python -m mpi4py bench/bench_topk.py --only compressor --n 16M --steps 12
    mpiexec -n 4 python -m mpi4py bench/bench_topk.py --only phases --n 16M \
        --wire coo,compact --wire-values none,bfloat16         # words vs coo and the bound

Four parts (rank 0 prints; volumes are the maximum over ranks, from ``comm.stats``; one word =
4 bytes, an int32 index or an fp32 value; ``--only`` runs one part):

1. ``phases``: Ok-Topk per phase on non-refresh steps, as a ratio to the COO lower bound
   2k(P-1)/P, on balanced inputs (every rank selects the same k indices, k/P per region) and on
   drifting correlated heavy-tailed data.
2. ``algorithms``: every algorithm on the drifting data: words received per rank per step (all
   phases, counts included) beside its cost model, and the time per call.
3. ``compressor`` (issue 11): ``TopkCompressor(n, density, "oktopk")`` over ``--steps`` steps of
   residual accumulation, gradient = heavy-tailed t(3) component shared by every rank (fixed, or
   drifting: a fresh t(3) part each step) + per-rank normal noise; both threshold policies side
   by side (``Threshold(policy="reference")`` = before, default ``"quantile"`` = after). Per step:
   local selection / k (min-max over ranks), result nnz / k, words received in the three data
   phases / bound and all words (control included) / bound, selection time (max over ranks).
   Targets (non-refresh steps after the first): nnz in [0.9k, 1.1k], local in [0.8k, 1.25k],
   data words <= 2.2x the bound.
4. ``selection``: local selection at ``--selection-n`` (default 2^24) on rank 0, every selector
   beside one threshold pass ``|x| >= t`` (``select_abs_ge`` at the k-th magnitude), as ratios
   (target for Ok-Topk's per-step selection: <= 1.2x one pass).

The rows of ``--json`` and ``--csv``: the phases and algorithms rows, then the compressor's
steps, then the selectors' times.
"""

from __future__ import annotations

import functools
import time

import numpy as np
from _common import (Table, common_parser, fraction, parse_length, parse_size,
                     positive_int, wire_arguments)

import cupycoll as cc
from cupycoll.primitives import kth_abs, select_abs_ge, topk_abs
from cupycoll.topk import (Exact, Gaussian, Threshold, TopkCompressor, TopkState, cost_model,
                           topk_allreduce)

WORD = 4
PHASES = ("oktopk.reduce", "oktopk.balance", "oktopk.allgather")
COLUMNS = ["input", "algorithm", "format", "phase", "P", "n", "k", "words/rank", "bound", "ratio",
           "x_coo", "model", "time(us)"]
#: the wire format of the runs: (wire, wire_values), set by --wire / --wire-values
FORMAT: list = [("auto", None)]
#: words of the coo rows, by (input, algorithm, phase): x_coo of the other formats
_COO: dict = {}


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


def _format_name() -> str:
    wire, values = FORMAT[0]
    return wire + (f"+{values}" if values else "")


def _row(table: Table, row: dict) -> None:
    """Add a row with its format and, after a coo row of the same case, x_coo."""
    row["format"] = _format_name()
    key = (row["input"], row["algorithm"], row["phase"])
    if FORMAT[0] == ("coo", None):
        _COO[key] = row["words/rank"]
    row["x_coo"] = row["words/rank"] / _COO[key] if _COO.get(key) else ""
    table.add(row)


def run_sequence(comm, algorithm: str, inputs, k: int, tau_prime: int):
    """Run the steps with one state; return per non-refresh step {op: words}, and mean time."""
    state = TopkState(tau_prime=tau_prime)
    wire, values = FORMAT[0]
    per_step, times = [], []
    for x in inputs:
        comm.stats.reset()
        comm.mpi_comm.Barrier()
        t0 = time.perf_counter()
        topk_allreduce(x, k, algorithm=algorithm, comm=comm, state=state, wire=wire,
                       wire_values=values)
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
        _row(table, {"input": name, "algorithm": "oktopk", "phase": phase, "P": p, "n": n, "k": k,
                   "words/rank": words, "bound": bound, "ratio": words / bound if bound else 0.0,
                   "model": model, "time(us)": seconds * 1e6 if phase == "3 phases" else ""})
    extra = max(s["total"] - sum(s.get(o, 0.0) for o in PHASES) for s in steps)
    _row(table, {"input": name, "algorithm": "oktopk", "phase": "counts+ctl", "P": p, "n": n,
               "k": k, "words/rank": extra, "bound": bound,
               "ratio": extra / bound if bound else 0.0, "model": "", "time(us)": ""})


def all_algorithms(comm, table: Table, inputs, n: int, k: int, tau_prime: int) -> None:
    p = comm.size
    bound = 2 * k * (p - 1) / p
    for alg in cc.algorithms("topk"):
        steps, seconds = run_sequence(comm, alg, inputs, k, tau_prime)
        words = float(np.mean([s["total"] for s in steps]))
        _row(table, {"input": "drifting", "algorithm": alg, "phase": "all", "P": p,
                   "n": n, "k": k, "words/rank": words, "bound": bound,
                   "ratio": words / bound if bound else 0.0,
                   "model": cost_model(alg, p, k, n).words, "time(us)": seconds * 1e6})


@functools.lru_cache(maxsize=1)
def _shared(n: int) -> np.ndarray:
    return (np.random.default_rng(6).standard_t(3, n) * 64).astype(np.float32)


def compressor_grad(r: int, n: int, t: int, drift: bool) -> np.ndarray:
    """The compressor workload's gradient of rank r at step t (module docstring, part 3)."""
    shared = _shared(n)
    if drift:
        shared = shared + np.random.default_rng([7, t]).standard_t(3, n) * 12
    return (shared + np.random.default_rng([8, r, t]).standard_normal(n) * 32).astype(np.float32)


def timed(selector):
    """Make ``selector.select`` record its duration in ``selector.seconds``."""
    inner = selector.select

    def select(*args, **kwargs):
        t0 = time.perf_counter()
        out = inner(*args, **kwargs)
        selector.seconds = time.perf_counter() - t0
        return out

    selector.select = select
    return selector


def compressor(comm, table: Table, n: int, density: float, steps: int, tau: int | str,
               tau_prime: int) -> list[dict]:
    """Part 3: per step counts, volumes and selection time under error feedback; return rows."""
    from mpi4py import MPI

    p, r, mpi = comm.size, comm.rank, comm.mpi_comm
    rows = []
    for drift in (False, True):
        for policy in ("reference", "quantile"):
            sel = timed(Threshold(policy=policy))
            comp = TopkCompressor(n, density, algorithm="oktopk", comm=comm, tau=tau,
                                  wire=FORMAT[0][0], wire_values=FORMAT[0][1],
                                  tau_prime=tau_prime, selector=sel)
            k, bound = comp.k, 2 * comp.k * (p - 1) / p
            for t in range(steps):
                grad = compressor_grad(r, n, t, drift)
                comm.stats.reset()
                upd = comp.step(grad)
                local = mpi.allgather(comp.state.last["local_count"])
                row = {"workload": "drifting" if drift else "fixed", "policy": policy, "step": t,
                       "refresh": comp.state.last["refresh"], "P": p, "n": n, "k": k,
                       "local/k": f"{min(local) / k:.2f}-{max(local) / k:.2f}",
                       "nnz/k": upd.nnz / k,
                       "data/bound": phase_words(comm, PHASES) / bound if p > 1 else 0.0,
                       "all/bound": phase_words(comm, comm.stats.by_op) / bound if p > 1 else 0.0,
                       "select(ms)": mpi.allreduce(sel.seconds, op=MPI.MAX) * 1e3}
                row["local_min"], row["local_max"] = min(local) / k, max(local) / k
                table.add(row)
                rows.append(row)
    return rows


def summary(rows: list[dict]) -> list[str]:
    """Per workload and policy, the ranges over non-refresh steps after the first."""
    lines = []
    for key in sorted({(r["workload"], r["policy"]) for r in rows}):
        got = [r for r in rows if (r["workload"], r["policy"]) == key and r["step"] > 0
               and not r["refresh"]]
        if not got:
            continue
        def rng(f, name):
            return f"{name} {min(f(r) for r in got):.2f}-{max(f(r) for r in got):.2f}"

        lines.append(f"# {key[0]:8s} {key[1]:9s}: " + ", ".join([
            rng(lambda r: r["local_min"], "local/k min") + " / max " +
            f"{max(r['local_max'] for r in got):.2f}", rng(lambda r: r["nnz/k"], "nnz/k"),
            rng(lambda r: r["data/bound"], "data/bound"),
            rng(lambda r: r["all/bound"], "all/bound"),
            f"select {np.median([r['select(ms)'] for r in got]):.2f} ms (median)"]))
    return lines


def selection_cost(comm, n: int, density: float, repeats: int) -> dict:
    """Part 4: time (rank 0) every selector beside one threshold pass on one vector of length n
    (round robin over the selectors, median per selector)."""
    if comm.rank != 0:  # wait without spinning, so rank 0 has the cores to itself
        request = comm.mpi_comm.Ibarrier()
        while not request.Test():
            time.sleep(0.01)
        return {}
    k = max(1, int(density * n))
    x = np.random.default_rng(5).standard_t(3, n).astype(np.float32)
    kth = float(kth_abs(x, k))
    reference = Threshold(policy="reference")
    reference.select(x, k, refresh=True)
    drifted = x * np.float32(1.001)
    fns = {"one pass |x|>=t": lambda: select_abs_ge(x, kth),
           "Threshold quantile": lambda: Threshold().select(x, k),
           "Threshold reference reuse": lambda: reference.select(drifted, k, refresh=False),
           "Gaussian corrected": lambda: Gaussian().select(x, k),
           "Gaussian reference": lambda: Gaussian(policy="reference").select(x, k),
           "exact topk_abs": lambda: topk_abs(x, k),
           "Exact selector": lambda: Exact().select(x, k)}
    samples: dict = {name: [] for name in fns}
    for _ in range(1 + repeats):  # round robin: a change of load hits every selector alike
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    timings = {name: float(np.median(got[1:])) for name, got in samples.items()}
    t0 = time.perf_counter()  # once: a sort-based exact top-k, for reference
    np.sort(np.argsort(-np.abs(x))[:k])
    timings["argsort top-k (once)"] = time.perf_counter() - t0
    comm.mpi_comm.Ibarrier().Wait()
    one = timings["one pass |x|>=t"]
    return {"n": n, "k": k, "seconds": timings,
            "ratio": {name: sec / one for name, sec in timings.items()}}


PARTS = ("phases", "algorithms", "compressor", "selection")
CCOLUMNS = ["workload", "policy", "step", "refresh", "P", "n", "k", "local/k", "nnz/k",
            "data/bound", "all/bound", "select(ms)"]


def main() -> None:
    p = common_parser("Top-k allreduce volumes per phase, density under error feedback, "
                      "selection cost", flags="")
    p.add_argument("--n", type=parse_length, default=parse_size("1M"), help="vector length")
    p.add_argument("--density", type=fraction, default=0.01, help="k / n, in (0, 1]")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="steps (default: 8 for the phases, 40 for the compressor)")
    p.add_argument("--tau", type=lambda v: v if v == "auto" else positive_int(v), default="auto",
                   help='compressor: repartition period, an int or "auto" (default)')
    p.add_argument("--tau-prime", type=positive_int, default=None,
                   help="refresh period (default: 4 for the phases, 32 for the compressor)")
    p.add_argument("--only", choices=PARTS, action="append", help="run only these parts")
    p.add_argument("--selection-n", type=parse_size, default=1 << 24,
                   help="vector length of the selection timing (0: skip it)")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="timed rounds of the selection timing")
    wire_arguments(p, " of the phases and algorithms parts (coo runs first); x_coo = words / "
                   "the coo row's; the compressor runs the first listed")
    args = p.parse_args()
    asked = [(w, None if v == "none" else v) for w in args.wire for v in args.wire_values]
    formats = sorted(asked, key=lambda f: f != ("coo", None))  # coo's rows before x_coo's
    parts = args.only or PARTS
    comm = cc.init("mpi")
    size, rank, n = comm.size, comm.rank, args.n
    if n < size:  # every rank alike: each one exits with the message
        p.error(f"--n {n}: must be at least the number of ranks, {size}")
    if ("phases" in parts or "algorithms" in parts) and min(args.steps or 8,
                                                            args.tau_prime or 4) < 2:
        p.error("--steps and --tau-prime: the phases and algorithms parts count the steps "
                "between Ok-Topk's refreshes (step 0 and every tau-prime-th): at least 2 each")
    k = max(size, int(args.density * n)) // size * size
    table = Table(COLUMNS, rank)
    meta: dict = {"P": size, "n": n, "k": k}
    if "phases" in parts or "algorithms" in parts:
        table.header(f"top-k allreduce on {size} ranks: n={n}, k={k}; words received per rank "
                     f"(max over ranks), bound = 2k(P-1)/P; non-refresh steps")
        inputs = [drifting(size, rank, n, t) for t in range(args.steps or 8)]
    for fmt in formats:
        FORMAT[0] = fmt
        if "phases" in parts:
            oktopk_phases(comm, table, "balanced", [balanced(size, rank, n, k)] * 2, n, k, 32)
            oktopk_phases(comm, table, "drifting", inputs, n, k, args.tau_prime or 4)
        if "algorithms" in parts:
            all_algorithms(comm, table, inputs, n, k, args.tau_prime or 4)
    FORMAT[0] = asked[0]
    if "compressor" in parts:
        ctable = Table(CCOLUMNS, rank)
        ctable.header(f"compressor workload on {size} ranks: TopkCompressor(n={n}, density="
                      f"{args.density:g}, 'oktopk', tau={args.tau}, tau_prime="
                      f"{args.tau_prime or 32}); words received per rank (max over ranks) / "
                      f"2k(P-1)/P")
        rows = compressor(comm, ctable, n, args.density, args.steps or 40, args.tau,
                          args.tau_prime or 32)
        meta["compressor"] = rows
        table.rows += rows
        if rank == 0:
            print("# non-refresh steps after the first (targets: local/k 0.8-1.25, nnz/k "
                  "0.9-1.1, data/bound <= 2.2):")
            print("\n".join(summary(rows)))
    sel = selection_cost(comm, args.selection_n, args.density, args.repeats) \
        if "selection" in parts and args.selection_n > 0 else {}
    if rank == 0 and sel:
        print(f"# selection at n={sel['n']}, k={sel['k']} (rank 0, median of {args.repeats}):")
        for name, sec in sel["seconds"].items():
            print(f"#   {name:26s} {sec * 1e3:9.2f} ms  {sel['ratio'][name]:7.2f}x one pass")
    meta["selection"] = sel
    table.rows += [{"selector": name, "time(ms)": sec * 1e3, "x one pass": sel["ratio"][name]}
                   for name, sec in sel.get("seconds", {}).items()]
    table.finish(args, meta)


if __name__ == "__main__":
    main()
