"""Late ranks named, dead communicators loud: the arrival board and the fate of a communicator.

Every rank counts the collectives it has started on a communicator (``Communicator.sequence``;
every rank starts the same collectives in the same order, so the count names one collective
across ranks). The **arrival board** publishes that count: one int64 slot per rank in an MPI
shared-memory window, overwritten with a plain store each time a collective starts (the whole
hot-path cost). Nobody reads it until a wait times out: then the timed-out rank reads every
rank's slot -- directly from shared memory for the ranks on its node, so a late rank that is
busy elsewhere (not calling MPI at all) need not help; ranks on other nodes through an MPI RMA
read that is given a short grace period -- and names the ranks whose count is below the one of
the collective it waited for.

A second slot holds where the rank aborted the communicator (0 while it is alive), so a rank
that times out after its peers gave up says so; a third the last collective it finished with
every one before it finished too (MPI: its wait, or a test, found it done; an asynchronous one
started earlier and not finished holds the count below itself; NCCL, whose collectives finish
on a stream, keeps a count no collective reaches), and a fourth, as bits, which of the
collectives just below that count it gave up unfinished (its Work failed or was dropped), so
a peer waiting in a collective a rank aborted inside, without finishing it, need not wait for
ever.

The **fate** is shared by a communicator and its duplicates: after a timeout, an interrupt or an
abort, every later call on any of them raises at once, naming the operation it died in, instead
of matching the operations left pending on other ranks. ``cupycoll.init()`` (on every rank)
builds a fresh communicator over a new MPI communicator.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import BackendError, CollectiveTimeout, CupycollError

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["Board", "Fate", "NO_SLOT", "SLOT_WORDS", "late_ranks", "timeout_error"]

#: int64 words of a rank's board slot: arrived, died at + 1, finished, given up unfinished
SLOT_WORDS = 4
#: stand-in for the board slot of a communicator without a board (stores go nowhere useful).
NO_SLOT = memoryview(np.zeros(SLOT_WORDS, np.int64)).cast("B").cast("q")
_ARRIVED, _DIED, _FINISHED, _GIVEN_UP = range(SLOT_WORDS)
#: the given-up word's bit d stands for collective finished - d, for 0 <= d < _WINDOW (an int64
#: without its sign bit); older ones count as finished (no peer waits that far behind a rank
#: that finished a later collective: every collective needs every rank)
_WINDOW = 63
#: the finished count of a communicator that does not publish its finishes (NCCL)
UNTRACKED = 1 << 62
#: seconds a wait goes on after it first sees that a peer aborted inside its collective,
#: unfinished (the peer may have sent its part: the wait can still complete)
_INSIDE_GRACE = 2.0
_REMOTE_GRACE = 0.5  # seconds a timed-out rank waits for RMA reads of ranks on other nodes
#: what every operation given up on in this process still reads or writes (see Fate.abandon,
#: and a board read left unfinished)
_ABANDONED: list[Any] = []


class Board:
    """The arrival board of one MPI communicator (collective to create).

    ``slot`` is this rank's ``[sequence, died at + 1, finished, given up]`` (int64 memoryview:
    a store is cheap), from ``sequence`` (collectives started and finished so far);
    ``finishes``: the communicator publishes the collectives it finishes (else ``UNTRACKED``).
    """

    def __init__(self, mpi_comm: MPI.Comm, sequence: int = 0, finishes: bool = True) -> None:
        from mpi4py import MPI  # here, not at import: `import cupycoll` works without an MPI library

        rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        self._shared = MPI.Win.Allocate_shared(8 * SLOT_WORDS, 8, comm=node)
        memory = self._shared.tomemory()
        self.slot = memoryview(memory).cast("B").cast("q")
        self.slot[_ARRIVED], self.slot[_DIED], self.slot[_GIVEN_UP] = sequence, 0, 0
        self.slot[_FINISHED] = sequence if finishes else UNTRACKED
        self._tracked, self._done, self._lock = finishes, sequence, threading.Lock()
        self._unfinished: set[int] = set()  # asynchronous collectives started, not finished
        self._let_go: list[int] = []  # collectives released, not yet taken in (see release)
        self._given_up: set[int] = set()  # released ones that hold the count down no longer
        self._inside_seen: dict[tuple[int, int], float] = {}
        members, cpus = zip(*node.allgather((rank, _cpus())))
        #: whether this node's ranks outnumber the cores they may run on (see :func:`crowded`)
        self.crowded = crowded(cpus)
        self._local = {}
        for i, world in enumerate(members):
            buf, _ = self._shared.Shared_query(i)
            # (a memoryview: a word reads as a Python int, not a numpy scalar)
            self._local[world] = memoryview(np.frombuffer(buf, np.int64, SLOT_WORDS))
        self._remote = None
        if node.Get_size() < size:  # ranks on other nodes: RMA reads of the same memory, in
            self._remote = MPI.Win.Create(memory, 8, comm=mpi_comm)  # one passive epoch:
            self._remote.Lock_all(MPI.MODE_NOCHECK)  # local (nobody locks it exclusively)
        self.size = size
        node.Free()

    @property
    def one_node(self) -> bool:
        """Whether every rank of the communicator is on this rank's node."""
        return len(self._local) == self.size

    def arrived(self, sequence: int) -> bool:
        """Whether every rank on this node has started collective ``sequence``."""
        return all(view[_ARRIVED] >= sequence for view in self._local.values())

    def started(self, sequence: int) -> None:
        """Collective ``sequence`` goes on asynchronously: the finished count published stays
        below it until it finishes."""
        with self._lock:
            self._unfinished.add(sequence)

    def release(self, sequence: int) -> None:
        """Collective ``sequence``'s Work failed or was dropped unfinished: from the next
        :meth:`finish` on it holds the count down no longer, and is published as given up
        (until a test of the dropped Work finds it done). Takes no lock: a Work's ``__del__``
        calls it, maybe inside :meth:`finish`."""
        self._let_go.append(sequence)

    def finish(self, sequence: int, slot: memoryview) -> None:
        """Publish in ``slot`` (this rank's, or a dead communicator's private one) that
        collective ``sequence`` finished: the last collective finished with all before it but
        those given up, and which of the ones up to it were given up."""
        if not self._tracked:
            return
        with self._lock:
            while self._let_go:
                let_go = self._let_go.pop()
                if let_go in self._unfinished or let_go > self._done:  # not finished here
                    self._unfinished.discard(let_go)
                    self._given_up.add(let_go)
            self._unfinished.discard(sequence)
            self._done = done = max(self._done, sequence)
            finished = min(done, min(self._unfinished) - 1) if self._unfinished else done
            mask = 0
            if self._given_up:  # (none: the usual case)
                self._given_up.discard(sequence)
                self._given_up = {s for s in self._given_up if finished - s < _WINDOW}
                mask = sum(1 << (finished - s) for s in self._given_up if s <= finished)
            slot[_GIVEN_UP] = mask
            slot[_FINISHED] = finished

    def read(self) -> list[tuple[int, int] | None]:
        """Return every rank's (sequence, died at + 1), or None where it could not be read."""
        out: list[tuple[int, int] | None] = [None] * self.size
        for r, view in self._local.items():
            out[r] = (int(view[_ARRIVED]), int(view[_DIED]))
        far = [r for r in range(self.size) if r not in self._local]
        if far and self._remote is not None:
            out_far = self._read_remote(far)
            for r in far:
                out[r] = out_far.get(r)
        return out

    def gave_up(self, rank: int, upto: int) -> str:
        """The ranks on this node (but ``rank``) that aborted or closed their communicator at
        collective ``upto`` or before, as "rank r gave it up at collective #c", "; "-joined
        ("" if none)."""
        return "; ".join(f"rank {r} gave it up at collective #{int(view[_DIED]) - 1}"
                         for r, view in sorted(self._local.items())
                         if r != rank and 0 < view[_DIED] <= upto + 1)

    def given_up_on(self, rank: int, sequence: int) -> dict[int, tuple[int, bool]]:
        """The ranks on this node (but ``rank``) that aborted or closed their communicator
        before they started collective ``sequence`` (a dead or closed communicator starts
        nothing more, and its count stays), or that aborted it inside ``sequence`` (or a later
        one) without finishing ``sequence``, seen so for ``_INSIDE_GRACE`` s by this rank after
        every live rank started it (what the aborted rank posted may let the collective
        complete once they have; only where every rank is on this node: a late rank elsewhere
        is not seen): {rank: (the collective it gave up at, whether it had started
        ``sequence``)}."""
        if not any(view[_DIED] for view in self._local.values()):  # nobody here gave up:
            return {}  # the usual case, in every poll round of a wait
        gone, inside, live_late = {}, {}, False
        for r, view in sorted(self._local.items()):
            arrived, died, finished, given_up = (int(v) for v in view)
            if r == rank:
                continue
            if not died:
                live_late |= arrived < sequence
            elif arrived < sequence:
                gone[r] = (died - 1, False)
            elif died - 1 == arrived and not _finished(finished, given_up, sequence):
                # aborted (not closed) inside its latest collective, without finishing this
                inside[r] = (died - 1, True)
        if inside and not live_late and self._remote is None:
            now = time.monotonic()
            for r, why in inside.items():
                if now - self._inside_seen.setdefault((r, sequence), now) >= _INSIDE_GRACE:
                    gone[r] = why
        return gone

    def _read_remote(self, ranks: Sequence[int]) -> dict[int, tuple[int, int]]:
        """RMA reads of ranks on other nodes, given ``_REMOTE_GRACE`` s (a rank whose MPI
        library needs its help to serve the read and is busy elsewhere stays unread). The
        epoch is open from the board's making: a lock taken here would wait for that help
        itself, past any grace. A read left unfinished keeps its buffer (MPI may still write
        it)."""
        from mpi4py import MPI

        bufs, reqs = {}, []
        for r in ranks:
            bufs[r] = np.zeros(2, np.int64)
            reqs.append(self._remote.Rget(bufs[r], r))
        deadline = time.monotonic() + _REMOTE_GRACE
        while not MPI.Request.Testall(reqs) and time.monotonic() < deadline:
            time.sleep(1e-3)
        done = {r: (int(b[0]), int(b[1])) for (r, b), q in zip(bufs.items(), reqs) if q.Test()}
        if len(done) < len(ranks):
            _ABANDONED.append((bufs, reqs))
        return done


