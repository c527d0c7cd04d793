"""The shipped benchmarks: their names and where their scripts are (``cupycoll bench NAME``,
``cupycoll selftest``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["BENCHMARKS", "bench_script"]

#: every bench/bench_NAME.py (``cupycoll bench NAME``); the convergence demo runs as ``demo``.
#: ``syncs`` ships because ``cupycoll selftest`` runs it; the developer probes in bench/dev/ are
#: not installed (run them from the source tree).
BENCHMARKS = ("dense", "sparse", "topk", "small", "wire", "torch", "regret", "syncs", "demo")


def bench_script(name: str) -> Path:
    """Return the path of benchmark ``name``: shipped in the package, else the source tree's."""
    file = "convergence_demo.py" if name == "demo" else f"bench_{name}.py"
    try:
        shipped = Path(str(resources.files("cupycoll.bench").joinpath(file)))
    except ModuleNotFoundError:  # a source checkout run without installing
        shipped = Path(__file__).resolve().parents[1] / "bench" / file
    if not shipped.is_file():
        raise FileNotFoundError(f"benchmark {name!r} not found at {shipped}")
    return shipped
