"""``CUPYCOLL_AUTO=learn``: ``auto`` learns from the calls a training loop repeats.

The synchronous ``auto`` calls of a shape class (:func:`.measure.kind`: P, element sizes, op,
output, wire, and n, width and total nnz to a power of two: those of the call that made the
front door's :class:`Kind`, kept while every rank's count stays near that call's) are timed
(:meth:`Record.timed`), agreed as the slowest rank's, feeding the class's :class:`Record`.
The first calls run the model's pick, then in turn the others it prices within :data:`WITHIN`
of it (at most :data:`CANDIDATES` in all): each a warm-up call (not counted) and
:data:`SAMPLES` timed ones, stopped after one over :data:`ABANDON` times the best so far.
Where the others would leave the pick, it is timed again first (a class's first calls pay for
what its size needs anew). Then the pick runs unless another is clearly faster
(:func:`clearly_faster`, over each one's latest :data:`WINDOW` samples; then the least median
of those): a call's time varies by more than the algorithms near the pick differ, and a median
of a few samples would follow that noise.
One in :data:`TIME_EVERY` of the choice's calls is timed, so a choice that slows down is left.
At a recheck (the class's :data:`RECHECK`-th call, then twice the calls before while the
choice stands, up to :data:`RECHECK_MAX`; ``RECHECK`` again once it changes) one of the
others, in turn, starts its trials again: one call if it takes over :data:`RETRY_WITHIN` times
the pick's median, ``SAMPLES`` if it is that close. A class's first trials take at most
:data:`TRIAL_CALLS` calls (its pick's included), a recheck up to ``SAMPLES``. A new class
next to one that finished its trials (half or twice the total nnz: a loop's drift across a
power of two) starts from that class's record, its times scaled by the sizes' ratio, without
trials of its own.

No collective is added: a call's time travels in the validation allreduce of the next
``sparse_allreduce`` on the communicator (a maximum of the agreement, ``learned``), so every
rank adds the same number to the same record and makes the same choice. A call during which
numba's background import ran on some rank (:func:`cupycoll.primitives._accel.loading`) is
not counted on any rank: that rank sends :data:`DISTURBED`, which the maximum gives everyone.
Asynchronous and small calls are not timed; an asynchronous call runs the current choice.
What a communicator learned can be saved and loaded (:func:`save`, :func:`load`: rank 0's
records, broadcast). Results stay bitwise identical across ranks; which algorithm computed
them (so the rounding of a float sum) can change between calls.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from typing import Any, Callable

import numpy as np

from ..primitives import _accel
from ._learn_file import read_records, write_records
from ._learn_kept import Kind, Records
from . import auto as _auto
from ._cost import Shape
from .measure import kind

__all__ = ["Record", "Records", "Kind", "plan", "class_key", "with_total", "finish", "absorb",
           "pending_us", "save", "load", "records", "WITHIN", "CANDIDATES", "SAMPLES", "ABANDON",
           "WINDOW", "RECHECK", "RECHECK_MAX", "RETRY_WITHIN", "TRIAL_CALLS", "TIME_EVERY",
           "DISTURBED"]

#: candidates: the algorithms the model prices within this factor of its best
WITHIN = 2.0
#: algorithms tried at most per shape class, the model's pick first
CANDIDATES = 3
#: timed calls of a candidate (after its warm-up) before the first choice
SAMPLES = 3
#: a candidate whose first timed call takes over this factor of the best median so far stops
ABANDON = 1.5
#: the share of sample pairs in which a candidate must beat the model's pick to replace it
FASTER_PAIRS = 0.85
#: the latest timed calls of each candidate that its median counts
WINDOW = 8
#: the call of a class's first recheck, and the calls to the next after a changed choice
RECHECK = 32
#: the most calls between two rechecks (each that finds the choice standing doubles them)
RECHECK_MAX = 256
#: a candidate tried again at a recheck whose first timed call takes over this factor of the
#: best median stops there (its first trials stop at ABANDON)
RETRY_WITHIN = 1.1
#: one in this many of a choice's calls is timed once the trials are done (a trial or recheck:
#: every call; the timing is most of learn's cost): its window spans ~WINDOW x TIME_EVERY calls
TIME_EVERY = 4
#: the most calls of a new shape class's first trials (a warm-up and SAMPLES timed calls each,
#: and SAMPLES more of the model's pick where the others would leave it)
TRIAL_CALLS = CANDIDATES * (1 + SAMPLES) + SAMPLES
DISTURBED = 1 << 62  #: the ``learned`` value of a call not to count: above any time in us


@dataclasses.dataclass
class Record:
    """One shape class: its candidates in the model's order, the warm-up calls seen, the
    latest agreed seconds of each, the abandoned ones and the class's timed calls."""

    candidates: list[str]
    warmed: list[str] = dataclasses.field(default_factory=list)
    seconds: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    abandoned: list[str] = dataclasses.field(default_factory=list)
    calls: int = 0
    #: the choice, kept until a time is added or a candidate's samples are dropped
    _choice: str | None = dataclasses.field(default=None, repr=False, compare=False)
    #: each candidate's median, kept until its window changes (a call reads them all)
    _medians: dict[str, float] = dataclasses.field(default_factory=dict, repr=False,
                                                   compare=False)
    #: the candidate tried again at the last recheck, until its first timed call is judged
    _retrying: str | None = dataclasses.field(default=None, repr=False, compare=False)
    #: the least median of the candidates other than the model's pick, as the choice was last
    #: made: while the pick is the choice, a sample of it keeps it while its median stays at or
    #: below this (no other is then faster by median, nor clearly faster)
    _rivals: float = dataclasses.field(default=np.inf, repr=False, compare=False)
    #: no candidate in its first trials (kept until a recheck drops a candidate's samples)
    _explored: bool = dataclasses.field(default=False, repr=False, compare=False)
    #: the model's pick was timed again after the others' first trials, where they would
    #: leave it (:meth:`exploring`); a record made from measured samples (a neighbour's, a
    #: loaded one) starts so
    _confirmed: bool = dataclasses.field(default=False, repr=False, compare=False)
    #: the call of the next recheck (0: RECHECK after the record's first), the calls between
    #: the last two, the rechecks so far and the choice at the last one (see :meth:`next`)
    _recheck_at: int = dataclasses.field(default=0, repr=False, compare=False)
    _interval: int = dataclasses.field(default=RECHECK, repr=False, compare=False)
    _rechecks: int = dataclasses.field(default=0, repr=False, compare=False)
    _checked: str | None = dataclasses.field(default=None, repr=False, compare=False)
    #: whether the call :meth:`next` returned last is timed (:meth:`timed`)
    _timed: bool = dataclasses.field(default=True, repr=False, compare=False)
    #: let go by its table (:class:`Records`): a :class:`Kind` holding it looks its class up
    #: again, and a time pending for it is not added
    _dropped: bool = dataclasses.field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._recheck_at = self._recheck_at or self.calls + RECHECK

    def median(self, name: str) -> float:
        found = self._medians.get(name)
        if found is None:
            window = self.seconds.get(name)
            found = self._medians[name] = _median(window) if window else np.inf
        return found

    def choice(self) -> str:
        """The model's pick, unless a candidate is clearly faster (:func:`clearly_faster` than
        it): then, of those, the one of least median time (the model's order on ties). A pick
        abandoned or not yet timed leaves the least median of the others."""
        if self._choice is None:
            pick = self.candidates[0]
            others = [c for c in self.candidates[1:] if c in self.seconds]
            # in both branches below the pick is chosen while its median is at or below these
            self._rivals = min((self.median(c) for c in others), default=np.inf)
            if pick in self.seconds and pick not in self.abandoned:
                others = [c for c in others if self.median(c) < self.median(pick)
                          and clearly_faster(self.seconds[c], self.seconds[pick])]
                if not others:
                    self._choice = pick
                    return pick
            self._choice = min([pick] + others,
                               key=lambda c: (self.median(c), self.candidates.index(c)))
        return self._choice

    def _changed(self, name: str) -> None:
        """``name``'s window changed: its median and the choice are read again."""
        self._medians.pop(name, None)
        self._choice = None

    def exploring(self) -> str | None:
        """The candidate still in its first trials, if any (the model's order). Where the
        others' first trials would leave the model's pick, its samples are dropped and it is
        timed again first, once: a class's first calls pay for what its size needs anew (the
        heap's growth, its pages' first touch), and the pick, tried first, took them."""
        if self._explored:
            return None
        for name in self.candidates:
            if name not in self.abandoned and len(self.seconds.get(name, ())) < SAMPLES:
                return name
        if not self._confirmed:
            self._confirmed = True
            pick = self.candidates[0]
            if pick in self.seconds and self.choice() != pick:
                self.seconds.pop(pick)
                self._changed(pick)
                return pick
        self._explored = True
        return None

    def next(self) -> str:
        """The algorithm of the next call (counted). At a recheck (see the module) one of the
        others, in turn, starts its trials again (its old samples dropped)."""
        self.calls += 1
        if self._explored and self.calls < self._recheck_at and self._choice is not None:
            self._timed = self.calls % TIME_EVERY == 0  # a settled class's call: its choice
            return self._choice
        if self.calls >= self._recheck_at and self.exploring() is None:
            pick = self.choice()
            kept = pick == self._checked
            self._interval = min(2 * self._interval, RECHECK_MAX) if kept else RECHECK
            self._recheck_at, self._checked = self.calls + self._interval, pick
            others = [c for c in self.candidates if c != pick]
            if others:
                again = others[self._rechecks % len(others)]
                self._rechecks += 1
                self.seconds.pop(again, None)
                self._changed(again)
                self._retrying, self._explored = again, False
                if again in self.abandoned:
                    self.abandoned.remove(again)
        name = self.exploring()
        self._timed = name is not None or self.calls % TIME_EVERY == 0
        return self.choice() if name is None else name

    def timed(self) -> bool:
        """Whether the call :meth:`next` returned last is timed: every call of a candidate in
        its trials or tried again, one in :data:`TIME_EVERY` of the choice's."""
        return self._timed

    def add(self, name: str, seconds: float) -> None:
        """An agreed time of ``name``: its first is the warm-up; then it joins the window, and
        a candidate in its first trials far slower than the best (tried again at a recheck:
        slower than :data:`RETRY_WITHIN` times it) is abandoned."""
        if name not in self.warmed:
            self.warmed.append(name)
            return
        window = self.seconds.setdefault(name, [])
        window.append(seconds)
        del window[:-WINDOW]
        if name == self._choice == self.candidates[0] and len(window) > 1:
            median = self._medians[name] = _median(window)
            if median <= self._rivals:  # no other's median below the pick's: it stays
                return
        self._changed(name)
        if len(window) > 1 or name in self.abandoned:
            return
        retried = name == self._retrying
        if retried:
            self._retrying = None
        limit = RETRY_WITHIN if retried else ABANDON
        best = min((self.median(c) for c in self.candidates if c != name), default=np.inf)
        if seconds > limit * best:
            self.abandoned.append(name)


