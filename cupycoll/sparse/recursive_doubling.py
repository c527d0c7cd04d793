"""``recursive_doubling``: SparCML's SSAR/DSAR, log2(P) rounds of pairwise exchange and merge.

Ranks pair up with ``rank ^ d`` for d = 1, 2, 4, ...; each round both partners send their
partial result and merge the two. Non-power-of-two P: with P2 the largest power of two <= P, rank
P2 + i first folds its input into rank i, the P2 ranks run the rounds, and rank i sends the
result back to P2 + i at the end.

Determinism: both partners merge the lower rank's part first, so both compute every value with
the same operands in the same order and hold identical bits (by induction, every rank does).

DSAR switch: a partial result is sent sparse (indices + rows, E = index + row bytes per entry)
until its nnz * E exceeds ``DELTA`` times the dense representation, n * R row bytes plus a
ceil(n/8)-byte presence bitmap (the union cannot be read from the values); from then on it is
dense and stays dense. R is the row's bytes on the wire (``wire_values`` rounds them) and I the
index's bytes uncoded (a compact wire's coded indices are known only once encoded; both
partners must decide from the nnz alone). ``DELTA`` = 1 switches at equal bytes, i.e. at union
density (R + 1/8) / (I + R): about 0.52 for float32 values and int32 indices. Both partners see
the same merged nnz, so they switch together; the last merge (not sent on) stays sparse.

Cost per rank and round: an 8-byte header (nnz, or -1 for dense; compact wire: + the block's
bytes, 16 bytes) and the partner's partial result as one packed block (|union of its group| * E,
or n*R + ceil(n/8) when dense), 1 + 1 messages. A block holding one rank's own input (the
fold-in, and the first round's from a rank without a fold-in partner) needs no header on the coo
wire when the caller passes every rank's nnz as ``counts`` (``sparse_allreduce`` does, from its
validation): at P = 2 the whole call is then one exchange. Partners merge the values as they travel
(rounded when the wire rounds them), so both hold the same bits. Total
about log2(P) rounds with the union growing each round: best at small sizes, latency bound.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .._registry import register
from .._types import ReduceOp, distinct, to_host
from ..primitives import _accel, combine, densify, gather
from ..primitives._numpy_few import chained_first, few_enough
from ..primitives._unfolded import folded
from ..wire._pack import (COO, Packed, Wire, coo_nbytes, pack, pack_dense, raw_block, unpack,
                          unpack_dense, value_nbytes)
from ._common import presence, reduce_parts, union_of_presence
from ._cost import Cost, Shape, estimate_union

__all__ = ["recursive_doubling", "cost", "work", "DELTA", "prefer_dense", "reads_in_place",
           "ALGORITHM"]

#: switch to dense when sparse bytes exceed DELTA * dense bytes (1.0: at equal bytes).
DELTA = 1.0
_OP = "recursive_doubling"


def dense_nbytes(n: int, row: tuple, dtype: Any, wire: Wire) -> int:
    """Bytes of a dense state's block: the rows over n (on the wire) and the bitmap."""
    return value_nbytes(n, row, dtype, wire) + (n + 7) // 8


