"""The Communicator protocol every algorithm is written against.

An algorithm only calls the methods below; it never touches MPI or NCCL itself. Dense methods use
NCCL's buffer semantics (``send is recv`` means in-place) and return a :class:`Work`; the front
doors in :mod:`cupycoll.collectives` wait on it unless the caller asked for ``async_op``. The
traffic counters live in :mod:`._stats`, the handles in :mod:`._work`.
"""

from __future__ import annotations

import abc
import contextlib
import os
import types
import weakref
from typing import Any, Sequence

import numpy as np

from .._config import parse_timeout
from .._types import ReduceOp, to_host
from ..errors import (BackendError, BackendUnavailable, CollectiveTimeout, CupycollError,
                      OutOfMemory)
from ._checks import check_counts, check_sends
from ._host_waits import HostWaits
from ._stats import Stats
from ._watchdog import NO_SLOT, SLOT_WORDS, Board, Fate, timeout_error
from ._work import Overlap, Work

__all__ = ["Communicator"]


class Communicator(HostWaits, abc.ABC):
    """A group of ranks and the verbs the algorithms use; see docs/dense.md (The Communicator).

    Attributes: ``rank``, ``size``, ``backend`` ("mpi" | "nccl"), ``xp`` (numpy | cupy), ``stats``
    and ``timeout`` (seconds a blocking wait may take before :class:`CollectiveTimeout`; None =
    forever).
    """

    backend: str
    xp: types.ModuleType
    rank: int
    size: int
    #: True when allgatherv is one native collective; False when it is emulated (NCCL), in which
    #: case algorithms may prefer a padded allgather.
    native_allgatherv: bool = False

    #: dense collectives this rank has started on this communicator (every rank starts the same
    #: ones in the same order, so the count names a collective across ranks).
    sequence: int = 0

    #: the arrival board (see :mod:`._watchdog`) and this rank's slot on it.
    board: Board | None = None
    _slot: memoryview = NO_SLOT
    #: the front-door verb running on this communicator (named by a timeout), if not dense.
    _verb: str | None = None
    #: the mpi4py communicator of the host's agreements and waits (None: none, e.g. wrapped NCCL)
    mpi_comm: Any = None

    def __init__(self, timeout: float | None = None) -> None:
        self.stats = Stats()
        self.timeout = parse_timeout(timeout)
        self.sequence = 0
        self._fate = Fate()
        self._fate.members.add(self)
        _MADE.add(self)

    # dense collectives, NCCL semantics; each returns a Work whose result is None
    @abc.abstractmethod
    def allreduce(self, send: Any, recv: Any, op: ReduceOp | str,
                  op_name: str = "allreduce") -> Work:
        """Start recv = op over ranks of send (identical on every rank)."""

    @abc.abstractmethod
    def broadcast(self, send: Any, recv: Any, root: int, op_name: str = "broadcast") -> Work:
        """Start recv = root's send on every rank (send is only read on root)."""

    @abc.abstractmethod
    def reduce(self, send: Any, recv: Any, op: ReduceOp | str, root: int,
               op_name: str = "reduce") -> Work:
        """Start recv = op over ranks of send, on root only (recv may be None elsewhere)."""

    @abc.abstractmethod
    def allgather(self, send: Any, recv: Any, op_name: str = "allgather") -> Work:
        """Start recv = concatenation of every rank's send along axis 0, in rank order."""

    @abc.abstractmethod
    def reduce_scatter(self, send: Any, recv: Any, op: ReduceOp | str,
                       op_name: str = "reduce_scatter") -> Work:
        """Start recv = this rank's block (axis 0 split into P equal blocks) of op over ranks."""

    def run(self, verb: str, *args: Any, op_name: str | None = None) -> None:
        """Run dense ``verb`` (a method name above, or ``_allgatherv_into``) to completion.

        The same as ``getattr(self, verb)(*args).wait()``; a backend may override it with a
        cheaper blocking call (the MPI backend does).
        """
        method = getattr(self, verb)
        (method(*args) if op_name is None else method(*args, op_name=op_name)).wait()

    # point to point
    @abc.abstractmethod
    def exchange(self, sends: Sequence[tuple[int, Any]], recvs: Sequence[tuple[int, Any]],
                 op_name: str = "exchange") -> Work:
        """Start sending each (peer, array) and receiving into each (peer, buffer), all at once.

        Messages between one pair of ranks arrive in the order they were posted. A peer equal to
        this rank is a local copy and is not counted as traffic.
        """

    @abc.abstractmethod
    def barrier(self) -> None:
        """Block until every rank has called barrier."""

    @abc.abstractmethod
    def wait(self, handles: Any, op_name: str) -> None:
        """Block on backend handles: the one place every blocking wait goes through."""

    def dup(self) -> "Communicator":
        """A communicator over the same ranks with its own message space (collective); a kind
        of communicator without one refuses."""
        raise BackendUnavailable(f"dup on rank {self.rank}: a {type(self).__name__} cannot be "
                                 "duplicated")

    def close(self) -> None:
        """Release backend resources (idempotent)."""

    def on_close(self, release: Any) -> None:
        """Call ``release()`` when this communicator is closed (what was made for it: the
        background worker of its asynchronous calls and that worker's duplicate)."""
        self.__dict__.setdefault("_releases", []).append(release)

    def _release_all(self) -> None:  # the on_close callbacks, once
        for release in self.__dict__.pop("_releases", []):
            release()

    def in_stream(self, join: bool = True) -> Any:
        """A context in which the body's device work runs in this communicator's stream order
        (NCCL: on its own stream, after the caller's current stream's work; with ``join`` the
        caller's stream waits for it on exit). Front doors run inside one. MPI: nothing."""
        return _NO_STREAM

    def synchronize(self) -> None:
        """Block the host until every operation started on this communicator has completed
        (MPI's operations complete in their waits: nothing to do)."""

    def abort(self) -> None:
        """Mark this communicator (and its duplicates) dead: every later call raises at once."""
        self._die(BackendError(f"abort() was called on rank {self.rank}"), "abort()")

    # failures: see _watchdog
    def calling(self, verb: str) -> "_Calling":
        """Name the front-door ``verb`` the operations inside belong to (the outermost wins), so
        a timeout reports ``sparse_allreduce`` rather than one of its steps (a context
        manager)."""
        return _Calling(self, verb)

    def _watch(self, mpi_comm: Any) -> None:
        """Publish this rank's collective count on an arrival board over ``mpi_comm``
        (collective), so a timeout can name the ranks that never arrived."""
        self.board = Board(mpi_comm, self.sequence, finishes=self.backend == "mpi")
        self._slot = self.board.slot

    def _share_fate(self, parent: "Communicator") -> None:
        """Live and die with ``parent`` (a duplicate of it)."""
        self._fate = parent._fate
        self._fate.members.add(self)

    def _timed_out(self, op_name: str, sequence: int | None = None,
                   pending: Sequence[int] = (), waited: Any = "timeout") -> CollectiveTimeout:
        """Build the CollectiveTimeout of a wait on collective ``sequence`` (default the latest)
        that gave up after ``waited`` seconds (default the timeout), naming the missing ranks,
        and abort the communicator."""
        seq = self.sequence if sequence is None else sequence
        verb = self._verb or op_name
        error = timeout_error(self.board, self.rank, self.size, verb, op_name,
                              self.timeout if waited == "timeout" else waited, seq, pending)
        self._die(error, f"{verb} (collective #{seq})")
        return error

    def _interrupted(self, op_name: str, kind: type = KeyboardInterrupt) -> None:
        """A wait, or a front-door call (its peers may wait in it), was left by an exception
        of type ``kind``. Not cupycoll's (KeyboardInterrupt, a signal handler's SystemExit or
        preemption error, a failure of this rank alone, OutOfMemory): an operation may stay
        pending, so the communicator is aborted (a later call would match it). cupycoll's
        other errors are raised on every rank, or have already aborted it: nothing to do."""
        if issubclass(kind, CupycollError) and not issubclass(kind, OutOfMemory):
            return
        how = "interrupted" if kind is KeyboardInterrupt else f"left by {kind.__name__}"
        self._die(BackendError(f"{op_name} was {how} on rank {self.rank}"),
                  f"{op_name} (collective #{self.sequence}, {how})")

    def _die(self, error: CupycollError, where: str) -> None:
        self._fate.kill(error, where, self.sequence, self._slot)

    def _disable(self) -> None:
        """Stop publishing arrivals (calls on a dead communicator start nothing); a backend
        extends this so every later operation raises ``self._fate.dead_error()``."""
        self._stop_publishing()

    def _stop_publishing(self) -> None:
        """Later collectives' counts go to a private slot, not the arrival board."""
        self._slot = memoryview(bytearray(8 * SLOT_WORDS)).cast("q")

    def _closed(self) -> None:
        """Say on the arrival board that this rank closed the communicator before its next
        collective (a peer's timeout there names it; the operations it started complete),
        then stop publishing: a later call on it starts nothing."""
        if self._fate.error is None:
            self._slot[1] = self.sequence + 2
        self._stop_publishing()

    def _forsake(self) -> None:
        """In a forked child: this communicator is its parent's; every use raises, and the
        parent's arrival board is never written (a backend also cuts its MPI communicator)."""
        self._stop_publishing()
        if self._fate.error is None:
            self._fate.error = BackendUnavailable(
                f"process {os.getpid()} is a forked child of the one that made it (e.g. a "
                "DataLoader worker): only the process that made a communicator may use it")
            self._fate.where = "a fork"

    def _check_alive(self) -> None:
        """Raise at once if this communicator was aborted."""
        if self._fate.error is not None:
            raise self._fate.dead_error()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # host synchronisation points (each is one on a GPU; see cupycoll.testing.syncs)
    def fetch(self, work: Work, array: Any) -> np.ndarray:
        """Wait for ``work`` and return ``array`` (which it produced) on the host.

        One host synchronisation where the backend can order the copy behind the operation;
        this default waits, then copies.
        """
        work.wait()
        return to_host(array)

    def run_fetch(self, verb: str, *args: Any, result: Any, op_name: str) -> np.ndarray:
        """Run dense ``verb`` to completion and return ``result`` (an array it wrote) on the
        host: one synchronisation, as :meth:`fetch`; MPI makes it one blocking call."""
        return self.fetch(getattr(self, verb)(*args, op_name=op_name), result)

    def send_buffer(self, nbytes: int) -> Any:
        """An uninitialised uint8 array of ``nbytes`` for one block of an exchange (a packed
        block of entries, sent or received), to hand back with :meth:`release_send_buffer` once
        nothing reads it.
        This default makes a new one."""
        return self.xp.empty(nbytes, dtype=np.uint8)

    def release_send_buffer(self, buffer: Any) -> None:
        """Hand back a :meth:`send_buffer` whose exchange is done (this default drops it)."""

    def stream_order(self, work: Work) -> None:
        """Make ``work``'s results visible to the work this rank issues next.

        For results only device work reads (the next kernel, the next transfer): NCCL orders
        them on the stream already, so the host need not wait; this default waits.
        """
        work.wait()

    def overlap(self) -> Overlap:
        """Return an :class:`Overlap` for consumers of this communicator's transfers."""
        return Overlap(self)

    # derived verbs, written once over the primitives above
    def allgather_counts(self, count: Any, op_name: str) -> np.ndarray:
        """Return every rank's ``count`` (int64, host numpy array) in rank order.

        ``count`` may be a host int or a 1-element device array (read with the result: no
        sync of its own).
        """
        xp = self.xp
        send = xp.asarray([count], dtype=np.int64) if np.ndim(count) == 0 else count
        recv = xp.empty(self.size, dtype=np.int64)
        return self.run_fetch("allgather", send, recv, result=recv, op_name=op_name)

    def allgatherv(self, send: Any, counts: Sequence[int] | None = None,
                   op_name: str = "allgatherv") -> tuple[Any, np.ndarray]:
        """Gather every rank's rows (axis 0) in rank order; return (recv, counts per rank).

        Counts are exchanged first (an allgather of one int64 per rank, booked as
        ``<op_name>.counts``) unless the caller passes them.
        """
        with self.calling("allgatherv"):
            if counts is None:
                counts = self.allgather_counts(int(send.shape[0]), op_name + ".counts")
            counts = check_counts(self, counts, int(send.shape[0]))
            recv = self.xp.empty((int(counts.sum()),) + tuple(send.shape[1:]), dtype=send.dtype)
            self.run("_allgatherv_into", send, recv, counts, op_name=op_name)
            return recv, counts

    def _allgatherv_into(self, send: Any, recv: Any, counts: np.ndarray, op_name: str) -> Work:
        """Point-to-point allgatherv (backends with a native one override this)."""
        offsets = np.concatenate([[0], np.cumsum(counts)])
        blocks = [recv[offsets[r]:offsets[r + 1]] for r in range(self.size)]
        blocks[self.rank][...] = send
        peers = [r for r in range(self.size) if r != self.rank]
        return self.exchange([(r, send) for r in peers if send.shape[0]],
                             [(r, blocks[r]) for r in peers if counts[r]], op_name)

    def alltoall_counts(self, counts: Sequence[int], op_name: str) -> np.ndarray:
        """Send counts[j] to rank j; return what every rank sent to this one (host int64)."""
        send = self.xp.asarray(np.asarray(counts, dtype=np.int64).reshape(self.size))
        return self.alltoall_device_counts(send, op_name)[1]

    def alltoall_device_counts(self, counts: Any, op_name: str) -> tuple[np.ndarray, np.ndarray]:
        """Send device ``counts[j]`` (int64, P entries) to rank j; return (sent, received) on the
        host, both read by one :meth:`fetch`."""
        p, rank = self.size, self.rank
        both = self.xp.empty(2 * p, dtype=np.int64)
        both[:p] = counts
        both[p + rank:p + rank + 1] = counts[rank:rank + 1]
        peers = [r for r in range(p) if r != rank]
        work = self.exchange([(r, both[r:r + 1]) for r in peers],
                             [(r, both[p + r:p + r + 1]) for r in peers], op_name)
        host = self.fetch(work, both)
        return host[:p], host[p:]

    def alltoallv(self, sends: Sequence[Any], op_name: str = "alltoallv",
                  recv_counts: Sequence[int] | None = None) -> list[Any]:
        """Send ``sends[j]`` (rows along axis 0) to rank j; return the list received from each rank.

        Counts go first (one int64 to each peer, booked as ``<op_name>.counts``) unless given.
        """
        check_sends(self, sends)
        with self.calling("alltoallv"):
            if recv_counts is None:
                recv_counts = self.alltoall_counts([s.shape[0] for s in sends],
                                                   op_name + ".counts")
            like = sends[self.rank]
            recvs = [self.xp.empty((int(c),) + tuple(like.shape[1:]), dtype=like.dtype)
                     for c in recv_counts]
            recvs[self.rank] = sends[self.rank]
            peers = [r for r in range(self.size) if r != self.rank]
            self.exchange([(r, sends[r]) for r in peers if sends[r].shape[0]],
                          [(r, recvs[r]) for r in peers if recvs[r].shape[0]], op_name).wait()
            return recvs

    def _record_allgatherv(self, op_name: str, byte_counts: np.ndarray) -> None:
        """Book a native allgatherv exactly: this rank's block to each peer, each peer's block in,
        and count it in ``sequence`` (a collective: a timeout names the ranks that never
        started it).

        Empty blocks are no messages, as in ``exchange``.
        """
        self._arrived()
        counts = [int(c) for c in byte_counts]
        own = counts.pop(self.rank)
        peers = self.size - 1 if own else 0
        self.stats.record(op_name, own * (self.size - 1), sum(counts), peers,
                          sum(1 for c in counts if c))

    def _record_collective(self, name: str, nbytes: int, root: int | None = None,
                           op_name: str | None = None) -> None:
        """Book a native collective's traffic by the rule in :class:`Stats` (under ``op_name``)
        and count it in ``sequence`` (the store on the arrival board is its whole cost there)."""
        self._arrived()
        self.stats.book_collective(op_name or name, name, nbytes, self.rank == root, self.size)


_NO_STREAM = contextlib.nullcontext()
#: every communicator of this process, forsaken in a forked child (:func:`_forked`)
_MADE: "weakref.WeakSet[Communicator]" = weakref.WeakSet()


def _forked() -> None:
    for comm in list(_MADE):
        comm._forsake()


os.register_at_fork(after_in_child=_forked)


class _Calling:
    """:meth:`Communicator.calling`'s context: a class, cheaper than a generator-based one."""

    __slots__ = ("comm", "verb", "outermost")

    def __init__(self, comm: Communicator, verb: str) -> None:
        self.comm, self.verb, self.outermost = comm, verb, False

    def __enter__(self) -> None:
        comm = self.comm
        if comm._verb is None:
            comm._check_alive()
            comm._verb, self.outermost = self.verb, True

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if self.outermost:
            comm, comm._verb = self.comm, None
            if kind is not None and comm._fate.error is None:
                comm._interrupted(self.verb, kind)  # its peers may be in the call
