"""The agreement of every validating call: one small int64 MAX-allreduce before any data moves.

``sparse_allreduce``, ``topk_allreduce``, ``TopkCompressor.step`` and (with ``CUPYCOLL_DEBUG``)
the dense verbs each declare their :class:`Terms` once: the ``fields`` every rank must pass
alike, the ``maxima`` every rank contributes to (any rank's flag), the per-rank ``columns``
(counts), the messages of a peer's bad argument and of a disagreement. A call fills a
:class:`Draft` (its fields, its columns, or the error it raised) and :meth:`Draft.settle`
returns the :class:`Agreed` record, or raises on every rank:

* this rank's own error, where its arguments were bad;
* the verb's peer error naming the lowest rank whose arguments were bad (every such rank in
  ``Failure.ranks``), where another's were;
* :class:`~cupycoll.errors.MismatchError` with the verb's message, where the ranks passed
  different fields (each field travels as f and -f: max(f) != -max(-f) shows it);
* MismatchError where the ranks called different verbs, or this call is not the same
  collective of the communicator everywhere (the header: +/- the verb's code, +/- the
  communicator's collective count), before anything has moved; the communicator stays usable.

Every verb sends a vector of the same length (:func:`length`, a function of P alone), laid out
from fixed capacities: the header, :data:`FIELDS` signed fields, :data:`MAXIMA` maxima, then
per rank an error word, an error detail word and :data:`COLUMNS` columns, then one entry slot
of :func:`slot_words` words per rank (INT64_MIN, neutral for MAX, except where its owner
writes), so a MAX-allreduce is also an allgather of small blocks: ``sparse_allreduce`` and
``topk_allreduce`` ship the entries of a small call there (:mod:`cupycoll.sparse.small`). The
slots add at most :data:`SLOT_WORDS_TOTAL` words in all, none above 32 ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from ._types import ReduceOp
from .errors import CupycollError, InvalidArgument, InvalidType, MismatchError

__all__ = ["VERBS", "ARGUMENTS", "HEADER", "FIELDS", "MAXIMA", "COLUMNS", "Terms", "Draft",
           "unchecked", "Agreed", "Failure", "Differ", "ranks_text", "length", "slot_words",
           "slot_start", "SLOT_WORDS_TOTAL"]

#: the verbs that validate collectively (codes are positions + 1).
VERBS = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "sparse_allreduce",
         "topk_allreduce", "TopkCompressor.step", "all_to_all_single", "alltoall", "gather",
         "scatter", "barrier")
#: the arguments an error can name across the ranks (others travel as unnamed).
ARGUMENTS = ("indices", "values", "n", "op", "algorithm", "accumulate_dtype", "alloc_fn",
             "completion_fn", "async_op", "wire", "wire_values", "output", "out", "x", "k",
             "selector", "state", "grad", "tensor", "CUPYCOLL_AUTO", "CUPYCOLL_ALGORITHM",
             "CUPYCOLL_WIRE", "CUPYCOLL_NUMBA", "CUPYCOLL_THREADS", "CUPYCOLL_RANKS_PER_NODE",
             "CUPYCOLL_TOPK_ALGORITHM", "device", "root", "arguments")
#: capacities every verb's vector has: signed fields, maxima, columns a rank (besides its
#: error and detail words); the longest declarations are sparse_allreduce's.
FIELDS, MAXIMA, COLUMNS = 10, 3, 1
#: words of the header: +/- the verb's code, +/- the communicator's collective count.
HEADER = 4
_PER_RANK = 2 + COLUMNS
#: int64 words of the entry slots of all ranks together (2 KiB); a slot under _MIN_SLOT words
#: (P > 32) is dropped, so the slots never cost more than 2 KiB and nothing at large P.
SLOT_WORDS_TOTAL, _MIN_SLOT = 256, 8
_CODES = {verb: code for code, verb in enumerate(VERBS, 1)}
_KINDS = (InvalidType, InvalidArgument, CupycollError)  # an error's kind: the first it is
_MIN = np.iinfo(np.int64).min
#: size -> the vector of INT64_MIN that a draft copies (a copy costs less than a fill)
_BLANK: dict[int, np.ndarray] = {}


class Failure(NamedTuple):
    """A peer's bad arguments: the lowest such rank, its error's kind (InvalidType,
    InvalidArgument or CupycollError), the argument it names (None: one of no verb's
    :data:`ARGUMENTS`), the detail it sent (None: none) and every rank that failed."""

    rank: int
    kind: type
    argument: str | None
    detail: int | None
    ranks: list[int]


class Differ(NamedTuple):
    """A field the ranks disagree on: this rank's value, the lowest and highest, and every
    rank's (by rank)."""

    field: str
    mine: int
    low: int
    high: int
    ranks: tuple[int, ...] = ()

    def by_rank(self, decode: Callable[[int], str] = str) -> str:
        """Each value (as ``decode`` writes it) and the ranks that passed it, the value of the
        most ranks first: "10 on ranks 0-2, 5; 12 on rank 3"."""
        passed: dict[int, list[int]] = {}
        for rank, value in enumerate(self.ranks):
            passed.setdefault(value, []).append(rank)
        return "; ".join(f"{decode(value)} on {ranks_text(ranks)}" for value, ranks
                         in sorted(passed.items(), key=lambda item: -len(item[1])))


