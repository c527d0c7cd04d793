"""Shared benchmark plumbing: nccl-tests flags and table, timing, JSON, progress (rank 0 prints)."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, NoReturn, Sequence

import numpy as np

from cupycoll._arguments import (NO_MATPLOTLIB, checked, listed, one_of,  # noqa: F401
                                 output_file, parse_length, parse_size, positive_int)
from cupycoll._types import DENSE_DTYPES
from cupycoll.primitives._accel import ready
from cupycoll.tuner.calibrate import interleaved

ready()  # timed calls run numba's loops from the first (its import not in the background)
GB = 1e9
_MIN_WIDTH = {"algorithm": 20}  # "recursive_doubling" and friends

#: nccl-tests columns; sparse benchmarks append density, nnz, algorithm, wire bytes.
DENSE_COLUMNS = ["size(B)", "count", "type", "redop", "root", "time(us)", "algbw(GB/s)",
                 "busbw(GB/s)", "#wrong"]
SPARSE_COLUMNS = DENSE_COLUMNS + ["density", "nnz", "algorithm", "wire(B)"]
#: the ``#wrong`` of a row not checked (``-c 0``), as nccl-tests prints it
NOT_CHECKED = "N/A"


#: argparse's types of the benchmarks' numbers (a bad value is a usage error before the run)
non_negative_int = checked(int, lambda v: v >= 0, "an int >= 0")
non_negative_float = checked(float, lambda v: 0 <= v < math.inf, "a finite number >= 0")
fraction = checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def dtype_name(text: str) -> str:
    """argparse's type of -d: the name of a dtype the dense collectives take here."""
    allowed = [d.name for d in DENSE_DTYPES]
    try:
        name = np.dtype(text).name if text.strip() else None
    except Exception:  # numpy's TypeError, or another error of a text it cannot read
        name = None
    if name not in allowed:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(allowed)}, got {text!r}")
    return name


#: nccl-tests' flags: letter -> (long name, add_argument's keywords)
NCCL_TESTS_FLAGS = {
    "b": ("--minbytes", {"type": parse_size, "default": parse_size("8")}),
    "e": ("--maxbytes", {"type": parse_size, "default": parse_size("64M")}),
    "f": ("--stepfactor", {"type": checked(int, lambda v: v >= 2, "an int >= 2"),
                           "default": 2}),
    "n": ("--iters", {"type": positive_int, "default": 20}),
    "w": ("--warmup_iters", {"type": non_negative_int, "default": 3}),
    "c": ("--check", {"type": checked(int, lambda v: v in (0, 1), "0 or 1"), "default": 1,
                      "help": "check correctness (1) or not (0)"}),
    "d": ("--datatype", {"type": dtype_name, "default": "float32"}),
    "o": ("--op", {"default": "sum"}),
}


def common_parser(description: str, flags: str = "befnwcdo", plots: bool = False
                  ) -> argparse.ArgumentParser:
    """Return an argparse parser with the nccl-tests flags among ``flags`` that the benchmark
    honours (a flag it would ignore is refused as unknown), --json, --csv and, for a benchmark
    that draws its rows (``plots``), --plot."""
    p = Parser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    for letter in flags:
        name, keywords = NCCL_TESTS_FLAGS[letter]
        p.add_argument(f"-{letter}", name, **keywords)
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON to PATH ('-' = stdout)")
    p.add_argument("--csv", metavar="PATH", help="write the rows as CSV to PATH ('-' = stdout)")
    if plots:
        p.add_argument("--plot", metavar="PATH", help="draw the rows with matplotlib into PATH")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is drawn only when stderr is a terminal)")
    return p


#: where --json - and --csv - write once parsed: the process's stdout (the table then goes to
#: stderr); None: sys.stdout at the time of writing
_DATA_OUT = None


class Parser(argparse.ArgumentParser):
    """The benchmarks' parser, which checks the output paths before the run (a folder that is
    not there, or --plot without matplotlib, is a usage error, not a run's results lost at its
    end) and, with --json - or --csv -, keeps stdout for that data alone (the table and notes
    go to stderr)."""

    def parse_args(self, *args: Any, **kwargs: Any) -> argparse.Namespace:
        global _DATA_OUT
        parsed = super().parse_args(*args, **kwargs)
        paths = {flag: getattr(parsed, flag, None) for flag in ("json", "csv", "plot")}
        if hasattr(parsed, "minbytes") and not sizes(parsed.minbytes, parsed.maxbytes,
                                                     getattr(parsed, "stepfactor", 2)):
            self.error(f"-b {parsed.minbytes} to -e {parsed.maxbytes}: no size to run")
        if paths["json"] == "-" and paths["csv"] == "-":
            self.error("--json - and --csv -: only one of them can have stdout")
        for flag, path in paths.items():
            if path and path != "-":  # ~ and ~user as a shell expands them (not in --json=~/x)
                path = os.path.expanduser(path)
                setattr(parsed, flag, path)
            if path and path != "-" and not os.path.isdir(os.path.dirname(path) or "."):
                self.error(f"--{flag} {path}: no folder {os.path.dirname(path)!r}")
            try:  # a folder, or a file it may not write: refused now, not after the run
                if path and path != "-":
                    output_file(path)
            except argparse.ArgumentTypeError as exc:
                self.error(f"--{flag}: {exc}")
        if paths["plot"]:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                self.error(f"--plot {paths['plot']}: {NO_MATPLOTLIB}")
        if "-" in (paths["json"], paths["csv"]):
            _DATA_OUT, sys.stdout = sys.stdout, sys.stderr
        return parsed

    def error(self, message: str) -> NoReturn:
        """Usage and message in one write: under mpiexec a rank's abort can end the job between
        two writes, and the message is the half a user needs."""
        self.exit(2, f"{self.format_usage()}{self.prog}: error: {message}\n")


