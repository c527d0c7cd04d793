"""A numpy-backed stand-in for CuPy that reports every host synchronisation CuPy would make.

:data:`xp` behaves like the ``cupy`` module on host memory: its arrays (:class:`DeviceArray`, a
numpy subclass) stay "on the device" through every operation, scalars and reductions come back
as 0-d device arrays, and each operation that blocks the host on real CuPy reports to
:func:`cupycoll.testing.syncs.host_sync`:

======================  =====================================================================
kind                    operations
======================  =====================================================================
``read``                ``int()``, ``float()``, ``bool()``, ``operator.index()``, ``.item()``,
                        ``.tolist()``, ``.get()``, ``asnumpy`` (a device-to-host copy or a
                        scalar read)
``mask``                indexing with a boolean mask (the result's size is on the device), and
                        assigning an array through one
``nonzero``             ``nonzero``, ``flatnonzero``, ``argwhere``, ``unique``, ``compress``,
                        ``extract``, one-argument ``where`` (data-dependent sizes; the
                        methods too), device sizes of ``empty``/``zeros``/``arange`` (read)
``wait`` / ``fetch``    reported by :class:`SyncCountingCommunicator` (below)
======================  =====================================================================

Host-to-device copies (``asarray`` of host data) are no sync (CUDA stages them). Primitives on
these arrays run :class:`~cupycoll.primitives._cupy.KernelPrimitives`, the GPU code, with the
kernels compiled for the CPU (:mod:`cupycoll.testing.kernel_shim`), found through the namespace's
``cupycoll_primitives`` attribute.

:class:`SyncCountingCommunicator` is the MPI backend over this namespace, booked like the NCCL
backend: each ``Work.wait()`` is one sync (an event synchronisation), ``fetch`` one, and the
host staging MPI needs is not counted (NCCL needs none).
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

import numpy as np

from ..comm._base import Communicator
from ..comm._work import Work
from ..comm.mpi import MPICommunicator
from .syncs import host_sync, uncounted

__all__ = ["DeviceArray", "xp", "SyncCountingCommunicator"]

_DATA_DEPENDENT = frozenset({"nonzero", "flatnonzero", "argwhere", "unique", "compress",
                             "extract", "unique_values", "unique_counts", "unique_inverse",
                             "unique_all", "trim_zeros"})


#: functions whose leading arguments (how many) are sizes read on the host
_SIZES = {"empty": 1, "zeros": 1, "ones": 1, "full": 1, "arange": 3}


def _host_ints(args: Any) -> Any:
    """Device integers read on the host where a function wants sizes (one sync each)."""
    if isinstance(args, DeviceArray):
        return int(args)
    if isinstance(args, (list, tuple)):
        return type(args)(_host_ints(a) for a in args)
    return args


def _is_mask(key: Any) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, np.ndarray) and k.dtype == bool and k.ndim > 0 for k in keys)


def _device(obj: Any) -> Any:
    """Results of numpy as device arrays: arrays viewed, numpy scalars made 0-d."""
    if isinstance(obj, DeviceArray):
        return obj
    if isinstance(obj, np.ndarray):
        return obj.view(DeviceArray)
    if isinstance(obj, np.generic):
        return np.asarray(obj).view(DeviceArray)
    if isinstance(obj, tuple):
        return tuple(_device(o) for o in obj)
    if isinstance(obj, list):
        return [_device(o) for o in obj]
    return obj


class DeviceArray(np.ndarray):
    """An array "on the device": host reads report a sync; scalars stay 0-d device arrays."""

    def __array_wrap__(self, arr: Any, context: Any = None, return_scalar: bool = False) -> Any:
        return np.ndarray.__array_wrap__(self, arr, context, False)  # cupy: 0-d, never a scalar

    def __array_function__(self, func: Callable, types_: Any, args: Any, kwargs: Any) -> Any:
        if func.__name__ in _DATA_DEPENDENT:  # np.<fn>(device array) dispatches like cupy's
            host_sync("nonzero")
        base = tuple(t for t in types_ if not issubclass(t, DeviceArray)) or (np.ndarray,)
        with uncounted():  # one cupy function is one sync at most, whatever numpy does inside
            return _device(super().__array_function__(func, base, args, kwargs))

    def __getitem__(self, key: Any) -> Any:
        if _is_mask(key):
            host_sync("mask")
        return _device(super().__getitem__(key))

    def __setitem__(self, key: Any, value: Any) -> None:
        if _is_mask(key) and isinstance(value, np.ndarray) and value.ndim > 0:
            host_sync("mask")
        super().__setitem__(key, value)

    def nonzero(self) -> Any:
        host_sync("nonzero")
        return _device(self.view(np.ndarray).nonzero())

    def compress(self, condition: Any, axis: Any = None, out: Any = None) -> Any:
        host_sync("nonzero")
        return _device(self.view(np.ndarray).compress(condition, axis, out))

    def argsort(self, axis: int = -1, kind: Any = None, order: Any = None) -> Any:
        return xp.argsort(self.view(np.ndarray), axis)  # stable, like CuPy's (a plain view:
        # numpy 1.x's np.argsort calls the array's own argsort, this one)

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):  # a CUDA cast neither warns nor raises
            return super().astype(*args, **kwargs)

    def __iter__(self) -> Any:
        return (self[i] for i in range(self.shape[0]))

    def _read(self) -> np.ndarray:
        host_sync("read")
        return self.view(np.ndarray)

    def __bool__(self) -> bool:
        return bool(self._read())

    def __int__(self) -> int:
        return int(self._read())

    def __float__(self) -> float:
        return float(self._read())

    def __complex__(self) -> complex:
        return complex(self._read())

    def __index__(self) -> int:
        return self._read().__index__()

    def item(self, *args: Any) -> Any:
        return self._read().item(*args)

    def tolist(self) -> Any:
        return self._read().tolist()

    def get(self, stream: Any = None, order: str = "C", out: Any = None,
            blocking: bool = True) -> np.ndarray:
        """Device-to-host copy (one sync)."""
        host = np.array(self._read(), order=order)
        if out is not None:
            out[...] = host
            return out
        return host

    def __array_namespace__(self, api_version: Any = None) -> Any:
        return xp

    @property
    def __cupycoll_namespace__(self) -> Any:
        return xp


class _Namespace(types.SimpleNamespace):
    """The ``cupy``-like module: numpy's functions returning :class:`DeviceArray`."""

    ndarray = DeviceArray

    def __getattr__(self, name: str) -> Any:
        attr = getattr(np, name)
        if isinstance(attr, np.ufunc) or not callable(attr) or isinstance(attr, type):
            return attr  # ufuncs keep DeviceArray inputs on the device; dtypes, constants
        wrapped = self._wrap(name, attr)
        setattr(self, name, wrapped)
        return wrapped

    @staticmethod
    def _wrap(name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if name in _DATA_DEPENDENT or (name == "where" and len(args) + len(kwargs) == 1):
                host_sync("nonzero")
            if name in _SIZES:
                args = _host_ints(args[:_SIZES[name]]) + args[_SIZES[name]:]
            with np.errstate(all="ignore"), uncounted():  # CUDA does not warn; one sync at most
                return _device(fn(*args, **kwargs))
        return call

    def asarray(self, a: Any, dtype: Any = None, order: Any = None) -> DeviceArray:
        """Host-to-device copy (no sync) or, for a device array, itself."""
        if isinstance(a, DeviceArray) and (dtype is None or np.dtype(dtype) == a.dtype):
            return a
        return np.array(a, dtype=dtype, order=order or "K").view(DeviceArray)

    array = asarray

    def argsort(self, a: Any, axis: int = -1, kind: Any = None) -> DeviceArray:
        """Stable, like CuPy's (which ignores ``kind``)."""
        return _device(np.argsort(a, axis=axis, kind="stable"))

    def asnumpy(self, a: Any) -> np.ndarray:
        return a.get() if isinstance(a, DeviceArray) else np.asarray(a)


#: the namespace (``cupy`` stand-in); ``xp.cupycoll_primitives`` runs the kernels on the CPU.
xp = _Namespace()


def _primitives() -> Any:
    from ..primitives._cupy import KernelPrimitives
    from . import kernel_shim

    with uncounted():
        libraries = kernel_shim.kernel_libraries()
    return KernelPrimitives(kernel_shim.ShimLauncher(libraries, xp))


class _LazyPrimitives:
    """Build the CPU kernels on first use (g++, cached on disk by source hash)."""

    _impl: Any = None

    def __getattr__(self, name: str) -> Any:
        if _LazyPrimitives._impl is None:
            _LazyPrimitives._impl = _primitives()
        return getattr(_LazyPrimitives._impl, name)


xp.cupycoll_primitives = _LazyPrimitives()


def _counted(work: Work) -> Work:
    """``work`` whose ``wait()`` reports one sync (NCCL: an event synchronisation)."""
    def wait() -> None:
        host_sync("wait")
        with uncounted():
            work.wait()
    return Work(wait, work.is_completed, lambda: work.result())


class SyncCountingCommunicator(MPICommunicator):
    """The MPI backend on :data:`xp` arrays, booked as NCCL would be: a wait or fetch is one sync,
    ``stream_order`` none, host staging none. Like NCCL it has no native allgatherv, so the
    algorithms take the data paths they take on NCCL."""

    native_allgatherv = False

    def __init__(self, mpi_comm: Any = None, *, timeout: float | None = None) -> None:
        super().__init__(mpi_comm, timeout=timeout, xp=xp)

    def dup(self) -> "SyncCountingCommunicator":
        return SyncCountingCommunicator(self.mpi_comm, timeout=self.timeout)  # (a duplicate)

    def run(self, verb: str, *args: Any, op_name: str | None = None) -> None:
        """Post and wait, as NCCL must (one sync), not MPI's blocking call."""
        Communicator.run(self, verb, *args, op_name=op_name)

    def run_fetch(self, verb: str, *args: Any, result: Any, op_name: str) -> np.ndarray:
        """Post, then one fetch (one sync), as on NCCL."""
        return Communicator.run_fetch(self, verb, *args, result=result, op_name=op_name)

    def fetch(self, work: Work, array: Any) -> np.ndarray:
        host_sync("fetch")
        with uncounted():
            return super().fetch(work, array)

    def stream_order(self, work: Work) -> None:
        with uncounted():
            super().stream_order(work)

    def barrier(self) -> None:
        host_sync("wait")
        with uncounted():
            super().barrier()


def _quiet(verb: Callable) -> Callable:
    @functools.wraps(verb)
    def call(self: Any, *args: Any, **kwargs: Any) -> Work:
        with uncounted():
            return _counted(verb(self, *args, **kwargs))
    return call


for _verb in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "exchange",
              "_allgatherv_into"):
    setattr(SyncCountingCommunicator, _verb, _quiet(getattr(MPICommunicator, _verb)))
