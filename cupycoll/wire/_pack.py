"""Packed messages: the indices and values of one transfer in ONE uint8 buffer.

A packed entry block of ``count`` entries is, in this order (so every part is aligned at an
offset that is a multiple of its itemsize, with no padding, whenever the buffer starts 8-aligned):

- ``coo`` indices: the raw indices and the values, the one with the larger itemsize first
  (itemsizes are powers of two, so the second starts at a multiple of its own itemsize);
- ``compact`` indices: the values first, then the codec's self-describing index stream (bytes).

Values travel in their dtype, or rounded to a 16-bit payload when the wire format says so
(float values only). The receiver knows ``count`` from the count exchange; a compact block's
byte length must be exchanged too (the stream's size depends on the indices).

Receive buffers hold several blocks at 8-aligned offsets (:func:`block_offsets`): the gaps are
local memory only, never sent, so the bytes on the wire are exactly the blocks' bytes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["Wire", "COO", "Packed", "pack", "unpack", "pack_dense", "unpack_dense", "value_nbytes", "coo_nbytes",
           "block_offsets", "receive_blocks"]


@dataclasses.dataclass(frozen=True)
class Wire:
    """How a call's sparse entries travel: ``compact`` index streams, ``values`` rounding."""

    compact: bool = False
    values: str | None = None  # None, "bfloat16" or "float16"

    @property
    def name(self) -> str:
        return "compact" if self.compact else "coo"

    @property
    def label(self) -> str:
        """``name``, with ``+values`` when values travel rounded (``compact+bfloat16``)."""
        return self.name + (f"+{self.values}" if self.values else "")

    def rounds(self, dtype: Any) -> bool:
        """True when values of ``dtype`` travel rounded to a 16-bit payload (float32 and
        float64 only: float16 values are 16-bit already, integers travel exact)."""
        return self.values is not None and np.dtype(dtype).kind == "f" and \
            np.dtype(dtype).itemsize >= 4

    def wire_dtype(self, dtype: Any) -> np.dtype:
        """The dtype values of ``dtype`` have on the wire."""
        return np.dtype(np.uint16) if self.rounds(dtype) else np.dtype(dtype)


#: raw COO, values as they are: what every algorithm sent before wire formats existed.
COO = Wire()


@dataclasses.dataclass
class Packed:
    """One packed block: ``buf`` (uint8), ``count`` entries, and the values as the receivers
    will see them (rounded when the wire rounds; the sender keeps them for consistency and
    error feedback)."""

    buf: Any
    count: int
    values: Any


def value_nbytes(count: int, row: tuple, dtype: Any, wire: Wire) -> int:
    """Bytes of the values part of a block of ``count`` rows of shape ``row``."""
    width = math.prod(row) if row else 1
    return int(count) * width * wire.wire_dtype(dtype).itemsize


def coo_nbytes(count: int, row: tuple, index_dtype: Any, dtype: Any, wire: Wire) -> int:
    """Bytes of a block with raw indices (known from the count alone)."""
    return int(count) * np.dtype(index_dtype).itemsize + value_nbytes(count, row, dtype, wire)


def _values_first(index_dtype: Any, dtype: Any, wire: Wire) -> bool:
    return wire.compact or wire.wire_dtype(dtype).itemsize > np.dtype(index_dtype).itemsize


def _as_bytes(a: Any) -> Any:
    """A contiguous array as a flat uint8 view."""
    return a.reshape(-1).view(np.uint8)


def pack(xp: Any, idx: Any, val: Any, wire: Wire, lo: int = 0, hi: int = 0,
         buffer: Callable[[int], Any] | None = None) -> Packed:
    """Pack sorted unique ``idx`` (in ``[lo, hi)``) and their rows ``val`` into one block
    (no bytes at all for no entries); ``buffer(nbytes)`` gives the block's uint8 array (a
    communicator's :meth:`~cupycoll.comm.Communicator.send_buffer`; default a new one).

    ``val`` may be :class:`~cupycoll.primitives._unfolded.Unfolded` rows: on a wire that does
    not round them they are summed straight into the block (no coalesced copy in between), and
    the returned ``values`` are that part of the block."""
    from ..primitives._unfolded import Unfolded
    from . import encode_indices, round_values

    count = int(idx.shape[0])
    unfolded = isinstance(val, Unfolded)
    if unfolded and (count == 0 or wire.rounds(val.dtype)):
        val, unfolded = val.folded(), False
    if count == 0:  # an empty block is empty on every wire (nothing to decode)
        return Packed(xp.empty(0, dtype=np.uint8), 0, val)
    if unfolded:
        return _pack_folding(xp, idx, val, wire, lo, hi, buffer)
    if wire.rounds(val.dtype):
        payload, val = round_values(val, wire.values)
    else:
        payload = val
    payload = payload if payload.flags.c_contiguous else xp.ascontiguousarray(payload)
    index_part = encode_indices(idx, lo, hi) if wire.compact else idx
    if _values_first(idx.dtype, val.dtype, wire):
        parts = (payload, index_part)
    else:
        parts = (index_part, payload)
    sizes = [int(p.size) * p.dtype.itemsize for p in parts]
    buf = xp.empty(sum(sizes), dtype=np.uint8) if buffer is None else buffer(sum(sizes))
    buf[:sizes[0]] = _as_bytes(parts[0])
    buf[sizes[0]:] = _as_bytes(parts[1])
    return Packed(buf, count, val)