def _finished(finished: int, given_up: int, sequence: int) -> bool:
    """Whether a rank whose slot reads ``finished`` and ``given_up`` finished ``sequence``."""
    behind = finished - sequence
    return behind >= 0 and not (behind < _WINDOW and given_up >> behind & 1)


class Fate:
    """Alive or dead, shared by a communicator and its duplicates."""

    def __init__(self) -> None:
        self.error: CupycollError | None = None
        self.where = ""
        self.members: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def abandon(self, *pending: Any) -> None:
        """Keep the requests and buffers of an operation given up on alive for good (for the
        life of the process, not of this communicator): MPI may still read or write them when
        a late peer arrives, a queued device-to-host copy when its stream moves on."""
        _ABANDONED.append(pending)

    def kill(self, error: CupycollError, where: str, sequence: int, slot: memoryview) -> None:
        """Mark every member dead (first cause wins) and publish it on the boards: ``slot``
        (the member that died, at ``sequence``) and each other member's own, at its count (a
        peer waiting on a duplicate, e.g. an asynchronous call's worker, is told too)."""
        if self.error is None:
            self.error, self.where = error, where
            slot[_DIED] = sequence + 1
            for member in list(self.members):
                mine = member._slot
                if mine is not slot and mine is not NO_SLOT and not mine[_DIED]:
                    mine[_DIED] = member.sequence + 1
            # calls on a dead communicator raise before they start: they are no arrivals
        for member in list(self.members):
            member._disable()

    def dead_error(self) -> CupycollError:
        """A fresh error of the kind that killed the communicator, saying where."""
        text = f"this communicator was aborted in {self.where}"
        tail = "; every call on it raises now: call cupycoll.init() on every rank for a new one"
        if isinstance(self.error, CollectiveTimeout):
            missing = self.error.missing_ranks
            text += " (timed out" + (f"; missing {_ranks(missing)})" if missing else ")")
            return CollectiveTimeout(text + tail, missing_ranks=missing,
                                     op_name=self.error.op_name)
        return BackendError(f"{text} ({self.error}){tail}")


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"


