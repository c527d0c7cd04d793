"""Transfers of packed entry blocks over the Communicator's verbs (one message per peer).

Sizes first, then one exchange round of packed blocks:

- ``coo`` wire: a block's byte length follows from its entry count, so only counts travel
  (one int64 per peer, as before packing);
- ``compact`` wire: a block's length depends on its encoded index stream, so (count, bytes)
  pairs travel (two int64 per peer), booked under the same ``.counts`` operation name.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._types import to_host
from ._pack import COO, Packed, Wire, coo_nbytes, pack, receive_blocks, unpack

__all__ = ["gather_entries", "exchange_sizes", "post_blocks", "size_words"]


def size_words(wire: Wire) -> int:
    """int64 words of one size record: the count, plus the byte length for compact."""
    return 2 if wire.compact else 1


def _nbytes(counts: Sequence[int], row: tuple, index_dtype: Any, dtype: Any,
            wire: Wire) -> list[int]:
    return [coo_nbytes(int(c), row, index_dtype, dtype, wire) for c in counts]


def gather_entries(comm: Any, idx: Any, val: Any, op_name: str, wire: Wire = COO,
                   lo: int = 0, hi: int = 0, counts: Any = None
                   ) -> tuple[list[tuple[Any, Any]], np.ndarray]:
    """Allgatherv sorted unique ``idx`` (in ``[lo, hi)``) and rows ``val`` as packed blocks.

    Sizes first (``op_name.counts``; skipped on the coo wire when the caller knows every
    rank's ``counts``), then ONE exchange round, one message per peer with entries, each into
    a buffer of its own. Returns every rank's (indices, rows) in rank order (a list the caller
    may empty as it goes), and the counts. This rank's
    part holds its values as the others receive them (rounded when the wire rounds), so every
    rank combines the same numbers.
    """
    xp, rank, p = comm.xp, comm.rank, comm.size
    row, count = tuple(val.shape[1:]), int(idx.shape[0])
    block = pack(xp, idx, val, wire, lo, hi, comm.send_buffer) if count and p > 1 else \
        Packed(None, count, val)
    if wire.compact:
        sizes = xp.asarray([count, 0 if block.buf is None else int(block.buf.shape[0])],
                           dtype=np.int64)
        recv = xp.empty(2 * p, dtype=np.int64)
        both = comm.run_fetch("allgather", sizes, recv, result=recv,
                              op_name=op_name + ".counts").reshape(p, 2)
        counts, nbytes = both[:, 0].copy(), both[:, 1].tolist()
    else:
        if counts is None:
            counts = comm.allgather_counts(count, op_name + ".counts")
        counts = np.asarray(counts, dtype=np.int64)
        nbytes = _nbytes(counts, row, idx.dtype, val.dtype, wire)
    peers = [(rank + s) % p for s in range(1, p)]
    # a buffer per peer: a caller that copies the blocks out one by one frees each as it goes
    slots = [xp.empty(nbytes[r] if r != rank else 0, dtype=np.uint8) for r in range(p)]
    sends = [(r, block.buf) for r in peers] if count else []
    recvs = [(r, slots[r]) for r in peers if counts[r]]
    comm.exchange(sends, recvs, op_name).wait()  # the one wait the result needs
    if block.buf is not None:
        comm.release_send_buffer(block.buf)
    parts = []
    for r in range(p):
        if r == rank:
            parts.append((idx, block.values))
        elif counts[r]:
            parts.append(unpack(slots[r], int(counts[r]), row, idx.dtype, val.dtype, wire))
        else:
            parts.append((idx[:0], xp.empty((0,) + row, dtype=val.dtype)))
    return parts, counts


def exchange_sizes(comm: Any, counts: Any, blocks: dict[int, Packed], wire: Wire,
                   row: tuple, index_dtype: Any, dtype: Any, op_name: str
                   ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Tell every peer the size of the block it gets; learn the sizes of the blocks coming.

    ``counts`` (P int64, device or host) are the entries this rank sends to each rank;
    ``blocks`` the packed blocks by destination (compact: their byte lengths travel too).
    Returns (sent counts, received counts, received byte lengths), host.
    """
    if not wire.compact:
        sent, received = comm.alltoall_device_counts(counts, op_name)
        return sent, received, _nbytes(received, row, index_dtype, dtype, wire)
    xp, p, rank = comm.xp, comm.size, comm.rank
    sent = np.asarray(to_host(counts), dtype=np.int64).reshape(p)
    mine = np.zeros((p, 2), dtype=np.int64)
    mine[:, 0] = sent
    for dst, block in blocks.items():
        mine[dst, 1] = int(block.buf.shape[0])
    both = xp.asarray(np.concatenate([mine.reshape(-1), np.zeros(2 * p, np.int64)]))
    out = both[2 * p:].reshape(p, 2)
    out[rank] = both[2 * rank:2 * rank + 2]
    peers = [r for r in range(p) if r != rank]
    work = comm.exchange([(r, both[2 * r:2 * r + 2]) for r in peers],
                         [(r, out[r]) for r in peers], op_name)
    got = comm.fetch(work, out)
    return sent, got[:, 0].copy(), got[:, 1].tolist()


def post_blocks(comm: Any, sends: dict[int, Packed], sources: Sequence[int],
                recv_counts: Sequence[int], recv_bytes: Sequence[int], op_name: str
                ) -> tuple[Any, dict[int, Any]]:
    """Post one exchange: each packed block to its peer, each expected block from ``sources``.

    Returns (the Work, {source: its receive slot}); unpack the slots once the Work is done.
    """
    xp = comm.xp
    live = [r for r in sources if int(recv_counts[r])]
    _, slots = receive_blocks(xp, [int(recv_bytes[r]) for r in live])
    slot_of = dict(zip(live, slots))
    work = comm.exchange([(dst, b.buf) for dst, b in sends.items() if b.count],
                         [(r, slot_of[r]) for r in live], op_name)
    return work, slot_of