def data_out() -> Any:
    """The stream of --json - and --csv -."""
    return _DATA_OUT or sys.stdout


def sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """Return the geometric size sweep from minbytes to maxbytes (inclusive)."""
    out, s = [], max(1, minbytes)
    while s <= maxbytes:
        out.append(s)
        s *= factor
    return out


def time_collective(fn: Callable[[], Any], iters: int, warmup: int, comm) -> np.ndarray:
    """Time ``fn`` ``iters`` times after ``warmup`` runs; each sample is the slowest rank's time
    (ranks start each iteration together: a sample is the collective's completion time as
    every rank experiences it)."""
    return interleaved({"fn": fn}, iters, warmup, comm)["fn"]


def print_medians(samples: dict[str, np.ndarray], base: str, what: str, ratio: str) -> None:
    """Print each call's median time (us) and its ratio to the median of call ``base``, in
    columns headed ``what`` and ``ratio`` (the side-by-side tables of the small benchmarks)."""
    reference = float(np.median(samples[base]))
    print(f"# {what:<40}{'time(us)':>10}{ratio:>13}")
    for name, s in samples.items():
        t = float(np.median(s))
        print(f"  {name:<40}{t * 1e6:>10.1f}{t / reference:>13.2f}")


def sample_stats(samples: np.ndarray) -> dict[str, float]:
    """Per-size statistics over iterations (each sample already the slowest rank's), in us."""
    us = np.asarray(samples, dtype=float) * 1e6
    return {"median(us)": float(np.median(us)), "min(us)": float(us.min()),
            "p95(us)": float(np.percentile(us, 95)), "p99(us)": float(np.percentile(us, 99)),
            "stdev(us)": float(us.std(ddof=1)) if us.size > 1 else 0.0, "iters": int(us.size)}


def run_meta(args: argparse.Namespace | None = None, **extra: Any) -> dict[str, Any]:
    """What a result needs to be reproduced: versions, arguments, relevant environment."""
    from cupycoll._cli import info_lines

    versions = dict(info_lines())
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("CUPYCOLL_", "OMP_", "MPI", "OPENBLAS_", "CUDA_VISIBLE", "NCCL_"))}
    keep = ("cupycoll", "python", "platform", "numpy", "mpi4py", "MPI library", "numba", "cupy",
            "cuda runtime", "cuda driver", "nccl", "devices")
    return {"versions": {k: versions[k] for k in keep if k in versions},
            "arguments": vars(args) if args is not None else {}, "environment": env,
            "command": sys.argv, **extra}


