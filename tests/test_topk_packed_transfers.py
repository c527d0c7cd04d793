"""Top-k packed transfers (``cupycoll/topk/_wire.py``) between ranks simulated by threads in
this process: what a rank receives is what its peer sent (padding
stripped, values rounded to nearest even where the wire rounds them: numpy reference), under
the documented operation names (``<op>.counts`` first on the compact wire only) and sizes."""

from __future__ import annotations

import numpy as np
import pytest

from cupycoll.topk import _wire
from cupycoll.wire._pack import Wire
from tests._threaded import on_ranks as _on_ranks


def _bfloat16(v: np.ndarray) -> np.ndarray:
    """float32-representable values rounded to bfloat16, nearest even (no NaN/inf here)."""
    bits = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def _travelled(val: np.ndarray, values: str | None) -> np.ndarray:
    """What the receiver sees of ``val`` (the reference rounding, widened back)."""
    if values is None or val.dtype == np.float16:
        return val
    rounded = _bfloat16(val) if values == "bfloat16" else val.astype(np.float16)
    return rounded.astype(val.dtype)


WIRES = [Wire(False, None), Wire(True, None), Wire(False, "bfloat16"), Wire(True, "float16"),
         Wire(True, "bfloat16")]
N = 1000


def _entries(seed: int, count: int, itype, dtype):
    """``count`` sorted unique indices in [0, N) with index 0 and N-1 among them, and values
    exact in float32 (so float64 values round alike however they are narrowed)."""
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(np.arange(1, N - 1), count - 2, replace=False))
    idx = np.concatenate([[0], idx, [N - 1]]).astype(itype)
    val = (rng.standard_normal(count).astype(np.float32) * 8).astype(dtype)
    return idx, val


def _padded(idx, val, k):
    """k pairs: the entries, then the sentinel index N with zero values."""
    pi, pv = np.full(k, N, idx.dtype), np.zeros(k, val.dtype)
    pi[:idx.size], pv[:val.size] = idx, val
    return pi, pv


def _bits(a):
    return np.asarray(a).view(f"u{np.asarray(a).dtype.itemsize}").tolist()


@pytest.mark.parametrize("wire", WIRES, ids=str)
@pytest.mark.parametrize("itype, dtype", [(np.int32, np.float32), (np.int64, np.float64),
                                          (np.int32, np.float16)])
def test_send_block_arrives_as_sent(wire, itype, dtype):
    """coo: k padded pairs travel; compact: only the real entries, after a (count, bytes)
    header booked as ``<op>.counts``; the sender gets back the values as the peer sees them."""
    k, idx, val = 12, *_entries(1, 9, itype, dtype)
    sent_i, sent_v = (idx, val) if wire.compact else _padded(idx, val, k)

    def fn(comm):
        if comm.rank == 0:
            return _wire.send_block(comm, 1, sent_i, sent_v, wire, N, "gtopk.tree")
        return _wire.receive_block(comm, 0, k, np.dtype(itype), np.dtype(dtype), wire,
                                   "gtopk.tree")

    (block, log0), ((ri, rv), log1) = _on_ranks(2, fn)
    want_v = _travelled(sent_v, wire.values)
    assert ri.dtype == itype and _bits(ri) == _bits(sent_i)
    assert rv.dtype == dtype and _bits(rv) == _bits(want_v)
    assert block.count == sent_i.size and _bits(block.values) == _bits(want_v)
    wire_bytes = 2 if wire.rounds(dtype) else np.dtype(dtype).itemsize
    if wire.compact:
        assert [name for name, _ in log1] == ["gtopk.tree.counts", "gtopk.tree"]
        assert log1[0][1] == 16 and log1[1][1] == block.buf.nbytes
    else:
        assert log1 == [("gtopk.tree", k * (np.dtype(itype).itemsize + wire_bytes))]
    assert log0 == []  # sends are booked by the receiver


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("wire", WIRES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_broadcast_block_gives_every_rank_the_real_entries(p, wire, dtype):
    """Rank 0's block of k pairs (sentinel padded): every rank, rank 0 included, gets the real
    entries with the values as they travelled; rank 0 alone gets its rounding errors."""
    k, idx, val = 10, *_entries(2, 7, np.int32, dtype)
    block = _padded(idx, val, k)

    def fn(comm):
        mine = block if comm.rank == 0 else (np.full(k, -1, np.int32), np.zeros(k, dtype))
        return _wire.broadcast_block(comm, mine, k, N, wire, "gtopk.bcast")

    want_v = _travelled(val, wire.values)
    for r, ((ri, rv, err), log) in enumerate(_on_ranks(p, fn)):
        assert _bits(ri) == _bits(idx) and rv.dtype == dtype and _bits(rv) == _bits(want_v), r
        if r == 0 and wire.rounds(dtype):
            assert _bits(err) == _bits(val - want_v)
        else:
            assert err is None, r
        names = [name for name, _ in log]
        assert names == (["gtopk.bcast.counts", "gtopk.bcast"] if wire.compact
                         else ["gtopk.bcast"]), (r, names)
        if not wire.compact:
            entry = 4 + (2 if wire.rounds(dtype) else np.dtype(dtype).itemsize)
            assert log[0][1] == k * entry


@pytest.mark.parametrize("blocks", [(3, 0, 5), (4, 4), (1, 6, 2, 0)])
@pytest.mark.parametrize("wire", WIRES, ids=str)
@pytest.mark.parametrize("itype, dtype", [(np.int32, np.float32), (np.int64, np.float64)])
def test_allgather_padded_concatenates_every_ranks_block(blocks, wire, itype, dtype):
    """Blocks of known sizes, one native allgather of equal buffers: every rank gets all blocks'
    entries in rank order; coo pads to max(blocks) pairs, compact gathers the coded sizes first
    (``<op>.counts``); buffers are 8-byte aligned."""
    p = len(blocks)
    parts = [_entries(10 + r, max(b, 2), itype, dtype) for r, b in enumerate(blocks)]
    parts = [(i[:b], v[:b]) for (i, v), b in zip(parts, blocks)]
    sizes = np.array(blocks, np.int64)

    def fn(comm):
        return _wire.allgather_padded(comm, *parts[comm.rank], sizes, N, wire, "oktopk.ag")

    want_i = np.concatenate([i for i, _ in parts])
    want_v = _travelled(np.concatenate([v for _, v in parts]), wire.values)
    entry = np.dtype(itype).itemsize + (2 if wire.rounds(dtype) else np.dtype(dtype).itemsize)
    for r, ((ri, rv), log) in enumerate(_on_ranks(p, fn)):
        assert ri.dtype == itype and _bits(ri) == _bits(want_i) and rv.dtype == dtype, r
        assert _bits(rv) == _bits(want_v), r
        names = [name for name, _ in log]
        assert names == (["oktopk.ag.counts", "oktopk.ag"] if wire.compact else ["oktopk.ag"])
        if not wire.compact:
            assert log[0][1] == p * (-(-max(blocks) * entry // 8) * 8)
        assert log[-1][1] % (8 * p) == 0


def test_real_entries_strip_the_sentinel_padding():
    idx, val = np.array([0, 4, 9, 10, 10], np.int32), np.arange(5.0)
    ri, rv = _wire.real_entries(np, idx, val, 10)
    assert ri.tolist() == [0, 4, 9] and rv.tolist() == [0.0, 1.0, 2.0]
    ri, rv = _wire.real_entries(np, idx[:3], val[:3], 10)
    assert ri.tolist() == [0, 4, 9]