def ranks_text(ranks: Sequence[int]) -> str:
    """Sorted ranks, runs as spans: "rank 3", "ranks 0-2, 5"."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


@dataclasses.dataclass(frozen=True)
class Terms:
    """What ``verb`` agrees on, declared once (see the module docstring).

    ``peer_error(failure, draft)`` makes the error a rank with good arguments raises for a
    peer's bad ones; ``mismatch(differs, draft)`` the message of the MismatchError."""

    verb: str
    fields: tuple[str, ...]
    peer_error: Callable[[Failure, "Draft"], CupycollError]
    mismatch: Callable[[list[Differ], "Draft"], str]
    maxima: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (len(self.fields) > FIELDS or len(self.maxima) > MAXIMA
                or len(self.columns) > COLUMNS or self.verb not in _CODES):
            raise ValueError(f"the agreement of {self.verb} exceeds the vector's capacities")

    def draft(self, comm: Any) -> "Draft":
        """A new vector of this verb on ``comm``: the header written, everything else empty."""
        return Draft(self, comm)


class Agreed(NamedTuple):
    """A settled agreement: the maxima, every rank's columns and the entry slots (host)."""

    maxima: dict[str, int]
    columns: dict[str, list[int]]
    slots: np.ndarray


def length(size: int) -> int:
    """Length of every agreement vector on ``size`` ranks."""
    return slot_start(size, size)


def slot_words(size: int) -> int:
    """int64 words of each rank's entry slot on ``size`` ranks (0: no slots)."""
    words = SLOT_WORDS_TOTAL // size
    return words if words >= _MIN_SLOT else 0


def slot_start(size: int, rank: int) -> int:
    """Position in the agreement vector of the first word of ``rank``'s entry slot."""
    return HEADER + 2 * FIELDS + MAXIMA + _PER_RANK * size + rank * slot_words(size)


def unchecked(error: Exception, rank: int) -> CupycollError:
    """``error``, raised while checking ``rank``'s arguments, as cupycoll's: its own as it is
    (a setting's, which names no rank, naming ``rank``), anything else (an argument's own
    method raising, an optional module missing) as InvalidArgument ``arguments`` "could not
    be checked", so that it still reaches the other ranks."""
    if isinstance(error, CupycollError):
        if type(error) is InvalidArgument and error.rank is None:
            error = InvalidArgument(error.argument, error.value, error.reason, rank=rank)
        return error
    checked = InvalidArgument("arguments", f"{type(error).__name__}: {error}",
                              "could not be checked", rank=rank)
    checked.__cause__ = error
    return checked


