"""Lossless coding of a sorted index stream: the numpy twin, the header and the format choice.

A strictly increasing stream ``idx`` (int32 or int64, ``0 <= lo <= idx < hi``) is sent as the
smaller of two self-describing formats (layout byte by byte in docs/wire.md):

* ``D`` (delta, bit-packed): gaps ``g_i = idx[i] - idx[i-1] - 1`` in blocks of :data:`BLOCK`;
  each block stores its gaps in ``w_b`` bits, ``w_b`` the bit length of its largest gap (a run
  of consecutive indices costs 0 bits). Every full block is ``4 * w_b`` bytes, so each block
  starts on a byte: one GPU thread packs a block, one thread unpacks an entry, and a prefix sum
  over the gaps restores the indices.
* ``B`` (bitmap): one bit per position of ``[idx[0], idx[-1]]``, chosen only when strictly
  smaller (dense streams).

The header (tag, count, first index, and the bitmap's span) is LEB128 varints, parsed on the
host; nothing is padded or aligned, and decoders read byte by byte, so ``buf`` may be any slice.
The cupy kernels (``kernels/wire.cu``) and the numba loops produce the same bytes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..errors import InvalidArgument, InvalidType

__all__ = ["BLOCK", "DELTA", "BITMAP", "Header", "parse_header", "check_stream", "bit_lengths",
           "block_bytes", "choose", "encode", "decode", "encoded_nbytes", "output_dtype"]

#: gaps per bit-packed block (32 * w bits = 4 * w bytes: blocks start on a byte).
BLOCK = 32
#: format tags (first byte of an encoded stream).
DELTA, BITMAP = 0x44, 0x42  # "D", "B"
#: longest header: tag + three 10-byte varints (a varint of a uint64 is at most 10 bytes).
MAX_HEADER = 31

_U64 = np.dtype(np.uint64)
_POWERS = np.left_shift(np.uint64(1), np.arange(64, dtype=_U64))  # 2**0 .. 2**63
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


class Header(NamedTuple):
    """A parsed header: format tag, count, first index, bitmap span (last - first; 0 for D)
    and the header's length in bytes."""

    kind: int
    count: int
    first: int
    span: int
    size: int


# ------------------------------------------------------------------------------ header
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def header_bytes(kind: int, count: int, first: int = 0, span: int = 0) -> bytes:
    """The header of a stream: tag, count and, when not empty, first (and span for a bitmap)."""
    out = bytes([kind]) + _varint(count)
    if count:
        out += _varint(first)
        if kind == BITMAP:
            out += _varint(span)
    return out


def parse_header(head: Any) -> Header:
    """Parse the header at the start of ``head`` (host bytes, at least the whole header)."""
    data = bytes(np.asarray(head, np.uint8))
    pos = 1

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            if pos >= len(data) or shift > 63:
                raise InvalidArgument("buf", len(data), "truncated or corrupt encoded index header")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    if not data or data[0] not in (DELTA, BITMAP):
        raise InvalidArgument("buf", data[:1], "not an encoded index stream (unknown format tag)")
    kind, count = data[0], varint()
    first = varint() if count else 0
    span = varint() if count and kind == BITMAP else 0
    if first + span > np.iinfo(np.int64).max or (kind == BITMAP and count > span + 1):
        raise InvalidArgument("buf", (count, first, span), "corrupt encoded index header (its "
                              "indices pass 2^63, or more than its bitmap holds)")
    return Header(kind, count, first, span, pos)


# ------------------------------------------------------------------------------ sizes
def check_stream(idx: Any, lo: Any, hi: Any) -> tuple[int, int]:
    """Check ``idx``'s type and the bounds (not the values); return ``(lo, hi)`` as ints."""
    if not hasattr(idx, "dtype") or not hasattr(idx, "ndim"):
        raise InvalidType("idx", type(idx).__name__, "a numpy or cupy array")
    if idx.dtype not in INDEX_DTYPES:
        raise InvalidType("idx", idx.dtype, "an array of int32 or int64")
    if idx.ndim != 1:
        raise InvalidArgument("idx", idx.shape, "must be 1-D")
    try:
        lo, hi = int(lo), int(hi)
    except (TypeError, ValueError):
        raise InvalidType("lo/hi", (lo, hi), "integers") from None
    if not 0 <= lo <= hi <= np.iinfo(np.int64).max:
        raise InvalidArgument("lo/hi", (lo, hi), "need 0 <= lo <= hi < 2**63")
    return lo, hi


def check_values(idx: Any, bad: bool, first: int, last: int, lo: int, hi: int) -> None:
    """Raise unless the stream ``idx`` (numpy or CuPy) was strictly increasing and inside
    ``[lo, hi)``; a bad step is named by its first position."""
    if bad:
        wide = idx.astype(np.int64)
        at = int((wide[1:] <= wide[:-1]).argmax()) + 1
        raise InvalidArgument("idx", f"idx[{at}] = {int(wide[at])} after idx[{at - 1}] = "
                              f"{int(wide[at - 1])}", "indices must be strictly increasing")
    if idx.size and not lo <= first <= last < hi:
        raise InvalidArgument("idx", (first, last), f"indices must lie in [lo, hi) = [{lo}, {hi})")


