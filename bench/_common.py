"""Shared benchmark plumbing: nccl-tests flags and table, timing, JSON, progress (rank 0 prints)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

GB = 1e9
_MIN_WIDTH = {"algorithm": 20}  # "recursive_doubling" and friends

#: nccl-tests columns; sparse benchmarks append density, nnz, algorithm, wire bytes.
DENSE_COLUMNS = ["size(B)", "count", "type", "redop", "root", "time(us)", "algbw(GB/s)",
                 "busbw(GB/s)", "#wrong"]
SPARSE_COLUMNS = DENSE_COLUMNS + ["density", "nnz", "algorithm", "wire(B)"]


def parse_size(text: str) -> int:
    """Parse nccl-tests sizes such as 8, 64K, 1M, 2G (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def common_parser(description: str) -> argparse.ArgumentParser:
    """Return an argparse parser with nccl-tests' flags (-b -e -f -n -w -c -d -o) and --json."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=3)
    p.add_argument("-c", "--check", type=int, default=1, help="check correctness (1) or not (0)")
    p.add_argument("-d", "--datatype", default="float32")
    p.add_argument("-o", "--op", default="sum")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON to PATH ('-' = stdout)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """Return the geometric size sweep from minbytes to maxbytes (inclusive)."""
    out, s = [], max(1, minbytes)
    while s <= maxbytes:
        out.append(s)
        s *= max(2, factor)
    return out


def time_collective(fn: Callable[[], Any], iters: int, warmup: int, mpi_comm) -> np.ndarray:
    """Time ``fn`` ``iters`` times after ``warmup`` runs; each sample is the slowest rank's time.

    Ranks start each iteration together (barrier) and the maximum over ranks is kept, so a
    sample is the collective's completion time as every rank experiences it.
    """
    from mpi4py import MPI

    for _ in range(warmup):
        fn()
    samples = np.empty(iters)
    for i in range(iters):
        mpi_comm.Barrier()
        t0 = time.perf_counter()
        fn()
        samples[i] = time.perf_counter() - t0
    slowest = np.empty_like(samples)
    mpi_comm.Allreduce(samples, slowest, op=MPI.MAX)
    return slowest


def interleaved(calls: dict[str, Callable[[], Any]], iters: int, warmup: int,
                mpi_comm) -> dict[str, np.ndarray]:
    """Time every call ``iters`` times, one of each per round (rotating the order), so drift
    on a shared machine hits them alike; each sample is the slowest rank's time of that call."""
    from mpi4py import MPI

    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name]()
    samples = {name: np.empty(iters) for name in names}
    for i in range(iters):
        for name in names[i % len(names):] + names[:i % len(names)]:
            mpi_comm.Barrier()
            t0 = time.perf_counter()
            calls[name]()
            samples[name][i] = time.perf_counter() - t0
    slowest = {}
    for name in names:
        slowest[name] = np.empty(iters)
        mpi_comm.Allreduce(samples[name], slowest[name], op=MPI.MAX)
    return slowest


class Table:
    """Print rows in fixed-width nccl-tests style on rank 0 and keep them for --json."""

    def __init__(self, columns: Sequence[str], rank: int, stream=sys.stdout) -> None:
        self.columns, self.rank, self.stream = list(columns), rank, stream
        self.rows: list[dict[str, Any]] = []
        self.widths = [max(_MIN_WIDTH.get(c, 12), len(c) + 1) for c in self.columns]

    def header(self, title: str = "") -> None:
        if self.rank != 0:
            return
        if title:
            print(f"# {title}", file=self.stream)
        print("#" + "".join(c.rjust(w) for c, w in zip(self.columns, self.widths)), file=self.stream)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.rank == 0:
            cells = [_fmt(row.get(c, "")) for c in self.columns]
            print(" " + "".join(c.rjust(w) for c, w in zip(cells, self.widths)), file=self.stream,
                  flush=True)

    def write_json(self, path: str | None, meta: dict[str, Any] | None = None) -> None:
        if self.rank != 0 or not path:
            return
        doc = {"meta": meta or {}, "rows": self.rows}
        if path == "-":
            json.dump(doc, sys.stdout, indent=1)
            print()
        else:
            with open(path, "w") as fh:
                json.dump(doc, fh, indent=1)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    return str(value)


def progress(items: Iterable, total: int, rank: int, enabled: bool = True, label: str = ""):
    """Yield items, drawing a one-line progress bar on rank 0's stderr."""
    show = enabled and rank == 0
    for i, item in enumerate(items, 1):
        yield item
        if show:
            filled = int(30 * i / max(total, 1))
            sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (30 - filled)}] {i}/{total}")
            sys.stderr.flush()
    if show:
        sys.stderr.write("\n")


def bandwidths(nbytes: int, seconds: float, factor: float) -> tuple[float, float]:
    """Return (algbw, busbw) in GB/s (GB = 1e9) for ``nbytes`` moved in ``seconds``."""
    algbw = nbytes / seconds / GB if seconds > 0 else 0.0
    return algbw, algbw * factor
