"""What the selftest's worker processes share: the device namespace, host copies, the result line.

A worker runs on a real GPU through CuPy, or, with ``--emulate D``, on the strict emulation tier
(:mod:`cupycoll.testing.emulation`, D emulated devices per node): the same code either way, so the
no-GPU selftest runs the very workers the GPU selftest runs. Workers are launched under
``mpiexec -n P python -m mpi4py -m cupycoll.testing.selftest._w_NAME`` (one rank is P = 1), so an
uncaught exception on one rank aborts every rank.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from typing import Any, Callable

import numpy as np

RESULT = "SELFTEST-RESULT "  # the line the runner reads (cupycoll.testing.selftest._launch.RESULT)


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with ``--emulate D`` (0, the default: the real CuPy)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--emulate", type=int, default=0, metavar="D",
                   help="run on D emulated devices per node (cupycoll.testing.emulation), "
                        "not a GPU")
    return p


def device_namespace(emulate: int) -> tuple[Any, Any]:
    """Return (cupy, emulation module or None): the emulated CuPy installed when ``emulate``
    (before cupycoll imports cupy), else the real one."""
    emu = None
    if emulate:
        import cupycoll.testing.emulation as emu

        emu.install(emulate, 14)
    import cupy

    return cupy, emu


def check_logs(emu: Any) -> None:
    """On the emulation tier: every rank's NCCL calls agree (raises if not)."""
    if emu is not None:
        emu.check_logs()


def host(a: Any) -> np.ndarray:
    """A numpy copy of a device or host array."""
    if isinstance(a, np.ndarray):
        return a
    return a.get() if hasattr(a, "get") else np.asarray(a)


def digest(*arrays: np.ndarray) -> str:
    """A hash of the arrays' dtypes, shapes and bytes (bitwise comparisons across ranks)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def same_bits(a: Any, b: Any) -> bool:
    """True when two arrays have the same dtype, shape and bytes (NaN and -0 included)."""
    a, b = host(a), host(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def median_seconds(fn: Callable[[], Any], sync: Callable[[], None], reps: int) -> float:
    """Median wall time of ``fn`` followed by ``sync`` over ``reps`` runs, after a warm-up."""
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def gather_failures(mpi: Any, failures: list[str]) -> list[str]:
    """Every rank's failure lines, prefixed with the rank (rank 0 gets them all)."""
    every = mpi.gather(failures, root=0)
    if mpi.Get_rank() != 0:
        return []
    return [f"rank {r}: {line}" for r, lines in enumerate(every) for line in lines]


def report(mpi: Any, result: dict) -> None:
    """Print the result line on rank 0 (the runner parses it)."""
    if mpi.Get_rank() == 0:
        print(RESULT + json.dumps(result, default=str), flush=True)
    sys.stdout.flush()
