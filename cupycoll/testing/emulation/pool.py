"""Emulated CuPy device memory pool: stream-ordered, with immediate reuse, like CuPy's.

CuPy's ``MemoryPool`` rounds a request up to 512 bytes and takes it from the arena of the stream
that is current at the allocation; when the array dies its block goes back to that arena at
once, and the next allocation of that size on that stream gets the same memory. CuPy knows
nothing of other streams still reading or writing the block (it has no ``recordStream``), so a
block freed while another stream's work on it is queued is a race on a GPU.

The emulation does the same, strictly:

* every device allocation of one or more bytes is a :class:`Block` of this pool, taken from a
  per-(device, stream, size class) free list, last freed first; where its size class has none,
  the smallest larger free block of the arena is split, as CuPy's pool splits a chunk: the
  allocation gets its first bytes and the rest stays free, both with the block's stream work
  (CuPy also merges neighbouring free chunks again; the emulation does not);
* an allocation is alive while a device array views it (:class:`Allocation`, held by the arrays
  only: the emulator's tasks, logs and closures hold blocks and raw pointers, never arrays, so
  they never keep memory allocated longer than CUDA would);
* a reused block keeps the stream work of its last owner (the writer and reader marks of
  :mod:`.device`): the new owner touching it before the other streams' work is ordered raises
  :class:`~.device.StreamOrderError`, however fast that work ran, and the message says why;
* a block comes out poisoned (all bits set: NaN, -1) when no stream work on it is unfinished;
* blocks stay the emulator's: memory an emulated NCCL task or copy writes by raw pointer is never
  returned to numpy's heap. Free blocks go back to the heap only when more than
  :data:`SPARE_LIMIT` bytes lie free, oldest first, and only blocks with no unfinished work.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
from typing import Any

import numpy as np

from . import buffers
from . import device as dev

__all__ = ["Block", "Allocation", "allocate", "buffer_at", "raw_view", "ROUND", "SPARE_LIMIT"]

#: CuPy's allocation unit: requests are rounded up to it, and blocks of one size are reused.
ROUND = 512
#: free pooled bytes above which idle free blocks go back to numpy's heap (oldest first).
SPARE_LIMIT = 64 << 20
_ALIGN = 256
_FREE: dict[tuple, dict[int, list["Block"]]] = {}  # (device, stream) -> size -> free blocks,
# last freed last
_REGISTRY: dict[int, "Block"] = {}  # address -> every block the pool owns
_ADDRESSES: list[int] = []
_dirty = [False]
_spare = [0]  # bytes in free blocks (approximate: frees need no lock)
_age = itertools.count()


class Block(buffers.Buffer):
    """One pooled block of device memory: the marks of :class:`~.buffers.Buffer`, its memory,
    its arena and, while allocated, the requested size."""

    __slots__ = ("memory", "arena", "nbytes", "freed")

    def __init__(self, arena: tuple, memory: np.ndarray) -> None:
        super().__init__(arena[0])
        self.memory, self.arena, self.nbytes, self.freed = memory, arena, 0, 0

    @property
    def address(self) -> int:
        return int(self.memory.ctypes.data)


class Allocation:
    """The lifetime of one allocation: every device array on it holds this; when the last one
    dies, the block goes back to its arena (as CuPy's pool frees on the array's death)."""

    __slots__ = ("block",)

    def __init__(self, block: Block) -> None:
        self.block = block

    def __del__(self) -> None:
        block = self.block
        try:
            block.nbytes, block.freed = 0, next(_age)
            _spare[0] += block.memory.nbytes
            _FREE.setdefault(block.arena[:2], {}).setdefault(  # atomic: no lock in a finalizer
                block.arena[2], []).append(block)
        except Exception:  # noqa: BLE001  (interpreter shutdown: the module is torn down)
            pass


def allocate(nbytes: int, stream: dev.Stream, poison: bool = True) -> Allocation:
    """A block for ``nbytes`` (> 0) bytes from ``stream``'s arena: the one freed last in its
    size class, else the first part of the smallest larger free block, else a new one. Stream
    work pending on a reused block stays on it; ``poison``: all bits set where no stream work
    on it is unfinished (else it holds what it held)."""
    size = -(-int(nbytes) // ROUND) * ROUND
    with dev.LOCK:
        block = _reused(_FREE.get((stream.device, stream)), size)
        if block is None:
            block = _new_block((stream.device, stream, size))
        block.nbytes = int(nbytes)
        _carry_over(block, stream)
        if poison and buffers.idle(block):
            block.memory[...] = 0xFF  # what a missing wait reads: NaN, -1
    return Allocation(block)


def _reused(sizes: dict[int, list[Block]] | None, size: int) -> Block | None:
    """A free block of ``size`` bytes from an arena's free lists (taken off them), split from
    the smallest larger one where ``size`` has none; None if the arena has nothing as large."""
    if not sizes:
        return None
    blocks = sizes.get(size)
    if not blocks:
        larger = [s for s, free in list(sizes.items()) if s > size and free]  # (a copy:
        # a finalizer frees without the lock, in any thread)
        if not larger:
            return None
        blocks = sizes[min(larger)]
    block = blocks.pop()
    _spare[0] -= block.memory.nbytes
    if block.memory.nbytes == size:
        return block
    head, rest = (_part(block, start, stop) for start, stop in
                  ((0, size), (size, block.memory.nbytes)))
    sizes.setdefault(rest.arena[2], []).append(rest)
    _spare[0] += rest.memory.nbytes
    return head


def _part(block: Block, start: int, stop: int) -> Block:
    """Bytes ``[start, stop)`` of a free ``block`` as a block of their own, with its stream
    work and age (registered at its address in place of what was there)."""
    part = Block(block.arena[:2] + (stop - start,), block.memory[start:stop])
    part.writer, part.readers, part.freed = block.writer, list(block.readers), block.freed
    _REGISTRY[part.address] = part
    _dirty[0] = True
    return part


def _new_block(arena: tuple) -> Block:
    if _spare[0] > SPARE_LIMIT:
        _release(_spare[0] - SPARE_LIMIT // 2)
    raw = np.empty(arena[2] + _ALIGN, np.uint8)
    skip = -int(raw.ctypes.data) % _ALIGN  # cudaMalloc's alignment
    block = Block(arena, raw[skip:skip + arena[2]])
    _REGISTRY[block.address] = block
    _dirty[0] = True
    return block


def _release(excess: int) -> None:
    """Give idle free blocks back to numpy's heap, oldest first, until ``excess`` bytes went."""
    free = sorted((b for sizes in list(_FREE.values()) for blocks in list(sizes.values())
                   for b in list(blocks)), key=lambda b: b.freed)  # (copies, as in _reused)
    for block in free:
        if excess <= 0:
            break
        if buffers.idle(block):
            _FREE[block.arena[:2]][block.arena[2]].remove(block)
            del _REGISTRY[block.address]
            _dirty[0] = True
            _spare[0] -= block.memory.nbytes
            excess -= block.memory.nbytes


