"""Ok-Topk's communication phases: split-and-reduce, balance, and the final allgather.

Indices and values travel together, one packed message per peer and transfer (int32 + fp32: 8
bytes per pair on the coo wire; :mod:`cupycoll.wire`); messages between one pair of ranks
arrive in the order posted. Each phase books its traffic under
its own operation name so tests and benchmarks can read the volume per phase:
``oktopk.reduce`` (+ ``.counts``), ``oktopk.balance`` (+ ``.counts``), ``oktopk.allgather``
(over several nodes: ``oktopk.allgather.node``, ``.leaders``, ``.bcast``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .._types import to_host
from ..primitives import scatter_reduce
from ..wire._exchange import exchange_sizes, gather_entries, post_blocks
from ..wire._pack import COO, Packed, Wire, coo_nbytes, pack, unpack
from ..wire._values import rounding_error
from ._oktopk_nodes import allgather_nodes, two_level
from ._wire import allgather_padded

__all__ = ["split_and_reduce", "balance", "block_sizes", "allgather_blocks", "THROTTLE"]

#: steps per bucket of the rotated reduce-scatter (the reference code's ``throttle``).
THROTTLE = 4


def split_and_reduce(comm: Any, idx: Any, val: Any, bounds: np.ndarray, wire: Wire = COO
                     ) -> tuple[Any, int, Any]:
    """Send each region's selected pairs to its owner; return (this rank's dense region sum, B_r,
    the rounding errors of this rank's sent values or None).

    Schedule: at step s = 0..P-1 rank r sends region (r+s) % P to rank (r+s) % P and receives
    from (r-s) % P (step 0 is local), so no two senders target one receiver in a step. Steps go
    in buckets of ``min(THROTTLE, P)``: bucket b's transfers are posted, then bucket b-1's chunks
    are scatter-added into the region while they are in flight (on NCCL on a side stream that
    waits for bucket b-1's event, see ``Communicator.overlap``). The region sum adds sources in
    schedule order (r, r-1, r-2, ...), so it is deterministic. Each chunk travels as one packed
    block, its indices rebased to the region (compact: encoded over the region).
    """
    xp, p, r = comm.xp, comm.size, comm.rank
    cuts_d = xp.searchsorted(idx, xp.asarray(bounds.astype(idx.dtype)))
    sizes, blocks = xp.diff(cuts_d).astype(np.int64), {}

    def chunk(dst: int, cuts: Sequence[int]) -> tuple[Any, Any]:
        a, b = int(cuts[dst]), int(cuts[dst + 1])
        return idx[a:b] - idx.dtype.type(bounds[dst]), val[a:b]

    def packed(dst: int, cuts: Sequence[int]) -> Packed:
        return pack(xp, *chunk(dst, cuts), wire, 0, int(bounds[dst + 1] - bounds[dst]))

    if wire.compact:  # encoded sizes must be known before the size exchange
        host_cuts = to_host(cuts_d).tolist()
        sizes = np.diff(host_cuts)
        blocks = {d: packed(d, host_cuts) for d in range(p) if d != r and sizes[d]}
    send_counts, recv_counts, recv_bytes = exchange_sizes(
        comm, sizes, blocks, wire, (), idx.dtype, val.dtype, "oktopk.reduce.counts")
    cuts = np.concatenate([[0], np.cumsum(send_counts)])
    if not wire.compact:
        blocks = {d: packed(d, cuts) for d in range(p) if d != r and send_counts[d]}
    errors = None
    if wire.rounds(val.dtype):
        errors = xp.zeros_like(val)
        for d, block in blocks.items():
            a, b = int(cuts[d]), int(cuts[d + 1])
            errors[a:b] = rounding_error(val[a:b], block.values)
    lo, hi = int(bounds[r]), int(bounds[r + 1])
    red = xp.zeros(hi - lo, dtype=val.dtype)

    def arrival(slot: Any, count: int) -> Callable[[], tuple[Any, Any]]:
        return lambda: unpack(slot, count, (), idx.dtype, val.dtype, wire)

    throttle = min(THROTTLE, p)
    overlap = comm.overlap()  # NCCL: the scatter-adds on a side stream, overlapping transfers
    pending: list = []
    previous = None
    for first in range(0, p, throttle):
        steps = range(first, min(first + throttle, p))
        arriving: list = []
        if first == 0:  # own values copied: later sends read ``val`` while this chunk is added
            ci, cv = chunk(r, cuts)
            arriving.append((ci, cv.copy()))
        sends = {(r + s) % p: blocks[(r + s) % p] for s in steps if (r + s) % p in blocks}
        sources = [(r - s) % p for s in steps if s]
        work, slots = post_blocks(comm, sends, sources, recv_counts, recv_bytes, "oktopk.reduce")
        arriving += [arrival(slots[src], int(recv_counts[src])) for src in sources if src in slots]
        overlap.after(previous, lambda chunks=pending: _add(red, chunks))
        previous, pending = work, arriving
    overlap.after(previous, lambda: _add(red, pending))
    overlap.join()
    return red, lo, errors


def _add(red: Any, chunks: list) -> None:
    """Scatter-add chunks of sorted selections, rebased into the region, in order (a chunk
    still packed is unpacked first)."""
    for item in chunks:
        ci, cv = item() if callable(item) else item
        scatter_reduce(red, ci, cv, checked=False)


def block_sizes(total: int, p: int) -> np.ndarray:
    """Balanced block sizes: ``total // p`` each, plus one for the first ``total % p`` ranks."""
    return np.array([total // p + (j < total % p) for j in range(p)], dtype=np.int64)


def _overlap(a0: int, a1: int, b0: int, b1: int) -> tuple[int, int]:
    return max(a0, b0), min(a1, b1)


def balance(comm: Any, idx: Any, val: Any, counts: Sequence[int],
            wire: Wire = COO, n: int = 2**62) -> tuple[Any, Any, np.ndarray]:
    """Re-cut the rank-ordered concatenation of every rank's selection into balanced blocks.

    Rank r owns slice ``[o_r, o_r + c_r)`` of the concatenation; it sends the overlap of that
    slice with block j's range to rank j (one packed message) and receives the overlaps of every
    rank's slice with its own block (compact: encoded over ``[0, n)``). Piece sizes follow from the counts; on the compact wire the
    pieces' byte lengths travel first (``oktopk.balance.sizes``). Returns (block indices, block
    values, block sizes of every rank).
    """
    xp, p, r = comm.xp, comm.size, comm.rank
    counts = np.asarray(counts, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    blocks = block_sizes(int(offsets[-1]), p)
    starts = np.concatenate([[0], np.cumsum(blocks)])
    mine0, mine1 = int(offsets[r]), int(offsets[r + 1])
    blk0, blk1 = int(starts[r]), int(starts[r + 1])
    out_i = xp.empty(blk1 - blk0, dtype=idx.dtype)
    out_v = xp.empty(blk1 - blk0, dtype=val.dtype)
    sends, pieces = {}, {}
    for j in range(p):
        a, b = _overlap(mine0, mine1, int(starts[j]), int(starts[j + 1]))
        if a < b and j == r:
            out_i[a - blk0:b - blk0] = idx[a - mine0:b - mine0]
            out_v[a - blk0:b - blk0] = val[a - mine0:b - mine0]
        elif a < b:
            sends[j] = pack(xp, idx[a - mine0:b - mine0], val[a - mine0:b - mine0], wire, 0, n)
        a, b = _overlap(int(offsets[j]), int(offsets[j + 1]), blk0, blk1)
        if a < b and j != r:
            pieces[j] = (a - blk0, b - blk0)
    recv_counts = [pieces[j][1] - pieces[j][0] if j in pieces else 0 for j in range(p)]
    if wire.compact:
        recv_bytes = _piece_bytes(comm, sends, pieces)
    else:
        recv_bytes = [coo_nbytes(c, (), idx.dtype, val.dtype, wire) for c in recv_counts]
    work, slots = post_blocks(comm, sends, sorted(pieces), recv_counts, recv_bytes,
                              "oktopk.balance")
    comm.stream_order(work)
    for j, (a, b) in pieces.items():
        out_i[a:b], out_v[a:b] = unpack(slots[j], b - a, (), idx.dtype, val.dtype, wire)
    return out_i, out_v, blocks


def _piece_bytes(comm: Any, sends: dict, pieces: dict) -> list[int]:
    """Exchange the byte lengths of the balance pieces (one int64 per piece); host list."""
    xp, p = comm.xp, comm.size
    mine = xp.asarray([int(sends[j].buf.shape[0]) if j in sends else 0 for j in range(p)],
                      dtype=np.int64)
    got = xp.zeros(p, dtype=np.int64)
    work = comm.exchange([(j, mine[j:j + 1]) for j in sends],
                         [(j, got[j:j + 1]) for j in sorted(pieces)], "oktopk.balance.sizes")
    return [int(v) for v in comm.fetch(work, got)]


def allgather_blocks(comm: Any, idx: Any, val: Any, blocks: np.ndarray, n: int, *,
                     padded: bool, wire: Wire = COO, topo: Any = None) -> tuple[Any, Any]:
    """Allgather balanced blocks in rank order, one packed message per peer (the counts are
    known: no count exchange on the coo wire; compact: (count, bytes) pairs first).

    ``topo`` (a :class:`~cupycoll.comm._topology.Topology`) spanning several nodes: in two
    levels through node leaders (:mod:`._oktopk_nodes`; point-to-point only, so also where
    ``padded`` would be needed).

    ``padded``: one native allgather of equal packed buffers (blocks padded to ``ceil(T/P)``
    entries with the sentinel index n, or the encoded bytes padded) -- what NCCL, which has no
    allgatherv, needs; the blocks differ by at most one, so at most P-1 pads travel.
    """
    if topo is not None and two_level(topo, wire):
        return allgather_nodes(comm, idx, val, blocks, n, topo, wire)
    if padded:
        return allgather_padded(comm, idx, val, blocks, n, wire, "oktopk.allgather")
    parts, _ = gather_entries(comm, idx, val, "oktopk.allgather", wire, 0, n, counts=blocks)
    xp = comm.xp
    return xp.concatenate([a for a, _ in parts]), xp.concatenate([b for _, b in parts])
