"""numba loops of the index codec: the same bytes as the numpy twin, one pass per block.

Imported lazily (see :func:`cupycoll.wire.fast`) when ``CUPYCOLL_NUMBA`` allows it and numba
imports. Header, format choice and validation stay in :mod:`._index_codec`; only the loops over
entries live here. The packing loop is the one ``kernels/wire.cu`` runs per block.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..primitives._numba_cache import make_process_safe
from . import _index_codec as twin

__all__ = ["encode", "decode", "encoded_nbytes"]

_BLOCK = twin.BLOCK


@njit(cache=True, nogil=True)
def _plan(idx, widths, sizes):  # pragma: no cover - compiled
    """Widths and byte sizes of the blocks of gaps; returns True when not strictly increasing."""
    n = idx.size
    bad = False
    for b in range(widths.size):
        top = np.uint64(0)
        end = min(n, 1 + (b + 1) * _BLOCK)
        for i in range(1 + b * _BLOCK, end):
            if idx[i] <= idx[i - 1]:  # compared: far-apart bad indices' step would overflow
                bad = True
            gap = np.uint64(np.int64(idx[i])) - np.uint64(np.int64(idx[i - 1])) - np.uint64(1)
            top = max(top, gap)
        w = 0
        while top:
            w += 1
            top >>= np.uint64(1)
        widths[b] = w
        sizes[b] = ((end - 1 - b * _BLOCK) * w + 7) // 8
    return bad


@njit(cache=True, nogil=True)
def _pack(idx, widths, starts, out):  # pragma: no cover - compiled
    """Bit-pack each block's gaps LSB first from byte ``starts[b]`` of ``out``: at most 32 bits
    at a time into a 64-bit accumulator that keeps fewer than 8 pending bits between pieces."""
    n = idx.size
    for b in range(widths.size):
        w = np.int64(widths[b])
        pos = starts[b]
        acc = np.uint64(0)
        fill = np.int64(0)
        for i in range(1 + b * _BLOCK, min(n, 1 + (b + 1) * _BLOCK)):
            v = np.uint64(np.int64(idx[i]) - np.int64(idx[i - 1]) - 1)
            left = w
            while left > 0:
                take = min(left, 32)
                acc |= (v & np.uint64((1 << take) - 1)) << np.uint64(fill)
                v >>= np.uint64(take)
                fill += take
                left -= take
                while fill >= 8:
                    out[pos] = np.uint8(acc & np.uint64(0xFF))
                    acc >>= np.uint64(8)
                    fill -= 8
                    pos += 1
        if fill:
            out[pos] = np.uint8(acc)


@njit(cache=True, nogil=True)
def _bitmap_pack(idx, first, out):  # pragma: no cover - compiled
    for i in range(idx.size):
        j = np.int64(idx[i]) - first
        out[j >> 3] |= np.uint8(1 << (j & 7))


@njit(cache=True, nogil=True)
def _unpack(buf, widths, starts, first, out):  # pragma: no cover - compiled
    """Decode the gaps of every block and sum them up into ``out`` (``out[0] = first``)."""
    n = out.size
    value = np.uint64(first)
    out[0] = first
    for b in range(widths.size):
        w = widths[b]
        pos = starts[b]
        acc = np.uint64(0)
        fill = 0
        for i in range(1 + b * _BLOCK, min(n, 1 + (b + 1) * _BLOCK)):
            v = np.uint64(0)
            got = 0
            while got < w:
                if fill == 0:
                    acc = np.uint64(buf[pos])
                    pos += 1
                    fill = 8
                take = min(fill, w - got)
                v |= (acc & np.uint64((1 << take) - 1)) << np.uint64(got)
                acc >>= np.uint64(take)
                fill -= take
                got += take
            value += v + np.uint64(1)
            out[i] = value


@njit(cache=True, nogil=True)
def _bitmap_unpack(bits, span, first, out):  # pragma: no cover - compiled
    """Positions (up to ``span``) of the set bits plus ``first``; returns how many were found."""
    k = 0
    for j in range(bits.size):
        byte = bits[j]
        for t in range(8):
            if byte >> t & 1 and 8 * j + t <= span:
                if k < out.size:
                    out[k] = first + 8 * j + t
                k += 1
    return k


def _layout(idx: np.ndarray, lo: int, hi: int) -> tuple:
    """Validated ``(idx, widths, sizes, first, header, total)`` of a stream."""
    lo, hi = twin.check_stream(idx, lo, hi)
    idx = np.ascontiguousarray(idx)
    n = idx.size
    nblocks = -(-max(n - 1, 0) // _BLOCK)
    widths, sizes = np.empty(nblocks, np.uint8), np.empty(nblocks, np.int64)
    bad = _plan(idx, widths, sizes) if n > 1 else False
    first, last = (int(idx[0]), int(idx[-1])) if n else (0, 0)
    twin.check_values(idx, bad, first, last, lo, hi)
    return (idx, widths, sizes, first) + twin.choose(n, first, last, nblocks + int(sizes.sum()))


def encoded_nbytes(idx: np.ndarray, lo: int, hi: int) -> int:
    """:func:`._index_codec.encoded_nbytes` with the numba planning loop."""
    return _layout(idx, lo, hi)[-1]


def encode(idx: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """:func:`._index_codec.encode` with numba loops (same bytes)."""
    idx, widths, sizes, first, head, total = _layout(idx, lo, hi)
    n, nblocks = idx.size, widths.size
    out = np.zeros(total, np.uint8)
    out[:len(head)] = np.frombuffer(head, np.uint8)
    body = out[len(head):]
    if head[0] == twin.BITMAP:
        _bitmap_pack(idx, np.int64(first), body)
    elif n > 1:
        body[:nblocks] = widths
        _pack(idx, widths, nblocks + np.cumsum(sizes) - sizes, body)
    return out


def decode(buf: np.ndarray, dtype: object = np.int64) -> np.ndarray:
    """:func:`._index_codec.decode` with numba loops (same values and errors)."""
    dt = twin.output_dtype(dtype)
    buf = np.asarray(twin._as_buffer(buf))
    head = twin.parse_header(buf[:twin.MAX_HEADER])
    if head.count == 0:
        return np.empty(0, dt)
    if head.kind == twin.BITMAP:
        nbytes = head.span // 8 + 1
        if len(buf) < head.size + nbytes:
            raise twin.InvalidArgument("buf", len(buf), "encoded bitmap is truncated")
        out = np.empty(head.count, np.int64)  # (after the checks: a corrupt count is refused)
        found = _bitmap_unpack(buf[head.size:head.size + nbytes], np.int64(head.span),
                               np.int64(head.first), out)
        if found != head.count:
            raise twin.InvalidArgument("buf", found, f"bitmap holds {found} indices, header "
                                       f"says {head.count}")
    else:
        widths, starts, _ = twin.delta_layout(buf, head)
        out = np.empty(head.count, np.int64)
        _unpack(buf, widths, starts, np.int64(head.first), out)
    return twin.checked_cast(out, dt)


make_process_safe(globals())  # ranks compiling at once: see _numba_cache
