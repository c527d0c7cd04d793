"""Session-wide test policy: a skip for any reason but a missing CUDA device fails the run.

The package and the workers are compiled to bytecode once, before any test starts, so the
mpiexec ranks load it instead of each compiling every module they import (under
PYTHONDONTWRITEBYTECODE, as on our machines, nothing else writes it).

The tests run the numpy loops (``CUPYCOLL_NUMBA=off``) unless the caller's environment says
otherwise; the tests of the numba loops set ``on`` themselves. Under the default ``auto``, which
loops a call took depended on when numba's background import ended, and each test process
imported numba and compiled, on a cold cache, every signature its calls met (docs/testing.md).
The MPI backend's waits nap from their first yield (``CUPYCOLL_SPIN=0``, unless the caller's
environment says otherwise): two test processes launch ranks at once on CI's 2 cores, where a
wait that spins takes the core from a rank of the other launch (docs/testing.md).

Also, under mutation testing only (tests/mutation/run.py), hands mutmut the functions that
the mpiexec workers of a test called, so mutants of multi-rank code are tested by them.
"""

from __future__ import annotations

import compileall
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from cupycoll.jupyter import OVERSUBSCRIBE
from tests._gpu import NO_DEVICE
from tests._mpi import ROOT

os.environ.setdefault("CUPYCOLL_NUMBA", "off")
os.environ.setdefault("CUPYCOLL_SPIN", "0")
for _name, _value in OVERSUBSCRIBE.items():  # under Open MPI too, launches of 3-8 ranks
    os.environ.setdefault(_name, _value)
#: hypothesis's storage (its example database, the constants it collects from the code) in a
#: folder of this run's, not ``.hypothesis/`` in the checkout, for the test processes and the
#: ranks they launch; removed at the end by the process that made it
_HYPOTHESIS_HOME = None
if "HYPOTHESIS_STORAGE_DIRECTORY" not in os.environ:
    _HYPOTHESIS_HOME = os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = tempfile.mkdtemp(
        prefix="cupycoll-hypothesis-")


def pytest_configure(config):
    """Compile ``cupycoll`` and ``tests`` to bytecode in the controlling process (not in
    each xdist worker)."""
    if not hasattr(config, "workerinput"):
        for folder in ("cupycoll", "tests"):
            compileall.compile_dir(str(ROOT / folder), quiet=1)


def pytest_collection_modifyitems(config, items):
    """In the test processes of a parallel run, the tests that compile numba's loops go first,
    then the tests of the most ranks, in their order otherwise. xdist's worksteal gives each
    test process a contiguous half of this order (and an idle one half of the other's rest):
    the first gets the compiles (on a fresh checkout's cold cache; two processes that need one
    signature at once would wait for each other's compile) and the largest launches, the
    second the smaller launches and the in-process tests (docs/testing.md). A serial run
    (``-n 0``, mutmut's) keeps pytest's order."""
    if hasattr(config, "workerinput"):
        items.sort(key=_weight, reverse=True)  # stable: ties keep their order


def _weight(item) -> int:
    """Tests marked ``numba`` first, then by the ranks a test launches: its ``nprocs``
    parameter or its ``ranks`` marker (0 without either)."""
    if item.get_closest_marker("numba") is not None:
        return 1 << 10
    ranks = item.get_closest_marker("ranks")
    if ranks is not None:
        return ranks.args[0]
    callspec = getattr(item, "callspec", None)
    return int(callspec.params.get("nprocs", 0)) if callspec is not None else 0


def skip_reasons(reports) -> Counter:
    """Number of skipped tests per reason (pytest's "Skipped: " prefix removed)."""
    reasons = Counter()
    for rep in reports:
        longrepr = rep.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    return reasons


def _bad_reasons(reasons: Counter) -> list[str]:
    return [r for r in reasons if not r.startswith(NO_DEVICE)]


#: what a run may leave in the checkout: bytecode (compiled above), pytest's own cache, and what
#: an install made before it (a virtual environment, an editable install's build files)
_MAY_STAY = re.compile(r"(^|/)(__pycache__|\.pytest_cache|\.venv)/|^build/|\.egg-info/")


def stray_paths(root: Path = ROOT) -> set[str] | None:
    """The untracked paths of the checkout at ``root``, ignored ones too (a new folder as one
    entry), but those a run may leave; None outside a git checkout."""
    try:
        listed = subprocess.run(["git", "status", "--porcelain", "--ignored", "-z"], cwd=root,
                                capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {entry[3:] for entry in listed.split("\0")
            if entry[:3] in ("?? ", "!! ") and not _MAY_STAY.search(entry[3:])}


def pytest_sessionstart(session):
    """The controlling process notes the checkout's stray paths before any test runs."""
    if not hasattr(session.config, "workerinput"):
        session.config.stash[_STRAY_BEFORE] = stray_paths()


_STRAY_BEFORE = pytest.StashKey[set[str] | None]()


def _left_behind(config) -> list[str]:
    """Paths the run added to the checkout (tests write only in temporary folders)."""
    before = config.stash.get(_STRAY_BEFORE, None)
    after = stray_paths() if before is not None else None
    return sorted(after - before) if after is not None else []


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and _bad_reasons(skip_reasons(reporter.stats.get("skipped", []))):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if _HYPOTHESIS_HOME is not None:
        shutil.rmtree(_HYPOTHESIS_HOME, ignore_errors=True)
    if not hasattr(session.config, "workerinput"):
        left = session.config.stash[_LEFT] = _left_behind(session.config)
        if left:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


_LEFT = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left = config.stash.get(_LEFT, [])
    if left:
        terminalreporter.line(f"FAILED: the run left {left} in the checkout: tests write only "
                              "in temporary folders (docs/testing.md)", red=True)
    reasons = skip_reasons(terminalreporter.stats.get("skipped", []))
    if not reasons:
        return
    terminalreporter.section("skips by reason")
    for reason, count in reasons.most_common():
        terminalreporter.line(f"{count:6d}  {reason}")
    bad = _bad_reasons(reasons)
    if bad:
        terminalreporter.line(f"FAILED: {len(bad)} skip reason(s) other than '{NO_DEVICE}': "
                              f"only a missing GPU may skip a test (tests/_gpu.py)", red=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """Mutation testing's stats run: credit this test with the workers' trampoline hits."""
    folder = os.environ.get("CC_MUTMUT_HITS")
    if not folder or os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    from mutmut.state import state

    for path in Path(folder).glob("*.hits"):
        state()._stats.update(path.read_text().split())
        path.unlink()
