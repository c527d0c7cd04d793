"""Tier 3: each primitive on cupy arrays (the kernels on a CUDA device) against its numpy twin.

Same seeded cases as the CPU tier plus larger inputs that use full launch grids; results must be
bit for bit equal. Skipped, with the reason, only when no CUDA device exists (tests/_gpu.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cupycoll import primitives
from cupycoll.primitives import _checks, _numpy_select

from . import _kernel_cases as cases
from ._gpu import no_device_reason


REASON = no_device_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def _to_device(obj: Any) -> Any:
    import cupy

    if isinstance(obj, np.ndarray) and obj.ndim > 0:  # 0-d thresholds stay host scalars
        if obj.flags.c_contiguous:
            return cupy.asarray(obj)
        base = obj.base  # the same view (offset and strides) of a device copy of its base
        assert isinstance(base, np.ndarray) and base.flags.c_contiguous
        offset = obj.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return cupy.ndarray(obj.shape, obj.dtype, cupy.asarray(base).data + offset, obj.strides)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o) for o in obj)
    return obj


def _to_host(obj: Any) -> Any:
    import cupy

    if isinstance(obj, cupy.ndarray):
        return cupy.asnumpy(obj)
    if isinstance(obj, tuple):
        return tuple(_to_host(o) for o in obj)
    return obj


def _run(name: str, args: tuple, kwargs: dict) -> None:
    host_args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
    want = getattr(primitives, name)(*host_args, **kwargs)
    device_args = _to_device(args)
    got = getattr(primitives, name)(*device_args, **kwargs)
    cases.assert_same(_to_host(got), want, name)
    if name == "scatter_reduce":  # in place
        cases.assert_same(_to_host(device_args[0]), host_args[0], "scatter_reduce dense")


def _params(generated) -> list:
    return [pytest.param(name, args, kwargs, id=f"{name}-{label}")
            for name, label, args, kwargs in generated]


def _large_case(name: str, dtype: str) -> tuple:
    """Inputs big enough for full launch grids (built in the test: cheap to collect)."""
    rng = np.random.default_rng(5)
    if name in ("count_abs_ge", "select_abs_ge", "kth_abs", "topk_abs"):
        x = cases.values(rng, dtype, 1 << 20)
        return (x, 1.5) if name.endswith("ge") else (x, 1 << 14)
    idx = rng.integers(0, 1 << 16, 1 << 18)
    val = cases.values(rng, dtype, idx.size)
    return (idx, val) if name == "coo_reduce" else (cases.values(rng, dtype, 1 << 16), idx, val)


@pytest.mark.parametrize("name,args,kwargs", _params(cases.threshold_cases()))
def test_thresholds(name, args, kwargs):
    _run(name, args, kwargs)


@pytest.mark.parametrize("name,args,kwargs", _params(cases.topk_cases()))
def test_topk(name, args, kwargs):
    _run(name, args, kwargs)


@pytest.mark.parametrize("name,args,kwargs", _params(cases.reduce_cases()))
def test_reductions(name, args, kwargs):
    _run(name, args, kwargs)


@pytest.mark.parametrize("name,args,kwargs", _params(cases.dense_cases()))
def test_dense(name, args, kwargs):
    _run(name, args, kwargs)


@pytest.mark.parametrize("name,args,kwargs", _params(cases.hot_cases(256)))
def test_hot_index(name, args, kwargs):
    """A hot index (100,000 duplicates) and runs around the block-fold cut of 256-thread blocks."""
    _run(name, args, kwargs)


@pytest.mark.parametrize("dtype", cases.VALUE_DTYPES)
@pytest.mark.parametrize("name", ["count_abs_ge", "select_abs_ge", "kth_abs", "topk_abs",
                                  "coo_reduce", "scatter_reduce"])
def test_large(name, dtype):
    _run(name, _large_case(name, dtype), {})


@pytest.mark.parametrize("name,args,kwargs", _params(cases.error_cases()))
def test_errors(name, args, kwargs):
    with pytest.raises(Exception) as want:
        getattr(primitives, name)(*args, **kwargs)
    with pytest.raises(type(want.value)) as got:
        getattr(primitives, name)(*_to_device(args), **kwargs)
    assert getattr(got.value, "argument", None) == getattr(want.value, "argument", None)


@pytest.mark.parametrize("dtype", cases.VALUE_DTYPES)
def test_int64_output_indices(dtype, monkeypatch):
    # arrays of 2**31 elements need 8+ GiB: lower the int64 cut-over instead
    for module in (_checks, _numpy_select):  # the kernels' and the numpy twin's cut-over
        monkeypatch.setattr(module, "_index_dtype", lambda n: np.dtype(np.int64))
    x = cases.values(np.random.default_rng(6), dtype, 1000)
    for name, arg in (("select_abs_ge", 1.0), ("topk_abs", 170)):
        _run(name, (x, arg), {})
