"""Launch multi-rank workers under mpiexec from pytest, with a timeout on every launch."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cupycoll.errors import BackendUnavailable
from cupycoll.jupyter import find_mpiexec

ROOT = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).resolve().parent / "workers"


def mpiexec() -> str:
    """Return the mpiexec next to this Python (the mpich wheel's), else the one on PATH."""
    try:
        return find_mpiexec()
    except BackendUnavailable as exc:  # the test extra installs the mpich wheel: a setup error
        pytest.fail(f"{exc} (install the test extra: pip install '.[test]')")


def run_mpi(nprocs: int, worker: str, *args: object, timeout: float = 180,
            env: dict[str, str] | None = None) -> str:
    """Run ``tests/workers/<worker>`` on ``nprocs`` ranks; fail the test unless every rank exits 0.

    Workers run as ``python -m mpi4py`` so an uncaught exception on one rank aborts the whole job
    instead of hanging it; the timeout kills the job if a bug hangs it anyway. They run with
    ``CUPYCOLL_NUMBA=off`` and MPICH's ``MPIR_CVAR_ENABLE_HEAVY_YIELD=1`` unless ``env`` or the
    caller's environment says otherwise. Returns stdout.
    """
    stdout, failure = _launch(nprocs, worker, args, timeout, env)
    if failure:
        pytest.fail(failure)
    return stdout


def _launch(nprocs: int, worker: str, args, timeout: float,
            env: dict[str, str] | None) -> tuple[str, str]:
    """Run the job; return its stdout and, if it failed or timed out, why ("" if it passed)."""
    script = WORKERS / worker
    cmd = [mpiexec(), "-n", str(nprocs), sys.executable, "-m", "mpi4py", str(script),
           *map(str, args)]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")])
    full_env.setdefault("OMP_NUM_THREADS", "1")
    # numba's import and cached loads cost each rank 1-4 CPU-seconds, more than most workers'
    # checks: the numpy loops run unless a test asks for numba (docs/testing.md)
    full_env.setdefault("CUPYCOLL_NUMBA", "off")
    # MPICH: a rank blocked in an MPI call (a worker's own allgather) yields its core by
    # nanosleep instead of sched_yield, which on oversubscribed cores still spins
    full_env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    full_env.update(env or {})
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                              cwd=ROOT, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-4000:]
        return "", f"timeout after {timeout}s: {' '.join(cmd)}\n{out!r}"
    if proc.returncode != 0:
        return proc.stdout, (f"exit status {proc.returncode}: {' '.join(cmd)}\n--- stdout\n"
                             f"{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc.stdout, ""


class Batch:
    """Workers whose launches at one rank count share one mpiexec job (``workers/batch.py``).

    ``jobs`` maps a worker to its arguments at each rank count that runs it. A test asks for one
    worker's output at one rank count; the first such request in a test process runs every
    worker of that rank count in turn, in ``jobs``' order, and keeps their outputs for the
    others' tests: each rank starts Python and imports once, not once a worker. A job that fails
    fails its test and the tests of the jobs after it, with the job's error; the jobs before it
    pass. The launch's timeout is ``timeout`` a job.
    """

    def __init__(self, jobs: dict[str, dict[int, tuple]], *, timeout: float = 240,
                 env: dict[str, str] | None = None):
        self.jobs, self.timeout, self.env = jobs, timeout, env
        self._runs: dict[int, tuple[list[str], str]] = {}

    def ranks(self, worker: str) -> list[int]:
        """The rank counts that run ``worker`` (a test's parametrization)."""
        return list(self.jobs[worker])

    def output(self, worker: str, nprocs: int) -> str:
        """Every rank's stdout of ``worker`` at ``nprocs`` ranks, in rank order; fails the test
        if that job failed or was not reached."""
        lines = [shlex.join(map(str, (name, *by_ranks[nprocs])))
                 for name, by_ranks in self.jobs.items() if nprocs in by_ranks]
        number = [shlex.split(line)[0] for line in lines].index(worker)
        if nprocs not in self._runs:
            self._runs[nprocs] = self._run(nprocs, lines)
        outputs, failure = self._runs[nprocs]
        if number >= len(outputs):
            pytest.fail(f"{lines[number]} did not finish in the batch of {lines}:\n{failure}")
        return outputs[number]

    def _run(self, nprocs: int, lines: list[str]) -> tuple[list[str], str]:
        """Launch the batch; return the outputs of the jobs that finished, and the failure."""
        with tempfile.TemporaryDirectory() as folder:
            _, failure = _launch(nprocs, "batch.py", [folder, *lines],
                                 self.timeout * len(lines), self.env)
            outputs = []
            for number in range(len(lines)):
                parts = [Path(folder, f"{number}.{rank}") for rank in range(nprocs)]
                if not all(part.exists() for part in parts):
                    partial = sorted(Path(folder).glob(f"{number}.*.partial"))
                    failure += "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}"
                                       for p in partial)
                    break
                outputs.append("".join(part.read_text() for part in parts))
        return outputs, failure
