"""Ok-Topk's communication phases: split-and-reduce, balance, and the final allgather.

Indices and values travel as separate messages (int32 + fp32: 8 bytes per pair), indices first;
messages between one pair of ranks arrive in the order posted. Each phase books its traffic under
its own operation name so tests and benchmarks can read the volume per phase:
``oktopk.reduce`` (+ ``.counts``), ``oktopk.balance`` (+ ``.counts``), ``oktopk.allgather``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..primitives import scatter_reduce

__all__ = ["split_and_reduce", "balance", "block_sizes", "allgather_blocks", "THROTTLE"]

#: steps per bucket of the rotated reduce-scatter (the reference code's ``throttle``).
THROTTLE = 4


def split_and_reduce(comm: Any, idx: Any, val: Any, bounds: np.ndarray) -> tuple[Any, int]:
    """Send each region's selected pairs to its owner; return (this rank's dense region sum, B_r).

    Schedule: at step s = 0..P-1 rank r sends region (r+s) % P to rank (r+s) % P and receives
    from (r-s) % P (step 0 is local), so no two senders target one receiver in a step. Steps go
    in buckets of ``min(THROTTLE, P)``: bucket b's transfers are posted, then bucket b-1's chunks
    are scatter-added into the region while they are in flight (on NCCL on a side stream that
    waits for bucket b-1's event, see ``Communicator.overlap``). The region sum adds sources in
    schedule order (r, r-1, r-2, ...), so it is deterministic.
    """
    xp, p, r = comm.xp, comm.size, comm.rank
    cuts_d = xp.searchsorted(idx, xp.asarray(bounds.astype(idx.dtype)))
    send_counts, recv_counts = comm.alltoall_device_counts(
        xp.diff(cuts_d).astype(np.int64), "oktopk.reduce.counts")  # one host read for both
    cuts = np.concatenate([[0], np.cumsum(send_counts)])
    lo, hi = int(bounds[r]), int(bounds[r + 1])
    red = xp.zeros(hi - lo, dtype=val.dtype)

    def chunk(dst: int) -> tuple[Any, Any]:
        a, b = int(cuts[dst]), int(cuts[dst + 1])
        return idx[a:b] - idx.dtype.type(bounds[dst]), val[a:b]

    throttle = min(THROTTLE, p)
    overlap = comm.overlap()  # NCCL: the scatter-adds on a side stream, overlapping transfers
    pending: list = []
    previous = None
    for first in range(0, p, throttle):
        sends, recvs, arriving = [], [], []
        for s in range(first, min(first + throttle, p)):
            dst, src = (r + s) % p, (r - s) % p
            if s == 0:  # own values copied: later sends read ``val`` while this chunk is added
                ci, cv = chunk(r)
                arriving.append((ci, cv.copy()))
                continue
            if send_counts[dst]:
                ci, cv = chunk(dst)
                sends += [(dst, ci), (dst, cv)]
            if recv_counts[src]:
                bi = xp.empty(int(recv_counts[src]), dtype=idx.dtype)
                bv = xp.empty(int(recv_counts[src]), dtype=val.dtype)
                recvs += [(src, bi), (src, bv)]
                arriving.append((bi, bv))
        work = comm.exchange(sends, recvs, "oktopk.reduce")
        overlap.after(previous, lambda chunks=pending: _add(red, chunks))
        previous, pending = work, arriving
    overlap.after(previous, lambda: _add(red, pending))
    overlap.join()
    return red, lo


def _add(red: Any, chunks: list) -> None:
    """Scatter-add chunks of sorted selections, rebased into the region, in order."""
    for ci, cv in chunks:
        scatter_reduce(red, ci, cv, checked=False)


def block_sizes(total: int, p: int) -> np.ndarray:
    """Balanced block sizes: ``total // p`` each, plus one for the first ``total % p`` ranks."""
    return np.array([total // p + (j < total % p) for j in range(p)], dtype=np.int64)


def _overlap(a0: int, a1: int, b0: int, b1: int) -> tuple[int, int]:
    return max(a0, b0), min(a1, b1)


def balance(comm: Any, idx: Any, val: Any,
            counts: Sequence[int]) -> tuple[Any, Any, np.ndarray]:
    """Re-cut the rank-ordered concatenation of every rank's selection into balanced blocks.

    Rank r owns slice ``[o_r, o_r + c_r)`` of the concatenation; it sends the overlap of that
    slice with block j's range to rank j and receives the overlaps of every rank's slice with its
    own block. Returns (block indices, block values, block sizes of every rank).
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
    sends, recvs = [], []
    for j in range(p):
        a, b = _overlap(mine0, mine1, int(starts[j]), int(starts[j + 1]))
        if a < b and j == r:
            out_i[a - blk0:b - blk0] = idx[a - mine0:b - mine0]
            out_v[a - blk0:b - blk0] = val[a - mine0:b - mine0]
        elif a < b:
            sends += [(j, idx[a - mine0:b - mine0]), (j, val[a - mine0:b - mine0])]
        a, b = _overlap(int(offsets[j]), int(offsets[j + 1]), blk0, blk1)
        if a < b and j != r:
            recvs += [(j, out_i[a - blk0:b - blk0]), (j, out_v[a - blk0:b - blk0])]
    comm.stream_order(comm.exchange(sends, recvs, "oktopk.balance"))
    return out_i, out_v, blocks


def allgather_blocks(comm: Any, idx: Any, val: Any, blocks: np.ndarray, n: int, *,
                     padded: bool) -> tuple[Any, Any]:
    """Allgather balanced blocks in rank order (counts are known: no count exchange).

    ``padded``: use a plain allgather of blocks padded to ``ceil(T/P)`` entries with the
    sentinel index n (value 0), dropped after the gather -- what NCCL, which has no allgatherv,
    needs; the blocks differ by at most one, so at most P-1 pads travel.
    """
    if not padded:
        all_i, _ = comm.allgatherv(idx, counts=blocks, op_name="oktopk.allgather")
        all_v, _ = comm.allgatherv(val, counts=blocks, op_name="oktopk.allgather")
        return all_i, all_v
    xp, p = comm.xp, comm.size
    width = int(blocks.max())
    send_i = xp.full(width, n, dtype=idx.dtype)
    send_v = xp.zeros(width, dtype=val.dtype)
    send_i[:idx.shape[0]] = idx
    send_v[:val.shape[0]] = val
    all_i = xp.empty(p * width, dtype=idx.dtype)
    all_v = xp.empty(p * width, dtype=val.dtype)
    comm.stream_order(comm.allgather(send_i, all_i, "oktopk.allgather"))
    comm.allgather(send_v, all_v, "oktopk.allgather").wait()
    # the pads' places are known on the host: gather the rest (a boolean mask would read the
    # device to learn the result's size)
    keep = xp.asarray(np.concatenate([j * width + np.arange(blocks[j]) for j in range(p)]))
    return all_i[keep], all_v[keep]