def _median(window: list[float]) -> float:
    """The median of a few samples (statistics.median's value, without its checks)."""
    ordered, half = sorted(window), len(window) // 2
    return ordered[half] if len(window) % 2 else (ordered[half - 1] + ordered[half]) / 2


def clearly_faster(these: list[float], than: list[float]) -> bool:
    """Whether the samples ``these`` are faster than ``than`` beyond the noise of a shared
    machine: in at least :data:`FASTER_PAIRS` of the pairs of one sample of each (3 against 3:
    8 of the 9 pairs, which equal times give by chance once in 10)."""
    ordered = sorted(than)
    faster = sum(len(ordered) - bisect.bisect_right(ordered, a) for a in these)
    return faster >= FASTER_PAIRS * len(these) * len(ordered)


def records(comm: Any) -> Records:
    """``comm``'s records by shape class (the same on every rank)."""
    return _auto.comm_table(comm, "_learned", Records)


def class_key(shape: Shape, op: Any) -> tuple:
    """The key of ``shape``'s class in :func:`records`: :func:`.measure.kind` (the ranks'
    nodes in it) and the op. Its last but one element is the total nnz's bit length
    (:func:`with_total`)."""
    return kind(shape) + (str(getattr(op, "value", op)),)


def with_total(key: tuple, total_nnz: int) -> tuple:
    """``key`` of a class with another total nnz (a call of the same kind)."""
    return key[:-2] + (total_nnz.bit_length(), key[-1])


