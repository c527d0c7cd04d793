"""The streams an NCCL communicator's results are read on, which its stream must follow.

A result a front door makes is allocated on the communicator's stream (it runs the whole call
there), so when the caller frees it the block goes back to that stream's part of CuPy's pool,
and CuPy has no ``recordStream``: the next allocation there gets it at once, whatever the
stream the caller read it on still has queued. So the communicator keeps the streams it
handed results to (the caller's stream when a call returns, a stream a ``Work.wait()`` ran on)
and every later call orders its stream after each of them as well as after the caller's
current one; callbacks and finalizers that read a result in another thread are ordered before
the communicator's stream when they return.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

__all__ = ["Readers"]


class Readers:
    """The streams of one device that results of ``stream``'s communicator were handed to,
    oldest first; past :attr:`LIMIT`, the oldest is ordered before ``stream`` once and
    forgotten."""

    __slots__ = ("_device", "_stream", "_streams", "_lock")

    #: streams kept; a caller that reads results on more streams than this must order the
    #: ones it stopped calling from itself, as for any CuPy array
    LIMIT = 8

    def __init__(self, device: Any, stream: Any) -> None:
        self._device, self._stream = device, stream
        self._streams: tuple[tuple[int, Any], ...] = ()  # (cudaStream_t, stream)
        self._lock = threading.Lock()

    def add(self, reader: Any) -> None:
        """``reader`` (a stream of the communicator's device) got a result."""
        if reader is self._stream:
            return
        handle = self._device.handle(reader)
        if any(known == handle for known, _ in self._streams):
            return
        with self._lock:
            streams = self._streams + ((handle, reader),)
            if len(streams) > self.LIMIT:
                self._follow(streams[0][1])
                streams = streams[1:]
            self._streams = streams

    def order(self, current: Any) -> None:
        """Make the communicator's stream wait for the work queued so far on ``current`` (the
        caller's stream) and on every stream a result was handed to."""
        self._follow(current)
        handle = self._device.handle(current)
        for known, reader in self._streams:
            if known != handle:
                self._follow(reader)

    def _follow(self, other: Any) -> None:
        device = self._device
        device.wait_event(self._stream, device.record(other))

    @contextlib.contextmanager
    def handing(self, device_id: int) -> Iterator[None]:
        """``device_id`` current while a Work hands its result over in this thread (the
        finalizer, ``completion_fn``, a future's callbacks); on exit the communicator's stream
        follows the thread's current stream, so a result they read and drop is not reused
        under their reads."""
        with self._device.on_device(device_id):
            try:
                yield
            finally:
                current = self._device.current()
                if current is not self._stream:
                    self._follow(current)
