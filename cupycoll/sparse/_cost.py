"""Shared pieces of the sparse algorithms' cost models: the problem shape and per-op traffic.

Every algorithm module has a ``cost(shape, rank) -> Cost`` beside it. A :class:`Cost` is what
``comm.stats`` of that rank must show after one ``sparse_allreduce`` call: bytes and messages
received per operation name, booked by the same rules as :class:`cupycoll.comm.Stats`
(point-to-point exactly; native collectives by the ring volume ``floor(factor * bytes)``).

A :class:`Shape` carries P, n, row width, element sizes and every rank's coalesced nnz. When it
also carries every rank's coalesced indices (``inputs``), data-dependent terms (group unions of
recursive doubling, region sizes of split) are exact; without them they are estimated under
independent uniformly random indices, which is what ``auto`` (and later the tuner) uses.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Sequence

import numpy as np

from .. import _agreement as agreement
from .._types import distinct
from ..comm import bus_factor
from ..wire._model import block_nbytes
from ..wire._pack import COO, Wire

__all__ = ["Shape", "Cost", "is_sum", "estimate_union", "validation_cost", "VALIDATION_FIELDS"]

#: agreement fields of the validation allreduce (each sent as max(x) and max(-x)); see _validate.
VALIDATION_FIELDS = ("n", "index_dtype", "value_dtype", "width", "op", "algorithm",
                     "accumulate_dtype", "wire", "output", "async_op")


def is_sum(op: Any) -> bool:
    """Whether ``op`` (a ReduceOp or its name) reduces as a sum: sum, or avg (a sum divided
    afterwards)."""
    return str(getattr(op, "value", op)) in ("sum", "avg")


def estimate_union(n: int, nnz: Iterable[int]) -> int:
    """Expected union size of independent uniformly random index sets of the given sizes."""
    sizes = [min(int(k), n) for k in nnz]
    if not sizes or n <= 0:
        return 0
    log_absent = sum(math.log1p(-k / n) if k < n else -math.inf for k in sizes)
    expected = n * -math.expm1(log_absent)
    return int(min(max(round(expected), max(sizes)), sum(sizes), n))


@dataclasses.dataclass(frozen=True)
class Shape:
    """One call as the cost models see it.

    Attributes:
        size: number of ranks P.
        n: dense length (rows).
        width: row width (0 for 1-D values).
        index_bytes, value_bytes: element sizes (values in the accumulate dtype).
        nnz: coalesced nnz of every rank, in rank order.
        inputs: optional coalesced sorted indices of every rank (host numpy), for exact terms.
        op: the reduction ("sum", "prod", "max", "min"; avg reduces as sum): ``dense`` folds
            presence into its allreduce only for sum.
        nodes: node of every rank (see :mod:`cupycoll.comm._topology`), for the node-aware
            algorithms; None = one node.
        wire: how entries travel (:class:`cupycoll.wire.Wire`: raw or compact indices, values
            as they are or rounded to 16 bits); ``float_values``: whether rounding applies.
        output: "sparse" (indices and values) or "dense" (the reduced n-vector itself: the
            ``dense`` algorithm needs no presence, every other one densifies its result).
        result_bytes: bytes of one value of the caller's dtype, where it differs from the
            accumulate dtype's (0: the same); split's dense regions travel in it.
        native_minmax_drops_nan, native_sum_keeps_minus_zero: the backend's native reductions
            (:func:`~._common.native_drops_nan`): NCCL's float max/min drop NaN and its sum
            need not keep -0, so ``mask``/``dense`` reduce float max/min as order keys and
            ``dense`` carries presence without -0 fills there. Defaults: MPI.
        host: the arrays are numpy arrays (numba's two-way merge then writes a float sum
            straight into the block that sends it: recursive doubling packs no merged rows).
        in_place: a rank's peers read its sparse blocks where it wrote them (an MPI
            communicator of host arrays on one node: :mod:`cupycoll.comm._mpi_arena`), so
            recursive doubling's blocks are booked but not copied (:attr:`Cost.in_place_bytes`).
    """

    size: int
    n: int
    width: int
    index_bytes: int
    value_bytes: int
    nnz: tuple[int, ...]
    inputs: tuple[np.ndarray, ...] | None = None
    op: str = "sum"
    nodes: tuple[int, ...] | None = None
    wire: Wire = COO
    float_values: bool = True
    output: str = "sparse"
    result_bytes: int = 0
    native_minmax_drops_nan: bool = False
    native_sum_keeps_minus_zero: bool = True
    host: bool = True
    in_place: bool = False

    @classmethod
    def from_inputs(cls, inputs: Sequence[np.ndarray], n: int, width: int, index_bytes: int,
                    value_bytes: int) -> "Shape":
        """Build an exact shape from every rank's coalesced sorted indices."""
        arrays = tuple(np.asarray(a) for a in inputs)
        return cls(len(arrays), n, width, index_bytes, value_bytes,
                   tuple(int(a.size) for a in arrays), arrays)

    @property
    def row_bytes(self) -> int:
        """Bytes of one value row (one value for 1-D)."""
        return self.value_bytes * max(self.width, 1)

    @property
    def result_row_bytes(self) -> int:
        """Bytes of one row of the caller's dtype (a dense output's row)."""
        return (self.result_bytes or self.value_bytes) * max(self.width, 1)

    @property
    def sums(self) -> bool:
        """Whether the reduction is a sum (:func:`is_sum`)."""
        return is_sum(self.op)

    @property
    def entry_bytes(self) -> int:
        """Bytes of one sparse entry: an index and its row."""
        return self.index_bytes + self.row_bytes

    @property
    def wire_row_bytes(self) -> int:
        """Bytes of one value row on the wire (2 per value when the wire rounds them)."""
        rounded = self.wire.values is not None and self.float_values
        return (2 if rounded else self.value_bytes) * max(self.width, 1)

    @property
    def size_words(self) -> int:
        """int64 words per size record of a packed transfer (count, + bytes when compact)."""
        return 2 if self.wire.compact else 1

    def block_bytes(self, count: int, indices: Any = None, lo: int = 0, hi: int | None = None
                    ) -> int:
        """Bytes of one packed block of ``count`` entries with indices in ``[lo, hi)``
        (exact with ``indices``, else expected for uniformly random ones)."""
        return block_nbytes(self.wire, count, self.wire_row_bytes, self.index_bytes, indices,
                            lo, self.n if hi is None else hi)

    @property
    def total_nnz(self) -> int:
        return sum(self.nnz)

    def union_of(self, ranks: Iterable[int]) -> int:
        """Size of the union of the given ranks' indices (exact with inputs, else estimated)."""
        ranks = list(ranks)
        if self.inputs is not None:
            parts = [self.inputs[r] for r in ranks]
            return int(distinct(np, parts).size) if parts else 0
        return estimate_union(self.n, (self.nnz[r] for r in ranks))

    @property
    def union(self) -> int:
        """Size of the union of every rank's indices."""
        return self.union_of(range(self.size))


