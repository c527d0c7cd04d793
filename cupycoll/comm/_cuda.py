"""How the NCCL backend touches CUDA: pointers, the current stream and events
(:class:`CudaDevice`), a side stream (:class:`SideStream`) and the overlap that runs on it."""

from __future__ import annotations

import contextlib
import types
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from ._work import Overlap, Work

if TYPE_CHECKING:
    from .nccl import NCCLCommunicator

__all__ = ["CudaDevice", "SideStream"]


class CudaDevice:
    """How the backend touches CUDA: array pointers, streams, events, the current device.

    Kept apart from the communicator so its logic (booking, grouping, staging, waiting) can run
    on the host with a stand-in that has the same members.
    """

    def __init__(self, cupy: types.ModuleType) -> None:
        self._cupy = cupy
        self.errors: tuple[type[BaseException], ...] = (cupy.cuda.runtime.CUDARuntimeError,)

    def pointer(self, a: Any) -> int:
        """Device address of the first element of ``a``."""
        return int(a.data.ptr)

    def current(self) -> Any:
        """The calling thread's current CuPy stream on the current device."""
        return self._cupy.cuda.get_current_stream()

    def current_device(self) -> int:
        """The calling thread's current CUDA device."""
        return self._cupy.cuda.runtime.getDevice()

    def new_stream(self) -> Any:
        """A non-blocking stream of the current device: it never waits for the legacy NULL
        stream, nor the NULL stream for it."""
        return self._cupy.cuda.Stream(non_blocking=True)

    @staticmethod
    def handle(stream: Any) -> int:
        """The ``cudaStream_t`` of ``stream`` (what NCCL calls take)."""
        return int(stream.ptr)

    def record(self, stream: Any = None, timing: bool = False) -> Any:
        """An event recorded on ``stream`` (default: the current one); it has ``done`` and
        ``synchronize()``, and with ``timing`` it can be timed (:meth:`elapsed`)."""
        event = self._cupy.cuda.Event(disable_timing=not timing)
        event.record(stream)
        return event

    def elapsed(self, start: Any, end: Any) -> float:
        """Seconds between two timing events, as their stream reached them; the host waits for
        ``end`` only if it has not run yet."""
        end.synchronize()
        return self._cupy.cuda.get_elapsed_time(start, end) / 1e3

    @staticmethod
    def wait_event(stream: Any, event: Any) -> None:
        """Work queued on ``stream`` from now on runs after ``event``'s (no host wait)."""
        stream.wait_event(event)

    @staticmethod
    def using(stream: Any) -> Any:
        """A context in which ``stream`` is the calling thread's current stream."""
        return stream

    def activate(self, device_id: int) -> None:
        """Make ``device_id`` the calling thread's current device (it is per host thread)."""
        self._cupy.cuda.Device(device_id).use()

    def on_device(self, device_id: int) -> Any:
        """A context in which ``device_id`` is the calling thread's current device (the one
        before it is current again on exit)."""
        return self._cupy.cuda.Device(device_id)

    def side_stream(self) -> "SideStream":
        """A non-blocking stream of this device for work that overlaps the current stream's."""
        return SideStream(self._cupy)

    def download(self, a: Any) -> tuple[np.ndarray, Any]:
        """Queue a copy of ``a`` into pinned host memory on the current stream; return the host
        array (valid once the event is done) and an event recorded behind the copy."""
        import cupyx

        if not a.flags.c_contiguous:  # results are contiguous: no device work queued here
            a = self._cupy.ascontiguousarray(a)
        host = cupyx.empty_pinned(a.shape, a.dtype)
        runtime = self._cupy.cuda.runtime
        runtime.memcpyAsync(host.ctypes.data, a.data.ptr, a.nbytes,
                            runtime.memcpyDeviceToHost, self.handle(self.current()))
        return host, self.record()


class SideStream:
    """A second CUDA stream: ``after(events)`` makes it wait for the events and current for the
    block; ``join()`` makes the current stream wait for everything queued on it."""

    def __init__(self, cupy: types.ModuleType) -> None:
        self._cupy = cupy
        self._stream = cupy.cuda.Stream(non_blocking=True)

    @contextlib.contextmanager
    def after(self, events: Sequence[Any]) -> Iterator[None]:
        for event in events:
            self._stream.wait_event(event)
        with self._stream:
            yield

    def join(self) -> None:
        self._cupy.cuda.get_current_stream().wait_event(self._stream.record())


class _SideStreamOverlap(Overlap):
    """Consumers on the communicator's side stream, each after its transfers' events; what
    they read is let go only once ``join()`` has ordered the side stream before the caller's."""

    def __init__(self, comm: "NCCLCommunicator", side: Any) -> None:
        super().__init__(comm)
        self._side = side

    def _run(self, work: Work | None, fn: Callable[[], None]) -> None:
        with self._side.after(getattr(work, "events", [])):
            fn()

    def join(self) -> None:
        self._side.join()
        super().join()
