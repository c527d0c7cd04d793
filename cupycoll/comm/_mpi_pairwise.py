"""The MPI backend's reduce-scatter as a pairwise exchange: every rank sends block j of its input
to rank j and folds the P blocks of its own in rank order (docs/dense.md: MPICH's
reduce-scatter is the slower one on one node from 64 KiB blocks); its reduce as that
exchange followed by every rank's folded block sent to the root (Rabenseifner's reduce: faster
than reduce as an allreduce from 256 KiB on one node, docs/dense.md); and its allreduce, on a
number of ranks that is not a power of two, as that exchange followed by every rank's folded
block sent to every rank (MPICH folds the ranks beyond a power of two in and out whole, about
twice the bytes on the critical path: the slower one from 2 MiB on one node, docs/dense.md)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
from mpi4py import MPI

from .._types import ReduceOp, to_host
from ..errors import CupycollError
from ._mpi_types import mpi_failure
from ._watchdog import late_ranks
from ._work import Work
from ._mpi_staging import settings_first
from ._mpi_types import _MPI_TYPES, _address, _fold_blocks, _separate, averaged, copied_into

_TAG_BLOCKS = 8  # the blocks' messages (apart from exchange's)
#: reduce's folded blocks on their way to the root: a tag of their own per call (the
#: communicator's collective count, the same on every rank, modulo _GATHER_TAGS), because this
#: phase is posted when a rank first waits for or tests the call, in each rank's own order
_GATHER_BASE, _GATHER_TAGS = 1024, 16384
#: communicators holding calls whose second phase is not posted yet (see :func:`progress_all`)
_UNPOSTED: "weakref.WeakSet[Any]" = weakref.WeakSet()
_UNPOSTED_LOCK = threading.Lock()  # the set is added to and read from several threads


def pairwise_blocks_apply(comm: Any, send: Any) -> bool:
    """Whether ``reduce_scatter`` runs as the pairwise exchange: from
    ``CUPYCOLL_REDUCE_SCATTER_PAIRWISE`` bytes a block, on P > 1, for a dtype MPI reduces
    natively. Only what every rank agrees on decides (the threshold, the byte count, the
    dtype): buffers that are not C-contiguous host arrays, or that overlap otherwise than in
    place, are staged by :func:`pairwise_reduce_scatter`, never sent another way."""
    threshold = comm._pairwise_blocks
    return (threshold is not None and comm.size > 1 and send.nbytes // comm.size >= threshold
            and send.dtype in _MPI_TYPES)


def pairwise_reduce_scatter(comm: Any, send: Any, recv: Any, op: ReduceOp, op_name: str,
                            blocking: bool):
    """Send block j of ``send`` to rank j and receive every rank's block of this rank (P - 1
    messages each way, into ``comm``'s pooled scratch), then fold them in rank order with the
    MPI backend's rules (:func:`._mpi_types._fold_blocks`; avg divides once). In place where
    ``recv`` is exactly this rank's block of ``send``; a ``send`` that is not a C-contiguous
    host array, or that ``recv`` overlaps otherwise, is read from a copy, and a ``recv`` that
    is not one receives through a host buffer copied into it. The bytes and the arrival notice
    are booked as the native collective's; a timeout names the peers whose blocks are missing.
    Returns a Work, or None when ``blocking`` (done)."""
    size, rank = comm.size, comm.rank
    settings_first(rank, op, send.dtype)
    comm._record_collective("reduce_scatter", send.nbytes, op_name=op_name)
    host, copy_back = comm._staged(recv)
    plain = type(send) is np.ndarray and send.flags.c_contiguous
    src = send if plain else np.ascontiguousarray(to_host(send))
    blocks = src.reshape(size, *host.shape)
    in_place = plain and host is recv and _address(recv) == _address(blocks[rank])
    if not in_place and np.shares_memory(src, host):  # read the input before it is written
        blocks = blocks.copy()
    scratch = comm._scratch((size,) + host.shape, send.dtype)
    mpi_comm, requests, peers = comm.mpi_comm, [], []
    for step in range(1, size):
        source, dest = (rank - step) % size, (rank + step) % size
        requests.append(mpi_comm.Irecv([scratch[source], MPI.BYTE], source, _TAG_BLOCKS))
        requests.append(mpi_comm.Isend([blocks[dest], MPI.BYTE], dest, _TAG_BLOCKS))
        peers += [source, dest]

    def fold() -> None:
        _fold_blocks(blocks, scratch, host, rank, op, in_place)
        if op is ReduceOp.AVG:
            averaged(host, size)
        comm._release(scratch)
        if copy_back is not None:
            copy_back()

    keep = (send, recv, blocks, host, scratch)
    if not blocking:
        return comm._work(requests, op_name, fold, keep, peers, collective=True)
    try:
        comm.wait(requests, op_name, peers)
    except BaseException:
        comm._fate.abandon(requests, keep)
        raise
    comm._finished()  # (its messages make a collective)
    fold()
    return None


def pairwise_reduce_applies(comm: Any, send: Any) -> bool:
    """Whether ``reduce`` runs as a pairwise exchange and a gather: from
    ``CUPYCOLL_REDUCE_PAIRWISE`` bytes of input, on P > 1, for a dtype MPI reduces natively.
    Only what every rank agrees on decides (the threshold, the byte count, the dtype); buffers
    that are not C-contiguous host arrays are staged by :func:`pairwise_reduce`."""
    threshold = comm._pairwise_reduce
    return (threshold is not None and comm.size > 1 and send.nbytes >= threshold
            and send.dtype in _MPI_TYPES)


def pairwise_allreduce_applies(comm: Any, send: Any) -> bool:
    """Whether ``allreduce`` runs as a pairwise exchange and an allgather: from
    ``CUPYCOLL_ALLREDUCE_PAIRWISE`` bytes of input, on a P > 1 that is not a power of two
    (MPICH's own allreduce moves as few bytes on the others), for a dtype MPI reduces
    natively. Only what every rank agrees on decides."""
    threshold, size = comm._pairwise_allreduce, comm.size
    return (threshold is not None and size & (size - 1) != 0 and send.nbytes >= threshold
            and send.dtype in _MPI_TYPES)


def _bounds(count: int, size: int) -> list[int]:
    """Offsets of P near-equal blocks of ``count`` elements (the first ``count % P`` one
    longer)."""
    q, r = divmod(count, size)
    return [i * q + min(i, r) for i in range(size + 1)]


def _root_output(comm: Any, send: np.ndarray, recv: Any) -> tuple[np.ndarray, bool, bool]:
    """The root's flat result buffer, whether it is ``send`` itself (in place) and whether it
    is staged: ``recv`` when it is a C-contiguous host array of the dtype and size, exactly
    ``send`` or apart from it; else a pooled scratch, copied into ``recv`` at the end."""
    if (type(recv) is np.ndarray and recv.dtype is send.dtype and recv.flags.c_contiguous
            and recv.size == send.size):
        if recv is send or _address(recv) == _address(send):
            return recv.reshape(-1), True, False
        if _separate(send, recv):
            return recv.reshape(-1), False, False
    return comm._scratch((send.size,), send.dtype), False, True


def pairwise_reduce(comm: Any, send: Any, recv: Any, op: ReduceOp, root: int | None,
                    op_name: str, blocking: bool):
    """Reduce onto ``root`` (None: onto every rank, an allreduce): block j of ``send`` (P
    near-equal blocks) to rank j, every rank's block of this rank folded in rank order
    (:func:`._mpi_types._fold_blocks`), then each rank's folded block to the root (to every
    rank), received straight into its output (avg divides there): every rank's result has
    the same bits. Bytes are booked as the native reduce's (allreduce's). Returns a Work, or
    None when ``blocking``."""
    size, rank, every = comm.size, comm.rank, root is None
    at_root = every or rank == root
    settings_first(rank, op, send.dtype)
    comm._record_collective("allreduce" if every else "reduce", send.nbytes, root,
                            op_name=op_name)
    gather_tag = _GATHER_BASE + comm.sequence % _GATHER_TAGS
    flat = np.ascontiguousarray(to_host(send)).reshape(-1)
    bounds = _bounds(flat.size, size)
    lo, hi = bounds[rank], bounds[rank + 1]
    out, in_place, staged = _root_output(comm, flat, recv) if at_root else (None, False, False)
    rows = comm._scratch((size + 1, bounds[1]), flat.dtype)  # the received blocks, the fold
    mine = out[lo:hi] if at_root else rows[size, :hi - lo]
    mpi_comm, first, peers = comm.mpi_comm, [], []
    for step in range(1, size):
        source, dest = (rank - step) % size, (rank + step) % size
        first.append(mpi_comm.Irecv([rows[source, :hi - lo], MPI.BYTE], source, _TAG_BLOCKS))
        first.append(mpi_comm.Isend([flat[bounds[dest]:bounds[dest + 1]], MPI.BYTE], dest,
                                    _TAG_BLOCKS))
        peers += [source, dest]

    def fold_and_send() -> tuple[list, list[int]]:
        blocks = [flat[lo:hi] if r == rank else None for r in range(size)]
        _fold_blocks(blocks, rows[:, :hi - lo], mine, rank, op, in_place)
        # aborted since the call: raises the library's error; closed: close() kept it for this
        now = comm.mpi_comm if comm._fate.error is not None else mpi_comm
        if every:  # the folded block to every rank, every rank's block from it
            sends, receives, others = [], [], []
            for step in range(1, size):
                source, dest = (rank - step) % size, (rank + step) % size
                receives.append(now.Irecv([out[bounds[source]:bounds[source + 1]], MPI.BYTE],
                                          source, gather_tag))
                sends.append(now.Isend([mine, MPI.BYTE], dest, gather_tag))
                others += [source, dest]
            return [q for pair in zip(receives, sends) for q in pair], others
        if not at_root:
            return [now.Isend([mine, MPI.BYTE], root, gather_tag)], [root]
        sources = [r for r in range(size) if r != root]
        return [now.Irecv([out[bounds[r]:bounds[r + 1]], MPI.BYTE], r, gather_tag)
                for r in sources], sources

    def finish() -> None:
        if at_root and op is ReduceOp.AVG:
            averaged(out, size)
        if staged:
            copied_into(recv, out.reshape(recv.shape), comm.xp)
            comm._release(out)
        comm._release(rows)

    keep = (send, recv, flat, out, rows)
    return _two_phases(comm, first, peers, fold_and_send, finish, keep, op_name, blocking)


def _two_phases(comm: Any, first: list, first_peers: list[int], between: Any, finish: Any,
                keep: tuple, op_name: str, blocking: bool):
    """Complete ``first``'s requests, run ``between()`` (which posts the second phase's and
    returns them with their peers), complete those, then ``finish()``; a Work of it all
    unless ``blocking``. On an error the buffers in ``keep`` stay alive for MPI.

    A second phase is posted when its call is first waited for or tested, in each rank's own
    order (or when this rank starts its next operation on the communicator: :func:`post_pending`,
    or as soon as its first phase is done while this rank waits on any communicator, is
    settled at exit or closes this one: :func:`progress_all`),
    so each call's second phase has a tag of its own, and a wait first posts the
    second phases of the calls made before it on this communicator (waiting for their first
    phases, which every rank posted at its call), and a test posts those whose first phases
    are done: a rank blocked in (or polling) one call's second phase has posted every earlier
    call's, so ranks waiting for their calls in different orders never wait for each other."""
    second: list = []
    failed: list = []  # the first phase's failure, raised by every later advance (MPI nulls
    lock = threading.Lock()  # the failed requests: a second test would find them done)

    def advance(blocking_first: bool = True) -> bool:
        with lock:  # once, whether wait() or a test from another thread gets there first
            if failed:
                raise failed[0]
            if not second:
                try:
                    if blocking_first:
                        comm.wait(first, op_name, first_peers, sequence)
                    elif not tested(comm, first, op_name):
                        return False
                except CupycollError as exc:
                    if comm._fate.error is None:  # (a dead communicator raises its own)
                        failed.append(exc)
                    raise
                second.append(between())
        return True

    def wait() -> None:
        requests = first
        try:
            post_pending(comm, advance)
            advance()  # this call's own (nothing where it is posted already)
            requests = second[0][0]
            comm.wait(requests, op_name, second[0][1], sequence)
            comm._finished(sequence)  # (the waits on peers' requests publish nothing)
        except BaseException:
            comm._fate.abandon(requests, list(keep))
            comm._released(sequence)
            raise

    def test() -> bool:
        progress_all()  # a peer may wait in another communicator's call this rank holds up
        _post_ready(comm, advance)
        try:
            if not (advance(blocking_first=False) and tested(comm, second[0][0], op_name)):
                return False
        except CupycollError:
            comm._released(sequence)
            raise
        comm._finished(sequence)
        return True

    sequence = comm.sequence
    with comm._posting:
        unposted = comm._unposted
        while unposted and unposted[0][1]:  # posted by a test: let go of it
            unposted.popleft()
        unposted.append((advance, second))
        with _UNPOSTED_LOCK:
            _UNPOSTED.add(comm)
    if blocking:
        wait()
        finish()
        return None
    comm.board.started(sequence)
    work = Work(wait, test, finish, on_drop=lambda: comm._dropped(test, keep, sequence),
                late=lambda: late_ranks(comm.board, comm.rank, sequence),
                interrupted=lambda kind: comm._interrupted(op_name, kind),
                wanted=lambda: comm._still_wanted(op_name, sequence), op_name=op_name)
    comm._started.add(work)
    return work


