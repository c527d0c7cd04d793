"""Mutation testing only: an mpiexec worker reports the mutmut trampolines it hit.

tests/mutation/run.py puts this folder on PYTHONPATH. In mutmut's stats run
(MUTANT_UNDER_TEST=stats) every process writes, at exit, the functions it called to
$CC_MUTMUT_HITS/<pid>.hits; tests/conftest.py credits them to the test that launched it.
"""

import atexit
import os


def _report_hits() -> None:
    try:
        from mutmut.state import state
    except ImportError:
        return
    names = sorted(state()._stats)
    if names:
        with open(os.path.join(os.environ["CC_MUTMUT_HITS"], f"{os.getpid()}.hits"), "w") as f:
            f.write("\n".join(names))


if os.environ.get("MUTANT_UNDER_TEST") == "stats" and os.environ.get("CC_MUTMUT_HITS"):
    atexit.register(_report_hits)