def prefer_dense(nnz: int, n: int, index_bytes: int, row_bytes: int) -> bool:
    """True when ``nnz`` sparse entries cost more bytes than the dense representation."""
    return nnz * (index_bytes + row_bytes) > DELTA * (n * row_bytes + (n + 7) // 8)


class _State:
    """A partial result: sparse (``first`` = indices, ``second`` = rows) or dense
    (``first`` = rows over n, ``second`` = presence mask); ``block``: the packed block that
    holds it already (a merge written into it, :meth:`_Rounds.packed_sum`)."""

    def __init__(self, dense: bool, first: Any, second: Any, block: Packed | None = None
                 ) -> None:
        self.dense, self.first, self.second, self.block = dense, first, second, block

    def pack(self, xp: Any, n: int, wire: Wire, buffer: Any = None
             ) -> tuple[Packed, "_State"]:
        """This state as one packed block, and the state as the partner will see it (values
        rounded when the wire rounds: both partners then merge the same numbers); a sparse
        block's bytes in ``buffer(nbytes)`` where given (:func:`~cupycoll.wire._pack.pack`; a
        dense block is packed into a new array)."""
        if self.block is not None:
            return self.block, self
        if self.dense:
            block = pack_dense(xp, self.first, xp.packbits(self.second), wire)
            return block, _State(True, block.values, self.second)
        block = pack(xp, self.first, self.second, wire, 0, n, buffer)
        return block, _State(False, self.first, block.values)


def _as_dense(state: _State, n: int) -> _State:
    if state.dense:
        return state
    return _State(True, densify(state.first, folded(state.second), n), presence(state.first, n))


class _Rounds:
    """The per-call context of the rounds (communicator, n, row shape, op) and their steps."""

    def __init__(self, comm: Any, n: int, op: ReduceOp, index_dtype: Any, values: Any,
                 accumulate_dtype: Any, wire: Wire, counts: Sequence[int] | None) -> None:
        self.comm, self.xp, self.n, self.op, self.wire = comm, comm.xp, n, op, wire
        self.index_dtype, self.value_dtype = index_dtype, values.dtype
        self.row = tuple(values.shape[1:])
        self.row_bytes = value_nbytes(1, self.row, values.dtype, wire)  # on the wire
        self.accumulate_dtype = accumulate_dtype
        self.counts = None if wire.compact else counts
        self._held: list[Any] = []  # the blocks of this call's exchanges (send_buffer)
        self.arena = None  # where this rank's sparse blocks go, read there by its peers
        if counts is not None and wire == COO and _may_share(comm):
            from ..comm._mpi_arena import arena_for
            self.arena = arena_for(comm, arena_bytes(counts, n, self.index_dtype.itemsize,
                                                     self.row_bytes))
            if self.arena is not None:
                self.arena.begin()

    def block_buffer(self, nbytes: int) -> Any:
        """Memory for a sparse block this rank sends: in its arena where it has one."""
        return self.comm.send_buffer(nbytes) if self.arena is None else self.arena.block(nbytes)

    def header_of(self, rank: int, own: bool) -> int | None:
        """The header ``rank`` sends, when the receiver knows it without the message: a block
        of ``rank``'s own input (``own``) on the coo wire with every rank's count known."""
        if not own or self.counts is None:
            return None
        nnz = int(self.counts[rank])
        return -1 if prefer_dense(nnz, self.n, self.index_dtype.itemsize, self.row_bytes) else nnz

    def start(self, indices: Any, values: Any, sends_first: bool) -> _State:
        """The rank's own input as a state; :class:`Unfolded` values stay so only where the
        rank's first step sends them (then they are summed straight into the block)."""
        return self.switch(_State(False, indices, values if sends_first else folded(values)))

    def switch(self, state: _State) -> _State:
        if not state.dense and prefer_dense(int(state.first.shape[0]), self.n,
                                            self.index_dtype.itemsize, self.row_bytes):
            return _as_dense(state, self.n)
        return state

    def transfer(self, state: _State | None, send_to: int | None, recv_from: int | None,
                 mine_own: bool = False, theirs_own: bool = False
                 ) -> tuple[_State | None, _State | None]:
        """Send ``state`` to ``send_to`` and/or receive a state from ``recv_from``: a header
        (nnz or -1 for dense; + the block's bytes on the compact wire), then one packed block.
        ``mine_own`` / ``theirs_own``: the block sent / received is its sender's own input
        (then the header is skipped where :meth:`header_of` knows it).
        Returns (``state`` as sent, the state received)."""
        comm, xp, wire = self.comm, self.xp, self.wire
        words = 2 if wire.compact else 1
        block = None
        if send_to is not None:
            block, state = state.pack(xp, self.n, wire, self.block_buffer)
        head = [block.count, int(block.buf.shape[0])] if block is not None else [0, 0]
        mine = xp.asarray(head[:words], dtype=np.int64)
        theirs = xp.empty(words, dtype=np.int64)
        known = None if recv_from is None else self.header_of(recv_from, theirs_own)
        sends = [(send_to, mine)] if send_to is not None and self.header_of(
            self.comm.rank, mine_own) is None else []
        recvs = [(recv_from, theirs)] if recv_from is not None and known is None else []
        if sends or recvs:
            comm.exchange(sends, recvs, _OP + ".counts").wait()
        if recv_from is None:
            got = [0, 0]
        elif known is not None:
            got = [known, 0]
        else:
            got = [int(v) for v in to_host(theirs)]
        nbytes = got[1] if wire.compact else (
            dense_nbytes(self.n, self.row, self.value_dtype, wire) if got[0] < 0 else
            coo_nbytes(got[0], self.row, self.index_dtype, self.value_dtype, wire))
        sends = [(send_to, block.buf)] if block is not None else []
        if self.arena is not None:  # a sparse block read where its sender wrote it
            recvs = [] if recv_from is None else [
                (recv_from, nbytes if got[0] >= 0 else self.held(comm.send_buffer(nbytes)))]
            buf = (self.arena.exchange(comm, sends, recvs, _OP) or [None])[0]
        else:
            buf = self.held(comm.send_buffer(nbytes))
            if block is not None and not state.dense:  # a dense block is not a send buffer
                self._held.append(block.buf)
            comm.exchange(sends, [(recv_from, buf)] if recv_from is not None else [],
                          _OP).wait()
        if recv_from is None:
            return state, None
        if got[0] < 0:
            rows, bits = unpack_dense(buf, self.n, self.row, self.value_dtype, wire)
            return state, _State(True, rows, xp.unpackbits(bits)[:self.n].view(bool))
        return state, _State(False, *unpack(buf, got[0], self.row, self.index_dtype,
                                            self.value_dtype, wire))

    def merge(self, lower: _State, higher: _State, sends_next: bool = False) -> _State:
        """Combine two partial results of disjoint groups, lower rank's first; ``sends_next``:
        it is sent on (into its block where :meth:`packed_sum` can; dense where it prefers)."""
        if not lower.dense and not higher.dense:
            packed = self.packed_sum(lower, higher) if sends_next else None
            if packed is not None:
                return self.released(packed)
            parts = [(lower.first, lower.second), (higher.first, higher.second)]
            merged = _State(False, *reduce_parts(parts, self.op, self.accumulate_dtype))
            return self.released(self.switch(merged) if sends_next else merged)
        lo, hi = _as_dense(lower, self.n), _as_dense(higher, self.n)
        return self.released(_State(True, combine(lo.first, hi.first, self.op),
                                    lo.second | hi.second))

    def packed_sum(self, lower: _State, higher: _State) -> _State | None:
        """The float sum of two sparse states written by numba's two-way merge straight into
        the raw coo block that sends it (:func:`~cupycoll.wire._pack.raw_block`; the bits of
        :func:`reduce_parts`, absent entries' +0 included), or None where another path merges
        (device arrays, another op or wire, a cast, a few entries, numba's k-way loop, or a
        union that goes dense)."""
        a, va, b, vb = lower.first, lower.second, higher.first, higher.second
        acc, row = np.dtype(self.value_dtype if self.accumulate_dtype is None
                            else self.accumulate_dtype), self.row
        total = int(a.shape[0]) + int(b.shape[0])
        if (self.xp is not np or self.op is not ReduceOp.SUM or self.wire != COO
                or acc != self.value_dtype or acc.kind != "f" or va.dtype != acc
                or vb.dtype != acc or few_enough(total * math.prod(row))
                or not chained_first(2, total, row)):
            return None
        loops = _accel.loops()
        if loops is None or acc not in loops.SUM_DTYPES:
            return None
        count = int(loops.union_sorted([a, b], self.index_dtype).shape[0])
        if prefer_dense(count, self.n, self.index_dtype.itemsize, self.row_bytes):
            return None
        buf, idx, val = raw_block(count, row, self.index_dtype, acc, self.block_buffer)
        loops.sum_two(a, va, b, vb, acc, self.index_dtype, True, (idx, val))
        return _State(False, idx, val, Packed(buf, count, val))

    def held(self, buf: Any) -> Any:
        """``buf`` (from ``send_buffer``), handed back by :meth:`released`."""
        self._held.append(buf)
        return buf

    def released(self, state: _State) -> _State:
        """Hand the blocks exchanged so far back to the communicator, but those ``state``
        (what the rounds go on with) still reads (a merge may return a part as it is)."""
        xp = self.xp
        for buf in self._held:
            if not any(xp.may_share_memory(buf, a) for a in (state.first, state.second)):
                self.comm.release_send_buffer(buf)
        self._held.clear()
        return state

    def finish(self, state: _State) -> tuple[Any, Any]:
        if state.dense:
            union = union_of_presence(state.second, self.index_dtype)
            state = _State(False, union, gather(state.first, union))
        state = self.released(state)
        if self.arena is None:
            return state.first, state.second
        # a result outlives the call; the window's halves do not
        return tuple(a.copy() if self.arena.holds(a) else a for a in (state.first, state.second))


def recursive_doubling(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
                       accumulate_dtype: Any = None, wire: Wire = COO,
                       counts: Sequence[int] | None = None) -> tuple[Any, Any]:
    """Pairwise exchange-and-merge in log2(P) rounds, folding non-power-of-two ranks in and out.

    ``counts``: every rank's nnz when the caller knows them (blocks of a rank's own input then
    travel without a header on coo). ``values``: coalesced rows, or
    :class:`cupycoll.primitives._unfolded.Unfolded` rows (a host input with duplicates), summed
    straight into the block of the rank's first send."""
    p, rank = comm.size, comm.rank
    pair = _Rounds(comm, n, op, indices.dtype, values, accumulate_dtype, wire, counts)
    p2 = 1 << (p.bit_length() - 1)
    state = pair.start(indices, values, sends_first=rank >= p2 or (rank + p2 >= p and p2 > 1))
    if rank >= p2:  # fold in, then wait for the result
        pair.transfer(state, rank - p2, None, mine_own=True)
        return pair.finish(pair.transfer(None, None, rank - p2)[1])
    folds_out = rank + p2 < p  # sends the result to its fold-in partner at the end
    if folds_out:
        state = pair.merge(state, pair.transfer(None, None, rank + p2, theirs_own=True)[1],
                           sends_next=True)
    d = 1
    while d < p2:
        peer = rank ^ d
        state, other = pair.transfer(state, peer, peer, mine_own=d == 1 and rank + p2 >= p,
                                     theirs_own=d == 1 and peer + p2 >= p)
        lower, higher = (state, other) if rank < peer else (other, state)
        d <<= 1
        state = pair.merge(lower, higher, sends_next=d < p2 or folds_out)
    if folds_out:
        state = pair.transfer(state, rank + p2, None)[0]
    elif p > 1 and wire.rounds(state.first.dtype if state.dense else state.second.dtype):
        state = state.pack(comm.xp, n, wire)[1]  # as a fold-out partner would receive it
    return pair.finish(state)


def reads_in_place(comm: Any, counts: Sequence[int], n: int, index_bytes: int,
                   row_bytes: int) -> bool:
    """Whether the exchange arena (:mod:`cupycoll.comm._mpi_arena`) serves a call of these
    agreed counts on ``comm`` (raw coo, ``row_bytes`` a row): the same on every rank."""
    if not _may_share(comm):
        return False
    from ..comm._mpi_arena import fits

    return fits(comm, arena_bytes(counts, n, index_bytes, row_bytes))


def _may_share(comm: Any) -> bool:
    """Whether ``comm`` may have an exchange arena (``_mpi_arena.shares_node``), asked
    without importing MPI for another backend's communicator."""
    if getattr(comm, "backend", None) != "mpi":
        return False
    from ..comm._mpi_arena import shares_node

    return shares_node(comm)


def arena_bytes(counts: Sequence[int], n: int, index_bytes: int, row_bytes: int) -> int:
    """An upper bound of the bytes of sparse blocks (raw coo wire, ``row_bytes`` a row) any
    rank sends in one call with these per-rank counts, in O(log P) (it runs on every call):
    the round of distance d sends a block of d virtual ranks (each one rank, or two where
    P is not a power of two), so at most that many times the largest count; no block holds
    more than all entries, n, or the entries a block stays sparse with (:func:`prefer_dense`);
    a fold-out rank's last send holds the result. + 64 bytes a block (alignment)."""
    p, largest, total = len(counts), max(counts, default=0), sum(counts)
    p2 = 1 << (p.bit_length() - 1)
    entry = index_bytes + row_bytes
    most = min(n, int(DELTA * (n * row_bytes + (n + 7) // 8) // entry))

    def block(entries: int) -> int:
        return min(entries, total, most) * entry + 64

    per_virtual = 1 if p == p2 else 2
    rounds = [1 << j for j in range(p2.bit_length() - 1)]
    return (sum(block(d * per_virtual * largest) for d in rounds)
            + (block(total) if p > p2 else 0))


def cost(shape: Shape, rank: int, profile: Any = None) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce), every rank's
    count known (as ``sparse_allreduce`` calls it).

    Group unions are exact when ``shape.inputs`` is given, else estimated. A group's state is
    dense iff its union prefers dense: unions only grow as groups merge and
    :func:`prefer_dense` is monotone in the size, so a dense part always makes a dense whole.
    Only the ~log2 P groups this rank receives are priced (O(P log P), not O(P^2 log P)).
    Sparse blocks are booked as read in place where ``shape.in_place`` on the raw coo wire.
    """
    p, c = shape.size, Cost()
    in_place = shape.in_place and shape.wire == COO
    p2 = 1 << (p.bit_length() - 1)
    dense_bytes = shape.n * shape.wire_row_bytes + (shape.n + 7) // 8

    def receive(group: list[int]) -> None:
        size = shape.union_of(group)
        if len(group) > 1 or shape.wire.compact:  # one rank's own input: its count is known
            c.book(_OP + ".counts", 8 * shape.size_words, 1)
        if prefer_dense(size, shape.n, shape.index_bytes, shape.wire_row_bytes):
            c.book(_OP, dense_bytes, 1)
            return
        union = (distinct(np, [shape.inputs[r] for r in group])
                 if shape.inputs is not None else None)
        c.book(_OP, shape.block_bytes(size, union), 1, in_place)

    def block(first: int, count: int) -> list[int]:
        """The ranks behind virtual ranks [first, first + count) after the fold-in."""
        return [r for v in range(first, first + count) for r in (v, v + p2) if r < p]

    if rank >= p2:  # folded in: receives only the final result
        receive(list(range(p)))
        return c
    if rank + p2 < p:  # fold in
        receive([rank + p2])
    d = 1
    while d < p2:
        receive(block(((rank ^ d) // d) * d, d))
        d <<= 1
    return c


def work(shape: Shape, rank: int, profile: Any = None) -> dict[str, float]:
    """Rounds of a homogeneous estimate: group unions of 2^j ranks' mean nnz. A sparse round
    merges both partners' partial results; the rows it sends are packed (copied) into its
    block in the first round (the rank's own input) and after a merge that cannot write its
    sum straight into the block (:meth:`_Rounds.packed_sum`: a host float sum of enough
    elements on the raw coo wire does, with numba's loops)."""
    w, p = max(shape.width, 1), shape.size
    mean = shape.total_nnz / max(p, 1)
    out = {"merge2": 0.0, "row": 0.0, "dense": 0.0, "scan": 0.0, "fold2": 0.0}
    rounds = max(p.bit_length() - 1, 0) + (1 if p & (p - 1) else 0)
    into_block = (shape.host and shape.sums and shape.float_values
                  and not shape.result_bytes and shape.wire == COO)
    merged = 0.0  # entries entering the merge that made the partial result sent
    for j in range(rounds):
        group = estimate_union(shape.n, [mean] * min(2 ** j, p))
        if prefer_dense(group, shape.n, shape.index_bytes, shape.wire_row_bytes):
            out["dense"] += 2 * shape.n * w
            out["scan"] += shape.n
        else:
            out["merge2"] += 2 * group  # the merge of both partial results
            out["fold2"] += 2 * group * (w - 1)
            if j == 0 or not into_block or few_enough(int(merged * w)):
                out["row"] += group * w  # its partial result packed to send
        merged = 2 * group
    return out


ALGORITHM = register("sparse", "recursive_doubling", recursive_doubling, cost=cost, work=work,
                     counts=True, unfolded=True)
