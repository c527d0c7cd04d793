"""``gtopk``: tree reduction keeping the top-k of every pairwise merge, then a broadcast; any P.

What is selected where:

1. Each rank selects locally (default :class:`Exact`: its top-k; a selector returning more than k
   entries is cut to the top-k of its selection) and packs them into a block of exactly k
   (index, value) pairs, padded with the sentinel index n and value 0.
2. Fold: with p2 the largest power of two <= P, rank r >= p2 sends its block to r - p2, which
   merges (sum) and keeps the top-k of the union.
3. log2(p2) rounds among ranks < p2: in round j, rank r with r % 2^(j+1) == 2^j sends its block
   to r - 2^j, which merges its own block with it (own first, so sums are in a fixed order) and
   keeps the top-k of the union (ties to the lower index). Pairs dropped by a merge are gone.
4. Rank 0 broadcasts its block: that is the result (about k entries, sums of the surviving
   contributions), identical on every rank. Every block travels packed (indices and values in
   one message); on the compact wire only its real entries, encoded, after an 8-byte (count,
   bytes) header; with ``wire_values`` each sender keeps the rounding errors of the values it
   sent that reached the result (and rank 0 those of the broadcast) as remainders.
5. Feedback: a contribution of rank A at index i is in the result iff i survived every merge on
   A's path to the root. Each merging rank lists, per merge, the dropped indices that are in the
   final result anyway (they came back through another subtree; usually none), and one allgatherv
   (``gtopk.feedback``) tells every rank which of its result indices its own value did not reach.
   ``included`` = (selection ∩ result) minus those, so the residual keeps every dropped value.

Cost (per rank): blocks are fixed at k pairs, so no counts are exchanged in the tree; the root
receives 2k words per round (fold + log2 p2 rounds), every other rank at most that plus the
broadcast's 2k: at most 4k*ceil(log2 P) words (the paper's 4k log P), latency 2 log2 P. The
feedback adds a count allgather (P int64) and the re-entered indices (8 bytes each, usually 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._result import SparseResult
from .._types import distinct
from ..primitives import merge_sorted, topk_abs
from .._registry import register
from ._common import (WordCost, TopkOutcome, TopkState, index_dtype, log2_ceil, sorted_member,
                      to_host)
from ..wire._pack import COO, Wire
from ..wire._values import rounding_error
from ._wire import broadcast_block, real_entries, receive_block, send_block
from .selectors import Exact

__all__ = ["gtopk", "cost"]


def cost(p: int, k: int, n: int) -> WordCost:
    """Words received per rank (upper bound) and latency of ``gtopk`` on p ranks."""
    return WordCost(4.0 * k * log2_ceil(p), 2.0 * log2_ceil(p))


def _pad(xp: Any, idx: Any, val: Any, k: int, n: int) -> tuple[Any, Any]:
    """Return a block of exactly k pairs: (idx, val) then sentinel index n with value 0."""
    bi = xp.full(k, n, dtype=idx.dtype)
    bv = xp.zeros(k, dtype=val.dtype)
    bi[:idx.shape[0]] = idx
    bv[:val.shape[0]] = val
    return bi, bv


def _merge_keep(xp: Any, own: tuple, got: tuple, k: int) -> tuple[tuple, Any]:
    """Merge two sorted unique sets (own first) by sum; keep the top-k; return (kept, dropped)."""
    ui, uv = merge_sorted([own, got])
    if ui.shape[0] <= k:
        return (ui, uv), ui[:0]
    pos, kv = topk_abs(uv, k)
    keep = xp.zeros(ui.shape[0], dtype=bool)
    keep[pos] = True
    return (ui[pos], kv), ui[~keep]


def _tree(comm: Any, block: tuple, k: int, n: int, wire: Wire
          ) -> tuple[tuple, list, tuple | None]:
    """Run the fold and the pairwise rounds; return (this rank's block, [(node code, dropped)],
    the (indices, rounding errors) of the block this rank sent, if it rounded one).

    Node codes: 0 = the fold merge, j + 1 = the merge of round j.
    """
    xp, p, r = comm.xp, comm.size, comm.rank
    p2 = 1 << (p.bit_length() - 1)
    drops: list = []
    idx_t, val_t = block[0].dtype, block[1].dtype

    def send(peer: int, blk: tuple) -> tuple | None:
        real = real_entries(xp, *blk, n) if wire.compact or wire.rounds(val_t) else blk
        packed = send_block(comm, peer, *(real if wire.compact else blk), wire, n,
                            "gtopk.reduce")
        if not wire.rounds(val_t):
            return None
        return real[0], rounding_error(real[1], packed.values[:real[0].shape[0]])

    def receive_merge(peer: int, blk: tuple, code: int) -> tuple:
        got = receive_block(comm, peer, k, idx_t, val_t, wire, "gtopk.reduce")
        kept, dropped = _merge_keep(xp, real_entries(xp, *blk, n),
                                    got if wire.compact else real_entries(xp, *got, n), k)
        drops.append((code, dropped))
        return _pad(xp, kept[0], kept[1], k, n)

    if r >= p2:
        return block, drops, send(r - p2, block)
    if r + p2 < p:
        block = receive_merge(r + p2, block, 0)
    for j in range(p2.bit_length() - 1):
        step = 1 << j
        if r % (2 * step):
            return block, drops, send(r - step, block)
        block = receive_merge(r + step, block, j + 1)
    return block, drops, None


def _excluded(comm: Any, drops: list, result_idx: Any, n: int) -> np.ndarray:
    """Allgather the dropped-but-in-the-result indices; return those on this rank's path."""
    xp, p, r = comm.xp, comm.size, comm.rank
    p2 = 1 << (p.bit_length() - 1)
    mine = [code * (n + 1) + to_host(d[sorted_member(d, result_idx)]).astype(np.int64)
            for code, d in drops]
    payload = np.concatenate(mine) if mine else np.empty(0, np.int64)
    got, counts = comm.allgatherv(xp.asarray(payload), op_name="gtopk.feedback")
    got = to_host(got)
    if got.shape[0] == 0:
        return np.empty(0, np.int64)
    source = np.repeat(np.arange(p), counts)
    code, idx = got // (n + 1), got % (n + 1)
    rep = r if r < p2 else r - p2
    node = np.where(code == 0, rep, rep & ~((np.int64(2) << np.maximum(code - 1, 0)) - 1))
    return distinct(np, idx[source == node])