def _carry_over(block: Block, stream: dev.Stream) -> None:
    """Name the marks other streams left on a reused block (the new owner's error says why)."""
    note = buffers.REUSED
    marks = ([block.writer] if block.writer else []) + block.readers
    renamed = {m: (m[0], m[1], m[2] + note) for m in marks
               if m[0] is not stream and not m[2].endswith(note)}
    if block.writer in renamed:
        block.writer = renamed[block.writer]
    block.readers = [renamed.get(m, m) for m in block.readers]


def buffer_at(ptr: int, nbytes: int) -> tuple[Block, np.ndarray] | None:
    """The live device allocation holding ``[ptr, ptr + nbytes)``, with its block's memory."""
    with dev.LOCK:
        if _dirty[0]:
            _ADDRESSES[:] = sorted(_REGISTRY)
            _dirty[0] = False
        i = bisect.bisect_right(_ADDRESSES, ptr) - 1
        if i < 0:
            return None
        start = _ADDRESSES[i]
        block = _REGISTRY[start]
        if not block.nbytes or ptr + nbytes > start + block.nbytes:
            return None
        return block, block.memory


def raw_view(ptr: int, count: int, dtype: Any) -> np.ndarray:
    """A numpy view of ``count`` elements of ``dtype`` at device address ``ptr``."""
    raw = (ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype)
