"""Emulated ``cupy.RawModule``: the CUDA source compiled for the CPU with ``kernels/cpu_shim.h``.

The source CuPy would hand to NVRTC is compiled by g++ into a shared library by
:func:`cupycoll.testing.kernel_shim.library` (cached on disk by its hash, so ranks and runs share
it);
``get_function(name_expression)`` returns a kernel whose call checks, like a launch, that every
array argument is on the current device and ordered on the current stream, then runs every
(block, thread) of the grid in turn.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ... import _kernels
from .. import kernel_shim
from . import buffers
from . import device as dev
from .array import _check_devices, ndarray

__all__ = ["RawModule"]

#: the shim runs threads through process-wide built-ins (blockIdx ...): one launch at a time.
_LAUNCH_LOCK = threading.Lock()
#: kernel name expression -> launches so far (tests check that a path really ran the kernels).
LAUNCHES: collections.Counter = collections.Counter()


def _cached_kernel(path: str) -> tuple[str, dict[str, str]]:
    """The CUDA source a cubin of cupycoll's kernel cache was compiled from, and its lowered
    name -> name expression (from the ``.source`` and ``.name`` notes that
    :func:`cupycoll._kernels.compiled` writes beside it)."""
    note, lowered = Path(path).with_suffix(".source"), Path(path).with_suffix(".name")
    if not (note.exists() and lowered.exists()):
        raise RuntimeError(f"the emulated RawModule(path=...) runs cupycoll's cached kernels "
                           f"only: no {note.name} and {lowered.name} beside {path}")
    file, expr = note.read_text().split("\n", 1)
    return _kernels.source(file), {lowered.read_text(): expr}


class RawModule:
    """``cupy.RawModule(code=..., options=..., name_expressions=...)`` run on the CPU."""

    def __init__(self, code: str = "", options: tuple = (), name_expressions: Any = None,
                 path: str | None = None, **kwargs: Any) -> None:
        self._aliases: dict[str, str] = {}
        if path is not None:  # a cubin of cupycoll's kernel cache: run its source instead
            code, self._aliases = _cached_kernel(path)
        self._lib = kernel_shim.library(code)
        self._kernels = kernel_shim.launchers(self._lib)
        self.device = dev.current_device()
        if name_expressions is not None:
            missing = set(map(_kernels._canonical, name_expressions)) - set(self._kernels)
            if missing:
                raise RuntimeError(f"name expressions not in the module: {sorted(missing)}")

    def get_function(self, name: str) -> "_Kernel":
        name = self._aliases.get(name, name)
        try:
            return _Kernel(self._kernels[_kernels._canonical(name)], name, self.device)
        except KeyError:
            raise RuntimeError(f"no kernel {name!r} in the module") from None


class _Kernel:
    def __init__(self, launch: Any, name: str, device: int) -> None:
        self.launch, self.name, self.device = launch, name, device

    def __call__(self, grid: tuple, block: tuple, args: tuple, **kwargs: Any) -> None:
        if dev.current_device() != self.device:
            raise dev.DeviceMismatch(f"kernel {self.name} of a module loaded on device "
                                     f"{self.device} launched while device "
                                     f"{dev.current_device()} is current")
        arrays = [(a, True) for a in args if isinstance(a, ndarray)]
        _check_devices(arrays, self.name)
        access = {id(a._buf): (a._buf, True) for a, _ in arrays}
        buffers.ordered_access(list(access.values()), f"kernel {self.name}")
        cells = []
        for a in args:
            if isinstance(a, ndarray):
                if not a.flags.c_contiguous:
                    raise dev.EmulationError(f"kernel {self.name}: non-contiguous array argument")
                cells.append(ctypes.c_void_p(a.data.ptr or None))
            elif isinstance(a, np.generic):
                cells.append(ctypes.create_string_buffer(a.tobytes(), a.itemsize))
            else:
                raise dev.EmulationError(f"kernel {self.name}: argument {a!r} is neither a "
                                         "device array nor a typed numpy scalar")
        argv = (ctypes.c_void_p * len(cells))(*(ctypes.addressof(c) for c in cells))
        with _LAUNCH_LOCK:
            self.launch(int(grid[0]), int(block[0]), argv)
            LAUNCHES[self.name] += 1
