"""The host waits of a Communicator: barriers and broadcasts of its host MPI communicator,
waited for under the communicator's timeout, before and instead of MPI's untimed calls."""

from __future__ import annotations

import pickle
import time
from typing import Any

import numpy as np

from ..errors import BackendError
from ._nccl_guard import spin
from ._watchdog import forsaken_error

__all__ = ["HostWaits"]


class HostWaits:
    """:class:`~cupycoll.comm._base.Communicator`'s host waits (a mixin of it: it reads its
    ``mpi_comm``, ``timeout``, ``sequence``, arrival board and fate)."""

    mpi_comm: Any
    timeout: float | None

    def host_arrival(self, op_name: str) -> None:
        """Wait, under ``self.timeout`` and interruptible, until every rank has reached this
        point: a barrier of the host MPI communicator (``mpi_comm``; none: nothing to wait
        for). Taken before MPI's blocking calls that have no nonblocking twin or are made once
        per communicator (node detection; a broadcast: :meth:`host_bcast`), so a rank left
        alone there (its peers gave up the call, or were interrupted) times out, never hangs.

        Raises:
            CollectiveTimeout: not every rank arrived in time (this communicator is aborted).
        """
        if self.mpi_comm is not None and self.size > 1:
            self._host_wait(self.mpi_comm.Ibarrier(), op_name)
            self._no_peer_gave_up(op_name)

    def _arrived(self) -> None:
        """Count a collective this rank started in ``sequence`` (its arrival notice on the
        board: a timeout names the ranks whose count is below it)."""
        self._slot[0] = self.sequence = self.sequence + 1

    def _finished(self, sequence: int | None = None) -> None:
        """Publish on the board that this rank finished collective ``sequence`` (default the
        latest): a peer still waiting in it then knows this rank's later abort left it whole
        (once every collective before it finished too: :meth:`Board.finish`)."""
        if self.board is not None:
            self.board.finish(self.sequence if sequence is None else sequence, self._slot)

    def _released(self, sequence: int | None) -> None:
        """Collective ``sequence`` (None: messages only) will not be seen finished here (its
        Work failed, or was dropped): it holds the finished count down no longer
        (:meth:`Board.release`)."""
        if sequence is not None and self.board is not None:
            self.board.release(sequence)

    def _dropped(self, test: Any, keep: Any, sequence: int | None) -> None:
        """A Work of collective ``sequence`` (None: of messages) was dropped unfinished: its
        operation is kept (``test``: whether done; ``keep``: its buffers) until it is done."""
        self._orphaned.append((test, keep))
        self._released(sequence)

    def _still_wanted(self, op_name: str, sequence: int | None = None) -> None:
        """In a wait for collective ``sequence`` (default the latest): raise if this
        communicator died meanwhile (``abort()`` from another thread), or, as a
        CollectiveTimeout naming them, if peers on this node gave it up before they started
        that collective (a dead communicator starts nothing: they never will), or inside it
        without finishing it, a grace period ago (:meth:`Board.given_up_on`)."""
        self._check_alive()
        seq = self.sequence if sequence is None else sequence
        gone = self.board.given_up_on(self.rank, seq) if self.board is not None else {}
        if gone:
            verb = self._verb or op_name
            error = forsaken_error(gone, self.rank, self.size, verb, seq)
            self._die(error, f"{verb} (collective #{seq}, a peer gave up)")
            raise error

    def _no_peer_gave_up(self, op_name: str) -> None:
        """After a barrier: raise (and abort) if a peer on this node gave up this barrier or
        an earlier collective (its abandoned barrier can complete this one), so this rank does
        not go on into MPI's untimed calls without it. A peer that passed the barrier is in
        those calls (or a later host wait, which counts): it cannot have given up since."""
        gave_up = self.board.gave_up(self.rank, self.sequence) if self.board is not None else ""
        if gave_up:
            error = BackendError(f"{op_name} on rank {self.rank}: {gave_up}; every later call "
                                 "on this communicator raises: call cupycoll.init() on every "
                                 "rank for a new one")
            self._die(error, f"{op_name} (collective #{self.sequence}, a peer gave up)")
            raise error

    def host_bcast(self, obj: Any, op_name: str) -> Any:
        """Rank 0's ``obj`` on every rank (pickled) over the host MPI communicator, each of its
        two nonblocking broadcasts (length, bytes) waited for as :meth:`host_arrival` waits:
        a rank whose peers never take part times out instead of hanging in MPI's bcast.
        Without a host communicator (a wrapped NCCL one), over this communicator's own
        broadcast (booked in ``stats``)."""
        mpi_comm = self.mpi_comm
        if self.size == 1:
            return obj
        if mpi_comm is None:
            return self._own_bcast(obj, op_name)
        data = pickle.dumps(obj) if self.rank == 0 else b""
        length = np.array([len(data)], dtype=np.int64)
        self._host_wait(mpi_comm.Ibcast(length, root=0), op_name)
        buffer = bytearray(data) if self.rank == 0 else bytearray(int(length[0]))
        self._host_wait(mpi_comm.Ibcast(buffer, root=0), op_name)
        return obj if self.rank == 0 else pickle.loads(buffer)

    def _own_bcast(self, obj: Any, op_name: str) -> Any:
        """:meth:`host_bcast` over this communicator's broadcast verb (length, then bytes)."""
        xp, data = self.xp, pickle.dumps(obj) if self.rank == 0 else b""
        length = xp.asarray([len(data)], dtype=np.int64)
        length = int(self.run_fetch("broadcast", length, length, 0, result=length,
                                    op_name=op_name)[0])
        buffer = xp.asarray(np.frombuffer(data, dtype=np.uint8)) if self.rank == 0 else (
            xp.empty(length, dtype=np.uint8))
        got = self.run_fetch("broadcast", buffer, buffer, 0, result=buffer, op_name=op_name)
        return obj if self.rank == 0 else pickle.loads(got.tobytes())

    def _host_wait(self, request: Any, op_name: str) -> None:
        """Wait for ``request`` of the host MPI communicator under ``self.timeout``; one given
        up on is kept for good (mpi4py's request holds its buffers, which MPI may still write
        when a late peer comes)."""
        from ._mpi_pairwise import progress_all  # (here: it needs MPI, which a host wait has)

        self._slot[0] = self.sequence = self.sequence + 1  # a timeout names the late ranks
        deadline = None if self.timeout is None else time.monotonic() + self.timeout

        def arrived() -> bool:
            if request.Test():
                return True
            if deadline is not None and time.monotonic() > deadline:
                raise self._timed_out(op_name)
            self._still_wanted(op_name)  # abort() from another thread, peers gone: it ends
            progress_all()  # a peer may wait in a pairwise call's second phase this rank holds
            return False

        try:
            spin(arrived)
        except BaseException as exc:  # the request stays posted: the others' wait completes
            self._fate.abandon(request)
            self._interrupted(op_name, type(exc))  # against it, so say this rank gave up
            raise
        self._finished()