def _post_ready(comm: Any, advance: Any = None) -> None:
    """Without blocking, post the second phase of every call on ``comm`` (up to the one
    ``advance`` posts) whose first phase is done: a loop polling a later call must also post
    the earlier ones, which peers may be waiting in (skipped while another thread posts)."""
    if not comm._posting.acquire(blocking=False):
        return
    try:
        for entry in list(comm._unposted):
            try:
                entry[0](blocking_first=False)
            except Exception:  # noqa: BLE001  an earlier call's failure: its own wait raises it
                if entry[0] is advance:
                    raise
            if entry[0] is advance:
                break
    finally:
        comm._posting.release()


def earlier_first(comm: Any) -> None:
    """Before this rank posts anything new on ``comm``: post the second phases of the pairwise
    calls before it (a peer may wait in one: MPI's nonblocking calls progress without a wait)
    and let go of the orphans (operations whose Work was dropped) that are done."""
    if comm._unposted:
        post_pending(comm)
    if comm._orphaned:
        comm._orphaned = [entry for entry in comm._orphaned if not _done(entry[0])]


def _done(test: Any) -> bool:
    """Whether a dropped operation is done: a failed one is (its error is lost with its Work,
    as its result would be; raising it here would fail a later call on this rank alone)."""
    try:
        return test()
    except Exception:  # noqa: BLE001
        return True