def timeout_error(board: Board | None, rank: int, size: int, verb: str, step: str,
                  waited: float | None, sequence: int,
                  pending: Sequence[int] = ()) -> CollectiveTimeout:
    """The CollectiveTimeout of a wait in ``verb`` (at its ``step``) on collective number
    ``sequence`` that gave up.

    Missing: ranks whose board count is below ``sequence`` (they never started it); when every
    rank has started it (a point-to-point step inside a call), the peers whose messages are still
    pending (``pending``), else those that gave the communicator up.
    """
    seen = board.read() if board is not None else [None] * size
    behind, died, unread, gone = [], [], [], []
    for r, entry in enumerate(seen):
        if r == rank:
            continue
        if entry is None:
            unread.append(r)
            continue
        count, dead = entry
        if count < sequence:
            behind.append(r)
        if dead:
            died.append(_gave_up(r, dead - 1))
            gone.append(r)
    missing = behind or sorted(set(pending))
    if behind:
        why = f"{_ranks(behind)} never arrived (started only collectives before #{sequence})"
    elif missing and set(missing) <= set(gone):
        why = f"{_ranks(missing)} gave the communicator up before sending this rank its messages"
    elif missing:
        owe = "still owe" if len(missing) > 1 else "still owes"
        why = f"every rank started it, but {_ranks(missing)} {owe} this rank messages"
    elif unread:
        why = f"{_ranks(unread)} on other nodes could not be read (MPI needs their help)"
        missing = unread
    else:  # e.g. a peer gave up the call and started another before this rank came
        why = "every rank started it and no peer owes this rank a message (a peer may have " \
            "given it up, or be in another operation)"
        missing = gone  # those that gave it up, as where they never started it
    notes = "; ".join(died)
    within = f"within {waited} s " if waited is not None else ""
    where = f"step {step}, " if step != verb else ""
    return CollectiveTimeout(
        f"{verb} ({where}collective #{sequence}) did not complete {within}on rank {rank} of "
        f"{size}: "
        f"{why}{'; ' + notes if notes else ''}. {_ABORTED}", missing_ranks=missing, op_name=verb)