class Draft:
    """One call's agreement vector: write this rank's part, then :meth:`settle`.

    ``vec`` is the host vector; a small call's packer may replace it by its copy on the
    communicator's device (entries written there without a host round trip)."""

    def __init__(self, terms: Terms, comm: Any) -> None:
        self.terms, self.comm, self.size, self.rank = terms, comm, comm.size, comm.rank
        blank = _BLANK.get(self.size)
        if blank is None:
            blank = _BLANK[self.size] = np.full(length(self.size), _MIN, dtype=np.int64)
        self.vec = blank.copy()
        code, seq = _CODES[terms.verb], comm.sequence
        self.vec[:HEADER] = code, -code, seq, -seq
        self.mine: tuple[int, ...] = ()
        self.error: CupycollError | None = None
        self.context: Any = None  # what the verb's messages read (e.g. the call's arguments)

    def agree(self, values: Sequence[int]) -> None:
        """This rank's fields, in the order of the declaration."""
        self.mine = tuple(int(v) for v in values)
        signed = self.vec[HEADER:HEADER + 2 * len(self.mine)]
        signed[0::2], signed[1::2] = self.mine, [-v for v in self.mine]

    def maximum(self, name: str, value: int) -> None:
        self.vec[HEADER + 2 * FIELDS + self.terms.maxima.index(name)] = value

    def column(self, name: str, value: int) -> None:
        self.vec[self._column(2 + self.terms.columns.index(name)) + self.rank] = value

    def fail(self, error: Exception, detail: int | None = None) -> None:
        """This rank's arguments were bad: ``error`` (raised here after the allreduce; any
        other than cupycoll's as :func:`unchecked`) and the ``detail`` its peers' errors may
        show (an offending value)."""
        error = self.error = unchecked(error, self.rank)
        kind = next(i for i, cls in enumerate(_KINDS) if isinstance(error, cls))
        argument = getattr(error, "argument", None)
        position = ARGUMENTS.index(argument) + 1 if argument in ARGUMENTS else 0
        self.vec[self._column(0) + self.rank] = (kind * 2 + (detail is not None)) * 64 + \
            position + 1
        if detail is not None:
            self.vec[self._column(1) + self.rank] = detail

    def slot(self) -> int:
        """The position of this rank's entry slot in ``vec``."""
        return slot_start(self.size, self.rank)

    def settle(self, op_name: str) -> Agreed:
        """Run the allreduce; return the record, or raise (see the module docstring). A rank
        that refuses its arguments runs it on the communicator's device (the refusal may be
        that the calling thread's current device is another one)."""
        device = getattr(self.comm, "device_id", None)
        on_device = (self.comm.xp.cuda.Device(device) if self.error is not None
                     and device is not None else contextlib.nullcontext())
        with on_device:
            out = _allreduce(self.comm, self.vec, self.terms.verb, op_name)
        if self.error is not None:
            raise self.error
        errors = out[self._column(0):self._column(1)].tolist()
        failed = [r for r, code in enumerate(errors) if code > 0]
        if failed:
            raise self.terms.peer_error(self._failure(out, failed), self)
        n = len(self.mine)
        highs, lows = out[HEADER:HEADER + 2 * n:2].tolist(), out[HEADER + 1:HEADER + 2 * n:2]
        differs = [Differ(name, mine, -int(low), high) for name, mine, high, low
                   in zip(self.terms.fields, self.mine, highs, lows) if high != -low]
        if differs:
            every = self._every_rank([self.terms.fields.index(d.field) for d in differs])
            differs = [d._replace(ranks=tuple(column))
                       for d, column in zip(differs, every.T.tolist())]
            raise MismatchError(self.terms.mismatch(differs, self))
        maxima = {name: int(out[HEADER + 2 * FIELDS + i])
                  for i, name in enumerate(self.terms.maxima)}
        columns = {name: out[self._column(2 + i):self._column(3 + i)].tolist()
                   for i, name in enumerate(self.terms.columns)}
        return Agreed(maxima, columns, out[slot_start(self.size, 0):])

    def _every_rank(self, fields: list[int]) -> np.ndarray:
        """Every rank's values of ``fields`` (rank by field), for a mismatch's message: one
        more MAX allreduce, which every rank runs, as every rank sees the same mismatch."""
        table = np.full((self.size, len(fields)), _MIN, dtype=np.int64)
        table[self.rank] = [self.mine[i] for i in fields]
        dev = table if self.comm.xp is np else self.comm.xp.asarray(table)
        return np.asarray(self.comm.run_fetch("allreduce", dev, dev, ReduceOp.MAX, result=dev,
                                              op_name=f"{self.terms.verb}.mismatch"))

    def _column(self, index: int) -> int:
        return HEADER + 2 * FIELDS + MAXIMA + index * self.size

    def _failure(self, out: np.ndarray, failed: list[int]) -> Failure:
        first = failed[0]
        code = int(out[self._column(0) + first]) - 1
        shown, position = divmod(code, 64)
        kind, has_detail = divmod(shown, 2)
        return Failure(first, _KINDS[kind], ARGUMENTS[position - 1] if position else None,
                       int(out[self._column(1) + first]) if has_detail else None, failed)


def _allreduce(comm: Any, vec: np.ndarray, verb: str, op_name: str) -> np.ndarray:
    """The MAX-allreduce of ``vec`` (host, or its copy on ``comm``'s device); the reduced
    vector on the host after the header's checks."""
    dev = vec if comm.xp is np else comm.xp.asarray(vec)
    out = comm.run_fetch("allreduce", dev, dev, ReduceOp.MAX, result=dev, op_name=op_name)
    high, low, last, first = out[:HEADER].tolist()
    low, first = -low, -first
    if low != high:
        raise MismatchError(
            f"ranks called different collectives at the same point: {_verb(low)} and "
            f"{_verb(high)} (rank {comm.rank} called {verb}); nothing was moved, every rank "
            "raises this")
    if first != last:
        raise MismatchError(
            f"ranks reached {verb} at different points: after {first} collectives on some "
            f"ranks, {last} on others (rank {comm.rank}: {comm.sequence - 1}); a rank skipped "
            "or added a call (e.g. it raised between collectives); nothing was moved")
    return out


def _verb(code: int) -> str:
    return VERBS[code - 1] if 1 <= code <= len(VERBS) else f"an unknown collective ({code})"