def post_pending(comm: Any, through: Any = None) -> None:
    """Post the second phase of every call on ``comm`` not posted yet (a rank starts nothing
    new before them), or only up to the one ``through`` posts, in call order (each waits for
    its own first phase)."""
    with comm._posting:
        unposted = comm._unposted
        while unposted and (through is None or any(entry[0] is through for entry in unposted)):
            unposted[0][0]()
            unposted.popleft()


def progress_all() -> None:
    """Without blocking, post the ready second phases of every communicator's calls (from a
    wait on any communicator, the exit's settling and ``close()``): a peer may wait in one while
    this rank waits on another communicator, as MPI's own nonblocking collectives progress in
    any MPI call. A failure is left to the call's own wait, which meets it again."""
    if not _UNPOSTED:
        return
    with _UNPOSTED_LOCK:
        comms = list(_UNPOSTED)
    for comm in comms:
        if not unposted_left(comm):
            with _UNPOSTED_LOCK:
                _UNPOSTED.discard(comm)
        elif comm._fate.error is None:
            try:
                _post_ready(comm)
            except Exception:  # noqa: BLE001  (raised again by that call's own wait)
                pass


def all_done(comm: Any, requests: list, op_name: str, sequence: int | None = None) -> bool:
    """:func:`tested` after :func:`progress_all` (every ready second phase posted first); once
    done, collective ``sequence`` (None: the requests finish no collective) is published
    finished."""
    progress_all()
    try:
        if not tested(comm, requests, op_name):
            return False
    except CupycollError:  # failed: it holds the finished count down no longer
        comm._released(sequence)
        raise
    if sequence is not None:
        comm._finished(sequence)
    return True


def tested(comm: Any, requests: list, op_name: str) -> bool:
    """Whether ``requests`` of ``comm`` are done; a failed one raises ``comm``'s BackendError
    naming ``op_name`` (MPI then nulls the request: a later test finds it done)."""
    try:
        return bool(MPI.Request.Testall(requests))
    except MPI.Exception as exc:
        raise mpi_failure(comm, op_name, {str(exc)}) from exc


def unposted_left(comm: Any) -> bool:
    """Whether a call on ``comm`` has its second phase still to post."""
    return any(not entry[1] for entry in list(comm._unposted))
