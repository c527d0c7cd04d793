"""Emulated ``cupy.cuda`` and ``cupy.cuda.runtime``: devices, streams and events by CuPy's names."""

from __future__ import annotations

import ctypes
import types
import weakref
from typing import Any

import numpy as np

from . import buffers
from . import device as dev

__all__ = ["Device", "Stream", "Event", "CUDARuntimeError", "runtime_module", "cuda_module"]


class CUDARuntimeError(RuntimeError):
    """Raised like cupy's for a bad device ordinal and other runtime failures."""

    def __init__(self, status: int, message: str = "") -> None:
        self.status = status
        super().__init__(message or f"cudaError {status}")


class Device:
    """``cupy.cuda.Device``: ``use()`` makes it current for the calling host thread only."""

    def __init__(self, device: Any = None) -> None:
        self.id = dev.current_device() if device is None else int(device)

    def use(self) -> None:
        _set_device(self.id)

    def __enter__(self) -> "Device":
        dev._stack("devices_entered").append(dev.current_device())  # per thread, as CuPy's
        _set_device(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        _set_device(dev._stack("devices_entered").pop())

    def synchronize(self) -> None:
        with self:
            dev.synchronize_device()

    compute_capability = "80"  # what kernels are compiled for is checked by the NVRTC tests

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id} (emulated)>"


def _set_device(device: int) -> None:
    try:
        dev.set_device(device)
    except ValueError as exc:
        raise CUDARuntimeError(101, f"cudaErrorInvalidDevice: {exc}") from None


class Stream(dev.Stream):
    """``cupy.cuda.Stream``: a new stream on the current device."""

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False):
        super().__init__(dev.current_device(), blocking=not non_blocking)


class Event(dev.Event):
    """``cupy.cuda.Event``."""


def elapsed_ms(start: dev.Event, end: dev.Event) -> float:
    """``cudaEventElapsedTime``: milliseconds between two recorded, completed timing events
    (the times their streams reached them); no host wait."""
    for event in (start, end):
        if not event.timing:
            raise dev.EmulationError("cudaEventElapsedTime of an event created with "
                                 "disable_timing=True (cudaErrorInvalidResourceHandle)")
        if event.task is None or not event.task.finished.is_set():
            raise dev.EmulationError("cudaEventElapsedTime of an event that has not completed "
                                 "(cudaErrorNotReady)")
    return (end.task.ended - start.task.ended) * 1e3


def get_current_stream(device_id: int | None = None) -> dev.Stream:
    return dev.current_stream()


def memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
    """``cudaMemcpyAsync`` device-to-host: queued on ``stream`` behind its work, ordered like a
    kernel reading the source allocation (which must be live device memory) and writing the
    destination, which must be pinned host memory (``cupyx.empty_pinned``) that stays allocated
    until a host thread knows the copy finished (see :func:`empty_pinned`)."""
    if kind != MEMCPY_DEVICE_TO_HOST:
        raise dev.EmulationError(f"cudaMemcpyAsync kind {kind}: only device-to-host is emulated")
    from .pool import buffer_at

    found = buffer_at(int(src), int(nbytes))
    if found is None:
        raise CUDARuntimeError(1, f"cudaErrorInvalidValue: cudaMemcpyAsync from {src:#x} "
                                  f"({nbytes} bytes) is not live device memory")
    here = dev.lookup_stream(stream)
    if here.device != dev.current_device():
        raise dev.DeviceMismatch(f"cudaMemcpyAsync on {here} while device "
                                 f"{dev.current_device()} is current")
    pinned = _pinned_at(int(dst), int(nbytes))
    source = found[1]  # the pool's block: never given back to numpy's heap while the copy
    # is unfinished (its mark below); a reuse on another stream meets that mark

    def run() -> None:
        for other, seq in waits:
            other.drain(seq)
        ctypes.memmove(int(dst), int(src), int(nbytes))
        del pinned[:]  # the emulation's hold on both memories ends with the copy

    with dev.LOCK:
        waits = buffers.ordered_access([(found[0], False)], "cudaMemcpyAsync", here=here,
                                   task_seq=here.seq + 1)
        task = here.enqueue("memcpy device to host", run)
        pinned[1].append((here, task.seq))
        pinned.append(source)


