"""The CUDA kernels of cupycoll: sources, instantiation names, per-device modules, NVRTC checks.

The ``.cu`` files live in the top-level ``kernels/`` folder, shipped as the ``cupycoll.kernels``
package. Each lists its template instantiations in ``CC_EXPORT(name<types>)`` lines, which are the
NVRTC name expressions. Sources are compiled with their local ``#include "x.cuh"`` lines inlined,
one instantiation at a time on its first use, and the cubins are cached on disk keyed by the
inlined source (so every header change recompiles): CuPy < 14.1 does not cache modules compiled
with name expressions, and compiling all of a file's instantiations up front costs seconds. A
device newer than the installed NVRTC gets PTX instead, which the driver JIT-compiles
(:func:`kernel_target`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
import math
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ._types import ReduceOp
from .errors import BackendUnavailable

__all__ = ["KERNEL_FILES", "NVRTC_OPTIONS", "CTYPES", "OPS", "expression", "source",
           "name_expressions", "nvrtc_compile", "kernel_target", "device_target", "compiled",
           "cache_dir", "CupyLauncher"]

_log = logging.getLogger("cupycoll")

#: every kernel source, in the order they are documented.
KERNEL_FILES = ("select.cu", "radix_select.cu", "segment.cu", "scatter.cu", "gather.cu", "wire.cu")
#: NVRTC options of every compilation (besides the target architecture).
NVRTC_OPTIONS = ("-std=c++17",)
#: C++ type of each value/index dtype in the kernels' template arguments.
CTYPES = {np.dtype(np.float16): "cc_half", np.dtype(np.float32): "float",
          np.dtype(np.float64): "double", np.dtype(np.int32): "int",
          np.dtype(np.int64): "long long"}
#: C++ functor of each reduction op.
OPS = {ReduceOp.SUM: "cc_op_sum", ReduceOp.PROD: "cc_op_prod", ReduceOp.MAX: "cc_op_max",
       ReduceOp.MIN: "cc_op_min"}

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.M)
_EXPORT = re.compile(r"^CC_EXPORT\((.+)\)[ \t]*$", re.M)


def expression(kernel: str, *types: str) -> str:
    """Return the canonical name expression ``kernel<t1, t2>`` (or ``kernel`` without types)."""
    return f"{kernel}<{', '.join(types)}>" if types else kernel


def _canonical(expr: str) -> str:
    return re.sub(r"\s*,\s*", ", ", re.sub(r"\s+", " ", expr.strip()))


@functools.lru_cache(maxsize=None)
def kernel_dir() -> Path:
    """Folder of the ``.cu`` files: the installed ``cupycoll.kernels``, else the source tree's."""
    try:
        folder = importlib.resources.files("cupycoll.kernels")
    except ModuleNotFoundError:
        folder = None
    if folder is not None and folder.joinpath(KERNEL_FILES[0]).is_file():
        return Path(str(folder))
    return Path(__file__).resolve().parents[1] / "kernels"


@functools.lru_cache(maxsize=None)
def source(name: str) -> str:
    """Return the text of kernel file ``name`` with its local includes inlined (each once)."""
    seen: set[str] = set()

    def expand(file: str) -> str:
        if file in seen:
            return ""
        seen.add(file)
        text = (kernel_dir() / file).read_text()
        text = text.replace("#pragma once\n", "")
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(name)


@functools.lru_cache(maxsize=None)
def name_expressions(name: str) -> tuple[str, ...]:
    """Return the instantiations that kernel file ``name`` exports, as NVRTC name expressions."""
    return tuple(_canonical(e) for e in _EXPORT.findall((kernel_dir() / name).read_text()))


