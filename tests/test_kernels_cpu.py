"""Tier 2: run the CUDA kernels on the CPU and compare the primitives with their numpy twins.

Each ``kernels/*.cu`` is compiled once as C++ by g++ with ``kernels/cpu_shim.h`` (CUDA built-ins
as plain C++, every (block, thread) run in turn) into a shared library loaded with ctypes. The
kernel-backed primitives (:class:`cupycoll.primitives._cupy.KernelPrimitives`, the same code the
GPU runs, with numpy in place of cupy) must then equal the numpy twins bit for bit.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np
import pytest

from cupycoll import _kernels, primitives
from cupycoll.primitives import _checks, _numpy_select
from cupycoll.primitives._cupy import KernelPrimitives
from cupycoll.testing import kernel_shim
from cupycoll.testing.kernel_shim import ShimLauncher

from . import _kernel_cases as cases

@pytest.fixture(scope="module")
def libraries() -> dict[str, ctypes.CDLL]:
    """Compile every kernel file for the CPU, all at once (one g++ per file; reused while the
    sources are unchanged, also by the sync-counting namespace)."""
    if kernel_shim.compiler() is None:
        pytest.fail("tier-2 kernel tests need a C++17 compiler (g++) on PATH")
    start = time.perf_counter()
    libs = kernel_shim.kernel_libraries()
    print(f"g++ build of {len(libs)} kernel files: {time.perf_counter() - start:.1f} s")
    return libs


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


class _BlockLauncher(ShimLauncher):
    """The shim launcher with ``block`` threads per block (the GPU launcher's 256, or a warp)."""

    def __init__(self, libraries, block: int):
        super().__init__(libraries)
        self.block = block

    def shape(self, items: int) -> tuple[int, int]:
        return max(1, min(3, -(-items // self.block))), self.block


@pytest.mark.parametrize("name,args,kwargs", _params(cases.hot_cases()))
def test_hot_index(kernels, name, args, kwargs):
    """Long runs of one index (100,000 duplicates), folded by a whole block where the op allows:
    bit-equal to the numpy twin's left fold."""
    _run(kernels, name, args, kwargs)


@pytest.mark.parametrize("block", (32, 256))
def test_hot_index_block_sizes(libraries, block):
    """The same with the GPU's block sizes (runs around 4 * block elements)."""
    prims = KernelPrimitives(_BlockLauncher(libraries, block), chunk=5)
    for name, label, args, kwargs in cases.hot_cases(block, hot=20_000):
        if name != "merge_sorted" or block == 32:
            _run(prims, name, args, kwargs)


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
    for module in (_checks, _numpy_select):  # the kernels' and the numpy twin's cut-over
        monkeypatch.setattr(module, "_index_dtype", lambda n: np.dtype(np.int64))
    x = cases.values(np.random.default_rng(6), dtype, 100)
    for name, arg in (("select_abs_ge", 1.0), ("topk_abs", 17)):
        _run(kernels, name, (x, arg), {})
