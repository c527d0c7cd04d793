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
dense and stays dense. ``DELTA`` = 1 switches at equal bytes, i.e. at union density
(R + 1/8) / (I + R): about 0.52 for float32 values and int32 indices. Both partners see the same
merged nnz, so they switch together.

Cost per rank and round: an 8-byte header (nnz, or -1 for dense) and the partner's partial
result (|union of its group| * E, or n*R + ceil(n/8) when dense), 1 + 2 messages. Total
about log2(P) rounds with the union growing each round: best at small sizes, latency bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._registry import register
from .._types import ReduceOp, to_host
from ..primitives import combine, densify, gather
from ._common import presence, reduce_parts, union_of_presence
from ._cost import Cost, Shape

__all__ = ["recursive_doubling", "cost", "DELTA", "prefer_dense"]

#: switch to dense when sparse bytes exceed DELTA * dense bytes (1.0: at equal bytes).
DELTA = 1.0
_OP = "recursive_doubling"


def prefer_dense(nnz: int, n: int, index_bytes: int, row_bytes: int) -> bool:
    """True when ``nnz`` sparse entries cost more bytes than the dense representation."""
    return nnz * (index_bytes + row_bytes) > DELTA * (n * row_bytes + (n + 7) // 8)


class _State:
    """A partial result: sparse (``first`` = indices, ``second`` = rows) or dense
    (``first`` = rows over n, ``second`` = presence mask)."""

    def __init__(self, dense: bool, first: Any, second: Any) -> None:
        self.dense, self.first, self.second = dense, first, second

    def header(self) -> int:
        return -1 if self.dense else int(self.first.shape[0])

    def wire(self, xp: Any) -> list[Any]:
        return [self.first, xp.packbits(self.second) if self.dense else self.second]


def _as_dense(state: _State, n: int) -> _State:
    if state.dense:
        return state
    return _State(True, densify(state.first, state.second, n), presence(state.first, n))


class _Rounds:
    """The per-call context of the rounds (communicator, n, row shape, op) and their steps."""

    def __init__(self, comm: Any, n: int, op: ReduceOp, index_dtype: Any, values: Any,
                 accumulate_dtype: Any) -> None:
        self.comm, self.xp, self.n, self.op = comm, comm.xp, n, op
        self.index_dtype, self.value_dtype = index_dtype, values.dtype
        self.row = tuple(values.shape[1:])
        self.row_bytes = values.dtype.itemsize * max(int(np.prod(self.row, dtype=np.int64)), 1)
        self.accumulate_dtype = accumulate_dtype

    def start(self, indices: Any, values: Any) -> _State:
        return self.switch(_State(False, indices, values))

    def switch(self, state: _State) -> _State:
        if not state.dense and prefer_dense(int(state.first.shape[0]), self.n,
                                            self.index_dtype.itemsize, self.row_bytes):
            return _as_dense(state, self.n)
        return state

    def _empty(self, header: int) -> list[Any]:
        xp = self.xp
        if header < 0:
            return [xp.empty((self.n,) + self.row, self.value_dtype),
                    xp.empty((self.n + 7) // 8, np.uint8)]
        return [xp.empty(header, self.index_dtype),
                xp.empty((header,) + self.row, self.value_dtype)]

    def transfer(self, state: _State | None, send_to: int | None, recv_from: int | None
                 ) -> _State | None:
        """Send ``state`` to ``send_to`` and/or receive a state from ``recv_from``."""
        comm, xp = self.comm, self.xp
        mine = xp.asarray([state.header() if state is not None else 0], dtype=np.int64)
        theirs = xp.empty(1, dtype=np.int64)
        sends = [(send_to, mine)] if send_to is not None else []
        recvs = [(recv_from, theirs)] if recv_from is not None else []
        comm.exchange(sends, recvs, _OP + ".counts").wait()
        bufs = self._empty(int(to_host(theirs)[0])) if recv_from is not None else []
        payload = state.wire(xp) if send_to is not None else []
        comm.exchange([(send_to, a) for a in payload], [(recv_from, b) for b in bufs], _OP).wait()
        if recv_from is None:
            return None
        if int(to_host(theirs)[0]) < 0:
            return _State(True, bufs[0], xp.unpackbits(bufs[1])[:self.n].view(bool))
        return _State(False, bufs[0], bufs[1])

    def merge(self, lower: _State, higher: _State) -> _State:
        """Combine two partial results of disjoint groups, lower rank's first."""
        if not lower.dense and not higher.dense:
            merged = reduce_parts([(lower.first, lower.second), (higher.first, higher.second)],
                                  self.op, self.accumulate_dtype)
            return self.switch(_State(False, *merged))
        lo, hi = _as_dense(lower, self.n), _as_dense(higher, self.n)
        return _State(True, combine(lo.first, hi.first, self.op), lo.second | hi.second)

    def finish(self, state: _State) -> tuple[Any, Any]:
        if not state.dense:
            return state.first, state.second
        union = union_of_presence(state.second, self.index_dtype)
        return union, gather(state.first, union)


@register("sparse", "recursive_doubling")
def recursive_doubling(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
                       accumulate_dtype: Any = None) -> tuple[Any, Any]:
    """Pairwise exchange-and-merge in log2(P) rounds, folding non-power-of-two ranks in and out."""
    p, rank = comm.size, comm.rank
    pair = _Rounds(comm, n, op, indices.dtype, values, accumulate_dtype)
    state = pair.start(indices, values)
    p2 = 1 << (p.bit_length() - 1)
    if rank >= p2:  # fold in, then wait for the result
        pair.transfer(state, rank - p2, None)
        return pair.finish(pair.transfer(None, None, rank - p2))
    if rank + p2 < p:
        state = pair.merge(state, pair.transfer(None, None, rank + p2))
    d = 1
    while d < p2:
        peer = rank ^ d
        other = pair.transfer(state, peer, peer)
        state = pair.merge(state, other) if rank < peer else pair.merge(other, state)
        d <<= 1
    if rank + p2 < p:
        pair.transfer(state, rank + p2, None)
    return pair.finish(state)


def cost(shape: Shape, rank: int) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce).

    Group unions are exact when ``shape.inputs`` is given, else estimated. A group's state is
    dense iff its union prefers dense: unions only grow as groups merge and
    :func:`prefer_dense` is monotone in the size, so a dense part always makes a dense whole.
    Only the ~log2 P groups this rank receives are priced (O(P log P), not O(P^2 log P)).
    """
    p, c = shape.size, Cost()
    p2 = 1 << (p.bit_length() - 1)
    dense_bytes = shape.n * shape.row_bytes + (shape.n + 7) // 8

    def receive(group: list[int]) -> None:
        size = shape.union_of(group)
        dense = prefer_dense(size, shape.n, shape.index_bytes, shape.row_bytes)
        c.book(_OP + ".counts", 8, 1)
        c.book(_OP, dense_bytes if dense else size * shape.entry_bytes, 2)

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