def bit_lengths(x: np.ndarray) -> np.ndarray:
    """Bit length of each uint64 (0 for 0), as uint8: how many powers of two are <= it."""
    return np.searchsorted(_POWERS, x.astype(_U64, copy=False), side="right").astype(np.uint8)


def block_bytes(widths: np.ndarray, ngaps: int) -> np.ndarray:
    """Bytes of each block: ``4 * w`` for full blocks, ``ceil(len * w / 8)`` for the last."""
    lens = np.full(widths.size, BLOCK, np.int64)
    if widths.size:
        lens[-1] = ngaps - BLOCK * (widths.size - 1)
    return (lens * widths.astype(np.int64) + 7) // 8


def choose(n: int, first: int, last: int, delta_payload: int) -> tuple[bytes, int]:
    """The format of a stream: its header and total size. ``delta_payload`` is the D format's
    bytes after the header (width table + blocks); a bitmap wins only when strictly smaller."""
    delta = header_bytes(DELTA, n, first)
    if n == 0:
        return delta, len(delta)
    bitmap = header_bytes(BITMAP, n, first, last - first)
    bitmap_size = len(bitmap) + (last - first) // 8 + 1
    if bitmap_size < len(delta) + delta_payload:
        return bitmap, bitmap_size
    return delta, len(delta) + delta_payload