def plan(comm: Any, kept: Kind, shape: Callable[[], Shape], op: Any, timed: bool
         ) -> tuple[str, tuple | None]:
    """The algorithm the call of class ``kept.key`` runs (``shape()`` prices a new class) and,
    for a call it times (synchronous, :meth:`Record.timed`), the token to pass to
    :func:`finish`; else None. The record is looked up in :func:`records` where ``kept``
    holds none or a dropped one, and used (the table forgets the class used least recently
    first) then and on every timed call (trials, rechecks, one in :data:`TIME_EVERY` of the
    choice's): a class a loop calls stays. Its other calls touch ``kept`` and the record
    alone."""
    record = kept.record
    if record is None or record._dropped:
        table = records(comm)
        record = table.use(kept.key)
        if record is None:
            priced, profile = _auto.resolved(shape(), comm=comm, op=op)
            record = table[kept.key] = _neighbour(table, kept.key) or _fresh(priced, profile)
        kept.record = record
    if not timed:
        return record.choice(), None
    name = record.next()
    if not record.timed():
        return name, None
    records(comm).use(kept.key)
    return name, (record, name, _mark(comm), _accel.loading())


def _mark(comm: Any) -> Any:
    """Where a timed call starts or ends: a timing event on a stream-ordered communicator's
    stream (the call's device time, read at the next validation, by when it has usually run:
    no host wait), else the host clock (an MPI call is done when it returns)."""
    mark = getattr(comm, "time_mark", None)
    return mark() if mark is not None else time.perf_counter()