@dataclasses.dataclass
class Cost:
    """Bytes and messages one rank receives, per operation name (as booked in ``comm.stats``).

    ``native_bytes`` / ``native_messages`` count the part booked by native collectives
    (allreduce, allgather), which the time model prices apart from point-to-point traffic;
    ``rounds`` counts the sequential communication steps on the critical path (one per booking:
    a collective, an exchange, a count exchange), ``native_rounds`` those of native collectives,
    and ``native_volumes`` the booked bytes of each native collective (a profile with a measured
    curve prices each by its own size: :meth:`cupycoll.tuner.profile.Profile.native_time`).
    ``in_place_bytes`` counts the point-to-point bytes a rank reads where their sender wrote
    them (booked as received, as ``comm.stats`` books them, but not copied).
    """

    received: dict[str, int] = dataclasses.field(default_factory=dict)
    messages: dict[str, int] = dataclasses.field(default_factory=dict)
    native_bytes: int = 0
    native_messages: int = 0
    rounds: int = 0
    native_rounds: int = 0
    native_volumes: list[int] = dataclasses.field(default_factory=list)
    in_place_bytes: int = 0

    @property
    def bytes_received(self) -> int:
        return sum(self.received.values())

    @property
    def messages_received(self) -> int:
        return sum(self.messages.values())

    @property
    def copied_bytes(self) -> int:
        """Bytes received that travel as bytes (all but :attr:`in_place_bytes`)."""
        return self.bytes_received - self.in_place_bytes

    def book(self, op: str, nbytes: int, messages: int, in_place: bool = False) -> "Cost":
        """Add ``nbytes`` in ``messages`` messages under ``op`` (``in_place``: read where the
        sender wrote them); zero entries are not kept."""
        if nbytes or messages:
            self.rounds += 1
            self.received[op] = self.received.get(op, 0) + int(nbytes)
            self.messages[op] = self.messages.get(op, 0) + int(messages)
            self.in_place_bytes += int(nbytes) if in_place else 0
        return self

    def add(self, other: "Cost") -> "Cost":
        """Add another cost's traffic to this one (in place) and return self."""
        for op, nbytes in other.received.items():
            self.received[op] = self.received.get(op, 0) + nbytes
            self.messages[op] = self.messages.get(op, 0) + other.messages[op]
        self.native_bytes += other.native_bytes
        self.native_messages += other.native_messages
        self.rounds += other.rounds
        self.native_rounds += other.native_rounds
        self.native_volumes += other.native_volumes
        self.in_place_bytes += other.in_place_bytes
        return self

    def _native(self, op: str, nbytes: int, messages: int) -> "Cost":
        if nbytes or messages:
            self.native_bytes += int(nbytes)
            self.native_messages += int(messages)
            self.native_rounds += 1
            self.native_volumes.append(int(nbytes))
        return self.book(op, nbytes, messages)

    # the Communicator's booking rules, one per verb
    def allreduce(self, op: str, size: int, nbytes: int) -> "Cost":
        """A native allreduce of ``nbytes`` booked under ``op``."""
        if size > 1:
            self._native(op, math.floor(bus_factor("allreduce", size) * nbytes), 2 * (size - 1))
        return self

    def allgather(self, op: str, size: int, recv_bytes: int) -> "Cost":
        """A native allgather whose receive buffer holds ``recv_bytes``."""
        if size > 1:
            self._native(op, math.floor(bus_factor("allgather", size) * recv_bytes), size - 1)
        return self

    def allgatherv(self, op: str, size: int, rank: int, counts: Sequence[int], row_bytes: int,
                   with_counts: bool = True) -> "Cost":
        """An allgatherv of ``counts[r]`` rows of ``row_bytes`` (counts exchanged first)."""
        if with_counts:
            self.allgather(op + ".counts", size, 8 * size)
        if size > 1:
            others = [int(c) for r, c in enumerate(counts) if r != rank]
            self.book(op, sum(others) * row_bytes, sum(1 for c in others if c))
        return self

    def allgatherv_entries(self, op: str, size: int, rank: int, block_bytes: Sequence[int],
                           words: int = 1) -> "Cost":
        """``wire.gather_entries``: a size allgather (``words`` int64 per rank), then one
        packed block of ``block_bytes[r]`` from every peer with entries (one message each)."""
        self.allgather(op + ".counts", size, 8 * words * size)
        others = [int(b) for r, b in enumerate(block_bytes) if r != rank and b]
        return self.book(op, sum(others), len(others))

    def alltoall_counts(self, op: str, size: int, words: int = 1) -> "Cost":
        """The size exchange before an alltoallv: ``words`` int64 from every peer."""
        return self.book(op, 8 * words * (size - 1), size - 1)

    def as_dict(self) -> dict[str, Any]:
        return {"bytes_received": self.bytes_received, "messages_received": self.messages_received,
                "by_op": {k: {"bytes_received": v, "messages_received": self.messages[k]}
                          for k, v in sorted(self.received.items())}}


def validation_cost(size: int) -> Cost:
    """Traffic of the one validation allreduce every ``sparse_allreduce`` call starts with."""
    return Cost().allreduce("sparse.validate", size, 8 * agreement.length(size))
