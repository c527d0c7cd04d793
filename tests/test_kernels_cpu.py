"""Tier 2: run the CUDA kernels on the CPU and compare the primitives with their numpy twins.

Each ``kernels/*.cu`` is compiled once as C++ by g++ with ``kernels/cpu_shim.h`` (CUDA built-ins
as plain C++, every (block, thread) run in turn) into a shared library loaded with ctypes. The
kernel-backed primitives (:class:`cupycoll._cupy_primitives.KernelPrimitives`, the same code the
GPU runs, with numpy in place of cupy) must then equal the numpy twins bit for bit.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import time
from typing import Any

import numpy as np
import pytest

from cupycoll import _kernels, primitives
from cupycoll._cupy_primitives import KernelPrimitives

from . import _kernel_cases as cases

_LAUNCH = ctypes.CFUNCTYPE(None, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p))


class ShimLauncher:
    """Runs kernel instantiations from the CPU-compiled libraries, cuLaunchKernel-style."""

    xp = np

    def __init__(self, libraries: dict[str, ctypes.CDLL]):
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


def _compiler() -> str:
    found = shutil.which("g++") or shutil.which("c++")
    if found is None:
        pytest.fail("tier-2 kernel tests need a C++17 compiler (g++) on PATH")
    return found


@pytest.fixture(scope="module")
def libraries(tmp_path_factory) -> dict[str, ctypes.CDLL]:
    """Compile every kernel file for the CPU, all at once (one g++ per file)."""
    out = tmp_path_factory.mktemp("kernels_cpu")
    folder = _kernels.kernel_dir()
    start = time.perf_counter()
    procs = {}
    for file in _kernels.KERNEL_FILES:
        cmd = [_compiler(), "-x", "c++", "-std=c++17", "-O1", "-shared", "-fPIC",
               "-fvisibility=hidden", "-Wall", "-Wno-unknown-pragmas",
               "-include", str(folder / "cpu_shim.h"),
               "-o", str(out / f"{file}.so"), str(folder / file)]
        procs[file] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True)
    for file, proc in procs.items():
        log, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"g++ failed on {file}:\n{log}"
        assert "warning" not in log, f"g++ warned on {file}:\n{log}"
    print(f"g++ build of {len(procs)} kernel files: {time.perf_counter() - start:.1f} s")
    return {file: ctypes.CDLL(str(out / f"{file}.so")) for file in procs}


@pytest.fixture(scope="module")
def kernels(libraries) -> KernelPrimitives:
    # chunks of 5 elements: several chunks even for small inputs, ragged last chunk
    return KernelPrimitives(ShimLauncher(libraries), chunk=5)


def test_shim_exports_every_name_expression(libraries):
    launcher = ShimLauncher(libraries)
    for file in _kernels.KERNEL_FILES:
        exported = {name for f, name in launcher.kernels if f == file}
        assert exported == set(_kernels.name_expressions(file)), file


def _run(kernels: KernelPrimitives, name: str, args: tuple, kwargs: dict) -> None:
    want_args = _copy(args)
    want = getattr(primitives, name)(*want_args, **kwargs)
    got_args = _copy(args)
    got = getattr(kernels, name)(*got_args, **kwargs)
    cases.assert_same(got, want, name)
    if name == "scatter_reduce":  # in place
        cases.assert_same(got_args[0], want_args[0], "scatter_reduce dense")


def _copy(obj: Any) -> Any:
    """A fresh copy of the arguments, arrays in the same layout (strides) as the originals.

    The reference and the kernel each get their own arrays, so an in-place result that never
    reaches a non-contiguous ``dense`` cannot pass by comparing an array with itself.
    """
    if isinstance(obj, np.ndarray):
        if obj.flags.c_contiguous:
            return obj.copy()
        base = obj.base
        assert isinstance(base, np.ndarray) and base.flags.c_contiguous, "view of a plain array"
        offset = obj.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        fresh = np.ndarray(obj.shape, obj.dtype, base.copy(), offset, obj.strides)
        assert fresh.strides == obj.strides and not fresh.flags.c_contiguous
        return fresh
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copy(o) for o in obj)
    return obj


def _params(generated) -> list:
    return [pytest.param(name, args, kwargs, id=f"{name}-{label}")
            for name, label, args, kwargs in generated]


@pytest.mark.parametrize("name,args,kwargs", _params(cases.threshold_cases()))
def test_thresholds(kernels, name, args, kwargs):
    _run(kernels, name, args, kwargs)


@pytest.mark.parametrize("name,args,kwargs", _params(cases.topk_cases()))
def test_topk(kernels, name, args, kwargs):
    _run(kernels, name, args, kwargs)


@pytest.mark.parametrize("name,args,kwargs", _params(cases.reduce_cases()))
def test_reductions(kernels, name, args, kwargs):
    _run(kernels, name, args, kwargs)


@pytest.mark.parametrize("name,args,kwargs", _params(cases.dense_cases()))
def test_dense(kernels, name, args, kwargs):
    _run(kernels, name, args, kwargs)


@pytest.mark.parametrize("name,args,kwargs", _params(cases.error_cases()))
def test_errors(kernels, name, args, kwargs):
    with pytest.raises(Exception) as want:
        getattr(primitives, name)(*args, **kwargs)
    with pytest.raises(type(want.value)) as got:
        getattr(kernels, name)(*args, **kwargs)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("dtype", cases.VALUE_DTYPES)
def test_int64_output_indices(kernels, dtype, monkeypatch):
    # arrays of 2**31 elements are out of reach here: lower the int64 cut-over instead
    monkeypatch.setattr(primitives, "_index_dtype", lambda n: np.dtype(np.int64))
    x = cases.values(np.random.default_rng(6), dtype, 100)
    for name, arg in (("select_abs_ge", 1.0), ("topk_abs", 17)):
        _run(kernels, name, (x, arg), {})
