"""Where the suite's time goes: CPU seconds per test, its launched ranks included.

    python -m pytest -p tests._cpu_times

Each test's CPU time (user + system) in its own process and in the processes it waited for
(an mpiexec launch's ranks: ``getrusage``'s children), with its start (epoch seconds) and
test process (xdist worker), one JSON line per test in
``build/cpu_times.jsonl`` (or ``$CC_TEST_CPU_TIMES``; the test processes append, the
controlling one starts the file afresh and sums it up at the end): the files and the tests
that use the most. On CI's two cores the suite is CPU-bound, so CPU time, not a test's wall
time, is what it costs the run (docs/testing.md).
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import Counter
from pathlib import Path

import pytest

from tests._mpi import ROOT

RECORDS = Path(os.environ.get("CC_TEST_CPU_TIMES", ROOT / "build" / "cpu_times.jsonl"))
SHOWN = 12


def _cpu() -> float:
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in used)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controlling process (or the only one)
        RECORDS.parent.mkdir(parents=True, exist_ok=True)
        RECORDS.write_text("")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall, start = _cpu(), time.monotonic(), time.time()
    yield
    line = {"test": item.nodeid, "cpu": _cpu() - cpu, "wall": time.monotonic() - wall,
            "start": start, "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}
    with RECORDS.open("a", encoding="utf-8") as f:  # one short write a line: no interleaving
        f.write(json.dumps(line) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):
        return
    lines = [json.loads(text) for text in RECORDS.read_text().splitlines() if text]
    by_file = Counter()
    for line in lines:
        by_file[line["test"].split("::")[0]] += line["cpu"]
    total = sum(by_file.values())
    terminalreporter.section(f"CPU time: {total / 60:.1f} min in {len(lines)} tests")
    for name, cpu in by_file.most_common(SHOWN):
        terminalreporter.line(f"{cpu:8.1f} s  {name}")
    terminalreporter.line("")
    for line in sorted(lines, key=lambda x: -x["cpu"])[:SHOWN]:
        terminalreporter.line(f"{line['cpu']:8.1f} s  (wall {line['wall']:6.1f} s)  "
                              f"{line['test']}")
