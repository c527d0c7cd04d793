"""The check runner: named checks with a time budget, run in order, each timed and caught.

A :class:`Check` computes nothing itself: its ``run`` launches child processes (see
:mod:`._launch`) with timeouts derived from its budget, and returns an :class:`Outcome`. The
runner times each one, turns an exception into a failed outcome (the next check still runs),
and records the wall time against the budget. The estimate of a plan is the sum of its
budgets. A run's deadline (``--deadline``) starts a check only while the time left covers its
budget and cuts every launch's timeout to the time left.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["Context", "Outcome", "Check", "NotRun", "run_checks", "estimate", "TIMEOUT_FACTOR"]

#: a launch is killed after this many times its check's budget (at least MIN_TIMEOUT seconds):
#: a slow machine passes, a hang ends
TIMEOUT_FACTOR = 3.0
MIN_TIMEOUT = 60.0


@dataclass
class Context:
    """What every check may read: the mode, the machine, where to put files."""

    quick: bool
    devices: int  # CUDA devices seen (0: the emulated equivalents run)
    source: Path | None  # the source checkout (tests/ present), None for an installed copy
    tmp: Path
    #: ``time.monotonic()`` by which the run ends (``--deadline``), inf for none
    deadline: float = math.inf

    def left(self) -> float:
        """Seconds left before the deadline."""
        return self.deadline - time.monotonic()

    def timeout(self, budget_s: float) -> float:
        """The timeout of one launch of a check with this budget (no later than the
        deadline)."""
        return min(max(MIN_TIMEOUT, TIMEOUT_FACTOR * budget_s), max(self.left(), 1.0))


@dataclass
class Outcome:
    """What a check found: ok or not, one line (or a few) saying what, and optional rows."""

    ok: bool
    detail: str
    table: list[dict] | None = None
    commands: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    """A named check: ``run(ctx)`` returns an Outcome; ``budget_s`` is its expected time."""

    name: str
    budget_s: float
    what: str
    run: Callable[[Context], Outcome]


@dataclass(frozen=True)
class NotRun:
    """A check this machine cannot run, and why (listed in the report, not in the status)."""

    name: str
    budget_s: float
    what: str
    reason: str


def estimate(checks: Sequence[Check]) -> float:
    """Seconds the plan is expected to take: the sum of its checks' budgets."""
    return float(sum(c.budget_s for c in checks))


def run_one(check: Check, ctx: Context) -> dict[str, Any]:
    """Run one check; its record (name, ok, seconds, budget, detail, ...) for the JSON."""
    start = time.perf_counter()
    try:
        outcome = check.run(ctx)
    except Exception as exc:  # noqa: BLE001 - a broken check fails alone; the next one runs
        outcome = Outcome(False, f"{type(exc).__name__}: {exc}\n"
                          + "".join(traceback.format_exc(limit=-4)))
    seconds = time.perf_counter() - start
    record: dict[str, Any] = {"name": check.name, "ok": bool(outcome.ok),
                              "seconds": round(seconds, 2), "budget_s": check.budget_s,
                              "over_budget": seconds > check.budget_s, "what": check.what,
                              "detail": outcome.detail}
    if outcome.table is not None:
        record["table"] = outcome.table
    if outcome.commands:
        record["commands"] = outcome.commands
    record.update(outcome.data)
    return record


def run_checks(checks: Sequence[Check], ctx: Context,
               progress: Callable[[str], None] | None = None,
               records: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Run ``checks`` in order, each appending its record to ``records`` (a new list by
    default: the caller's list holds the finished ones if the run is interrupted) as it ends,
    until one whose budget the deadline's time left does not cover; return ``records``.
    ``progress`` gets one line per check."""
    records = [] if records is None else records
    for i, check in enumerate(checks, 1):
        if ctx.left() < check.budget_s:
            if progress:
                progress(f"[{i}/{len(checks)}] {check.name}: not started, {ctx.left():.0f} s "
                         f"left before the deadline (budget {check.budget_s:.0f} s)")
            break
        if progress:
            progress(f"[{i}/{len(checks)}] {check.name} (budget {check.budget_s:.0f} s) ...")
        record = run_one(check, ctx)
        records.append(record)
        if progress:
            state = "ok" if record["ok"] else "FAILED"
            progress(f"[{i}/{len(checks)}] {check.name}: {state} in {record['seconds']:.1f} s")
    return records