def forsaken_error(gone: dict[int, tuple[int, bool]], rank: int, size: int, verb: str,
                   sequence: int) -> CollectiveTimeout:
    """The CollectiveTimeout of a wait on collective number ``sequence`` that ``gone``
    (:meth:`Board.given_up_on`) will never start or finish."""
    why = "; ".join(f"{_gave_up(r, at)}, "
                    f"{'without finishing' if started else 'before starting'} this one"
                    for r, (at, started) in gone.items())
    return CollectiveTimeout(
        f"{verb} (collective #{sequence}) cannot complete on rank {rank} of {size}: {why}. "
        f"{_ABORTED}", missing_ranks=sorted(gone), op_name=verb)


#: how a wait's error ends once it has aborted its communicator
_ABORTED = ("The communicator is aborted: every later call on it raises at once; call "
            "cupycoll.init() on every rank for a new one")


def _gave_up(rank: int, collective: int) -> str:
    return f"rank {rank} aborted or closed it at collective #{collective}"


def late_ranks(board: Board | None, rank: int, sequence: int) -> list[int]:
    """The ranks (but ``rank``) whose board count is below ``sequence``: they have not started
    that collective (none where there is no board or a rank could not be read)."""
    seen = board.read() if board is not None else []
    return [r for r, entry in enumerate(seen)
            if r != rank and entry is not None and entry[0] < sequence]


def _cpus() -> frozenset[int] | int:
    """The cores this process may run on (their count where the OS does not say which)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


def crowded(cpus: Sequence[frozenset[int] | int]) -> bool:
    """Whether the ranks of a node (``cpus``: each one's :func:`_cpus`) outnumber the cores
    they may run on together: ranks sharing a core, so a wait that spins holds a core that a
    peer it waits for needs (MPI's waits then spin ``_naps.CROWDED_SPIN`` unless the caller's
    own wait finds every rank of the node inside the collective)."""
    if all(isinstance(c, frozenset) for c in cpus):
        return len(cpus) > len(frozenset().union(*cpus))
    return len(cpus) > max(c if isinstance(c, int) else len(c) for c in cpus)
