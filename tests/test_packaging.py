"""The built wheel ships the CUDA kernels, the typing marker and every subpackage."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_kernels(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, timeout=300,
                   cwd=tmp_path)
    wheel = next(tmp_path.glob("cupycoll-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = sorted(p.name for p in (ROOT / "kernels").glob("*.cu"))
    assert kernels, "no .cu files in kernels/"
    for name in kernels:
        assert f"cupycoll/kernels/{name}" in names, f"{name} missing from the wheel"
    for module in ("cupycoll/__init__.py", "cupycoll/py.typed", "cupycoll/comm/mpi.py",
                   "cupycoll/comm/nccl.py", "cupycoll/sparse/__init__.py",
                   "cupycoll/topk/__init__.py", "cupycoll/primitives.py",
                   "cupycoll/_emulation/nccl.py", "cupycoll/kernels/cpu_shim.h"):
        assert module in names, f"{module} missing from the wheel"