def _nvrtc(name: str, exprs: tuple[str, ...], arch: str, cubin: bool) -> tuple[bytes, dict]:
    """Compile kernel file ``name`` for ``exprs`` only; return (binary, expr -> lowered name)."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(source(name), name, [], [])
    try:
        for expr in exprs:
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", *NVRTC_OPTIONS])
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"NVRTC failed on {name} for {arch}: {exc}\n"
                               f"{nvrtc.getProgramLog(prog)}") from None
        binary = nvrtc.getCUBIN(prog) if cubin else nvrtc.getPTX(prog)
        if not binary:
            raise RuntimeError(f"NVRTC produced no {'cubin' if cubin else 'PTX'} for {name}")
        return binary, {expr: nvrtc.getLoweredName(prog, expr) for expr in exprs}
    finally:
        nvrtc.destroyProgram(prog)


def nvrtc_compile(name: str, arch: str, *, cubin: bool = True) -> dict[str, str]:
    """Compile kernel file ``name`` for ``arch`` (e.g. ``"sm_90"``) with NVRTC directly.

    Needs no GPU and no driver (unlike CuPy's own compile helpers). Returns the lowered (mangled)
    name of every exported name expression; raises ``RuntimeError`` with the compiler log on
    failure.
    """
    return _nvrtc(name, name_expressions(name), arch, cubin)[1]


def kernel_target(capability: int, supported: Iterable[int]) -> str:
    """Return what to compile for a device of compute capability ``capability`` (e.g. 90).

    ``"sm_90"`` (a cubin) when NVRTC supports the device's architecture, else
    ``"compute_YY"``: PTX for the newest supported architecture YY below the device's, which
    the driver JIT-compiles when the module loads (PTX of compute_YY runs on every device of
    capability >= YY, so a GPU newer than the installed NVRTC still gets its kernels).

    Args:
        capability: the device's compute capability as major * 10 + minor.
        supported: the architectures NVRTC compiles for (``nvrtc.getSupportedArchs()``).
    Raises:
        BackendUnavailable: the device is older than every supported architecture (an NVRTC
            that dropped it): neither a cubin nor PTX of this NVRTC runs there.
    """
    archs = sorted(set(supported))
    if capability in archs:
        return f"sm_{capability}"
    older = [arch for arch in archs if arch < capability]
    if not older:
        raise BackendUnavailable(
            f"the installed NVRTC compiles for {', '.join(f'sm_{a}' for a in archs) or 'nothing'}"
            f"; this device is sm_{capability}, older than all of them, and PTX runs only on "
            f"its architecture or newer: install a CUDA toolkit (CuPy wheel) that supports "
            f"sm_{capability}")
    return f"compute_{older[-1]}"


@functools.lru_cache(maxsize=None)
def supported_archs() -> tuple[int, ...]:
    """The architectures the installed NVRTC compiles for, e.g. ``(75, 80, ..., 120)``."""
    from cupy.cuda import nvrtc

    return tuple(nvrtc.getSupportedArchs())


@functools.lru_cache(maxsize=None)
def device_target(capability: int) -> str:
    """:func:`kernel_target` for the installed NVRTC, logging a PTX fallback once (INFO)."""
    target = kernel_target(capability, supported_archs())
    if target.startswith("compute_"):
        _log.info("the installed NVRTC cannot compile for sm_%d; cupycoll's kernels are "
                  "compiled to PTX for %s, which the driver JIT-compiles for the device",
                  capability, target)
    return target


def cache_dir() -> Path:
    """Where compiled instantiations are kept: ``$CUPY_CACHE_DIR/cupycoll`` (CuPy's own cache
    folder, default ``~/.cupy/kernel_cache``)."""
    root = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    return Path(root) / "cupycoll"


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` through a uniquely named temporary file beside it, then rename it.

    Concurrent writers (threads, ranks, or hosts whose processes may share a PID and a home
    directory) never see a partial file nor take each other's temporary file; the temporary
    file is removed if anything fails.
    """
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except FileNotFoundError:
            pass
        raise


def compiled(name: str, expr: str, arch: str) -> tuple[Path, str]:
    """Return (module path, lowered name) of one instantiation, compiling it once per machine.

    ``arch`` is ``"sm_XX"`` for a cubin or ``"compute_XX"`` for PTX (see :func:`kernel_target`);
    either file loads with ``cupy.RawModule(path=...)``. The cache key is the inlined source,
    the instantiation, the architecture, the options and NVRTC's version, so any change
    recompiles; files are written atomically, so concurrent ranks at worst compile twice.
    """
    from cupy.cuda import nvrtc

    key = hashlib.sha256("\0".join([source(name), expr, arch, *NVRTC_OPTIONS,
                                     str(nvrtc.getVersion())]).encode()).hexdigest()[:32]
    cubin = arch.startswith("sm_")
    folder = cache_dir()
    module, lowered = folder / f"{key}.{'cubin' if cubin else 'ptx'}", folder / f"{key}.name"
    note = folder / f"{key}.source"  # which kernel file (for tools such as the emulator)
    if not (module.exists() and lowered.exists() and note.exists()):
        binary, names = _nvrtc(name, (expr,), arch, cubin=cubin)
        folder.mkdir(parents=True, exist_ok=True)
        for path, data in ((module, bytes(binary)), (lowered, names[expr].encode()),
                           (note, f"{name}\n{expr}".encode())):
            _write_atomically(path, data)
    return module, lowered.read_text()


class CupyLauncher:
    """Launch the kernels on the current CUDA device through ``cupy.RawModule`` (one per device)."""

    block = 256
    blocks_per_sm = 8

    def __init__(self) -> None:
        self._modules: list[Any] = []  # kept alive: their functions are in use
        self._functions: dict[tuple[int, str, str], Any] = {}
        self._max_blocks: dict[int, int] = {}

    @property
    def xp(self) -> Any:
        import cupy

        return cupy

    def shape(self, items: int) -> tuple[int, int]:
        """Return ``(grid, block)`` for a grid-stride loop over ``items`` work items."""
        runtime = self.xp.cuda.runtime
        device = runtime.getDevice()
        cap = self._max_blocks.get(device)
        if cap is None:
            sms = runtime.deviceGetAttribute(runtime.cudaDevAttrMultiProcessorCount, device)
            cap = self._max_blocks[device] = sms * self.blocks_per_sm
        return max(1, min(math.ceil(items / self.block), cap)), self.block

    def __call__(self, file: str, expr: str, shape: tuple[int, int], *args: Any) -> None:
        """Run instantiation ``expr`` of kernel file ``file``; ``None`` args are null pointers.

        Each instantiation is compiled on its first use, for this device's architecture only
        (PTX where NVRTC predates the device: :func:`kernel_target`), and kept in
        :func:`cache_dir` across runs (see :func:`compiled`).
        """
        cupy = self.xp
        device = cupy.cuda.runtime.getDevice()
        key = (device, file, expr)
        fn = self._functions.get(key)
        if fn is None:
            arch = device_target(int(cupy.cuda.Device(device).compute_capability))
            path, lowered = compiled(file, expr, arch)
            module = cupy.RawModule(path=str(path))
            self._modules.append(module)
            fn = self._functions[key] = module.get_function(lowered)
        fn((shape[0],), (shape[1],), tuple(np.uint64(0) if a is None else a for a in args))
