"""The CUDA kernels compiled for the CPU (``kernels/cpu_shim.h``) and a launcher that runs them.

For tests and tools without a GPU: each ``kernels/*.cu`` is compiled as C++ by g++ into a shared
library loaded with ctypes; :class:`ShimLauncher` runs its instantiations cuLaunchKernel-style,
so :class:`~cupycoll.primitives._cupy.KernelPrimitives` (the code the GPU runs) can work on host
arrays. Built libraries are cached by the hash of the sources and the compiler command.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import _kernels

__all__ = ["ShimLauncher", "build", "load", "compiler"]

_LAUNCH = ctypes.CFUNCTYPE(None, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p))
_FLAGS = ("-x", "c++", "-std=c++17", "-O1", "-shared", "-fPIC", "-fvisibility=hidden", "-pthread",
          "-Wall", "-Wno-unknown-pragmas")


def compiler() -> str | None:
    """Path of the C++17 compiler the shim needs (g++ or c++), or None."""
    return shutil.which("g++") or shutil.which("c++")


def _command(file: str, out: Path) -> list[str]:
    folder = _kernels.kernel_dir()
    return [compiler() or "g++", *_FLAGS, "-include", str(folder / "cpu_shim.h"), "-o", str(out),
            str(folder / file)]


def build(folder: Path | None = None) -> dict[str, Path]:
    """Compile every kernel file for the CPU (one g++ per file, in parallel); return the paths.

    Libraries already built from the same sources are reused; concurrent callers (the ranks of
    one job) take turns on a lock file, so only the first compiles. Raises RuntimeError with the
    compiler log on failure or on any warning.
    """
    kdir = _kernels.kernel_dir()
    digest = hashlib.sha256(" ".join([compiler() or "g++", *_FLAGS]).encode())
    for name in sorted(p.name for p in kdir.iterdir() if p.suffix in (".cu", ".cuh", ".h")):
        digest.update(name.encode() + (kdir / name).read_bytes())
    folder = Path(folder or Path(tempfile.gettempdir()) / f"cupycoll-shim-{os.getuid()}")
    folder = folder / digest.hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    paths = {file: folder / f"{file}.so" for file in _kernels.KERNEL_FILES}
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _compile_missing(paths)
    return paths


def _compile_missing(paths: dict[str, Path]) -> None:
    procs = {}
    for file, path in paths.items():
        if not path.exists():
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            procs[file] = (partial, subprocess.Popen(
                _command(file, partial), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
    for file, (partial, proc) in procs.items():
        log, _ = proc.communicate(timeout=300)
        if proc.returncode != 0 or "warning" in log:
            raise RuntimeError(f"g++ failed or warned on {file}:\n{log}")
        os.replace(partial, paths[file])  # atomic: a reader never sees half a file


def load(paths: dict[str, Path]) -> dict[str, ctypes.CDLL]:
    """Load built kernel libraries."""
    return {file: ctypes.CDLL(str(path)) for file, path in paths.items()}


class ShimLauncher:
    """Runs kernel instantiations from the CPU-compiled libraries, cuLaunchKernel-style.

    ``xp`` is the array namespace the primitives work on (numpy, or a namespace of numpy-backed
    device arrays such as the sync-counting one).
    """

    def __init__(self, libraries: dict[str, ctypes.CDLL], xp: Any = np):
        self.xp = xp
        self.libraries = libraries  # kept alive: the launchers point into them
        self.kernels: dict[tuple[str, str], Any] = {}
        for file, lib in libraries.items():
            lib.cc_shim_name.restype = ctypes.c_char_p
            lib.cc_shim_launcher.restype = ctypes.c_void_p
            for i in range(lib.cc_shim_count()):
                name = _kernels._canonical(lib.cc_shim_name(i).decode())
                self.kernels[(file, name)] = _LAUNCH(lib.cc_shim_launcher(i))

    def shape(self, items: int) -> tuple[int, int]:
        # a few odd-sized blocks, so grid-stride loops wrap and partial outputs have many columns
        return max(1, min(2, -(-items // 3))), 3

    def __call__(self, file: str, expr: str, shape: tuple[int, int], *args: Any) -> None:
        assert (file, expr) in self.kernels, f"{expr} is not exported by {file}"
        cells = []
        for a in args:
            if a is None:
                cells.append(ctypes.c_void_p(None))
            elif isinstance(a, np.ndarray):
                assert a.flags.c_contiguous, f"{expr}: non-contiguous array argument"
                cells.append(ctypes.c_void_p(a.ctypes.data))
            else:  # a typed numpy scalar, exactly like a kernel argument through CuPy
                assert isinstance(a, np.generic), f"{expr}: untyped argument {a!r}"
                cells.append(ctypes.create_string_buffer(a.tobytes(), a.itemsize))
        argv = (ctypes.c_void_p * len(cells))(*(ctypes.addressof(c) for c in cells))
        self.kernels[(file, expr)](shape[0], shape[1], argv)
