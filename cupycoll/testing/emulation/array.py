"""Emulated ``cupy.ndarray`` and the cupy array namespace: numpy underneath, GPU rules on top.

An :class:`ndarray` wraps a numpy view of a block of the emulated device memory pool
(:mod:`.pool`: CuPy's stream-ordered pool, a freed block handed to the next allocation of its
size on its stream at once, with the stream work still pending on it) and that block's
:class:`~.buffers.Buffer` marks. Like cupy: mixing it with numpy arrays raises TypeError, implicit
conversion to numpy raises, reductions return 0-d device arrays, every operation needs its arrays
on the current device (:class:`~.device.DeviceMismatch` otherwise), and reading a value on the
host (``get``, ``int()``, ``bool()``, ``item``, data-dependent sizes such as ``nonzero`` or
boolean masks) is a host synchronization reported to :func:`cupycoll.testing.syncs.host_sync`. Every
array creation function and every new result of an operation is a new allocation on the current
stream, written there (``empty``/``empty_like``/``ndarray(shape)``: uninitialised, poisoned);
a view shares its array's allocation, which is freed when the last array on it dies.
"""

from __future__ import annotations

import functools
import inspect
import operator
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from . import buffers
from . import device as dev
from .arith import cast
from .pool import Allocation, allocate, buffer_at, raw_view

__all__ = ["ndarray", "raw_view", "buffer_at"]

#: functions whose result size depends on the data: cupy reads a count back to the host.
SIZE_SYNCS = frozenset({"nonzero", "flatnonzero", "argwhere", "unique", "extract", "compress",
                        "unique_values", "unique_counts", "unique_inverse", "unique_all",
                        "trim_zeros"})
#: functions that accept host data (host-to-device copies).
FROM_HOST = frozenset({"asarray", "array", "asanyarray"})
#: array methods that write their array.
WRITING_METHODS = frozenset({"fill", "sort", "put", "itemset", "partition", "resize"})
#: functions that write their first argument.
WRITING_FUNCTIONS = frozenset({"copyto", "put", "putmask", "place", "fill_diagonal",
                               "put_along_axis"})
#: arguments (positions from, to) read on the host as integers (sizes, shapes).
HOST_INTS = {"empty": (0, 1), "zeros": (0, 1), "ones": (0, 1), "full": (0, 1),
             "arange": (0, 3), "reshape": (1, None), "resize": (1, None)}

#: functions whose result is uninitialised memory (poisoned, see :mod:`.pool`).
UNINITIALISED = frozenset({"empty", "empty_like"})


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _memory(shape: Any, dtype: Any, order: str = "C", poison: bool = True, strides: Any = None
            ) -> tuple[np.ndarray, buffers.Buffer, Allocation | None]:
    """A new device allocation from the current stream's arena of the pool: (its numpy view,
    its block, its lifetime). Zero bytes take no block (CuPy's null pointer)."""
    like = np.empty(0, dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * like.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype, order), buffers.Buffer(dev.current_device()), None
    owner = allocate(nbytes, dev.current_stream(), poison)
    return np.ndarray(shape, like.dtype, buffer=owner.block.memory, order=order,
                      strides=strides), owner.block, owner


def _device_copy(value: np.ndarray, what: str) -> "ndarray":
    """A new device array holding ``value``, written on the current stream (an allocation
    whose block another stream still has unordered work on raises StreamOrderError here)."""
    order = "F" if value.flags.f_contiguous and not value.flags.c_contiguous else "C"
    a, buf, owner = _memory(value.shape, value.dtype, order, poison=False)
    out = ndarray(_a=a, _buf=buf, _owner=owner)
    buffers.ordered_access([(buf, True)], what)
    a[...] = value
    return out


def _unpickled(value: np.ndarray) -> "ndarray":
    return _device_copy(value, "unpickle")


class _Data:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr, self.device_id = ptr, device_id