def _pack_folding(xp: Any, idx: Any, rows: Any, wire: Wire, lo: int, hi: int,
                  buffer: Callable[[int], Any] | None) -> Packed:
    """:func:`pack` of :class:`~cupycoll.primitives._unfolded.Unfolded` ``rows`` on a wire
    that does not round them: the indices copied, the rows folded into their part."""
    from . import encode_indices

    index_part = encode_indices(idx, lo, hi) if wire.compact else idx
    vbytes = rows.shape[0] * math.prod(rows.shape[1:]) * rows.dtype.itemsize
    ibytes = int(index_part.size) * index_part.dtype.itemsize
    buf = xp.empty(vbytes + ibytes, dtype=np.uint8) if buffer is None else \
        buffer(vbytes + ibytes)
    first = _values_first(idx.dtype, rows.dtype, wire)
    vpart, ipart = (buf[:vbytes], buf[vbytes:]) if first else (buf[ibytes:], buf[:ibytes])
    ipart[:] = _as_bytes(index_part)
    values = rows.fold_into(vpart.view(rows.dtype).reshape(rows.shape))
    return Packed(buf, int(idx.shape[0]), values)


def raw_block(count: int, row: tuple, index_dtype: Any, dtype: Any,
              buffer: Callable[[int], Any]) -> tuple[Any, Any, Any]:
    """A block of ``count`` entries on the raw coo wire, laid out as :func:`pack` lays it out,
    to be written in place (a merge's result sent without a copy): the block
    (``buffer(nbytes)``), its indices' part and its rows' part, shaped ``(count,) + row``."""
    index_dtype, dtype = np.dtype(index_dtype), np.dtype(dtype)
    ibytes, vbytes = count * index_dtype.itemsize, value_nbytes(count, row, dtype, COO)
    buf = buffer(ibytes + vbytes)
    vpart, ipart = ((buf[:vbytes], buf[vbytes:]) if _values_first(index_dtype, dtype, COO)
                    else (buf[ibytes:], buf[:ibytes]))
    return buf, ipart.view(index_dtype), vpart.view(dtype).reshape((count,) + row)


def unpack(buf: Any, count: int, row: tuple, index_dtype: Any, dtype: Any,
           wire: Wire) -> tuple[Any, Any]:
    """Return (indices, rows) of a block; rows in ``dtype`` (widened from a rounded payload).

    Raw parts are views into ``buf`` (no copy); a compact index stream is decoded.
    """
    from . import decode_indices, widen_values

    index_dtype, dtype = np.dtype(index_dtype), np.dtype(dtype)
    vbytes = value_nbytes(count, row, dtype, wire)
    wire_dtype = wire.wire_dtype(dtype)
    if _values_first(index_dtype, dtype, wire):
        vpart, ipart = buf[:vbytes], buf[vbytes:]
    else:
        ipart, vpart = buf[:buf.shape[0] - vbytes], buf[buf.shape[0] - vbytes:]
    vals = vpart.view(wire_dtype).reshape((count,) + tuple(row))
    if wire.rounds(dtype):
        vals = widen_values(vals, wire.values, dtype)
    if wire.compact:
        idx = decode_indices(ipart, index_dtype) if count else buf[:0].astype(index_dtype)
    else:
        idx = ipart.view(index_dtype)
    return idx, vals


def pack_dense(xp: Any, rows: Any, bits: Any, wire: Wire) -> Packed:
    """Pack dense rows (rounded when the wire rounds) and a packed presence bitmap (uint8)."""
    from . import round_values

    payload, rows = round_values(rows, wire.values) if wire.rounds(rows.dtype) else (rows, rows)
    size = int(payload.size) * payload.dtype.itemsize
    buf = xp.empty(size + int(bits.shape[0]), dtype=np.uint8)
    buf[:size] = _as_bytes(payload if payload.flags.c_contiguous else xp.ascontiguousarray(payload))
    buf[size:] = bits
    return Packed(buf, -1, rows)


def unpack_dense(buf: Any, n: int, row: tuple, dtype: Any, wire: Wire) -> tuple[Any, Any]:
    """Return (rows, packed bitmap) of a block made by :func:`pack_dense`."""
    from . import widen_values

    size = value_nbytes(n, row, dtype, wire)
    rows = buf[:size].view(wire.wire_dtype(dtype)).reshape((n,) + tuple(row))
    if wire.rounds(dtype):
        rows = widen_values(rows, wire.values, dtype)
    return rows, buf[size:]


def block_offsets(nbytes: Sequence[int]) -> np.ndarray:
    """Offsets of blocks of ``nbytes`` laid out in one buffer, each 8-aligned (P+1 entries)."""
    padded = [(int(b) + 7) // 8 * 8 for b in nbytes]
    return np.concatenate([[0], np.cumsum(padded, dtype=np.int64)]).astype(np.int64)


def receive_blocks(xp: Any, nbytes: Sequence[int]) -> tuple[Any, list[Any]]:
    """One uint8 buffer and the 8-aligned slice of it that receives each block."""
    offsets = block_offsets(nbytes)
    buf = xp.empty(int(offsets[-1]), dtype=np.uint8)
    return buf, [buf[int(a):int(a) + int(b)] for a, b in zip(offsets[:-1], nbytes)]