MEMCPY_DEVICE_TO_HOST = 2
#: pinned host allocations: address -> [the memory (owned here), the copies queued into it]
_PINNED: dict[int, list] = {}
#: pinned memory freed while a copy into it was queued and not known finished (check_logs)
FREED_EARLY: list[str] = []


def empty_pinned(shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
    """``cupyx.empty_pinned``: host memory that device-to-host copies may target.

    The caller gets a view; the memory itself is the emulation's until no queued copy writes it,
    so a copy never lands in freed host memory. Freeing the view while a copy into it is queued
    and no host thread has learned it finished is the bug (CuPy's pinned pool hands the block to
    the next allocation and the copy overwrites that): recorded, and raised by ``check_logs()``.
    """
    memory = np.empty(shape, dtype, order)
    view = memory.view()
    address = int(memory.ctypes.data)
    entry = _PINNED[address] = [memory, []]
    weakref.finalize(view, _freed, address, entry)
    return view


def _pinned_at(dst: int, nbytes: int) -> list:
    """[memory, copies] of the live pinned allocation holding ``[dst, dst + nbytes)``: a new
    list that the queued copy holds (memory first), while the allocation's copies are shared."""
    for address, (memory, copies) in list(_PINNED.items()):
        if address <= dst and dst + nbytes <= address + memory.nbytes:
            return [memory, copies]
    raise dev.EmulationError(f"cudaMemcpyAsync to {dst:#x} ({nbytes} bytes): not inside live "
                             "pinned host memory (cupyx.empty_pinned); a pageable destination "
                             "makes the copy synchronous, a freed one is overwritten later")


def _freed(address: int, entry: list) -> None:
    if _PINNED.get(address) is entry:
        del _PINNED[address]
    early = [(stream, seq) for stream, seq in entry[1] if not dev.known_anywhere(stream, seq)]
    if early:
        FREED_EARLY.append(
            f"pinned host memory {address:#x} ({entry[0].nbytes} bytes) was freed while the "
            f"device-to-host copy #{early[0][1]} on {early[0][0]} into it was queued and no host "
            "thread knew it finished: the copy writes it later (CuPy's pinned pool may have "
            "handed it to the next allocation by then); keep it until the copy's event is done")


def cupyx_module() -> types.ModuleType:
    """``cupyx`` as far as cupycoll uses it: pinned host memory."""
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = empty_pinned
    return cupyx


def runtime_module() -> types.ModuleType:
    rt = types.ModuleType("cupy.cuda.runtime")
    rt.CUDARuntimeError = CUDARuntimeError
    rt.cudaDevAttrMultiProcessorCount = 16
    rt.getDeviceCount = dev.device_count
    rt.getDevice = dev.current_device
    rt.setDevice = _set_device
    rt.deviceSynchronize = dev.synchronize_device
    rt.deviceGetAttribute = lambda attr, device: 2  # two SMs: small grids, many wraps
    rt.is_hip = False
    rt.memcpyAsync = memcpy_async
    rt.memcpyDeviceToHost = MEMCPY_DEVICE_TO_HOST
    rt.runtimeGetVersion = rt.driverGetVersion = lambda: 12080
    return rt


def cuda_module(nccl: types.ModuleType) -> types.ModuleType:
    cuda = types.ModuleType("cupy.cuda")
    cuda.Device = Device
    cuda.Stream = Stream
    cuda.Event = Event
    cuda.get_current_stream = get_current_stream
    cuda.get_elapsed_time = elapsed_ms
    cuda.runtime = runtime_module()
    cuda.nccl = nccl
    cuda.is_available = lambda: True
    return cuda
