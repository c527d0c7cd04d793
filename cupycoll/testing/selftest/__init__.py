"""``cupycoll selftest``: a one-command acceptance run, on a GPU machine or without one.

    python -m cupycoll selftest [--json FILE] [--report FILE] [--quick] [--list] [--deadline S]

With a CUDA device it runs the GPU checks (the suite's gpu tests, kernel compile time, NCCL at
P = 1, several processes sharing the device on the MPI backend, kernel throughput against the
memory bandwidth, host syncs and host time; with two or more GPUs the NCCL suites and Ok-Topk's
overlap buckets); without one, their emulated equivalents (docs/selftest.md lists every check,
its budget and how to read the report). Each check runs in its own processes with a timeout;
the markdown report goes to stdout (and ``--report``), the JSON document to ``--json``. The exit
status is 0 only when every check that ran is ok. An interrupted run (Ctrl-C, SIGTERM) still
writes both, with the checks that finished, and is not ok.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import math
import signal
import sys
import threading
import tempfile
import time
from pathlib import Path

from ..._arguments import checked, made_folder, output_file
from ._device import probe
from ._launch import source_tree
from ._plan import emulated_plan, gpu_plan
from ._report import document, markdown, plan_markdown
from ._runner import Check, Context, NotRun, estimate, run_checks

__all__ = ["add_arguments", "main", "plan"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The selftest's command-line options (``cupycoll selftest --help``)."""
    p.add_argument("--json", metavar="FILE", type=output_file,
                   help="write the JSON document to FILE")
    p.add_argument("--report", metavar="FILE", type=output_file,
                   help="also write the markdown report to FILE")
    p.add_argument("--quick", action="store_true",
                   help="a subset sized for CI (about a minute on 2 cores without a GPU)")
    p.add_argument("--list", action="store_true",
                   help="print what would run, with each budget and the estimate, and exit")
    p.add_argument("--only", metavar="PATTERNS",
                   help="run only the checks whose names match these comma-separated patterns "
                        "(fnmatch, e.g. 'compile*,mpi-cupy-*')")
    p.add_argument("--deadline", metavar="SECONDS",
                   type=checked(float, lambda v: 0 < v < math.inf, "a positive number"),
                   help="end the run within SECONDS: a check starts only while the time left "
                        "covers its budget, and its launches are killed when the time is up "
                        "(the checks not started are listed as not run)")
    p.add_argument("--fail-check", action="store_true",
                   help="add a check that always fails (to test the selftest's failure path: "
                        "exit status 1, \"ok\": false)")


def plan(devices: int, source: Path | None, quick: bool
         ) -> tuple[str, list[Check], list[NotRun], float]:
    """(mode, checks to run, checks not run here with why, estimate of the one-GPU run)."""
    gpu_checks, gpu_missing = gpu_plan(max(devices, 1), source, quick)
    if devices:
        return "gpu", gpu_checks, gpu_missing, estimate(gpu_checks)
    checks, missing = emulated_plan(source, quick)
    here = {c.name for c in checks}
    needs_gpu = [NotRun(c.name, c.budget_s, c.what, "needs a GPU") for c in gpu_checks
                 if c.name not in here]
    needs_gpu += [n if n.reason.startswith("needs") else
                  NotRun(n.name, n.budget_s, n.what, f"needs a GPU; {n.reason}")
                  for n in gpu_missing]
    return "emulated", checks, needs_gpu + missing, estimate(gpu_checks)


def _select(checks: list[Check], not_run: list[NotRun], patterns: str | None
            ) -> tuple[list[Check], list[NotRun]]:
    """Keep the checks matching ``--only``; the others join the not-run list."""
    if not patterns:
        return checks, not_run
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    keep = [c for c in checks if any(fnmatch.fnmatchcase(c.name, p) for p in wanted)]
    dropped = [NotRun(c.name, c.budget_s, c.what, "not selected (--only)")
               for c in checks if c not in keep]
    return keep, not_run + dropped


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    """Run (or ``--list``) the selftest; return the exit status."""
    from . import _checks

    device = probe()
    source = source_tree()
    mode, checks, not_run, gpu_estimate = plan(device["count"], source, args.quick)
    checks, not_run = _select(checks, not_run, args.only)
    if device.get("broken"):
        checks.insert(0, _checks.broken_cuda_check(device["broken"]))
    if args.fail_check:
        checks.append(_checks.failing_check())
    if args.list:
        print("\n".join(plan_markdown(mode, device, checks, not_run, gpu_estimate)))
        return 0
    start = time.perf_counter()
    deadline = math.inf if args.deadline is None else time.monotonic() + args.deadline
    records: list[dict] = []
    stopped = None
    try:
        with _terminated_as_exit(), tempfile.TemporaryDirectory(prefix="cupycoll-selftest-") as tmp:
            ctx = Context(args.quick, device["count"], source, Path(tmp), deadline)
            run_checks(checks, ctx, _progress, records)
    except (KeyboardInterrupt, SystemExit) as exc:  # the finished checks are still reported
        stopped = exc
    why = ("interrupted (Ctrl-C)" if isinstance(stopped, KeyboardInterrupt) else
           f"interrupted (exit status {stopped.code})" if stopped is not None else
           f"the time left before --deadline {args.deadline or 0:g} s did not cover its budget")
    not_run = not_run + [NotRun(c.name, c.budget_s, c.what, f"not finished: {why}")
                         for c in checks[len(records):]]
    doc = document(mode, device, checks, records, not_run, gpu_estimate, args.quick,
                   time.perf_counter() - start, None if source is None else str(source))
    if stopped is not None:
        doc["ok"], doc["interrupted"] = False, why
    text = markdown(doc, checks, not_run)
    print(text)
    if args.report:
        made_folder(args.report).write_text(text)
    if args.json:
        made_folder(args.json).write_text(json.dumps(doc, indent=1, default=str))
    if stopped is not None:
        return 130 if isinstance(stopped, KeyboardInterrupt) else int(stopped.code or 1)
    return 0 if doc["ok"] else 1


@contextlib.contextmanager
def _terminated_as_exit():
    """SIGTERM raises SystemExit(143) inside (from the main thread), so a running check's
    launch kills its process group on the way out, as on Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
