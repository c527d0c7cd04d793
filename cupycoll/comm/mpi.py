"""MPI backend: mpi4py buffer (upper-case) calls over numpy arrays; cupy arrays are host-staged.

MPI has no float16/bfloat16 reduction and no average: half-precision inputs are reduced in
float32 and rounded once (every rank gets the same bits), ``avg`` is a sum divided by P."""

from __future__ import annotations

import collections
import functools
import math
import os
import threading
import time
import weakref
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .._config import made_settings, shared_thresholds
from .._types import ReduceOp, parse_op, to_host
from ..errors import BackendError
from ._base import Communicator
from ._checks import agreed_settings, before_barrier, check_peers, rank_of
from ._mpi_exit import settle_at_exit
from ._mpi_staging import _AVG, Staging, settings_first
from ._mpi_pairwise import (all_done, earlier_first, pairwise_allreduce_applies,
                             pairwise_blocks_apply, pairwise_reduce, pairwise_reduce_applies,
                             pairwise_reduce_scatter, progress_all, unposted_left)
from ._mpi_types import (_ClosedComm, _DeadComm, _address, _bytes, _pending, _separate,
                         duplicate, mpi_failure, out_of_communicators, usable)
from ._naps import CROWDED_SPIN, in_helper_thread, nap
from ._watchdog import late_ranks
from ._work import Work

__all__ = ["MPICommunicator"]

_TAG = 7
_POLLS = 8  # tests between two yields (or naps, or deadline checks); docs/failures.md


