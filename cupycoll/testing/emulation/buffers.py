"""Emulated device memory's stream order: each allocation's last writer and readers, and the
check every access makes against them (:func:`ordered_access`, the rule :mod:`.device`'s
docstring states: touching a buffer that unfinished work on another stream writes, or reads for
a write, raises :class:`~.device.StreamOrderError` unless that work is ordered before)."""

from __future__ import annotations

from .device import LOCK, Stream, StreamOrderError, current_stream, implicit, known

__all__ = ["Buffer", "idle", "ordered_access", "REUSED"]

#: the end of the name of a mark left by a block's previous allocation (see :mod:`.pool`)
REUSED = " [on the block's previous allocation]"
_REUSED_WHY = ("; that work was on this memory's previous allocation, which was freed (back to "
               "CuPy's stream-ordered pool, which knows no other stream) before that work was "
               "ordered, and the pool handed the block to this allocation: keep the old array "
               "alive until the work on it is ordered before its allocating stream")


class Buffer:
    """One device allocation: its device, and the stream work that last wrote and read it."""

    __slots__ = ("device", "writer", "readers", "__weakref__")

    def __init__(self, device: int) -> None:
        self.device = device
        self.writer: tuple[Stream, int, str] | None = None
        self.readers: list[tuple[Stream, int, str]] = []


def idle(buf: Buffer) -> bool:
    """No unfinished stream work reads or writes ``buf`` (so overwriting it harms nobody)."""
    marks = ([buf.writer] if buf.writer else []) + buf.readers
    return all(stream.done_seq >= seq for stream, seq, _ in marks)


def _implicit(a: Stream, b: Stream) -> bool:
    """The legacy null stream and a blocking stream of one device wait for each other's work."""
    return a.device == b.device and ((a.null and b.blocking) or (b.null and a.blocking))


def _ordered(stream: Stream, seq: int, here: Stream) -> bool:
    """Is work #seq on ``stream`` ordered before what runs next on ``here`` (the host knows it
    finished, or ``here`` waited for it)?"""
    return (stream is here or known().get(stream, 0) >= seq or here.known.get(stream, 0) >= seq)


def ordered_access(buffers: list[tuple[Buffer, bool]], what: str, here: Stream | None = None,
                   task_seq: int | None = None) -> list[tuple[Stream, int]]:
    """Check (and book) reads/writes of ``buffers`` by ``what`` on stream ``here``.

    ``task_seq`` None: an operation run now on the host thread (it waits for its own stream
    first); else the sequence number of an enqueued task on ``here``, which must first wait for
    the returned (stream, seq) pairs (work it is implicitly ordered after, see :func:`_implicit`).
    """
    here = current_stream() if here is None else here
    waits = implicit(here)
    if task_seq is None:
        seq = here.eager()
    else:
        seq = task_seq
    with LOCK:
        for buf, writes in buffers:
            conflicts = ([buf.writer] if buf.writer else []) + (buf.readers if writes else [])
            for stream, done, name in conflicts:
                if _implicit(stream, here) and not _ordered(stream, done, here):
                    waits.append((stream, done))
                elif not _ordered(stream, done, here):
                    verb = "writes" if (stream, done, name) == buf.writer else "reads"
                    raise StreamOrderError(
                        f"{what} on {here} touches a buffer of device {buf.device} that "
                        f"{name.removesuffix(REUSED)} (#{done} on {stream}) {verb}, with no "
                        "event, stream wait or synchronize ordering it before: a missing wait "
                        "on a GPU (the data would be garbage)" +
                        (_REUSED_WHY if name.endswith(REUSED) else ""))
        for buf, writes in buffers:
            mark = (here, seq, what)
            if writes:
                buf.writer, buf.readers = mark, []
            else:
                buf.readers = [r for r in buf.readers if r[0] is not here] + [mark]
    if task_seq is None:
        for stream, done in waits:
            stream.drain(done)
    return waits
