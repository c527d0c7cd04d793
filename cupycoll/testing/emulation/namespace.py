"""The emulated ``cupy`` module's names (:func:`namespace`): numpy's functions, ufuncs and
submodules made device-side over :class:`.array.ndarray`, and CuPy's own creation functions."""

from __future__ import annotations

import types
from typing import Any

import numpy as np

from .arith import CANONICAL, canonical_nans
from .arith import copyto as arith_copyto
from .array import _call, _creator, _device_copy, _stable_argsort, _Submodule, ndarray

__all__ = ["namespace"]

#: ufunc methods' positional ``out`` (``at`` writes its first argument).
UFUNC_METHOD_OUT = {"at": 0, "reduce": 3, "accumulate": 3, "reduceat": 4}


def asarray(a: Any, dtype: Any = None, order: Any = None, *, blocking: bool = False) -> ndarray:
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    return _device_copy(np.asarray(a, dtype=dtype, order=order), "host-to-device copy")


def array(a: Any, dtype: Any = None, copy: bool = True, order: str = "K", ndmin: int = 0,
          **kwargs: Any) -> ndarray:
    if isinstance(a, ndarray):  # a device copy: CUDA's conversion (ndarray.astype)
        return a.astype(a.dtype if dtype is None else dtype, order=order)
    return _device_copy(np.array(a, dtype=dtype, order=order, ndmin=ndmin),
                        "host-to-device copy")


def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None,
            blocking: bool = True) -> np.ndarray:
    return a.get() if isinstance(a, ndarray) else np.asarray(a, order=order)


def get_array_module(*args: Any) -> Any:
    import sys

    return sys.modules["cupy"] if any(isinstance(a, ndarray) for a in args) else np


def from_dlpack(x: Any) -> ndarray:
    return asarray(np.from_dlpack(x))


def _shares_memory(a: Any, b: Any, max_work: Any = None) -> bool:
    """CuPy's: the exact search (``None``, ``"MAY_SHARE_EXACT"``) or the bounds check
    (``"MAY_SHARE_BOUNDS"``); an integer bound raises NotImplementedError (CuPy 14
    ``_misc/memory_ranges.py``), where numpy searches within it."""
    if max_work == "MAY_SHARE_BOUNDS":
        return bool(np.may_share_memory(a, b))
    if max_work not in (None, "MAY_SHARE_EXACT"):
        raise NotImplementedError("Not supported for integer `max_work`.")
    return bool(np.shares_memory(a, b))


_SPECIAL = {"ndarray": ndarray, "asarray": asarray, "array": array, "asnumpy": asnumpy,
            "get_array_module": get_array_module, "from_dlpack": from_dlpack,
            "shares_memory": _creator(_shares_memory, "shares_memory"),
            "ascontiguousarray": _creator(np.ascontiguousarray, "ascontiguousarray"),
            "argsort": _creator(_stable_argsort, "argsort"),
            "copyto": _creator(arith_copyto, "copyto")}


def namespace(name: str) -> Any:
    """The attribute ``name`` of the emulated ``cupy`` module (numpy's, made device-side)."""
    if name in _SPECIAL:
        return _SPECIAL[name]
    attr = getattr(np, name)
    if isinstance(attr, np.ufunc):
        return _Ufunc(attr)
    if isinstance(attr, types.ModuleType):  # cupy.linalg, cupy.random, ...
        return _Submodule(attr)
    if callable(attr) and not isinstance(attr, type):
        return _creator(attr, name)
    return attr  # dtypes, scalar types, constants


class _Ufunc:
    """A numpy ufunc that works on (and returns) device arrays."""

    def __init__(self, ufunc: np.ufunc) -> None:
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.__name__

        def fn(*a: Any, **k: Any) -> Any:  # with CuPy's kernels' NaN bits
            return canonical_nans(name, self._ufunc(*a, **k), k.get("where", True))
        return _call(fn if name in CANONICAL else self._ufunc, name, args, kwargs,
                     writes=tuple(range(self._ufunc.nin, len(args))))  # positional out

    def __getattr__(self, method: str) -> Any:
        out = UFUNC_METHOD_OUT.get(method)
        return _creator(getattr(self._ufunc, method), f"{self.__name__}.{method}",
                        writes=() if out is None else (out,))