class ndarray(NDArrayOperatorsMixin):
    """A device array: a numpy array plus the device buffer it lives in."""

    __slots__ = ("_a", "_buf", "_owner", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape: Any = None, dtype: Any = float, *, _a: Any = None,
                 _buf: buffers.Buffer | None = None, _owner: Allocation | None = None) -> None:
        if _a is None:  # cupy.ndarray(shape, dtype): an uninitialised allocation
            _a, _buf, _owner = _memory(shape, dtype)
        self._a, self._buf, self._owner = _a, _buf, _owner

    # ---------------------------------------------------------------- what it is
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _view(self, self._a.T))

    @property
    def data(self) -> _Data:
        return _Data(_address(self._a) if self._a.size else 0, self._buf.device)

    @property
    def device(self) -> Any:
        from .runtime import Device

        return Device(self._buf.device)

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"emulated cupy {self.get()!r} on device {self._buf.device}"

    def __reduce__(self) -> tuple:
        """Pickled as its host copy (a host synchronization), unpickled onto the current
        device, as CuPy pickles its arrays."""
        return _unpickled, (self.get(),)

    # ---------------------------------------------------------------- host reads (syncs)
    def get(self, stream: Any = None, order: str = "C", out: Any = None,
            blocking: bool = True) -> np.ndarray:
        """Device-to-host copy on the array's device (CuPy switches to it): a host
        synchronization on that device's current stream; ``out`` is filled and returned."""
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if out.dtype != self.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
            if out.shape != self.shape:
                raise ValueError(f"Shape mismatch. Old shape: {out.shape}, new shape: "
                                 f"{self.shape}")
        with _on_device(self):
            host = _call(np.array, "get", (self,), {}, sync="get", host=True)
        if out is None:
            return host
        out[...] = host
        return out

    def _scalar(self, kind: str) -> Any:
        if self.size != 1:
            raise TypeError("only size-1 arrays can be read as a scalar")
        with _on_device(self):
            return _call(lambda a: a.reshape(-1)[0].item(), kind, (self,), {}, sync="scalar",
                         host=True)

    def item(self, *args: Any) -> Any:
        return self._scalar("item") if not args else self[args].item()

    def tolist(self) -> Any:
        return self.get().tolist()

    def __int__(self) -> int:
        return int(self._scalar("int()"))

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError("only integer arrays can be an index")
        return int(self._scalar("index"))

    def __float__(self) -> float:
        return float(self._scalar("float()"))

    def __bool__(self) -> bool:
        return bool(self._scalar("bool()"))

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    # ---------------------------------------------------------------- numpy's protocols
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _call(getattr(ufunc, method), ufunc.__name__, inputs, kwargs)

    def __array_function__(self, func: Any, types_: Any, args: Any, kwargs: Any) -> Any:
        return _call(func, func.__name__, args, kwargs,
                     sync=_size_sync(func.__name__, args, kwargs), writes=_writes(func.__name__))

    def __getitem__(self, key: Any) -> Any:
        return _call(lambda a, k: a[k], "getitem", (self, key), {},
                     sync="boolean mask" if _masked(key) else None)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, np.ndarray):  # a host-to-device copy, allowed like cupy
            value = _from_host(value)

        def store(a: np.ndarray, k: Any, v: Any) -> None:
            a[k] = cast(v, a.dtype) if isinstance(v, np.ndarray) else v
        masked = isinstance(value, ndarray) and value.ndim > 0 and _masked(key)
        _call(store, "setitem", (self, key, value), {}, writes=(0,),
              sync="boolean mask set" if masked else None)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._a, name)  # AttributeError as numpy's
        if not callable(attr):
            return attr
        method = {"argsort": _stable_argsort, "astype": _astype}.get(name) or \
            getattr(np.ndarray, name)
        writes = (0,) if name in WRITING_METHODS else _writes(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return _call(method, name, (self,) + args, kwargs, sync=_size_sync(name),
                         writes=writes)
        return call

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Host-to-device copy of an array of this dtype and shape (CuPy's checks)."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.dtype != self.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        with _on_device(self):
            self[...] = arr


ndarray.__module__ = "cupy"


def _on_device(a: ndarray) -> Any:
    from .runtime import Device

    return Device(a._buf.device)


def _size_sync(name: str, args: Any = (), kwargs: Any = ()) -> str | None:
    if name == "where" and len(args) + len(kwargs) == 1:  # one argument: nonzero
        return "where (data-dependent size)"
    return f"{name} (data-dependent size)" if name in SIZE_SYNCS else None


@functools.lru_cache(maxsize=None)
def _writes(name: str) -> tuple[int, ...]:
    """Positions of the arguments that numpy's function ``name`` writes: the first of the
    in-place functions, else a positional ``out`` (as in the method of that name)."""
    if name in WRITING_FUNCTIONS:
        return (0,)
    try:
        params = list(inspect.signature(getattr(np, name)).parameters)
    except (AttributeError, TypeError, ValueError):
        return ()
    return (params.index("out"),) if "out" in params else ()


def _host_int(v: Any) -> Any:
    """A 0-d device integer where numpy wants a host int: read back (a host sync)."""
    if isinstance(v, ndarray):
        return operator.index(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_host_int(x) for x in v)
    return v


def _masked(key: Any) -> bool:
    return any(getattr(k, "dtype", None) == np.bool_ for k in
               (key if isinstance(key, tuple) else (key,)))


def _view(of: ndarray, a: np.ndarray) -> ndarray:
    return ndarray(_a=a, _buf=of._buf, _owner=of._owner)


def _from_host(value: Any) -> ndarray:
    return _device_copy(np.asarray(value), "host-to-device copy")


def _call(fn: Any, name: str, args: Any, kwargs: dict, sync: str | None = None,
          writes: tuple[int, ...] = (), host: bool = False) -> Any:
    """Run ``fn`` on the numpy arrays behind the device arrays in its arguments, in order."""
    if name in HOST_INTS:
        start, stop = HOST_INTS[name]
        args = tuple(_host_int(a) if start <= i < (len(args) if stop is None else stop)
                     else a for i, a in enumerate(args))
    found: list[tuple[ndarray, bool]] = []
    raw_args = tuple(_unwrap(a, found, i in writes, name) for i, a in enumerate(args))
    raw_kwargs = {k: _unwrap(v, found, k == "out", name) for k, v in kwargs.items()}
    _check_devices(found, name)
    access = {}
    for arr, writes_it in found:
        access[id(arr._buf)] = (arr._buf, access.get(id(arr._buf), (None, False))[1] or writes_it)
    buffers.ordered_access(list(access.values()), name)
    if sync is not None:
        dev.host_sync(sync)
    with np.errstate(all="ignore"):  # CUDA neither warns nor raises on overflow or NaN
        result = fn(*raw_args, **raw_kwargs)
    if host:  # a blocking read: the host has waited for the current stream
        dev.waited(dev.current_stream())
    return result if host else _wrap(result, found, name)


def _check_devices(found: list[tuple[ndarray, bool]], name: str) -> None:
    device = dev.current_device()
    for arr, _ in found:
        if arr._buf.device != device:
            raise dev.DeviceMismatch(
                f"{name}: an array on device {arr._buf.device} used while device {device} is "
                "current (cupy raises: the array's device differs from the current device)")


def _unwrap(x: Any, found: list, writes: bool, name: str) -> Any:
    if isinstance(x, ndarray):
        found.append((x, writes))
        return x._a
    if isinstance(x, np.ndarray) and x.ndim > 0 and name not in FROM_HOST \
            and name not in ("getitem", "setitem"):
        raise TypeError(f"Unsupported type {type(x)} in emulated cupy.{name} (a host numpy "
                        "array mixed with device arrays)")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, found, writes, name) for v in x)
    if isinstance(x, slice):  # a device bound is read on the host, as CuPy's __index__
        return slice(*(_host_int(v) for v in (x.start, x.stop, x.step)))
    return x


