"""Emulated CUDA devices, streams and events: the ordering rules a GPU enforces, on the host.

* Every host thread has its own current device (0 until it calls ``use``/``setDevice``), as in
  the CUDA runtime, and per device a current stream (the device's legacy null stream by default).
* Every device allocation is a :class:`~.buffers.Buffer` that knows its device (a block of the
  stream-ordered pool of :mod:`.pool`, which keeps a freed block's marks for its next
  allocation). Array operations run at once on the calling thread, as if the stream had drained
  up to them: they first wait for the work already enqueued on the current stream (stream
  order).
* NCCL operations are :class:`Task` s on a stream, run later by that stream's own thread, in
  stream order. A task that will write a buffer poisons it when enqueued.
* Ordering is tracked per buffer (last writer, readers since): touching a buffer that a task on
  another stream writes (or reads, for a write) is a :class:`StreamOrderError` unless that task
  is known complete (event/stream synchronize, ``event.done``) or the current stream waited on an
  event recorded after it. So a missing wait fails deterministically, however fast the task ran;
  marks left by a block's previous allocation (:data:`~.buffers.REUSED`) say so in the error.
  The marks and the check are :mod:`.buffers`'.
* Every operation that blocks the host until the device catches up (device-to-host copy,
  scalar read, data-dependent size, event or stream synchronize) is reported to
  :func:`cupycoll.testing.syncs.host_sync`, the one hook every counting tool reads
  (:func:`cupycoll.testing.syncs.count_host_syncs`).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Callable

from .. import syncs

__all__ = ["EmulationError", "StreamOrderError", "DeviceMismatch", "Stream", "Event", "Task",
           "host_sync", "current_device", "set_device", "current_stream", "set_stream",
           "device_count", "node_of", "null_stream", "lookup_stream", "synchronize_device",
           "known_anywhere", "known", "LOCK", "implicit", "follow"]

#: guards the bookkeeping (never held while blocking).
LOCK = threading.RLock()
_DEVICES = {"count": 2}
_tls = threading.local()
_ptrs = itertools.count(0x7E000)
_STREAMS: dict[int, "Stream"] = {}
#: seconds a stream's server thread waits for a task before it ends
IDLE = 1.0
_KNOWN: dict = {}  # known()


class EmulationError(AssertionError):
    """A rule that real CUDA/NCCL hardware enforces was broken (the emulator's verdict)."""


class StreamOrderError(EmulationError):
    """A buffer was touched before the stream work that writes (or reads) it was ordered before."""


class DeviceMismatch(EmulationError, ValueError):
    """An array, stream or communicator of one device used while another device is current."""


def host_sync(kind: str) -> None:
    """Report one host synchronization (to :func:`cupycoll.testing.syncs.host_sync`)."""
    syncs.host_sync(kind)


def device_count() -> int:
    return _DEVICES["count"]


def node_of(world_rank: int) -> int:
    """The emulated node of a world rank: ``devices_per_node`` consecutive ranks per node."""
    return int(world_rank) // device_count()


def configure(count: int) -> None:
    _DEVICES["count"] = int(count)


def current_device() -> int:
    return getattr(_tls, "device", 0)


def set_device(device: int) -> None:
    if not 0 <= int(device) < device_count():
        raise ValueError(f"invalid device ordinal {device} (emulating {device_count()} devices)")
    _tls.device = int(device)


def known() -> dict:
    """What the host knows complete (an event, stream or device synchronize, an event query,
    by any host thread): stream -> highest finished sequence number. One record for every
    thread, as on a GPU: work a thread saw finish is finished for a thread that reads its
    result after it (ordered by a join, a future, a lock)."""
    return _KNOWN


def known_anywhere(stream: "Stream", seq: int) -> bool:
    """Has a host thread learned that work #seq on ``stream`` finished? (Whether freeing host
    memory that work writes was safe.)"""
    with LOCK:
        return _KNOWN.get(stream, 0) >= seq


def waited(stream: "Stream") -> None:
    """This host thread has waited for all work on ``stream`` so far: a synchronize, or a
    blocking device-to-host read, which CuPy ends with one (reported as the read itself)."""
    with LOCK:
        _learn(known(), {stream: stream.seq})
        _learn(known(), stream.known)


def _learn(into: dict, facts: dict) -> None:
    for stream, seq in facts.items():
        if into.get(stream, -1) < seq:
            into[stream] = seq


class Task:
    """One piece of stream work: ``run()`` on the stream's thread, ``seq`` its place in order."""

    def __init__(self, stream: "Stream", seq: int, name: str, run: Callable[[], None] | None):
        self.stream, self.seq, self.name, self.run = stream, seq, name, run
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self.ended: float | None = None  # time.perf_counter() when it finished (event timing)

    def __repr__(self) -> str:
        return f"{self.name} (#{self.seq} on {self.stream})"


class Stream:
    """A FIFO of tasks run by its own daemon thread; eager operations order after it."""

    def __init__(self, device: int, ptr: int | None = None, null: bool = False,
                 blocking: bool = False) -> None:
        self.device, self.null, self.blocking = device, null, blocking
        self.ptr = 0 if null else (next(_ptrs) if ptr is None else ptr)
        self.seq = 0  # last sequence number handed out
        self.done_seq = 0  # every task up to here has finished
        self.known: dict[Stream, int] = {}  # other streams' progress this one has waited for
        self.tasks: "queue.Queue[Task]" = queue.Queue()
        self.last: Task | None = None
        self._thread: threading.Thread | None = None
        if not null:
            _STREAMS[self.ptr] = self

    def __repr__(self) -> str:
        return f"{'null stream' if self.null else f'stream {self.ptr:#x}'} of device {self.device}"

    # enqueueing
    def next_seq(self) -> int:
        with LOCK:
            self.seq += 1
            return self.seq

    def enqueue(self, name: str, run: Callable[[], None] | None) -> Task:
        """Append ``run`` to the stream; it runs after everything enqueued before it."""
        server = None
        with LOCK:
            task = Task(self, self.next_seq(), name, run)
            self.last = task
            if self._thread is None:
                self._thread = server = threading.Thread(target=self._serve, daemon=True,
                                                         name=f"emulated {self}")
            self.tasks.put(task)  # under LOCK: an idle server ends only on an empty queue
        if server is not None:  # started without LOCK: a finalizer that the garbage collector
            server.start()  # runs in the new thread as it starts may take LOCK (a deadlock)
        return task

    def eager(self) -> int:
        """Order a host-run operation on this stream: wait for what is queued, take a number."""
        self.drain()
        with LOCK:
            seq = self.next_seq()
            if self.last is None or self.last.finished.is_set():
                self.done_seq = seq
            return seq

    def _serve(self) -> None:
        """Run the tasks in order; end after IDLE seconds without one (the next enqueue
        starts a new server), so streams a program dropped keep no thread."""
        while True:
            try:
                task = self.tasks.get(timeout=IDLE)
            except queue.Empty:
                with LOCK:
                    if self.tasks.empty():
                        self._thread = None
                        return
                continue
            try:
                if task.run is not None:
                    task.run()
            except BaseException as exc:  # recorded; the NCCL layer turns it into async errors
                task.error = exc
            with LOCK:
                self.done_seq = max(self.done_seq, task.seq)
            task.ended = time.perf_counter()
            task.finished.set()

    # waiting
    def drain(self, upto: int | None = None) -> None:
        """Block until every task up to ``upto`` (default: all enqueued) has finished."""
        last = self.last
        if last is None:
            return
        if upto is None or upto >= last.seq:
            _wait(last.finished)
            return
        while self.done_seq < upto:
            time.sleep(1e-4)

    def synchronize(self) -> None:
        """Host waits for all work on this stream (cudaStreamSynchronize)."""
        host_sync("stream.synchronize")
        self.drain()
        waited(self)

    @property
    def done(self) -> bool:
        last = self.last
        finished = last is None or last.finished.is_set()
        if finished:
            with LOCK:
                _learn(known(), {self: self.seq})
        return finished

    def wait_event(self, event: "Event") -> None:
        """Later work on this stream runs after the event's work (cudaStreamWaitEvent)."""
        if event.task is None:
            return
        waited = event.task

        def wait() -> None:
            _wait(waited.finished)
        self.enqueue(f"wait {event}", wait)
        with LOCK:
            _learn(self.known, event.facts)

    def record(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def use(self) -> "Stream":
        set_stream(self)
        return self

    def __enter__(self) -> "Stream":
        _stack("streams_entered").append(current_stream())  # per thread, as CuPy's
        set_stream(self)
        return self

    def __exit__(self, *exc: object) -> None:
        set_stream(_stack("streams_entered").pop())


class Event:
    """A marker on a stream: ``done`` / ``synchronize()`` make its work known to the host."""

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False) -> None:
        self.timing = not disable_timing
        self.device = current_device()  # an event belongs to the device current at creation
        self.task: Task | None = None
        self.facts: dict[Stream, int] = {}
        self.observed = False  # the host has seen it complete (counted as one host sync)

    def record(self, stream: Stream | None = None) -> None:
        stream = current_stream() if stream is None else stream
        if stream.device != current_device():
            raise DeviceMismatch(f"cudaEventRecord on {stream} while device {current_device()} "
                                 "is current")
        if stream.device != self.device:
            raise DeviceMismatch(f"cudaEventRecord of an event of device {self.device} on "
                                 f"{stream} (CUDA: event and stream on one device, "
                                 "cudaErrorInvalidResourceHandle)")
        self.mark(stream)

    def mark(self, stream: Stream) -> None:
        """Record on ``stream`` (no checks): done once the stream's work so far is."""
        waits = implicit(stream)

        def run() -> None:
            for other, seq in waits:
                other.drain(seq)
        self.task = stream.enqueue("event", run if waits else None)
        self.observed = False
        with LOCK:
            self.facts = dict(stream.known)
            self.facts[stream] = self.task.seq

    def _learn(self, kind: str) -> None:
        if not self.observed:  # a wait that polls ``done`` is one synchronization, not many
            self.observed = True
            host_sync(kind)
        with LOCK:
            _learn(known(), self.facts)

    @property
    def done(self) -> bool:
        if self.task is None or self.task.finished.is_set():
            self._learn("event query (a wait)")
            return True
        return False

    def synchronize(self) -> None:
        if self.task is not None:
            _wait(self.task.finished)
        self._learn("event.synchronize")


def _wait(flag: threading.Event) -> None:
    while not flag.wait(0.5):
        pass


_NULL: dict[int, Stream] = {}


def null_stream(device: int | None = None) -> Stream:
    device = current_device() if device is None else device
    with LOCK:
        stream = _NULL.get(device)
        if stream is None:
            stream = _NULL[device] = Stream(device, null=True)
        return stream


def _stack(name: str) -> list:
    if not hasattr(_tls, name):
        setattr(_tls, name, [])
    return getattr(_tls, name)


def implicit(here: Stream) -> list[tuple[Stream, int]]:
    """The legacy null stream's implicit order, learned by ``here`` now: work on the null
    stream waits for the blocking streams' work so far, work on a blocking stream for the null
    stream's. Returns the (stream, seq) that work on ``here`` must wait for."""
    with LOCK:
        if here.null:
            others = [s for s in _STREAMS.values() if s.blocking and s.device == here.device]
        elif here.blocking:
            others = [s for d, s in _NULL.items() if d == here.device]
        else:
            return []
        waits = [(s, s.seq) for s in others if s.seq and here.known.get(s, 0) < s.seq]
        for s, seq in waits:
            _learn(here.known, s.known)
            _learn(here.known, {s: seq})
        return waits


def follow(later: Stream, earlier: Stream) -> None:
    """``later``'s next work waits for ``earlier``'s work so far (an event, recorded and
    waited for, with no device checks)."""
    if later is not earlier:
        event = Event()
        event.mark(earlier)
        later.wait_event(event)


def current_stream() -> Stream:
    streams = getattr(_tls, "streams", None)
    stream = None if streams is None else streams.get(current_device())
    return stream if stream is not None else null_stream()


def set_stream(stream: Stream) -> None:
    if stream.device != current_device():
        raise DeviceMismatch(f"making {stream} current while device {current_device()} is "
                             "current")
    if getattr(_tls, "streams", None) is None:
        _tls.streams = {}
    _tls.streams[stream.device] = stream


def lookup_stream(ptr: int) -> Stream:
    """The stream behind an NCCL ``stream`` argument (0: the current device's null stream)."""
    if int(ptr) == 0:
        return null_stream()
    stream = _STREAMS.get(int(ptr))
    if stream is None:
        raise EmulationError(f"stream handle {ptr:#x} is not a stream")
    return stream


def synchronize_device() -> None:
    """Host waits for every stream of the current device (cudaDeviceSynchronize)."""
    host_sync("device.synchronize")
    device = current_device()
    for stream in [s for s in list(_STREAMS.values()) + list(_NULL.values())
                   if s.device == device]:
        stream.drain()
        with LOCK:
            _learn(known(), {stream: stream.seq})
