"""The ``cupycoll`` command: ``info`` for bug reports, ``bench`` to run the shipped benchmarks,
``tune`` to measure this machine's profile, ``simulate`` to predict times up to 1,024 ranks,
``selftest`` for a one-command acceptance run (docs/selftest.md).

    python -m cupycoll info
    mpiexec -n 4 python -m cupycoll bench sparse --n 16M --density 0.01
    mpiexec -n 4 python -m cupycoll tune
    python -m cupycoll simulate --json sim.json --plot sim.png
    python -m cupycoll selftest --json selftest.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Callable

from ._bench_scripts import BENCHMARKS, bench_script
from ._arguments import output_file
from ._config import SETTINGS, chosen, setting

__all__ = ["main", "info_lines", "bench_script", "BENCHMARKS"]

_FORWARD_SECONDS = 0.2  # mpiexec forwards a rank's last output before the abort's kill


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _probe(fn: Callable[[], str]) -> str:
    """Run one version probe; a failure is reported as text, never raised (info must always run)."""
    try:
        return fn()
    except Exception as exc:  # a broken CUDA/MPI install is exactly what info must show
        return f"unavailable ({type(exc).__name__}: {exc})".replace("\n", " ")


def _mpi() -> str:
    from mpi4py import MPI

    library = MPI.Get_library_version().strip().splitlines()[0]
    return f"{library} (MPI {'.'.join(map(str, MPI.Get_version()))})"


def _numba() -> str:
    import numba

    return numba.__version__


def _cupy_lines() -> list[tuple[str, str]]:
    """CuPy, CUDA runtime/driver, NCCL and the visible devices, or why they are unavailable."""
    try:
        import cupy
    except Exception as exc:  # not installed, or a broken install
        return [("cupy", f"unavailable ({type(exc).__name__}: {exc})")]
    rt = cupy.cuda.runtime
    lines = [("cupy", cupy.__version__),
             ("cuda runtime", _probe(lambda: _cuda_version(rt.runtimeGetVersion()))),
             ("cuda driver", _probe(lambda: _cuda_version(rt.driverGetVersion()))),
             ("nccl", _probe(_nccl_version)),
             ("devices", _probe(_devices))]
    return lines


def _cuda_version(code: int) -> str:
    if code == 0:  # cudaDriverGetVersion's answer when no driver is loaded
        return "none (no CUDA driver loaded)"
    return f"{code // 1000}.{code % 1000 // 10}"


def _nccl_version() -> str:
    from cupy.cuda import nccl

    if not nccl.available:
        return "not available in this CuPy"
    code = nccl.get_version()
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def _devices() -> str:
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    names = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(count)]
    return f"{count}: " + ", ".join(names) if count else "0"


def _backend_choice() -> str:
    """Which backend ``init()`` would pick here, and why (without creating a communicator)."""
    from ._config import made_settings
    from .comm import _init_settings, load_mpi, nccl_usable
    from .errors import CupycollError

    try:  # what init() checks before it picks
        backend, _ = _init_settings(None, None)
        made_settings()
        load_mpi()
    except CupycollError as exc:
        return f"none: init() raises {type(exc).__name__} ({exc})"
    source = "CUPYCOLL_BACKEND" if "CUPYCOLL_BACKEND" in os.environ else "default"
    if backend == "nccl" and not nccl_usable():
        return f"none: init() raises BackendUnavailable ({source} asks for nccl; no usable " \
            "CUDA device with CuPy + NCCL here)"
    if backend != "auto":
        return f"{backend} ({source} says so)"
    if nccl_usable():
        return "nccl (auto: CuPy, NCCL and a CUDA device are usable)"
    return "mpi (auto: no usable CUDA device with CuPy + NCCL here)"


def info_lines() -> list[tuple[str, str]]:
    """Return (name, value) pairs: versions, settings in effect and the backend init() would pick."""
    lines = [("cupycoll", f"{_version('cupycoll')} at {Path(__file__).resolve().parent}"),
             ("python", f"{platform.python_version()} ({sys.executable})"),
             ("platform", platform.platform()),
             ("numpy", _version("numpy")),
             ("mpi4py", _version("mpi4py")),
             ("MPI library", _probe(_mpi)),
             ("numba", _probe(_numba))]
    lines += _cupy_lines()
    for name in sorted(SETTINGS):
        source = "environment" if name in os.environ else "default"
        lines.append((name, f"{_probe(lambda n=name: _setting_shown(n))} ({source})"))
    lines.append(("init() backend", _probe(_backend_choice)))
    return lines


def _profile_shown() -> str:
    from .tuner.profile import profile_path

    path = profile_path()
    return f"None: {path}" + ("" if path.is_file() else " (absent: the shipped profile)")


def _emulation_cache_shown() -> str:
    from .testing.kernel_shim import cache_folder

    return f"None: {cache_folder()}"


#: settings whose default (None) stands for a path worked out where it is used: info shows it
_PATHS = {"CUPYCOLL_PROFILE": _profile_shown, "CUPYCOLL_EMULATION_CACHE": _emulation_cache_shown}


def _setting_shown(name: str) -> str:
    """A setting's value as info shows it; a name a call would refuse (an algorithm, a wire
    format, a backend or a log level that does not exist) raises InvalidArgument saying so."""
    from . import algorithms
    from .comm import _BACKENDS, log_level
    from .wire._choice import WIRES

    if name == "CUPYCOLL_LOG_LEVEL":
        log_level()  # (raises for a name logging does not know)
    if name in _PATHS and setting(name) is None:
        return _PATHS[name]()
    valid = {"CUPYCOLL_ALGORITHM": algorithms("sparse"), "CUPYCOLL_WIRE": list(WIRES),
             "CUPYCOLL_TOPK_ALGORITHM": algorithms("topk"),
             "CUPYCOLL_BACKEND": _BACKENDS}.get(name)
    if valid is None:
        return repr(setting(name))
    return repr(chosen(name, None, name, valid, "a call that takes it from the variable (no "
                       "keyword) refuses it; "))


def _info(_: argparse.Namespace) -> int:
    lines = info_lines()
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        print(f"{name.ljust(width)}  {value}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .comm import load_mpi
    from .errors import BackendUnavailable

    try:  # every benchmark imports mpi4py's MPI: without an MPI library, what to install
        load_mpi()
    except BackendUnavailable as exc:
        print(f"cupycoll bench: {exc}", file=sys.stderr)
        return 1
    script = bench_script(args.name)
    sys.argv = [str(script), *args.rest]
    sys.path.insert(0, str(script.parent))  # the scripts import their sibling _common
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # e.g. an argument refused on this rank only: as python -m
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code:  # mpi4py, a failed exit ends the job rather than leave the others waiting
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
            _abort_if_parallel(code)
        return code
    except BaseException as exc:  # like python -m mpi4py: one rank's failure must not hang
        traceback.print_exc()  # the others; printed once, here, before an abort can end it
        _abort_if_parallel()
        if isinstance(exc, Exception):
            return 1
        raise SystemExit(130 if isinstance(exc, KeyboardInterrupt) else 1) from None
    return 0


def _abort_if_parallel(code: int = 1) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and mpi.COMM_WORLD.Get_size() > 1:
        time.sleep(_FORWARD_SECONDS)  # the launcher forwards what this rank wrote before the kill
        mpi.COMM_WORLD.Abort(code)


def _tune(args: argparse.Namespace) -> int:
    import cupycoll as cc

    from .errors import CupycollError
    from .tuner.calibrate import tune
    from .tuner.profile import profile_path, save_profile

    try:
        comm = cc.init(args.backend)
    except CupycollError as exc:  # e.g. nccl asked for where no GPU is: a message, no traceback
        print(f"cupycoll tune: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    problem = None
    if comm.rank == 0:  # the file rank 0 writes, checked before anything is measured; every
        try:  # rank learns the outcome (none waits for a rank that left)
            output_file(str(profile_path() if args.output is None else args.output))
        except (argparse.ArgumentTypeError, RuntimeError) as exc:  # (~nosuchuser)
            where = ("--output" if args.output is not None else "CUPYCOLL_PROFILE"
                     if setting("CUPYCOLL_PROFILE") else "the default profile file")
            problem = f"cupycoll tune: error: {where}: {exc}"
    problem = comm.host_bcast(problem, "tune's profile file")
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    profile = tune(comm, repeats=args.repeats, runs=args.runs)
    if comm.rank == 0:
        path = save_profile(profile, args.output)
        print(json.dumps(profile.as_dict(), indent=1, sort_keys=True))
        print(f"# profile of {comm.size} ranks written to {path}")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from .tuner.simulate import run

    return run(args)


def _selftest(args: argparse.Namespace) -> int:
    from .testing.selftest import main as selftest

    return selftest(args)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cupycoll", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, settings and backend: paste into a bug report")
    info.set_defaults(func=_info)
    bench = sub.add_parser("bench", help="run a shipped benchmark (under mpiexec for P > 1)",
                           description="Run bench/bench_NAME.py; arguments after NAME go to it "
                                       "(try: cupycoll bench sparse --help).")
    bench.add_argument("name", choices=BENCHMARKS)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)
    tune = sub.add_parser("tune", help="measure alpha, beta, gamma here; write the profile auto "
                          "reads (run under mpiexec with the job's ranks)")
    tune.add_argument("--output", help="profile file (default: "
                      "CUPYCOLL_PROFILE or the cache dir)")
    tune.add_argument("--repeats", type=_at_least_one, default=15,
                      help="timed repeats per measurement")
    tune.add_argument("--runs", type=_at_least_one, default=1, help="measure this many times, "
                      "keep every price's median (a shared machine's slow spells; "
                      "docs/tuning.md)")
    tune.add_argument("--backend", default=None, choices=["auto", "mpi", "nccl"],
                      help="communicator backend (default: init()'s)")
    tune.set_defaults(func=_tune)
    from .tuner.simulate import add_arguments

    simulate = sub.add_parser("simulate", help="predict per-algorithm time and bytes per rank, "
                              "sparse and top-k families, P = 2..1024, named networks")
    add_arguments(simulate)
    simulate.set_defaults(func=_simulate)
    from .testing.selftest import add_arguments as selftest_arguments

    selftest = sub.add_parser("selftest", help="one-command acceptance run: the GPU checks "
                              "with a CUDA device, their emulated equivalents without")
    selftest_arguments(selftest)
    selftest.set_defaults(func=_selftest)
    return p


def _at_least_one(text: str) -> int:
    """An int >= 1 (argparse's type: anything else is a usage error)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m cupycoll`` and the ``cupycoll`` console script."""
    args = _parser().parse_args(argv)
    return int(args.func(args) or 0)