class Table:
    """Print rows in fixed-width nccl-tests style on rank 0 and keep them for --json/--csv/--plot.

    Rows go to stdout through tqdm.write when tqdm is there, so a progress bar on stderr is
    cleared and redrawn around them instead of being overwritten by them.
    """

    def __init__(self, columns: Sequence[str], rank: int, stream=None) -> None:
        self.columns, self.rank, self._stream = list(columns), rank, stream
        self.rows: list[dict[str, Any]] = []
        self.widths = [max(_MIN_WIDTH.get(c, 12), len(c) + 1) for c in self.columns]

    @property
    def stream(self):
        """The output stream: the one given, else sys.stdout at the time of printing."""
        return self._stream if self._stream is not None else sys.stdout

    def _print(self, line: str) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            print(line, file=self.stream, flush=True)
        else:
            tqdm.write(line, file=self.stream)
            self.stream.flush()

    def header(self, title: str = "") -> None:
        if self.rank != 0:
            return
        if title:
            self._print(f"# {title}")
        self._print("#" + _cells(self.columns, self.widths))

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.rank == 0:
            cells = [_fmt(row.get(c, "")) for c in self.columns]
            self._print(" " + _cells(cells, self.widths))

    def write_json(self, path: str | None, meta: dict[str, Any] | None = None) -> None:
        if self.rank != 0 or not path:
            return
        doc = {"meta": meta or {}, "rows": self.rows}
        if path == "-":
            out = data_out()
            json.dump(doc, out, indent=1, default=str)
            print(file=out, flush=True)
        else:
            with open(path, "w") as fh:
                json.dump(doc, fh, indent=1, default=str)

    def write_csv(self, path: str | None) -> None:
        if self.rank != 0 or not path:
            return
        fields = list(dict.fromkeys(k for row in self.rows for k in row))
        fh = data_out() if path == "-" else open(path, "w", newline="")
        try:
            writer = csv.DictWriter(fh, fields)
            writer.writeheader()
            writer.writerows(self.rows)
        finally:
            if path == "-":
                fh.flush()
            else:
                fh.close()

    def plot(self, path: str | None, x: str, y: str, group: str, title: str = "",
             logy: bool = True) -> None:
        """Draw ``y`` against ``x``, one line per value of ``group`` (matplotlib, PNG)."""
        if self.rank != 0 or not path:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for name in dict.fromkeys(row.get(group) for row in self.rows):
            pts = sorted((row[x], row[y]) for row in self.rows
                         if row.get(group) == name and x in row and y in row)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=str(name))
        ax.set(xlabel=x, ylabel=y, title=title)
        ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)

    def finish(self, args: argparse.Namespace, meta: dict[str, Any] | None = None,
               plot: tuple[str, str, str] | None = None) -> int:
        """Write --json/--csv/--plot, print nccl-tests' footers; return the exit status."""
        self.write_json(getattr(args, "json", None), run_meta(args, **(meta or {})))
        self.write_csv(getattr(args, "csv", None))
        if plot is not None:
            self.plot(getattr(args, "plot", None), *plot)
        counts = [row["#wrong"] for row in self.rows if "#wrong" in row]
        wrong = sum(int(c or 0) for c in counts if c != NOT_CHECKED)
        if self.rank == 0 and counts:  # no claim where nothing is checked
            verdict = ("N/A (not checked: -c 0)" if all(c == NOT_CHECKED for c in counts)
                       else f"{wrong} {'OK' if wrong == 0 else 'FAILED'}")
            self._print(f"# Out of bounds values : {verdict}")
        if self.rank == 0:
            bus = [row["busbw(GB/s)"] for row in self.rows if "busbw(GB/s)" in row]
            if bus:
                self._print(f"# Avg bus bandwidth    : {sum(bus) / len(bus):.4g}")
        return 0 if wrong == 0 else 1


def _cells(cells: Sequence[str], widths: Sequence[int]) -> str:
    """``cells`` right-aligned in their columns, a cell wider than its column set off by a
    space (never run into the one before)."""
    return "".join(c.rjust(w) if len(c) < w else " " + c for c, w in zip(cells, widths))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    return str(value)


def progress(items: Iterable, total: int, rank: int, enabled: bool = True, label: str = ""):
    """Yield items with a tqdm progress bar on rank 0's stderr, drawn only when stderr is a
    terminal (never in logs or pipes) and tqdm is installed."""
    show = enabled and rank == 0 and sys.stderr.isatty()
    if show:
        try:
            from tqdm import tqdm
        except ImportError:
            show = False
    if not show:
        yield from items
        return
    with tqdm(items, total=total, desc=label or None, file=sys.stderr, leave=False,
              dynamic_ncols=True) as bar:
        yield from bar


def bandwidths(nbytes: int, seconds: float, factor: float) -> tuple[float, float]:
    """Return (algbw, busbw) in GB/s (GB = 1e9) for ``nbytes`` moved in ``seconds``."""
    algbw = nbytes / seconds / GB if seconds > 0 else 0.0
    return algbw, algbw * factor


# the numpy loops against the numba loops, interleaved (bench_wire.py, dev/bench_primitives.py)


def measure(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """Median seconds of each function, run round-robin so machine noise hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: float(np.median(s)) for name, s in samples.items()}


#: impl -> (CUPYCOLL_NUMBA, CUPYCOLL_THREADS)
IMPLS = {"numpy": ("off", "1"), "numba1": ("on", "1"), "numba": ("on", "auto")}


def implementations(choice: str) -> list[str]:
    """The implementations to measure: numpy, and numba when installed (``choice`` both)."""
    if choice != "both":
        return [choice]
    try:
        import numba  # noqa: F401
    except ImportError:
        return ["numpy"]
    return list(IMPLS)


def under(impl: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run with the numpy loops or the numba loops on one or the default threads."""
    numba, threads = IMPLS[impl]

    def run() -> Any:
        os.environ["CUPYCOLL_NUMBA"], os.environ["CUPYCOLL_THREADS"] = numba, threads
        return fn()

    return run


def wire_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--wire`` and ``--wire-values`` flags of a benchmark that times wire formats
    (``what``: the end of ``--wire``'s help)."""
    parser.add_argument("--wire", type=listed(one_of("coo", "compact", "auto")), default="auto",
                        help=f"wire formats (comma list of coo, compact, auto){what}")
    parser.add_argument("--wire-values", type=listed(one_of("none", "bfloat16", "float16")),
                        default="none", help="value formats (comma list of none, bfloat16, "
                        "float16)")
