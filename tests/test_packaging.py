"""The built wheel ships the CUDA kernels, the benchmarks, the typing marker, every subpackage and
a working ``cupycoll`` command."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(ROOT)], check=True, timeout=300, cwd=out)
    return next(out.glob("cupycoll-*.whl"))


def test_wheel_ships_kernels_and_benchmarks(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = sorted(p.name for p in (ROOT / "kernels").glob("*.cu"))
    benches = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
    assert kernels and benches
    for name in kernels:
        assert f"cupycoll/kernels/{name}" in names, f"{name} missing from the wheel"
    for name in benches:
        assert f"cupycoll/bench/{name}" in names, f"{name} missing from the wheel"
    for module in ("cupycoll/__init__.py", "cupycoll/py.typed", "cupycoll/comm/mpi.py",
                   "cupycoll/comm/nccl.py", "cupycoll/sparse/__init__.py",
                   "cupycoll/topk/__init__.py", "cupycoll/primitives.py",
                   "cupycoll/__main__.py", "cupycoll/jupyter.py",
                   "cupycoll/_emulation/nccl.py", "cupycoll/kernels/cpu_shim.h",
                   "cupycoll/wire/__init__.py", "cupycoll/wire/_cupy.py"):
        assert module in names, f"{module} missing from the wheel"


def test_installed_command_runs_info_and_a_benchmark(wheel, tmp_path):
    """pip install the wheel into a fresh target (dependencies from this environment): the
    console script works outside the source tree, reports the installed version, and runs a
    shipped benchmark."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}
    command = str(target / "bin" / "cupycoll")
    info = subprocess.run([command, "info"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env, check=True).stdout
    version = next(line for line in info.splitlines() if line.startswith("cupycoll "))
    assert "0.1.0" in version and str(target) in version, version
    bench = subprocess.run([command, "bench", "dense", "-b", "8", "-e", "64", "-n", "2", "-w",
                            "1", "--no-progress"], capture_output=True, text=True, timeout=120,
                           cwd=tmp_path, env=env)
    assert bench.returncode == 0, bench.stderr
    rows = [r for r in bench.stdout.splitlines() if r.strip() and not r.startswith("#")]
    assert len(rows) == 4 and all(r.split()[-1] == "0" for r in rows), bench.stdout
