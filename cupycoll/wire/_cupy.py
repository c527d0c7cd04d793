"""The index codec on device arrays: the kernels of ``kernels/wire.cu`` plus prefix sums.

:class:`WireKernels` needs only a launcher (see :class:`cupycoll.primitives._cupy.Launcher`):
CuPy's on a GPU, the CPU-compiled kernels in tests, so the orchestration below runs without a
GPU too. Host syncs: encoding reads one small array (the D format's size, the order flag, the
first and last index: the output's size must be known); decoding reads the header (the count).
Nothing else leaves the device. Writes the same bytes as the numpy twin.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._kernels import CTYPES, expression
from . import _index_codec as twin

__all__ = ["WireKernels"]

_FILE = "wire.cu"


class WireKernels:
    """encode/decode of :mod:`cupycoll.wire` over ``launcher``'s array namespace."""

    def __init__(self, launcher: Any) -> None:
        self.launch = launcher

    @property
    def xp(self) -> Any:
        return self.launch.xp

    def _host(self, a: Any) -> np.ndarray:
        """A device-to-host copy (the launcher's namespace may be numpy itself)."""
        return getattr(self.xp, "asnumpy", np.asarray)(a)

    def _run(self, kernel: str, items: int, *args: Any, types: tuple[str, ...] = ()) -> None:
        self.launch(_FILE, expression(kernel, *types), self.launch.shape(items), *args)

    def _exclusive(self, sizes: Any, base: int) -> tuple[Any, Any]:
        """(base + exclusive prefix sum, inclusive prefix sum) of ``sizes``, on the device."""
        ends = self.xp.cumsum(sizes)
        return ends - sizes + base, ends

    def encode(self, idx: Any, lo: int, hi: int) -> Any:
        """:func:`cupycoll.wire.encode_indices` for device arrays (one host read)."""
        xp = self.xp
        lo, hi = twin.check_stream(idx, lo, hi)
        idx = xp.ascontiguousarray(idx)
        n, itype = idx.size, CTYPES[idx.dtype]
        nblocks = -(-max(n - 1, 0) // twin.BLOCK)
        widths = xp.empty(nblocks, np.uint8)
        info = np.zeros(4, np.int64)  # D payload bytes, order flag, first, last
        if n:
            sizes = xp.empty(nblocks, np.int64)
            flag = xp.zeros(1, np.int32)
            if nblocks:
                self._run("cc_wire_plan", nblocks, idx, np.int64(n), np.int64(nblocks), widths,
                          sizes, flag, types=(itype,))
            ends = xp.cumsum(sizes)
            ends = ends[-1:] if nblocks else xp.zeros(1, np.int64)
            ends = ends + nblocks
            info = self._host(xp.concatenate([ends, flag.astype(np.int64), idx[:1].astype(np.int64),
                                              idx[-1:].astype(np.int64)]))
        payload, bad, first, last = (int(v) for v in info)
        twin.check_values(idx, bool(bad), first, last, lo, hi)
        head, total = twin.choose(n, first, last, payload)
        out = xp.empty(total, np.uint8)
        out[:len(head)] = xp.asarray(np.frombuffer(head, np.uint8))
        body = len(head)
        if n and head[0] == twin.BITMAP:
            nbytes = total - body
            self._run("cc_wire_bitmap_pack", nbytes, idx, np.int64(n), np.int64(first),
                      np.int64(nbytes), out[body:], types=(itype,))
        elif nblocks:
            out[body:body + nblocks] = widths
            starts, _ = self._exclusive(sizes, body + nblocks)
            self._run("cc_wire_pack", nblocks, idx, np.int64(n), np.int64(nblocks), widths,
                      starts, out, types=(itype,))
        return out

    def decode(self, buf: Any, dtype: Any = np.int64) -> Any:
        """:func:`cupycoll.wire.decode_indices` for device arrays (one host read: the header).

        Unlike the twin, a truncated delta stream, a value too large for int32, a bitmap whose
        bits disagree with its header's count or a block width above 63 (corrupt buffers) is
        not detected (that would take another host read): the indices are then undefined, but
        kernels never read past ``buf`` nor write past the header's count.
        """
        xp = self.xp
        dt = twin.output_dtype(dtype)
        buf = twin._as_buffer(buf)
        head = twin.parse_header(self._host(buf[:twin.MAX_HEADER]))
        n = head.count
        if n == 0:
            return xp.empty(0, dt)
        buf = xp.ascontiguousarray(buf)
        if head.kind == twin.BITMAP:
            nbytes = head.span // 8 + 1
            if len(buf) < head.size + nbytes:
                raise twin.InvalidArgument("buf", len(buf), "encoded bitmap is truncated")
            bits = buf[head.size:head.size + nbytes]
            counts = xp.empty(nbytes, np.int64)
            self._run("cc_wire_popcount", nbytes, bits, np.int64(nbytes), np.int64(head.span),
                      counts)
            starts, _ = self._exclusive(counts, 0)
            out = xp.empty(n, dt)
            self._run("cc_wire_bitmap_unpack", nbytes, bits, np.int64(nbytes),
                      np.int64(head.span), starts, np.int64(head.first), np.int64(n), out,
                      types=(CTYPES[dt],))
            return out
        ngaps = n - 1
        nblocks = -(-ngaps // twin.BLOCK)
        if len(buf) < head.size + nblocks:
            raise twin.InvalidArgument("buf", len(buf), "encoded index stream is truncated")
        steps = xp.empty(n, np.int64)
        steps[:1] = head.first
        if nblocks:
            widths = buf[head.size:head.size + nblocks]
            sizes = xp.empty(nblocks, np.int64)
            self._run("cc_wire_block_bytes", nblocks, widths, np.int64(nblocks), np.int64(ngaps),
                      sizes)
            starts, _ = self._exclusive(sizes, head.size + nblocks)
            self._run("cc_wire_unpack", ngaps, buf, np.int64(len(buf)), widths, starts,
                      np.int64(ngaps), steps)
        return xp.cumsum(steps).astype(dt, copy=False)