class MPICommunicator(Staging, Communicator):
    """Communicator over an mpi4py communicator (default ``MPI.COMM_WORLD``)."""

    backend = "mpi"
    native_allgatherv = True

    def __init__(self, mpi_comm: MPI.Comm | None = None, *, timeout: float | None = None,
                 xp: Any = np, _wait: Any = None) -> None:
        """Collective over a duplicate of ``mpi_comm`` (its own message space: what a dead
        communicator left pending never matches a new one's), with the arrival board that names
        late ranks. ``_wait(request, op_name)``: the timed wait of the one duplicated (dup)."""
        super().__init__(timeout)
        base = usable(mpi_comm if mpi_comm is not None else MPI.COMM_WORLD)
        #: seconds a wait tests (and yields) before it naps (``_spin_alone``: unless it is a
        #: caller's and every rank on the node started its collective: see _poll); bytes from
        #: which reduce runs as an allreduce, reduce is a pairwise exchange and a gather,
        #: reduce_scatter a pairwise exchange, allreduce one and an allgather (None: never)
        self._spin, (self._reduce_as_allreduce, self._pairwise_reduce, self._pairwise_blocks,
                     self._pairwise_allreduce) = agreed_settings(
            base, made_settings, _wait, shared_thresholds)  # a dead base: why
        try:
            self.mpi_comm = duplicate(base, _wait)
            self.rank, self.size = self.mpi_comm.Get_rank(), self.mpi_comm.Get_size()
            self._watch(self.mpi_comm)
            self._spin_alone = self._spin if not self.board.crowded or "CUPYCOLL_SPIN" in \
                os.environ else min(self._spin, CROWDED_SPIN)
        except MPI.Exception as exc:  # e.g. "Too many communicators"
            raise out_of_communicators(exc, base.Get_rank()) from exc
        self.xp = xp
        self._verbs = {"allreduce": self._allreduce, "broadcast": self._broadcast,
                       "reduce": self._reduce, "allgather": self._allgather,
                       "reduce_scatter": self._reduce_scatter,
                       "_allgatherv_into": self._allgatherv_into}
        #: staging buffers of finished calls (bytes), reused: see _scratch
        self._spare: list[np.ndarray] = []
        #: two-phase calls (._mpi_pairwise) whose second phase is unposted, in order; its lock
        self._unposted: collections.deque = collections.deque()
        self._posting = threading.Lock()
        #: (whether done, buffers) of Works dropped unfinished, kept until done (earlier_first)
        self._orphaned: list[tuple[Any, Any]] = []
        self._started: "weakref.WeakSet[Work]" = weakref.WeakSet()  # waited for at exit
        settle_at_exit(self)

    def dup(self) -> "MPICommunicator":
        """Return a communicator over the same ranks with its own message space."""
        twin = type(self)(self.mpi_comm, timeout=self.timeout, xp=self.xp, _wait=self._host_wait)
        twin._share_fate(self)
        return twin

    def wait(self, handles: Sequence[MPI.Request], op_name: str,
             peers: Sequence[int] | None = None, sequence: int | None = None) -> None:
        """Block on the requests under ``self.timeout`` (interruptible: a Python loop of tests).

        ``sequence``: the collective the requests belong to (default the latest started);
        ``peers``: the peer rank of each point-to-point request (they finish no collective). A
        timeout names the ranks that never started that collective (or else the peers still
        owing messages)."""
        self._check_alive()  # also for a Work started before the communicator died
        requests = list(handles)
        if not requests:
            return
        # one request (every collective) raises its own error; several report theirs in statuses
        statuses = [MPI.Status() for _ in requests] if len(requests) > 1 else []
        try:
            self._poll(requests, statuses, op_name, peers, sequence)
        except MPI.Exception as exc:
            reasons = {MPI.Get_error_string(s.Get_error()).split(",")[0] for s in statuses
                       if s.Get_error() != MPI.SUCCESS}
            raise mpi_failure(self, op_name, reasons or {str(exc)}) from exc
        except BaseException as exc:  # Ctrl-C, a signal handler's exception: still pending
            self._interrupted(op_name, type(exc))
            raise
        if peers is None:
            self._finished(sequence)

    def _poll(self, requests: list, statuses: list, op_name: str,
              peers: Sequence[int] | None, sequence: int | None = None) -> None:
        """Test the requests until done or ``self.timeout`` passes: back to back, yielding the
        core every ``_POLLS`` tests (as MPICH's blocking progress loop does) for the first
        ``CUPYCOLL_SPIN`` seconds, then napping between rounds, longer as the wait goes on
        (:func:`._naps.nap`: on oversubscribed cores this beats napping at once and spinning
        without yielding). Where the node is crowded, it naps after ``CROWDED_SPIN`` while a
        peer on the node has not started the collective, or on one of cupycoll's own threads
        (their caller's thread may compute): the spin would hold a core they need. Ctrl-C
        ends it; past that first spin, so do ``abort()`` from another thread and peers on the
        node that gave the collective up (:meth:`_still_wanted`)."""
        test = requests[0].Test if not statuses else functools.partial(
            MPI.Request.Testall, requests, statuses)
        if test():
            return
        start = time.monotonic()
        deadline = start + self.timeout if self.timeout is not None else float("inf")
        spun, alone, polls = start + self._spin, start + self._spin_alone, 0
        spun = alone if in_helper_thread() else spun
        while not test():
            polls += 1
            if polls % _POLLS:
                continue
            now = time.monotonic()
            if now > deadline:
                raise self._timed_out(op_name, sequence, _pending(requests, peers))
            if now > alone:  # abort() from another thread, or peers that gave it up first
                self._still_wanted(op_name, sequence)
            progress_all()
            if now > spun or now > alone and not self.board.arrived(
                    self.sequence if sequence is None else sequence):
                time.sleep(nap(now - start))
            else:
                os.sched_yield()

    def run(self, verb: str, *args: Any, op_name: str | None = None) -> None:
        """Run a dense verb to completion without a Work: post it and test it in the
        interruptible loop of :meth:`wait` (see :meth:`_launch`), which publishes it finished."""
        self._verbs[verb](*args, op_name or verb, True)

    def run_fetch(self, verb: str, *args: Any, result: Any, op_name: str) -> np.ndarray:
        """``run`` (one blocking call), then ``result`` on the host."""
        self.run(verb, *args, op_name=op_name)
        return to_host(result)

    def _launch(self, blocking: bool, op_name: str, call: Any, icall: Any, args: tuple,
                finalize: Any = None, keep: tuple = ()) -> Work | None:
        """Start ``icall(*args)`` and return its Work, or (``blocking``) complete the operation
        by testing the request in :meth:`wait`'s interruptible loop. ``call``, MPI's blocking
        twin, is not used: it ignores Ctrl-C and ``CUPYCOLL_TIMEOUT``, ranks may not mix it with
        the nonblocking call, and on oversubscribed cores it spins without giving its core to
        the peer it waits for (docs/dense.md; ``bench/dev/bench_tracking.py`` times both)."""
        try:  # posting fails too, e.g. MPICH out of memory for its temporary buffer
            request = icall(*args)
            done = blocking and request.Test()
        except MPI.Exception as exc:
            raise mpi_failure(self, op_name, {str(exc)}) from exc
        if blocking and not done:
            try:
                self.wait([request], op_name)  # (which publishes it finished)
            except BaseException:
                self._fate.abandon(request, args)
                raise
        elif blocking:
            self._finished()
        else:
            return self._work([request], op_name, finalize, keep + args)
        if finalize is not None:
            finalize()
        return None

    def _work(self, requests: list, op_name: str, finalize=None, keep: tuple = (),
              peers: list[int] | None = None, collective: bool = False) -> Work:
        """Wrap requests; ``keep`` holds every buffer alive until the transfers are done;
        ``peers``: each request's peer (they finish no collective unless ``collective``)."""
        def wait() -> None:
            try:
                self.wait(requests, op_name, peers, sequence)
            except BaseException:
                self._fate.abandon(requests, keep_alive)
                self._released(finishes)
                raise
            keep_alive.clear()
            if collective:
                self._finished(sequence)

        sequence, keep_alive = self.sequence, list(keep)
        finishes = sequence if peers is None or collective else None  # the collective finished
        if finishes is not None:
            self.board.started(sequence)
        done = functools.partial(all_done, self, requests, op_name, finishes)
        work = Work(wait, done, finalize,
                    on_drop=lambda: self._dropped(done, keep_alive, finishes),
                    late=lambda: late_ranks(self.board, self.rank, sequence),
                    interrupted=lambda kind: self._interrupted(op_name, kind),
                    wanted=lambda: self._still_wanted(op_name, sequence), op_name=op_name)
        self._started.add(work)
        return work

    def allreduce(self, send: Any, recv: Any, op: ReduceOp, op_name: str = "allreduce") -> Work:
        return self._allreduce(send, recv, parse_op(op, rank=self.rank), op_name, False)

    def _allreduce(self, send: Any, recv: Any, op: ReduceOp, op_name: str, blocking: bool):
        if pairwise_allreduce_applies(self, send):  # (a pairwise exchange and an allgather)
            return pairwise_reduce(self, send, recv, op, None, op_name, blocking)
        args, finalize, keep = self._reduction(send, recv, op, True)
        self._record_collective("allreduce", send.nbytes, op_name=op_name)
        comm = self.mpi_comm
        return self._launch(blocking, op_name, comm.Allreduce, comm.Iallreduce, args, finalize,
                            keep)

    def reduce(self, send: Any, recv: Any, op: ReduceOp, root: int,
               op_name: str = "reduce") -> Work:
        return self._reduce(send, recv, parse_op(op, rank=self.rank), rank_of(self, root, "root"),
                            op_name, False)

    def _reduce(self, send: Any, recv: Any, op: ReduceOp, root: int, op_name: str,
                blocking: bool):
        """Reduce onto ``root``: from ``CUPYCOLL_REDUCE_PAIRWISE`` bytes (dtypes MPI reduces
        natively) a pairwise reduce-scatter and a gather (:mod:`._mpi_pairwise`); else from
        ``CUPYCOLL_REDUCE_AS_ALLREDUCE`` bytes an allreduce only the root keeps (the others into
        pooled scratch: MPICH's nonblocking reduce is slower from 256 KiB, docs/dense.md). Every
        rank decides from the agreed byte count and dtype; a bad setting raises first."""
        at_root = self.rank == root
        if pairwise_reduce_applies(self, send):  # (checks the settings itself)
            return pairwise_reduce(self, send, recv if at_root else None, op, root, op_name,
                                   blocking)
        settings_first(self.rank, op, send.dtype)
        self._record_collective("reduce", send.nbytes, root, op_name=op_name)
        comm = self.mpi_comm
        threshold = self._reduce_as_allreduce
        if threshold is None or send.nbytes < threshold or self.size == 1:
            args, finalize, keep = self._reduction(send, recv if at_root else None, op, at_root)
            return self._launch(blocking, op_name, comm.Reduce, comm.Ireduce, args + (root,),
                                finalize, keep)
        if at_root:
            args, finalize, keep = self._reduction(send, recv, op, True)
        else:
            scratch = self._scratch(send.shape, np.dtype(send.dtype))
            summed = ReduceOp.SUM if op is _AVG else op  # the result is dropped: no division
            args, finalize, keep = self._reduction(send, scratch, summed, False)
            finalize = self._then_release(finalize, scratch)
        return self._launch(blocking, op_name, comm.Allreduce, comm.Iallreduce, args,
                            finalize, keep)

    def reduce_scatter(self, send: Any, recv: Any, op: ReduceOp,
                       op_name: str = "reduce_scatter") -> Work:
        return self._reduce_scatter(send, recv, parse_op(op, rank=self.rank), op_name, False)

    def _reduce_scatter(self, send: Any, recv: Any, op: ReduceOp, op_name: str, blocking: bool):
        """Reduce-scatter; from ``CUPYCOLL_REDUCE_SCATTER_PAIRWISE`` bytes a block, where it
        applies, as a pairwise exchange of the blocks folded here (:mod:`._mpi_pairwise`)."""
        if pairwise_blocks_apply(self, send):
            return pairwise_reduce_scatter(self, send, recv, op, op_name, blocking)
        args, finalize, keep = self._reduction(send, recv, op, False)
        self._record_collective("reduce_scatter", send.nbytes, op_name=op_name)
        comm = self.mpi_comm
        return self._launch(blocking, op_name, comm.Reduce_scatter_block,
                            comm.Ireduce_scatter_block, args, finalize, keep)

    def broadcast(self, send: Any, recv: Any, root: int, op_name: str = "broadcast") -> Work:
        return self._broadcast(send, recv, rank_of(self, root, "root"), op_name, False)

    def _broadcast(self, send: Any, recv: Any, root: int, op_name: str, blocking: bool):
        host, copy_back = self._staged(recv)
        if self.rank == root and host is not send:  # staged (device arrays): even in place
            host[...] = send if type(send) is np.ndarray else to_host(send)
        self._record_collective("broadcast", recv.nbytes, root, op_name=op_name)
        comm = self.mpi_comm
        return self._launch(blocking, op_name, self._bcast, comm.Ibcast, (_bytes(host), root),
                            copy_back, (host,))

    def _bcast(self, buf: list, root: int) -> None:
        """The blocking twin of Ibcast (for comparisons, see :meth:`_launch`): Bcast on two
        ranks (nobody forwards; faster on small messages, docs/dense.md), Ibcast + Wait on more:
        ranks that disagree on the count stop MPICH's blocking tree at the rank that detects
        the truncation (its subtree waits for ever), while the nonblocking schedule forwards."""
        if self.size == 2:
            self.mpi_comm.Bcast(buf, root)
        else:
            self.mpi_comm.Ibcast(buf, root).Wait()

    def allgather(self, send: Any, recv: Any, op_name: str = "allgather") -> Work:
        return self._allgather(send, recv, op_name, False)

    def _allgather(self, send: Any, recv: Any, op_name: str, blocking: bool):
        host, copy_back = self._staged(recv)
        sbuf = np.ascontiguousarray(to_host(send))  # (a C-contiguous ndarray as it is)
        if not _separate(sbuf, host):
            own = _address(host) + self.rank * sbuf.nbytes  # NCCL's in place: this rank's block
            if _address(sbuf) == own and sbuf.nbytes * self.size == host.nbytes:
                sbuf = None
            elif np.shares_memory(sbuf, host):
                sbuf = sbuf.copy()
        self._record_collective("allgather", recv.nbytes, op_name=op_name)
        comm = self.mpi_comm
        return self._launch(blocking, op_name, comm.Allgather, comm.Iallgather,
                            (MPI.IN_PLACE if sbuf is None else _bytes(sbuf), _bytes(host)),
                            copy_back, (sbuf, host))

    def _allgatherv_into(self, send: Any, recv: Any, counts: np.ndarray, op_name: str,
                         blocking: bool = False) -> Work | None:
        host, copy_back = self._staged(recv)
        row = math.prod(recv.shape[1:]) * recv.dtype.itemsize
        byte_counts = np.asarray(counts, dtype=np.int64) * row
        displs = np.zeros_like(byte_counts)
        np.cumsum(byte_counts[:-1], out=displs[1:])
        sbuf = np.ascontiguousarray(to_host(send))
        self._record_allgatherv(op_name, byte_counts)
        comm = self.mpi_comm
        return self._launch(blocking, op_name, comm.Allgatherv, comm.Iallgatherv,
                            ([sbuf, sbuf.nbytes, MPI.BYTE],
                             [host, (byte_counts, displs), MPI.BYTE]),
                            copy_back, (sbuf, host, byte_counts, displs))

    def exchange(self, sends: Sequence[tuple[int, Any]], recvs: Sequence[tuple[int, Any]],
                 op_name: str = "exchange") -> Work:
        requests, copy_backs, buffers, peers = [], [], [], []
        check_peers(self, sends, recvs)
        earlier_first(self)
        self.stats.record(op_name)
        to_self = [a for peer, a in sends if peer == self.rank]  # FIFO, like messages to peers
        for peer, buf in recvs:
            if peer == self.rank:
                buf[...] = to_self.pop(0)
                continue
            host, copy_back = self._staged(buf)
            buffers.append(host)
            requests.append(self.mpi_comm.Irecv(_bytes(host), source=peer, tag=_TAG))
            peers.append(peer)
            if copy_back is not None:
                copy_backs.append(copy_back)
            self.stats.record(op_name, received=host.nbytes, msgs_received=1)
        for peer, arr in sends:
            if peer == self.rank:
                continue
            host = np.ascontiguousarray(to_host(arr))
            buffers.append(host)
            requests.append(self.mpi_comm.Isend(_bytes(host), dest=peer, tag=_TAG))
            peers.append(peer)
            self.stats.record(op_name, sent=host.nbytes, msgs_sent=1)
        finalize = (lambda: [f() for f in copy_backs] and None) if copy_backs else None
        return self._work(requests, op_name, finalize, tuple(buffers), peers)

    def barrier(self) -> None:
        before_barrier(self)
        earlier_first(self)
        request = self.mpi_comm.Ibarrier()
        self._arrived()
        self.wait([request], "barrier")

    def _record_collective(self, name: str, nbytes: int, root: int | None = None,
                           op_name: str | None = None) -> None:
        earlier_first(self)
        super()._record_collective(name, nbytes, root, op_name)

    def _record_allgatherv(self, op_name: str, byte_counts: np.ndarray) -> None:
        earlier_first(self)
        super()._record_allgatherv(op_name, byte_counts)

    def close(self) -> None:
        """Free the MPI communicator (not while a pairwise call has a second phase to post:
        MPI_Finalize does); operations started before complete; any later use raises."""
        self._release_all()
        progress_all()
        self._closed()
        if self._orphaned:  # MPI may still use them: kept for the life of the process
            self._fate.abandon(self._orphaned)
        comm, self.mpi_comm = self.mpi_comm, _ClosedComm(self.rank)
        if isinstance(comm, (_DeadComm, _ClosedComm)):
            return  # its pending operations may never complete: leave it to MPI_Finalize
        if comm is not None and not MPI.Is_finalized() and not unposted_left(self):
            comm.Free()

    def _forsake(self) -> None:
        super()._forsake()
        if not isinstance(self.mpi_comm, (_DeadComm, _ClosedComm)):
            self.mpi_comm = _DeadComm(self._fate)

    def _disable(self) -> None:
        """Replace the MPI communicator with one that raises: nothing more is posted on it."""
        super()._disable()
        if not isinstance(self.mpi_comm, (_DeadComm, _ClosedComm)):
            self.mpi_comm = _DeadComm(self._fate)