def _seconds(comm: Any, start: Any, end: Any) -> float:
    between = getattr(comm, "seconds_between", None)
    return between(start, end) if between is not None else end - start


def _fresh(shape: Shape, profile: Any) -> Record:
    """A new class's record: the model's candidates, nothing timed."""
    times = _auto.predicted_times(_auto.shape_class(shape), profile)
    return Record(_auto.candidates(times, WITHIN, CANDIDATES))


def _neighbour(table: dict[tuple, Record], key: tuple) -> Record | None:
    """A new class's record from the class of half or twice its total nnz, once that one has
    finished its trials: its candidates, warm-ups and samples, the seconds scaled by the sizes'
    ratio. None without one."""
    for step in (-1, 1):  # the total nnz's bit length is the key's last but one element
        near = table.get(key[:-2] + (key[-2] + step, key[-1]))
        if near is not None and near.exploring() is None:
            scale = 2.0 ** -step
            return Record(list(near.candidates), list(near.warmed),
                          {name: [t * scale for t in window]
                           for name, window in near.seconds.items()},
                          list(near.abandoned), near.calls, _confirmed=True,
                          _recheck_at=near._recheck_at, _interval=near._interval,
                          _rechecks=near._rechecks, _checked=near._checked)
    return None


def finish(comm: Any, token: tuple) -> None:
    """After a timed call: its seconds wait for the next validation to be agreed (and whether
    numba's background import ran at its start or end)."""
    record, name, started, disturbed = token
    comm._learn_pending = (record, name, started, _mark(comm), disturbed or _accel.loading())


def pending_us(comm: Any) -> int:
    """This rank's time of the last timed call not yet agreed, in microseconds (-1: none;
    :data:`DISTURBED`: not to count), for the ``learned`` maximum of the next validation."""
    pending = getattr(comm, "_learn_pending", None)
    if pending is None:
        return -1
    if pending[4]:
        return DISTURBED
    return min(max(int(_seconds(comm, pending[2], pending[3]) * 1e6), 0), DISTURBED - 1)


def absorb(comm: Any, agreed_us: int) -> None:
    """The agreed (slowest rank's) time of the last timed call joins its record (unless its
    table let the record go since, e.g. cleared or loaded, or some rank's call was
    :data:`DISTURBED`: then it is dropped, and the candidate's next timed call takes its
    place)."""
    pending = getattr(comm, "_learn_pending", None)
    if pending is None or agreed_us < 0:
        return
    comm._learn_pending = None
    record, name = pending[:2]
    if not record._dropped and agreed_us < DISTURBED:
        record.add(name, agreed_us * 1e-6)


def save(comm: Any, path: str) -> None:
    """Write ``comm``'s records to ``path`` (JSON; rank 0 writes, the others wait for it).

    Raises:
        InvalidArgument: on every rank, when rank 0 could not write ``path``."""
    write_records(comm, records(comm), path, Record)


def load(comm: Any, path: str) -> int:
    """Replace ``comm``'s records by those of ``path`` (rank 0 reads, then broadcasts:
    ``comm.host_bcast``); returns how many. A loaded class runs its choice from its first
    call.

    Raises:
        InvalidArgument: on every rank, when rank 0 could not read ``path`` as a table
            :func:`save` wrote (the records are left as they were)."""
    loaded = read_records(comm, path, Record)
    records(comm).clear()
    records(comm).update(loaded)
    comm._learn_pending = None  # a time measured before: not of a loaded record
    return len(loaded)
