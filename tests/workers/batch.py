"""Run several workers in turn in one mpiexec job: each rank starts Python, numpy, mpi4py and
cupycoll once for all of them (docs/testing.md).

Usage: batch.py FOLDER JOB [JOB ...], a JOB being one worker's command line ("sparse_volume.py
7"). Each job's script runs as ``__main__`` with ``sys.argv`` set to that line. What a rank
prints goes to ``FOLDER/<job number>.<rank>``, written when the job returns, or to
``....partial`` if it raises (the exception then aborts the job's ranks, as it would in the
worker run alone).
"""

from __future__ import annotations

import contextlib
import io
import runpy
import shlex
import sys
from pathlib import Path

from mpi4py import MPI


def run(folder: Path, number: int, line: str) -> None:
    """Run one job's script as ``__main__`` with its command line, keeping what it prints."""
    script, *args = shlex.split(line)
    sys.argv = [str(Path(__file__).with_name(script)), *args]
    printed = io.StringIO()
    name = f"{number}.{MPI.COMM_WORLD.Get_rank()}"
    try:
        with contextlib.redirect_stdout(printed):
            runpy.run_path(sys.argv[0], run_name="__main__")
    except BaseException:
        (folder / f"{name}.partial").write_text(printed.getvalue())
        raise
    (folder / name).write_text(printed.getvalue())


def main() -> None:
    folder = Path(sys.argv[1])
    for number, line in enumerate(sys.argv[2:]):
        run(folder, number, line)


if __name__ == "__main__":
    main()