def gtopk(comm: Any, x: Any, k: int, state: TopkState) -> TopkOutcome:
    """gTopk: pairwise top-k tree reduction to rank 0, then broadcast (values = sums)."""
    xp, n = comm.xp, int(x.shape[0])
    sel = state.selector.select(x, k, refresh=state.refresh)
    mine_i, mine_v = sel.indices, sel.values
    if sel.count > k:
        pos, mine_v = topk_abs(mine_v, k)
        mine_i = mine_i[pos]
    wire = state.wire or COO
    block = _pad(xp, mine_i.astype(index_dtype(n), copy=False), mine_v, k, n)
    block, drops, sent = _tree(comm, block, k, n, wire)
    res_i, res_v, root_error = broadcast_block(comm, block, k, n, wire, "gtopk.broadcast")
    excluded = xp.asarray(_excluded(comm, drops, res_i, n).astype(res_i.dtype))
    keep = sorted_member(mine_i, res_i) & ~sorted_member(mine_i, excluded)
    state.last = {"refresh": state.refresh, "local_count": sel.count,
                  "global_count": int(res_i.shape[0])}
    remainders = []
    if sent is not None:  # my sent block's errors, where its values reached the result
        arrived = sorted_member(sent[0], res_i) & ~sorted_member(sent[0], excluded)
        remainders.append((sent[0][arrived], sent[1][arrived]))
    if root_error is not None:
        remainders.append((res_i, root_error))
    return TopkOutcome(SparseResult(res_i, res_v, n), mine_i[keep], sel, tuple(remainders))


ALGORITHM = register("topk", "gtopk", gtopk, cost=cost, selector=Exact)
