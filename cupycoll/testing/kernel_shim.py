"""The CUDA kernels compiled for the CPU (``kernels/cpu_shim.h``) and a launcher that runs them.

For tests, tools and the GPU emulation tier without a GPU: CUDA source (a ``kernels/*.cu`` file
with its includes inlined, or the code the emulated ``cupy.RawModule`` is handed) is compiled as
C++ by g++ into a shared library loaded with ctypes; :class:`ShimLauncher` runs a library's
instantiations cuLaunchKernel-style, so :class:`~cupycoll.primitives._cupy.KernelPrimitives`
(the code the GPU runs) can work on host arrays. This is the one builder: every library is
cached on disk by the hash of its source, the shim, the compiler and its flags, in
``CUPYCOLL_EMULATION_CACHE`` (default ``cupycoll-emulation-UID`` in the temporary directory),
shared by every process and run.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from .. import _kernels
from .._config import setting
from ..errors import InvalidArgument

__all__ = ["ShimLauncher", "kernel_libraries", "library", "libraries", "compiler"]

_LAUNCH = ctypes.CFUNCTYPE(None, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p))
_FLAGS = ("-x", "c++", "-std=c++17", "-O1", "-shared", "-fPIC", "-fvisibility=hidden", "-pthread",
          "-Wall", "-Wno-unknown-pragmas")
#: libraries loaded in this process, by key (a library is loaded once).
_LOADED: dict[str, ctypes.CDLL] = {}
_LOADING = threading.Lock()


def compiler() -> str | None:
    """Path of the C++17 compiler the shim needs (g++ or c++), or None."""
    return shutil.which("g++") or shutil.which("c++")


def cache_folder() -> Path:
    """Where the built libraries go (``CUPYCOLL_EMULATION_CACHE`` or its default), unmade."""
    named = setting("CUPYCOLL_EMULATION_CACHE")
    return Path(named or Path(tempfile.gettempdir()) / f"cupycoll-emulation-{os.getuid()}")


def cache_dir() -> Path:
    """Folder of the built libraries (:func:`cache_folder`), created if missing."""
    named, folder = setting("CUPYCOLL_EMULATION_CACHE"), cache_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgument("CUPYCOLL_EMULATION_CACHE" if named else "the emulation cache",
                              str(folder), f"cannot be made a folder of the kernels' CPU "
                              f"builds ({exc.strerror})") from exc
    return folder


def kernel_libraries() -> dict[str, ctypes.CDLL]:
    """Every ``kernels/*.cu`` file's library, by file name."""
    return libraries({file: _kernels.source(file) for file in _kernels.KERNEL_FILES})


def library(code: str) -> ctypes.CDLL:
    """The library of CUDA source ``code`` (see :func:`libraries`)."""
    return libraries({"code": code})["code"]


def libraries(codes: dict[str, str]) -> dict[str, ctypes.CDLL]:
    """The CPU library of each CUDA source in ``codes`` (name -> source), loaded.

    Missing libraries are compiled in parallel (one g++ each); concurrent callers (the ranks of
    one job) take turns on a lock file per library, so only the first compiles. Raises
    RuntimeError with the compiler's log on failure or on any warning, or without a compiler.
    """
    shim = _kernels.kernel_dir() / "cpu_shim.h"
    salt = "\0".join((compiler() or "g++", *_FLAGS, shim.read_text()))
    keys = {name: hashlib.sha256((salt + "\0" + code).encode()).hexdigest()[:24]
            for name, code in codes.items()}
    with _LOADING:
        missing = {keys[name]: code for name, code in codes.items() if keys[name] not in _LOADED}
        if missing:
            folder = cache_dir()
            with ExitStack() as locks:
                for key in sorted(missing):  # one order for every process: no deadlock
                    lock = locks.enter_context(open(folder / f"{key}.lock", "w"))
                    fcntl.flock(lock, fcntl.LOCK_EX)
                _compile_missing(folder, shim, missing)
            for key in missing:
                _LOADED[key] = _loaded(folder / f"{key}.so")
        return {name: _LOADED[keys[name]] for name in codes}


def _compile_missing(folder: Path, shim: Path, codes: dict[str, str]) -> None:
    """Compile each source of ``codes`` (key -> source) whose library is not in ``folder``."""
    cxx = compiler()
    procs = {}
    for key, code in codes.items():
        target = folder / f"{key}.so"
        if target.exists():
            continue
        if cxx is None:
            raise RuntimeError("the CPU build of the CUDA kernels needs a C++17 compiler (g++)")
        source = folder / f"{key}.cu"
        source.write_text(code)
        partial = folder / f"{key}.{os.getpid()}.tmp"
        procs[key] = (partial, subprocess.Popen(
            [cxx, *_FLAGS, "-include", str(shim), "-o", str(partial), str(source)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    failed = []
    for key, (partial, proc) in procs.items():  # every build waited for, failed or not
        log, _ = proc.communicate(timeout=300)
        if proc.returncode != 0 or "warning" in log:
            partial.unlink(missing_ok=True)
            failed.append(f"g++ failed or warned on {folder / key}.cu:\n{log}")
        else:
            os.replace(partial, folder / f"{key}.so")  # atomic: no reader sees half a file
    if failed:
        raise RuntimeError("\n".join(failed))


def _loaded(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.cc_shim_name.restype = ctypes.c_char_p
    lib.cc_shim_launcher.restype = ctypes.c_void_p
    return lib


def launchers(lib: ctypes.CDLL) -> dict[str, Any]:
    """Name expression (canonical) -> launcher of every instantiation ``lib`` exports."""
    return {_kernels._canonical(lib.cc_shim_name(i).decode()): _LAUNCH(lib.cc_shim_launcher(i))
            for i in range(lib.cc_shim_count())}


class ShimLauncher:
    """Runs kernel instantiations from the CPU-compiled libraries, cuLaunchKernel-style.

    ``xp`` is the array namespace the primitives work on (numpy, or a namespace of numpy-backed
    device arrays such as the sync-counting one).
    """

    def __init__(self, libraries: dict[str, ctypes.CDLL], xp: Any = np):
        self.xp = xp
        self.libraries = libraries  # kept alive: the launchers point into them
        self.kernels = {(file, name): launch for file, lib in libraries.items()
                        for name, launch in launchers(lib).items()}

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
