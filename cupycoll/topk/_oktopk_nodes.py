"""Ok-Topk's allgather phase in two levels, when the ranks span several nodes.

Flat, every rank receives every other rank's balanced block: P-1 messages each, most of them
across nodes. In two levels (nodes from :func:`cupycoll.comm._topology.topology`, e.g.
``CUPYCOLL_RANKS_PER_NODE``):

1. node gather (``oktopk.allgather.node``): every rank sends its block to its node's leader
   (the node's lowest rank);
2. leaders' allgatherv (``oktopk.allgather.leaders``): every leader sends its node's blocks,
   as one message, to every other leader -- the only messages that cross nodes, N - 1 per
   leader for N nodes;
3. node broadcast (``oktopk.allgather.bcast``): every leader sends all blocks, as one message,
   to each other rank of its node.

Blocks are packed once (coo wire) and forwarded as bytes, each in an 8-aligned slot of one
payload laid out in node order (a node's blocks are contiguous, whatever its ranks); every rank
unpacks them into rank order, so the result is the flat phase's, bit for bit. The block sizes
are known to every rank (balanced from the allgathered counts), so no size travels. The compact
wire (whose encoded sizes are not known in advance) keeps the flat phase.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..comm._topology import Topology
from ..wire._pack import Wire, block_offsets, coo_nbytes, pack, unpack

__all__ = ["two_level", "allgather_nodes", "allgather_nodes_cost", "OPS"]

#: the operation names of the three steps.
OPS = ("oktopk.allgather.node", "oktopk.allgather.leaders", "oktopk.allgather.bcast")


def two_level(topo: Topology, wire: Wire) -> bool:
    """True when the allgather runs in two levels: several nodes, one with >= 2 ranks, coo."""
    return topo.count > 1 and topo.width > 1 and not wire.compact


def _layout(topo: Topology, blocks: Sequence[int], entry_bytes: Any) -> tuple[dict, dict]:
    """{rank: (start, padded bytes)} of every block's slot and {node: (start, end)} of every
    node's segment of the payload (node order, 8-aligned slots: a node's segment and the
    broadcast carry the padding, a block sent to its leader does not)."""
    order = [r for members in topo.members for r in members]
    offsets = block_offsets([entry_bytes(int(blocks[r])) for r in order])
    slots = {r: (int(offsets[i]), int(offsets[i + 1] - offsets[i])) for i, r in enumerate(order)}
    segments, at = {}, 0
    for node, members in enumerate(topo.members):
        segments[node] = (int(offsets[at]), int(offsets[at + len(members)]))
        at += len(members)
    return slots, segments


def allgather_nodes_cost(topo: Topology, blocks: Sequence[int], rank: int,
                         entry_bytes: Any) -> dict[str, tuple[int, int]]:
    """{op: (bytes, messages)} ``rank`` receives in the two-level allgather (empty ops left
    out); ``entry_bytes(count)`` = bytes of a packed block of ``count`` entries."""
    slots, segments = _layout(topo, blocks, entry_bytes)
    node = topo.nodes[rank]
    members = topo.members[node]
    out: dict[str, tuple[int, int]] = {}
    if rank != members[0]:
        total = max(end for _, end in segments.values())
        return {OPS[2]: (total, 1)} if total else out
    gathered = [entry_bytes(int(blocks[m])) for m in members[1:] if int(blocks[m])]
    others = [e - s for j, (s, e) in segments.items() if j != node and e > s]
    for op, sizes in ((OPS[0], gathered), (OPS[1], others)):
        if sizes:
            out[op] = (sum(sizes), len(sizes))
    return out


def allgather_nodes(comm: Any, idx: Any, val: Any, blocks: np.ndarray, n: int, topo: Topology,
                    wire: Wire) -> tuple[Any, Any]:
    """Every rank's balanced block (``blocks[r]`` entries on rank r), concatenated in rank
    order on every rank, through the node leaders (see the module docstring)."""
    xp, rank = comm.xp, comm.rank
    row, itype, vtype = tuple(val.shape[1:]), idx.dtype, val.dtype

    def entry_bytes(count: int) -> int:
        return coo_nbytes(count, row, itype, vtype, wire)

    slots, segments = _layout(topo, blocks, entry_bytes)
    node = topo.nodes[rank]
    members, leaders = topo.members[node], [m[0] for m in topo.members]
    payload = xp.empty(max(end for _, end in segments.values()), dtype=np.uint8)

    def slot(r: int) -> Any:
        start, _ = slots[r]
        return payload[start:start + entry_bytes(int(blocks[r]))]

    def segment(j: int) -> Any:
        return payload[segments[j][0]:segments[j][1]]

    own = pack(xp, idx, val, wire, 0, n)
    if own.count:
        slot(rank)[...] = own.buf
    if rank != members[0]:
        if own.count:
            comm.stream_order(comm.exchange([(members[0], own.buf)], [], OPS[0]))
        if payload.shape[0]:
            comm.stream_order(comm.exchange([], [(members[0], payload)], OPS[2]))
    else:
        recvs = [(m, slot(m)) for m in members[1:] if int(blocks[m])]
        if recvs:
            comm.stream_order(comm.exchange([], recvs, OPS[0]))
        mine = segment(node)
        sends = [(lead, mine) for lead in leaders if lead != rank and mine.shape[0]]
        recvs = [(leaders[j], segment(j)) for j in range(topo.count)
                 if j != node and segment(j).shape[0]]
        if sends or recvs:
            comm.stream_order(comm.exchange(sends, recvs, OPS[1]))
        if len(members) > 1 and payload.shape[0]:
            comm.stream_order(comm.exchange([(m, payload) for m in members[1:]], [], OPS[2]))
    starts = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)
    out_i = xp.empty(int(starts[-1]), dtype=itype)
    out_v = xp.empty((int(starts[-1]),) + row, dtype=vtype)
    for r in range(comm.size):
        count = int(blocks[r])
        if count:
            out_i[starts[r]:starts[r + 1]], out_v[starts[r]:starts[r + 1]] = unpack(
                slot(r), count, row, itype, vtype, wire)
    return out_i, out_v
