"""Which checks run, in which order, with which budget: the GPU plan and the emulated one.

The budgets are the expected wall times (seconds): on one H200 with 16 cores for the GPU plan,
on 2 CPU cores for the emulated plan. Their sum is the estimate printed first; every launch of
a check is killed after ``TIMEOUT_FACTOR`` times its budget (:mod:`._runner`).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from . import _checks as C
from ._runner import Check, NotRun

__all__ = ["gpu_plan", "emulated_plan", "NO_SOURCE", "NO_PYTEST", "NO_COMPILER", "NO_CUPY"]

NO_SOURCE = ("tests/ is not here (an installed copy): run the selftest from a source checkout "
             "to include it")
NO_PYTEST = "pytest is not installed (pip install 'cupycoll[test]')"
NO_CUPY = ("CuPy is not installed: the emulation tier runs CuPy's own code on emulated devices "
           "(pip install 'cupycoll[gpu-cu12]' or gpu-cu13; no GPU needed)")
NO_COMPILER = ("no C++ compiler (g++): the emulation tier that counts host syncs compiles the "
               "kernels for the CPU")


def _needs_source(checks: list[Check], source: Path | None, pytest: bool = False
                  ) -> tuple[list[Check], list[NotRun]]:
    """The checks that need tests/ (and pytest) when those are here, else as not run."""
    if source is None:
        return [], [NotRun(c.name, c.budget_s, c.what, NO_SOURCE) for c in checks]
    if pytest and importlib.util.find_spec("pytest") is None:
        return [], [NotRun(c.name, c.budget_s, c.what, NO_PYTEST) for c in checks]
    return checks, []


def _needs_cupy(checks: list[Check]) -> tuple[list[Check], list[NotRun]]:
    """The checks on the emulation tier when CuPy is installed, else as not run."""
    if importlib.util.find_spec("cupy") is None:
        return [], [NotRun(c.name, c.budget_s, c.what, NO_CUPY) for c in checks]
    return checks, []


def gpu_plan(devices: int, source: Path | None, quick: bool = False
             ) -> tuple[list[Check], list[NotRun]]:
    """The checks of a machine with ``devices`` >= 1 CUDA devices, and those it cannot run."""
    if quick:
        return [C.compile_check("compile", 40, False, False),
                C.dense_check("nccl-dense-p1", 30, False),
                C.compare_check("mpi-cupy-p2", 40, False, 2, True),
                C.throughput_check("throughput", 20, False, 22, 5)], []
    tests, not_run = _needs_source([C.pytest_check(
        "gpu-tests", 180, "every gpu-marked test of the suite (pytest -m gpu: kernel parity, "
        "wire codec, NCCL collectives on as many GPUs as there are)", C.gpu_test_files, "gpu")],
        source, pytest=True)
    syncs = C.syncs_check("host-syncs", 40, 2)
    if shutil.which("g++") or shutil.which("c++"):
        counted = [syncs]
    else:  # the emulation tier compiles the kernels for the CPU
        counted, not_run = [], not_run + [NotRun(syncs.name, syncs.budget_s, syncs.what,
                                                 NO_COMPILER)]
    checks = tests + [
        C.compile_check("compile", 40, False, False),
        C.dense_check("nccl-dense-p1", 30, False),
        C.compare_check("mpi-cupy-p2", 45, False, 2, False),
        C.compare_check("mpi-cupy-p4", 75, False, 4, False),
        C.throughput_check("throughput", 40, False, 26, 10)] + counted + [
        C.host_time_check("host-time-p1", 25, False, 300)]
    multi = multi_gpu_checks(max(devices, 2))
    if devices >= 2:
        suites, missing = _needs_source(multi[:2], source)
        checks += suites + multi[2:]
        not_run += missing
    else:
        not_run += [NotRun(c.name, c.budget_s, c.what, "needs 2 or more GPUs (runs at P = "
                           "the GPU count)") for c in multi]
    return checks, not_run


def multi_gpu_checks(devices: int) -> list[Check]:
    """With two or more GPUs: the NCCL suites at P = the GPU count with NVLS on and off, and
    Ok-Topk with P overlap buckets bit for bit the MPI backend (the suites need tests/)."""
    return [C.suites_check(f"nccl-suites-nvls{v}", 90, devices, True, v, 12, False)
            for v in ("1", "0")] + [C.oktopk_check("oktopk-buckets", 45, False, devices, 6)]


def emulated_plan(source: Path | None, quick: bool = False
                  ) -> tuple[list[Check], list[NotRun]]:
    """The no-GPU equivalents: the same workers on the emulation tier, the suites of
    tests/workers on emulated GPUs, NVRTC for sm_90, the kernels on the CPU shim."""
    if quick:
        return _needs_cupy([C.compile_check("compile-sm90", 15, True, False),
                            C.dense_check("nccl-dense-p1-emulated", 10, True),
                            C.compare_check("mpi-cupy-p2-emulated", 15, True, 2, True),
                            C.throughput_check("throughput-emulated", 8, True, 12, 2),
                            C.oktopk_check("oktopk-buckets-p3-emulated", 12, True, 3, 2)])
    tier, not_run = _needs_source([C.pytest_check(
        "kernels-cpu-tier", 180, "the CUDA kernels on the CPU shim against the numpy twins "
        "(tests/test_kernels_cpu.py)", lambda s: ["tests/test_kernels_cpu.py"], None)],
        source, pytest=True)
    suites, missing = _needs_source([
        C.suites_check("emulated-suites-p2", 30, 2, False, None, 8, True),
        C.suites_check("emulated-suites-p3", 40, 3, False, None, 8, True)], source)
    emulated, no_cupy = _needs_cupy([
        C.compile_check("compile-sm90", 45, True, True),
        C.dense_check("nccl-dense-p1-emulated", 15, True)] + suites + [
        C.compare_check("mpi-cupy-p2-emulated", 30, True, 2, False),
        C.compare_check("mpi-cupy-p4-emulated", 45, True, 4, False),
        C.throughput_check("throughput-emulated", 20, True, 14, 3),
        C.syncs_check("host-syncs", 15, 2),
        C.host_time_check("host-time-p1-emulated", 15, True, 20),
        C.oktopk_check("oktopk-buckets-p3-emulated", 20, True, 3, 4)])
    return tier + emulated, not_run + missing + no_cupy
