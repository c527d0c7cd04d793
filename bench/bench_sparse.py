"""nccl-tests-style benchmark of sparse_allreduce's algorithms against a plain MPI dense Allreduce.

Sweeps algorithms x density x overlap (x n, x row width) on whatever ``mpiexec -n`` gives; every
row reports the median time over ranks' slowest (and the minimum), the ratio to mpi4py's dense
``Allreduce`` of the same n float32 measured in the same run (``x_dense``), the wire bytes this
algorithm receives per rank (max over ranks), and with ``--memory`` the peak extra memory of one
call (tracemalloc, which sees numpy's allocations) divided by the bytes that rank received.
Algorithms are timed interleaved (one call of each per round) so drift hits them alike.

    mpiexec -n 4 python -m mpi4py bench/bench_sparse.py                   # the full sweep
    mpiexec -n 4 python -m mpi4py bench/bench_sparse.py --n 16M --density 0.01 \\
        --overlap random --width 0 -n 15 --memory                         # the target row
    mpiexec -n 4 python -m mpi4py bench/bench_sparse.py --width 64 --json rows.json
    mpiexec -n 3 python -m mpi4py bench/bench_sparse.py --cases 64K/0.3/0/random/0.5,4K/0.01/16/hot
    mpiexec -n 4 python -m mpi4py bench/bench_sparse.py --cases 16M/0.01/0/random \\
        --algorithms split --wire coo,compact --wire-values none,bfloat16   # wire formats

Every row also shows the time the tuner's model predicts (``pred(us)``, from the profile
``auto`` uses: CUPYCOLL_PROFILE, else the file ``tune`` writes by default, else the shipped
one) and ``pred/meas``. The summary ends with the
regret table: per case, the best exact algorithm, auto's pick, auto / best, auto / plain dense
Allreduce, the sparse result's bytes over the dense vector's, and the counts against the
targets (auto <= 1.10x best; auto <= 1.15x dense where the sparse result is the smaller;
predictions within +-30%). Under ``CUPYCOLL_AUTO=learn`` (the default) every auto call first
runs its shape class's trials, untimed, so auto's row shows what a training loop runs once
they are done, and auto's pick is the algorithm learn then keeps (under ``estimate``: the
model's pick; under ``measure``: the one kept once its trials ended, e.g. in the warm-up).
``--profiles A.json,B.json`` adds the same counts for other profiles, priced against the same
measured times (noise between two runs cannot favour either): how two tunes or two tuner
versions compare.
"""

from __future__ import annotations

import argparse
import os
import sys
import tracemalloc

import numpy as np
from _common import (NOT_CHECKED, SPARSE_COLUMNS, Table, bandwidths, common_parser,
                     interleaved, listed, non_negative_float, non_negative_int, one_of,
                     parse_size, progress, sample_stats, wire_arguments)
from mpi4py import MPI

import cupycoll as cc
from cupycoll.comm import bus_factor
from cupycoll.primitives import free_scratch
from cupycoll._registry import lookup
from cupycoll._types import ReduceOp
from cupycoll.sparse import SparseResult, sparse_allreduce
from cupycoll.sparse._cost import Shape
from cupycoll._config import setting
from cupycoll.sparse import learn, measure
from cupycoll.sparse.auto import choose, prices, resolved
from cupycoll.sparse.recursive_doubling import reads_in_place
from cupycoll.tuner.predict import predict
from cupycoll.tuner.profile import load_profile, profile_for
from cupycoll.wire._pack import Wire

OVERLAPS = ("disjoint", "random", "identical", "hot")
ALGORITHMS = ("allgather", "mask", "dense", "recursive_doubling", "split", "auto")
BASELINE = "mpi_dense"
COLUMNS = SPARSE_COLUMNS + ["overlap", "min(us)", "x_dense", "pred(us)", "pred/meas",
                            "mem/recv", "format", "x_coo", "x_bound"]


