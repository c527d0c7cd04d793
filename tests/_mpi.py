"""Launch multi-rank workers under mpiexec from pytest, with a timeout on every launch."""

from __future__ import annotations

import os
import subprocess
import sys
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
    ``CUPYCOLL_NUMBA=off`` unless ``env`` or the caller's environment says otherwise. Returns
    stdout.
    """
    script = WORKERS / worker
    cmd = [mpiexec(), "-n", str(nprocs), sys.executable, "-m", "mpi4py", str(script),
           *map(str, args)]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")])
    full_env.setdefault("OMP_NUM_THREADS", "1")
    # numba's import and cached loads cost each rank 1-4 CPU-seconds, more than most workers'
    # checks: the numpy loops run unless a test asks for numba (docs/testing.md)
    full_env.setdefault("CUPYCOLL_NUMBA", "off")
    full_env.update(env or {})
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                              cwd=ROOT, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-4000:]
        pytest.fail(f"timeout after {timeout}s: {' '.join(cmd)}\n{out!r}")
    if proc.returncode != 0:
        pytest.fail(f"exit status {proc.returncode}: {' '.join(cmd)}\n--- stdout\n"
                    f"{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc.stdout