def _wrap(result: Any, found: list, name: str) -> Any:
    """Device arrays for ``fn``'s results: an input (or a view of one) as such, anything new
    copied into a new allocation (as a kernel writing it on the current stream)."""
    if isinstance(result, np.generic):
        result = np.asarray(result)
    if isinstance(result, np.ndarray):
        for arr, _ in found:
            if arr._a is result:
                return arr
        root = _root(result)
        for arr, _ in found:
            if _root(arr._a) is root:
                return _view(arr, result)
        if name in UNINITIALISED:  # its layout kept (order='F', empty_like's 'K')
            a, buf, owner = _memory(result.shape, result.dtype, strides=result.strides)
            return ndarray(_a=a, _buf=buf, _owner=owner)
        return _device_copy(result, name)
    if isinstance(result, (list, tuple)):
        return type(result)(_wrap(r, found, name) for r in result)
    if isinstance(result, (np.random.Generator, np.random.RandomState)):
        return _Submodule(result)  # cupy.random's generators draw device arrays
    return result


def _astype(a: np.ndarray, dtype: Any, order: str = "K", casting: str = "unsafe",
            subok: bool = True, copy: bool = True) -> np.ndarray:
    """``astype`` as CUDA converts (float to integer saturates: :func:`.arith.cast`), whatever
    the other arguments; numpy's own where it refuses the cast or returns ``a`` itself."""
    if casting != "unsafe" or (not copy and np.dtype(dtype) == a.dtype):
        return a.astype(dtype, order=order, casting=casting, subok=subok, copy=copy)
    return cast(a, dtype, order)


def _stable_argsort(a: np.ndarray, axis: int = -1, kind: Any = None) -> np.ndarray:
    """CuPy's argsort is stable whatever ``kind`` says (a radix sort); numpy's default is not."""
    return np.argsort(a, axis=axis, kind="stable")


def _creator(fn: Any, name: str, writes: tuple[int, ...] | None = None) -> Any:
    def create(*args: Any, **kwargs: Any) -> Any:
        return _call(fn, name, args, kwargs, sync=_size_sync(name, args, kwargs),
                     writes=writes)
    writes = _writes(name) if writes is None else writes
    create.__name__ = name
    return create


class _Submodule:
    """A numpy module (or generator) whose callables return device arrays."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        return _creator(attr, name) if callable(attr) and not isinstance(attr, type) else attr