def make_input(seed: int, rank: int, size: int, n: int, k: int, width: int, overlap: str,
               skew: float = 0.0):
    """Sorted unique indices (k of them; rank 0: (1 + skew) k) and float32 values (rows)."""
    rng = np.random.default_rng([seed, rank])
    k = min(n, int(round(k * (1 + skew)))) if rank == 0 else k
    if overlap == "disjoint":
        idx = rank + size * np.sort(rng.choice(n // size, min(k, n // size), replace=False))
    elif overlap == "identical":
        idx = np.sort(np.random.default_rng(seed).choice(n, k, replace=False))
    elif overlap == "hot":  # half from the shared hot range [0, k), half uniform: skewed
        hot = rng.choice(k, k // 2, replace=False)
        idx = np.union1d(hot, rng.choice(n, k - k // 2, replace=False))
    else:
        idx = np.sort(rng.choice(n, k, replace=False))
    shape = (idx.size, width) if width else (idx.size,)
    return idx.astype(np.int32 if n < 2**31 else np.int64), rng.standard_normal(shape,
                                                                               np.float32)


def reference(inputs, n: int, width: int):
    """Union indices and float64 sums of all ranks' inputs (independent of cupycoll)."""
    total = np.zeros((n, width) if width else n)
    seen = np.zeros(n, bool)
    for idx, val in inputs:
        np.add.at(total, idx, val)
        seen[idx] = True
    union = np.flatnonzero(seen)
    return union, total[union]


def count_wrong(res, ref, rtol: float = 1e-5) -> int:
    union, want = ref
    if not isinstance(res, SparseResult):  # output="dense": the union's values, zeros elsewhere
        absent = np.ones(res.shape[0], bool)
        absent[union] = False
        res = SparseResult(union if not res[absent].any() else union[:0], res[union],
                           res.shape[0])
    if res.indices.shape != union.shape or not np.array_equal(res.indices, union):
        return int(max(union.size, 1))
    tol = rtol * (np.abs(want) + 1)
    return int(np.count_nonzero(np.abs(res.values - want) > tol))


def peak_ratio(call, comm) -> float:
    """Peak extra memory of one call / bytes this rank received in it (max over ranks)."""
    comm.stats.reset()
    free_scratch()  # so the temporaries the numba loops keep are counted in this call
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    result = call()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del result
    received = max(comm.stats.bytes_received, 1)
    return float(comm.mpi_comm.allreduce(peak / received, op=MPI.MAX))


def auto_shape(comm, inputs: list, n: int, width: int, output: str) -> Shape:
    """The Shape ``auto`` prices a case of float32 ``inputs`` (every rank's) by, as the front
    door builds it: host arrays, blocks read in place where the exchange arena serves it."""
    nnz, index_bytes = tuple(int(i.size) for i, _ in inputs), inputs[0][0].dtype.itemsize
    return Shape(comm.size, n, width, index_bytes, 4, nnz, output=output, host=comm.xp is np,
                 in_place=reads_in_place(comm, nnz, n, index_bytes, 4 * max(width, 1)))


def run_group(args, comm, table: Table, n: int, width: int, density: float, overlap: str,
              algorithms: list[str], skew: float = 0.0) -> dict:
    p, rank = comm.size, comm.rank
    k = max(1, int(round(density * n)))
    inputs = [make_input(args.seed, r, p, n, k, width, overlap, skew) for r in range(p)]
    shape = auto_shape(comm, inputs, n, width, args.output)
    union = np.unique(np.concatenate([i for i, _ in inputs])).size
    profile = profile_for(comm)
    pick = choose(shape, profile)  # auto's pick may be outside --algorithms: priced anyway
    predicted = {a: predict(a, shape, profile) for a in {*algorithms, pick} - {"auto"}}
    idx, val = inputs[rank]
    dense_in = np.ones((n, width) if width else n, np.float32)
    dense_out = np.empty_like(dense_in)
    calls = {BASELINE: lambda: comm.mpi_comm.Allreduce(dense_in, dense_out, op=MPI.SUM)}
    formats = wire_formats(args)
    into = np.empty_like(dense_in) if args.output == "dense" else None  # like the baseline's
    for base in algorithms:
        for fmt in formats:
            name = base + format_suffix(fmt, formats)
            calls[name] = (lambda a, f: lambda: sparse_allreduce(
                idx, val, n, algorithm=a, comm=comm, wire=f[0], wire_values=f[1],
                output=args.output, out=into))(base, fmt)
            if args.raw and base != "auto":  # the algorithm alone: no validation, no coalescing
                calls[name] = (lambda fn, f: lambda: SparseResult(*fn(
                    comm, idx, val, n, ReduceOp.SUM, None, Wire(f[0] == "compact", f[1])),
                    n))(lookup("sparse", base, counts=shape.nnz, **prices(comm, base)), fmt)
    algorithms = [a for a in calls if a != BASELINE]
    # auto, its pick and other profiles' picks are read on the first wire format's rows (a
    # row's name carries its format when --wire or --wire-values name one)
    suffix = format_suffix(formats[0], formats)
    classes = learn_trials(comm, {a: calls[a] for a in algorithms if a.split("[")[0] == "auto"})
    samples = interleaved(calls, args.iters, args.warmup_iters, comm)
    pick = measured_pick(comm, shape) or learned_pick(comm, classes.get("auto" + suffix)) or pick
    ref = reference(inputs, n, width) if args.check else None
    dense_time = float(np.median(samples[BASELINE]))
    size_bytes = n * max(width, 1) * 4
    times, coo_bytes = {}, {}
    # the COO lower bound: an optimal allgather of k entries (an index and a row each) spread
    # evenly over the ranks, of which each rank receives the (P-1)/P it lacks
    bound = k * (p - 1) / p * shape.entry_bytes
    for name in [BASELINE] + algorithms:
        seconds = float(np.median(samples[name]))
        times[name] = seconds
        wrong, wire, mem = 0 if args.check else NOT_CHECKED, 2 * (p - 1) * size_bytes // p, ""
        base, fmt = name.split("[")[0], name.partition("[")[2].rstrip("]") or "-"
        if name != BASELINE:
            comm.stats.reset()
            if into is not None:  # the buffer every call writes: its check starts from NaN
                into.fill(np.nan)
            res = calls[name]()
            wire = int(comm.mpi_comm.allreduce(comm.stats.bytes_received, op=MPI.MAX))
            if ref is not None:
                # rounded values (wire_values): within a rounding per rank of the sum
                rtol = {"bfloat16": 2**-8, "float16": 2**-11}.get(fmt.partition("+")[2], 1e-5)
                wrong = int(comm.mpi_comm.allreduce(count_wrong(res, ref, rtol * p)))
            del res
            if args.memory:
                mem = peak_ratio(calls[name], comm)
        algbw, busbw = bandwidths(size_bytes, seconds, bus_factor("allreduce", p))
        if name != BASELINE and fmt in ("-", "coo"):
            coo_bytes[base] = wire
        pred = predicted.get(pick if base == "auto" else base)
        table.add({"size(B)": size_bytes, "count": n, "type": "float32", "redop": "sum",
                   "root": -1, "time(us)": seconds * 1e6, "algbw(GB/s)": algbw,
                   "busbw(GB/s)": busbw, "#wrong": wrong, "density": density,
                   "nnz": min(shape.nnz) if name != BASELINE else n, "algorithm": name,
                   "wire(B)": wire,
                   "overlap": overlap, "min(us)": float(samples[name].min()) * 1e6,
                   "x_dense": seconds / dense_time, "mem/recv": mem, "width": width,
                   "ranks": p, "skew": skew, "pred(us)": pred * 1e6 if pred else "",
                   "pred/meas": pred / seconds if pred else "", "format": fmt,
                   "x_coo": wire / coo_bytes[base] if coo_bytes.get(base) else "",
                   "x_bound": wire / bound if bound else "", **sample_stats(samples[name])})
    exact = {a: t for a, t in times.items() if a != BASELINE and a.split("[")[0] != "auto"}
    best = min(exact, key=exact.get) if exact else None
    auto_time, pick_time = times.get("auto" + suffix), times.get(pick + suffix)
    errors = _errors(predicted, times)
    others, bases = {}, {a.split("[")[0] for a in algorithms} - {"auto"}
    for path in filter(None, args.profiles.split(",")):
        other = load_profile(path, size=p)
        choice = choose(shape, other)
        others[path] = {"pred_over_meas": _errors({a: predict(a, shape, other) for a in bases},
                                                   times),
                        "pick_x_best": times[choice + suffix] / exact[best]
                        if best and choice + suffix in times else None}
    return {"n": n, "width": width, "density": density, "overlap": overlap, "skew": skew,
            "ranks": p, "best": best, "auto_choice": pick,
            "result_x_dense": union * shape.entry_bytes / (n * shape.row_bytes),
            "best_x_dense": exact[best] / dense_time if best else None,
            "auto_x_best": auto_time / exact[best] if best and auto_time else None,
            "auto_x_dense": auto_time / dense_time if auto_time else None,
            "pick_x_best": pick_time / exact[best] if best and pick_time else None,
            "pred_over_meas": errors, "profiles": others}


def measured_pick(comm, shape: Shape) -> str | None:
    """Under CUPYCOLL_AUTO=measure, the algorithm auto kept for this kind of call (once its
    trials ended, e.g. in the warm-up: ``-w`` >= 24), else None (the model's pick is shown)."""
    if setting("CUPYCOLL_AUTO") != "measure" or comm.size == 1:
        return None
    trials = measure.measured(comm).get(measure.kind(resolved(shape, comm=comm, op="sum")[0]))
    return trials.pick if trials else None


def learn_trials(comm, calls: dict) -> dict:
    """Under CUPYCOLL_AUTO=learn (the default; P > 1): run each of ``calls`` (auto's) through
    its shape class's first trials, untimed (``1 + learn.TRIAL_CALLS`` calls), so that the
    timing shows what a training loop runs once they are done (bench_regret.py shows what the
    trials cost a loop); return each call's class in learn's records (none for a call that
    learn does not time: a small call, finished in the validation)."""
    if setting("CUPYCOLL_AUTO") != "learn" or comm.size == 1:
        return {}
    classes = {}
    for name, call in calls.items():
        before = {key: record.calls for key, record in learn.records(comm).items()}
        for _ in range(1 + learn.TRIAL_CALLS):
            call()
        grown = [key for key, record in learn.records(comm).items()
                 if record.calls > before.get(key, 0)]
        if grown:
            classes[name] = grown[0]
    return classes


def learned_pick(comm, key) -> str | None:
    """The algorithm learn's record of class ``key`` runs now (None without one)."""
    record = learn.records(comm).get(key) if key is not None else None
    return record.choice() if record is not None else None


def _errors(predicted: dict[str, float], times: dict[str, float]) -> list[float]:
    """predicted / measured of every timed algorithm with a prediction."""
    return [predicted[a.split("[")[0]] / times[a] for a in times if a.split("[")[0] in predicted]


def wire_formats(args) -> list[tuple[str, str | None]]:
    """(wire, wire_values) pairs asked for by --wire and --wire-values (coo first)."""
    values = [None if v == "none" else v for v in args.wire_values]
    return sorted([(w, v) for w in args.wire for v in values], key=lambda f: f != ("coo", None))


def format_suffix(fmt: tuple[str, str | None], formats: list) -> str:
    """``[compact+bfloat16]``-style row suffix (none when only the default format runs)."""
    if formats == [("auto", None)]:
        return ""
    return f"[{fmt[0]}{'+' + fmt[1] if fmt[1] else ''}]"


def _case(text: str) -> tuple:
    """``n/density/width/overlap[/skew]`` -> a group of run_group's arguments."""
    parts = text.split("/")
    if len(parts) not in (4, 5):
        raise ValueError(f"a case is n/density/width/overlap[/skew], got {text!r}")
    skew = non_negative_float(parts[4]) if len(parts) > 4 else 0.0
    return parse_size(parts[0]), int(parts[2]), float(parts[1]), parts[3], skew


def _ratio(value: float | None) -> str:
    """A ratio to two decimals, or "-" when it was not measured (e.g. auto's pick not run)."""
    return "-" if value is None else f"{value:.2f}"


def print_regret(summary: list[dict]) -> None:
    """The regret table (markdown) and the counts against auto's targets.

    A row whose pick was not among --algorithms shows "-" for pick/best and is left out of
    that count (auto's own run is still timed and counted). ``result/dense`` is the bytes of
    the sparse result (the union's indices and rows) over the dense vector's: the 1.15x
    target counts the rows where it is below 1."""
    print("| P | n | width | density | overlap | skew | best | auto -> | pick/best | auto/best | "
          "auto/dense | best/dense | result/dense | pred/meas range |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        if s["auto_x_best"] is None:
            continue
        err = s["pred_over_meas"]
        spread = f"{min(err):.2f}-{max(err):.2f}" if err else "-"
        print(f"| {s['ranks']} | {s['n']} | {s['width']} | {s['density']} | {s['overlap']} | "
              f"{s['skew']} | {s['best']} | {s['auto_choice']} | {_ratio(s['pick_x_best'])} | "
              f"{s['auto_x_best']:.2f} | "
              f"{s['auto_x_dense']:.2f} | {s['best_x_dense']:.2f} | "
              f"{s['result_x_dense']:.2f} | {spread} |")
    rows = [s for s in summary if s["auto_x_best"] is not None]
    picks = [s["pick_x_best"] for s in rows if s["pick_x_best"] is not None]
    errors = [e for s in rows for e in s["pred_over_meas"]]
    smaller = [s for s in rows if s["result_x_dense"] < 1]
    if rows:
        print(f"# auto's pick (its interleaved time) <= 1.10x best on "
              f"{sum(x <= 1.10 for x in picks)}/{len(picks)} rows where it ran; "
              f"auto's own run <= 1.10x best on {sum(s['auto_x_best'] <= 1.10 for s in rows)}"
              f"/{len(rows)} rows; auto <= 1.15x dense Allreduce on "
              f"{sum(s['auto_x_dense'] <= 1.15 for s in smaller)}/{len(smaller)} rows whose "
              f"sparse result is smaller than the dense vector "
              f"({sum(s['auto_x_dense'] <= 1.15 for s in rows)}/{len(rows)} in all); "
              f"predictions within +-30% on {sum(0.7 <= e <= 1.3 for e in errors)}/{len(errors)}")
    for path in rows[0].get("profiles", {}) if rows else ():
        picks = [s["profiles"][path]["pick_x_best"] for s in rows]
        picks = [x for x in picks if x is not None]
        errors = [e for s in rows for e in s["profiles"][path]["pred_over_meas"]]
        print(f"# with {path}: its pick <= 1.10x best on {sum(x <= 1.10 for x in picks)}/"
              f"{len(picks)} rows; predictions within +-30% on "
              f"{sum(0.7 <= e <= 1.3 for e in errors)}/{len(errors)}")


def main() -> int:
    parser = common_parser(__doc__, flags="nwc", plots=True)
    parser.set_defaults(iters=10, warmup_iters=2)
    parser.add_argument("--n", default="4M,16M", help="dense lengths of 1-D rows (comma list)")
    parser.add_argument("--rows", default="64K", help="number of rows for --width > 0")
    parser.add_argument("--width", default="0,64", help="row widths, 0 = 1-D (comma list)")
    parser.add_argument("--density", default="0.001,0.01,0.1", help="nnz / n per rank")
    parser.add_argument("--overlap", default=",".join(OVERLAPS))
    parser.add_argument("--algorithms", type=listed(one_of(*cc.algorithms("sparse"))),
                        default=",".join(ALGORITHMS))
    parser.add_argument("--memory", action="store_true", help="measure peak extra memory")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--profiles", default="", help="other profile files (comma list) to "
                        "price the same measured rows with (summary counts per profile)")
    parser.add_argument("--raw", action="store_true", help="time the algorithms alone (no "
                        "validation allreduce): their own cost against the dense Allreduce")
    parser.add_argument("--skew", type=non_negative_float, default=0.0,
                        help="rank 0 has (1 + skew) x nnz")
    wire_arguments(parser, "; bytes are reported against coo's (x_coo; coo runs first) and "
                   "against the COO lower bound k(P-1)/P entries, an index and a row each "
                   "(x_bound)")
    parser.add_argument("--output", default="sparse", choices=["sparse", "dense"],
                        help="dense: sparse_allreduce(output='dense') into a preallocated "
                        "buffer (as the baseline Allreduce), for callers that apply it densely")
    parser.add_argument("--cases", default="", help="explicit cases n/density/width/overlap"
                        "[/skew], comma separated (replaces the grid)")
    args = parser.parse_args()
    if args.raw and args.output == "dense":
        parser.error("--raw times the algorithms' sparse results; not with --output dense")
    algorithms = args.algorithms
    groups = []
    try:
        for width in (int(w) for w in args.width.split(",")):
            lengths = [parse_size(args.rows)] if width else [parse_size(s)
                                                              for s in args.n.split(",")]
            groups += [(n, width, float(d), o, args.skew) for n in lengths
                       for d in args.density.split(",") for o in args.overlap.split(",")]
        if args.cases:
            groups = [_case(c) for c in args.cases.split(",") if c]
    except (argparse.ArgumentTypeError, ValueError, IndexError) as exc:
        parser.error(str(exc))
    if not all(g[0] >= 1 and g[1] >= 0 and 0 < g[2] <= 1 for g in groups):
        parser.error("every n must be >= 1, every width >= 0 and every density in (0, 1]")
    unknown = {g[3] for g in groups} - set(OVERLAPS)
    if unknown:
        parser.error(f"unknown {sorted(unknown)}: overlaps are {list(OVERLAPS)}")
    missing = [path for path in filter(None, args.profiles.split(",")) if not os.path.isfile(path)]
    if missing:
        parser.error(f"--profiles: no such file {missing}")
    comm = cc.init("mpi")
    table = Table(COLUMNS, comm.rank)
    table.header(f"sparse_allreduce  ranks={comm.size}  backend={comm.backend}  "
                 f"iters={args.iters} warmup={args.warmup_iters}  time = median of slowest rank")
    summary = [run_group(args, comm, table, *g[:4], algorithms, skew=g[4])
               for g in progress(groups, len(groups), comm.rank, not args.no_progress)]
    status = table.finish(args, {"ranks": comm.size, "backend": comm.backend,
                                 "summary": summary}, plot=("density", "x_dense", "algorithm"))
    if comm.rank == 0:
        print_regret(summary)
    return status


if __name__ == "__main__":
    sys.exit(main())