# ------------------------------------------------------------------------------ numpy twin
def _gaps(idx: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Validated gaps - 1 as uint64."""
    wide = idx.astype(np.int64, copy=False)
    bad = idx.size > 1 and bool((wide[1:] <= wide[:-1]).any())  # compared, not subtracted:
    check_values(idx, bad, int(wide[0]) if idx.size else 0,  # far-apart bad indices'
                 int(wide[-1]) if idx.size else 0, lo, hi)  # step would overflow
    return np.diff(wide).view(_U64) - np.uint64(1)


def _plan(gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Width and byte size of each block of ``gaps``."""
    nblocks = -(-gaps.size // BLOCK)
    padded = np.zeros(nblocks * BLOCK, _U64)
    padded[:gaps.size] = gaps
    widths = bit_lengths(padded.reshape(nblocks, BLOCK).max(axis=1, initial=0))
    return widths, block_bytes(widths, gaps.size)


def encoded_nbytes(idx: np.ndarray, lo: int, hi: int) -> int:
    """Exact size of ``encode(idx, lo, hi)`` in bytes (validates like it)."""
    lo, hi = check_stream(idx, lo, hi)
    idx = np.asarray(idx)
    gaps = _gaps(idx, lo, hi)
    widths, sizes = _plan(gaps)
    n = idx.size
    return choose(n, int(idx[0]) if n else 0, int(idx[-1]) if n else 0,
                  widths.size + int(sizes.sum()))[1]


def _by_width(widths: np.ndarray) -> Any:
    """``(w, blocks of width w)`` for each width that occurs (one vectorised pass per width)."""
    for w in np.unique(widths):
        yield int(w), np.flatnonzero(widths == w)


def _pack(gaps: np.ndarray, widths: np.ndarray, starts: np.ndarray, total: int) -> np.ndarray:
    """Bit-pack ``gaps`` (block b at byte ``starts[b]``, ``widths[b]`` bits each), LSB first.

    Blocks of one width at a time: their gaps' low ``w`` bits, unpacked to bits and packed
    again 32 * w at a time, are exactly the blocks' bytes (a last short block is padded with
    zero gaps; its padding lands past ``total``, in the slack that is cut off).
    """
    out = np.zeros(total + 4 * 64, np.uint8)
    padded = np.zeros(widths.size * BLOCK, "<u8")
    padded[:gaps.size] = gaps
    blocks = padded.reshape(widths.size, BLOCK)
    for w, which in _by_width(widths):
        if w == 0:
            continue
        nbytes = -(-w // 8)  # flat (un)packing: numpy is slow along short axes
        low = np.ascontiguousarray(blocks[which].view(np.uint8).reshape(-1, 8)[:, :nbytes])
        bits = np.unpackbits(low.reshape(-1), bitorder="little").reshape(-1, 8 * nbytes)[:, :w]
        packed = np.packbits(np.ascontiguousarray(bits).reshape(-1), bitorder="little")
        out[(starts[which][:, None] + np.arange(4 * w)).reshape(-1)] = packed
    return out[:total]


def encode(idx: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Encode a strictly increasing stream in ``[lo, hi)`` (the numpy twin)."""
    lo, hi = check_stream(idx, lo, hi)
    gaps = _gaps(idx, lo, hi)
    widths, sizes = _plan(gaps)
    n = idx.size
    first, last = (int(idx[0]), int(idx[-1])) if n else (0, 0)
    head, total = choose(n, first, last, widths.size + int(sizes.sum()))
    out = np.zeros(total, np.uint8)
    out[:len(head)] = np.frombuffer(head, np.uint8)
    body = out[len(head):]
    if head[0] == BITMAP:
        bits = np.zeros(last - first + 1, bool)
        bits[idx.astype(np.int64) - first] = True
        body[:] = np.packbits(bits, bitorder="little")
    elif n > 1:
        body[:widths.size] = widths
        starts = widths.size + np.cumsum(sizes) - sizes
        body[:] |= _pack(gaps, widths, starts, body.size)
    return out


def output_dtype(dtype: Any) -> np.dtype:
    """The decode dtype, checked: int32 or int64."""
    dt = np.dtype(dtype)
    if dt not in INDEX_DTYPES:
        raise InvalidType("dtype", dt, "int32 or int64")
    return dt


def _as_buffer(buf: Any) -> np.ndarray:
    if not hasattr(buf, "dtype") or buf.dtype != np.uint8 or buf.ndim != 1:
        raise InvalidType("buf", getattr(buf, "dtype", type(buf).__name__), "a 1-D uint8 array")
    return buf


def delta_layout(buf: np.ndarray, head: Header) -> tuple[np.ndarray, np.ndarray, int]:
    """Widths, block start offsets (in ``buf``) and the end of a D stream; checks the length."""
    ngaps = max(head.count - 1, 0)
    nblocks = -(-ngaps // BLOCK)
    if len(buf) < head.size + nblocks:
        raise InvalidArgument("buf", len(buf), "encoded index stream is truncated")
    widths = np.asarray(buf[head.size:head.size + nblocks])
    if (widths > 63).any():
        raise InvalidArgument("buf", int(widths.max()), "corrupt block width (> 63 bits)")
    sizes = block_bytes(widths, ngaps)
    starts = head.size + nblocks + np.cumsum(sizes) - sizes
    end = head.size + nblocks + int(sizes.sum())
    if len(buf) < end:
        raise InvalidArgument("buf", len(buf), f"encoded index stream is truncated (needs {end})")
    return widths, starts, end


def _unpack(buf: np.ndarray, widths: np.ndarray, starts: np.ndarray, ngaps: int) -> np.ndarray:
    """The gaps - 1 of a D stream as uint64 (the inverse of :func:`_pack`)."""
    data = np.zeros(len(buf) + 4 * 64, np.uint8)  # a short last block reads zeros past the end
    data[:len(buf)] = buf
    blocks = np.zeros((widths.size, BLOCK, 8), np.uint8)
    for w, which in _by_width(widths):
        if w == 0:
            continue
        raw = data.take(starts[which][:, None] + np.arange(4 * w))
        bits = np.unpackbits(raw.reshape(-1), bitorder="little").reshape(-1, w)
        nbytes = -(-w // 8)  # flat (un)packing: numpy is slow along short axes
        wide = np.zeros((bits.shape[0], 8 * nbytes), np.uint8)
        wide[:, :w] = bits
        packed = np.packbits(wide.reshape(-1), bitorder="little").reshape(which.size, BLOCK, -1)
        blocks[which, :, :nbytes] = packed
    return blocks.view("<u8").reshape(-1)[:ngaps].astype(_U64, copy=False)


def decode(buf: Any, dtype: Any = np.int64) -> np.ndarray:
    """Decode a stream written by :func:`encode` (the numpy twin); ``buf`` may be any slice."""
    dt = output_dtype(dtype)
    buf = np.asarray(_as_buffer(buf))
    head = parse_header(buf[:MAX_HEADER])
    if head.count == 0:
        return np.empty(0, dt)
    if head.kind == BITMAP:
        nbytes = head.span // 8 + 1
        if len(buf) < head.size + nbytes:
            raise InvalidArgument("buf", len(buf), "encoded bitmap is truncated")
        bits = np.unpackbits(buf[head.size:head.size + nbytes], count=head.span + 1,
                             bitorder="little")
        values = np.flatnonzero(bits).astype(np.int64) + head.first
        if values.size != head.count:
            raise InvalidArgument("buf", values.size, f"bitmap holds {values.size} indices, "
                                  f"header says {head.count}")
    else:
        widths, starts, _ = delta_layout(buf, head)
        steps = np.empty(head.count, _U64)
        steps[0] = head.first
        steps[1:] = _unpack(buf, widths, starts, head.count - 1) + np.uint64(1)
        values = np.cumsum(steps, dtype=_U64).view(np.int64)
    return checked_cast(values, dt)


def checked_cast(values: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``values`` (int64, ascending) as ``dt``; raise when they do not fit, or when a corrupt
    stream's gaps carried them past 2^63 (the last one then below the first: O(1))."""
    if values.size and (values[0] < 0 or values[-1] < values[0]):
        raise InvalidArgument("buf", (int(values[0]), int(values[-1])), "corrupt encoded index "
                              "stream (its indices pass 2^63)")
    if dt == np.int32 and values.size and (values[-1] > np.iinfo(np.int32).max or values[0] < 0):
        raise InvalidArgument("dtype", dt, f"decoded index {int(values[-1])} does not fit int32")
    return values.astype(dt, copy=False)
