"""Child processes of the selftest: one command each, a timeout each, the result line parsed.

Every check that computes runs in its own process (a worker module of this package, a pytest
run, a benchmark script), so a crash, a hang or a CUDA error ends that check alone: the runner
kills the whole process group at the timeout and goes on with the next check. Workers print
one line ``SELFTEST-RESULT {json}`` (rank 0) that :meth:`Launch.result` reads back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...jupyter import OVERSUBSCRIBE, find_mpiexec

__all__ = ["Launch", "launch", "worker_command", "script_command", "source_tree", "RESULT",
           "PACKAGE_ROOT"]

#: the prefix of a worker's result line
RESULT = "SELFTEST-RESULT "
#: the folder holding the ``cupycoll`` package this selftest belongs to (put first on the
#: children's PYTHONPATH, so they import the same cupycoll, installed or a checkout)
PACKAGE_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Launch:
    """One finished (or killed) child process."""

    command: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    timeout: float = 0.0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def shown(self) -> str:
        """The command as a shell line, with the environment variables the selftest set."""
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + " ".join(self.command)

    def result(self) -> dict | None:
        """The worker's result (its last ``SELFTEST-RESULT`` line), None when it printed none."""
        lines = [ln for ln in self.stdout.splitlines() if ln.startswith(RESULT)]
        return json.loads(lines[-1][len(RESULT):]) if lines else None

    def failure(self, tail: int = 3000) -> str:
        """Why it failed: timeout or exit status, the command, the end of its output."""
        what = (f"timed out after {self.timeout:.0f} s" if self.timed_out
                else f"exit status {self.returncode}")
        out = (self.stdout[-tail:] + "\n" + self.stderr[-tail:]).strip()
        return f"{what}: {self.shown()}\n{out}"


def launch(command: list[str], timeout: float, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> Launch:
    """Run ``command`` to its end or to ``timeout`` seconds (then kill its process group).

    ``env`` is added to this process's environment; PYTHONPATH starts with
    :data:`PACKAGE_ROOT` and OMP_NUM_THREADS defaults to 1 (ranks share the cores). It runs in
    ``cwd``, by default :data:`PACKAGE_ROOT` (``-m`` puts the folder it runs in first on the
    path: the caller's folder could hold another cupycoll).
    """
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT),
                                                     full.get("PYTHONPATH", "")) if p)
    full.setdefault("OMP_NUM_THREADS", "1")
    for name, value in OVERSUBSCRIBE.items():  # Open MPI: more ranks than cores, as MPICH
        full.setdefault(name, value)
    full.update(env or {})
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full, cwd=cwd or PACKAGE_ROOT, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        timed_out = True
    except BaseException:  # Ctrl-C, or SIGTERM (selftest's main makes it SystemExit): the
        _kill_group(proc.pid)  # child runs in a session of its own, which neither reaches
        proc.communicate()
        raise
    return Launch(command, proc.returncode, out, err, time.perf_counter() - start, timed_out,
                  timeout, dict(env or {}))


def _kill_group(pid: int) -> None:
    """SIGKILL the child's process group (mpiexec and its ranks), if it is still there."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def worker_command(module: str, args: list[str], nprocs: int | None) -> list[str]:
    """``python -m cupycoll.testing.selftest.<module> ARGS``, under ``mpiexec -n nprocs python -m
    mpi4py`` (an exception on one rank aborts every rank) unless ``nprocs`` is None."""
    target = ["-m", f"cupycoll.testing.selftest.{module}", *args]
    if nprocs is None:
        return [sys.executable, *target]
    return [find_mpiexec(), "-n", str(nprocs), sys.executable, "-m", "mpi4py", *target]


def script_command(script: Path, args: list[str], nprocs: int) -> list[str]:
    """``mpiexec -n nprocs python -m mpi4py SCRIPT ARGS``."""
    return [find_mpiexec(), "-n", str(nprocs), sys.executable, "-m", "mpi4py", str(script),
            *args]


def source_tree() -> Path | None:
    """The source checkout this cupycoll runs from (the folder holding ``tests/`` next to the
    package), None for an installed copy: tests/ is not installed."""
    root = PACKAGE_ROOT
    if (root / "tests" / "_gpu.py").is_file() and (root / "tests" / "workers").is_dir():
        return root
    return None
