"""Packed transfers the top-k algorithms share, and their wire choice (see cupycoll.wire).

Every transfer moves indices and values in ONE packed message. Fixed-size blocks (gTopk's k
pairs padded with the sentinel index n, Ok-Topk's padded allgather) keep their padding on the
``coo`` wire, whose sizes everybody knows; on the ``compact`` wire only the real entries travel,
encoded, after their sizes (booked ``<op>.counts``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._types import to_host
from ..wire._choice import could_pay, prefer_compact
from ..wire._model import expected_index_nbytes
from ..wire._pack import Packed, Wire, coo_nbytes, pack, unpack
from ..wire._values import rounding_error

__all__ = ["real_entries", "send_block", "receive_block", "broadcast_block", "allgather_padded",
           "choose_wire"]


def real_entries(xp: Any, bi: Any, bv: Any, n: int) -> tuple[Any, Any]:
    """Strip the sentinel padding (indices are ascending, the sentinel n is last)."""
    m = int(xp.searchsorted(bi, n))
    return bi[:m], bv[:m]


def send_block(comm: Any, peer: int, idx: Any, val: Any, wire: Wire, n: int,
               op_name: str) -> Packed:
    """Send (idx, val) to ``peer`` as one packed block (compact: a (count, bytes) header
    first); return the packed block (its ``values`` as the peer will see them)."""
    block = pack(comm.xp, idx, val, wire, 0, n)
    if wire.compact:
        head = comm.xp.asarray([block.count, int(block.buf.shape[0])], dtype=np.int64)
        comm.exchange([(peer, head)], [], op_name + ".counts").wait()
    comm.exchange([(peer, block.buf)], [], op_name).wait()
    return block


def receive_block(comm: Any, peer: int, k: int, index_dtype: Any, dtype: Any, wire: Wire,
                  op_name: str) -> tuple[Any, Any]:
    """Receive what :func:`send_block` sent: k padded pairs (coo) or the real ones (compact)."""
    xp = comm.xp
    count, nbytes = k, coo_nbytes(k, (), index_dtype, dtype, wire)
    if wire.compact:
        head = xp.empty(2, dtype=np.int64)
        comm.exchange([], [(peer, head)], op_name + ".counts").wait()
        count, nbytes = (int(v) for v in to_host(head))
    buf = xp.empty(nbytes, dtype=np.uint8)
    comm.exchange([], [(peer, buf)], op_name).wait()
    return unpack(buf, count, (), index_dtype, dtype, wire)


def broadcast_block(comm: Any, block: tuple, k: int, n: int, wire: Wire, op_name: str
                    ) -> tuple[Any, Any, Any]:
    """Broadcast rank 0's padded block packed; return (indices, values, rank 0's rounding
    errors or None). Every rank, rank 0 included, reads the values as they travelled."""
    xp, root = comm.xp, comm.rank == 0
    idx_t, val_t = block[0].dtype, block[1].dtype
    real = real_entries(xp, *block, n) if root and (wire.compact or wire.rounds(val_t)) \
        else block
    packed = pack(xp, *(real if wire.compact else block), wire, 0, n) if root else None
    count, nbytes = k, coo_nbytes(k, (), idx_t, val_t, wire)
    if wire.compact:
        head = xp.asarray([packed.count, int(packed.buf.shape[0])] if root else [0, 0],
                          dtype=np.int64)
        count, nbytes = (int(v) for v in comm.run_fetch(
            "broadcast", head, head, 0, result=head, op_name=op_name + ".counts"))
    buf = packed.buf if root else xp.empty(nbytes, dtype=np.uint8)
    comm.broadcast(buf, buf, 0, op_name=op_name).wait()
    res_i, res_v = unpack(buf, count, (), idx_t, val_t, wire)
    if not wire.compact:
        res_i, res_v = real_entries(xp, res_i, res_v, n)
    error = rounding_error(real[1], res_v) if root and wire.rounds(val_t) else None
    return res_i, res_v, error


def allgather_padded(comm: Any, idx: Any, val: Any, blocks: np.ndarray, n: int, wire: Wire,
                     op_name: str) -> tuple[Any, Any]:
    """Allgather balanced blocks (sizes ``blocks``, known everywhere) as one native allgather of
    equal packed buffers (NCCL has no allgatherv): coo pads to ``max(blocks)`` pairs with the
    sentinel index n; compact allgathers the encoded sizes first and pads the bytes."""
    xp, p = comm.xp, comm.size
    if wire.compact:
        block = pack(xp, idx, val, wire, 0, n)
        sizes = comm.allgather_counts(int(block.buf.shape[0]), op_name + ".counts")
        counts = blocks
    else:
        width = int(blocks.max())
        pad_i, pad_v = xp.full(width, n, dtype=idx.dtype), xp.zeros(width, dtype=val.dtype)
        pad_i[:idx.shape[0]], pad_v[:val.shape[0]] = idx, val
        block = pack(xp, pad_i, pad_v, wire)
        sizes, counts = [int(block.buf.shape[0])] * p, [width] * p
    stride = (int(max(sizes)) + 7) // 8 * 8
    send = xp.zeros(stride, dtype=np.uint8)
    send[:block.buf.shape[0]] = block.buf
    recv = xp.empty(p * stride, dtype=np.uint8)
    comm.allgather(send, recv, op_name).wait()
    parts = [unpack(recv[j * stride:j * stride + int(sizes[j])], int(counts[j]), (), idx.dtype,
                    val.dtype, wire) for j in range(p)]
    keep = [(a[:int(blocks[j])], b[:int(blocks[j])]) for j, (a, b) in enumerate(parts)]
    return xp.concatenate([a for a, _ in keep]), xp.concatenate([b for _, b in keep])


def choose_wire(request: str, values: str | None, p: int, k: int, n: int,
                profile: Any) -> Wire:
    """The wire of a top-k call: ``auto`` takes compact when the index bytes it saves on about
    k received entries per rank (density k/n), priced at beta, beat coding them twice."""
    if request == "coo" or p == 1:
        return Wire(False, values)
    if request == "compact":
        return Wire(True, values)
    index_bytes = 4 if n < 2**31 else 8
    if not could_pay(profile, index_bytes):
        return Wire(False, values)
    coded = expected_index_nbytes(k, n, index_bytes)

    def cost_of(wire: Wire) -> tuple[int, int]:
        return (coded if wire.compact else k * index_bytes), 2 * k

    return Wire(prefer_compact(cost_of, values, profile), values)
