"""Emulated ``cupy.cuda.nccl``: NCCL's rules between MPI processes, data moved by mpi4py (the
module itself is assembled by :func:`.nccl_module.build`).

What a call checks on the host (before anything moves): the communicator is alive, the current
device and the stream's device are the communicator's, every buffer is live device memory of that
device and large enough for ``count`` elements (NCCL's units), in-place calls use NCCL's exact
in-place pointers and other buffers do not overlap; and the same call with the same argument
types goes to the real ``cupy.cuda.nccl`` on an uninitialised communicator, which must answer
with NCCL's own NcclError (proves names, signatures and enums of the installed CuPy).

Then, as NCCL >= 2.22, a communicator's first collective and first send/recv with each peer
block the host thread in a handshake with the peer(s) (on a non-blocking communicator: return
ncclInProgress, connecting in the background); the data moves in a task on the stream (poisoned
receive buffers until then). :func:`check_logs` compares the calls' logs across ranks. Aborts,
asynchronous errors, non-blocking progress and destroy are :mod:`.nccl_lifetime`'s."""

from __future__ import annotations

import hashlib
import threading
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from . import buffers
from . import device as dev
from .array import buffer_at, raw_view
from ...comm._nccl_config import IN_PROGRESS
from .logs import COMMS, GLOBAL_LOG
from .nccl_lifetime import _Lifetime, _nonblocking
from .nccl_core import (INTERNAL, INVALID_ARGUMENT, INVALID_USAGE, STATE,
                        dtype_of, error, exchange, itemsize, join, p2p_links,
                        reduce_rows, uid_bytes, waitall, waitall_confirmed)

__all__ = ["NcclCommunicator", "groupStart", "groupEnd"]

_tls = threading.local()
_P2P_TAG, _HANDSHAKE_TAG = 7, 9


def groupStart() -> None:
    _tls.depth = getattr(_tls, "depth", 0) + 1
    if _tls.depth == 1:
        _tls.pending = []


def groupEnd() -> None:
    depth = getattr(_tls, "depth", 0)
    if depth < 1:
        raise error(INVALID_USAGE)
    _tls.depth = depth - 1
    if _tls.depth == 0:
        by_comm: dict[int, list] = {}
        pending = _tls.__dict__.pop("pending")
        GLOBAL_LOG.append([(comm.uid, op.entry) for comm, op in pending])  # one launch
        for comm, op in pending:
            by_comm.setdefault(id(comm), [comm]).append(op)
        for comm, *ops in by_comm.values():
            comm._launch(ops)


class _Op:
    """One logged call: what moves (``run`` on the stream thread) and the buffers it touches."""

    def __init__(self, entry: tuple, stream: dev.Stream, reads: list, writes: list,
                 run: Callable[[], None], peer: int | None = None) -> None:
        self.entry, self.stream, self.reads, self.writes = entry, stream, reads, writes
        self.run, self.peer = run, peer


class NcclCommunicator(_Lifetime):
    """``NcclCommunicator(ndev, commId, rank, config=None)``: blocks until all ``ndev`` ranks
    have joined, unless ``config`` (CuPy's ``NcclConfig``) has ``blocking = 0``: then, as NCCL,
    the init and every call that has to connect to peers return ``ncclInProgress`` (CuPy raises
    it as NcclError 7 after keeping the communicator) and go on in the background until
    ``check_async_error()`` stops raising it; a call issued meanwhile is an EmulationError."""

    def __init__(self, ndev: int, commId: Any, rank: int, config: Any = None, *,
                 _mpi: Any = None, _uid: bytes | None = None) -> None:
        if not isinstance(ndev, int) or not isinstance(rank, int):
            raise TypeError("ndev and rank must be int")
        if not 0 <= rank < ndev:
            raise error(INVALID_ARGUMENT)
        self.nonblocking = _nonblocking(config)
        self.uid = _uid if _uid is not None else uid_bytes(commId)
        self._rank, self._size, self.device = rank, ndev, dev.current_device()
        self.aborted = self.destroyed = False
        self.async_error: int | None = None
        self.log: list[tuple] = []
        self.connected: set = set()
        self.coll_seq = self.splits = 0
        self.tasks: list[dev.Task] = []
        self.stale: list = []  # requests of operations that failed: kept alive
        self.calling: int | None = None  # the host thread inside a call of this communicator
        self.in_progress: Callable[[], bool] | None = None  # a non-blocking call being issued
        self.world_ranks: list | None = None  # the members' world ranks, once joined
        self._real = STATE["real"].NcclCommunicator.__new__(STATE["real"].NcclCommunicator)
        COMMS.append(self)
        if _mpi is not None:
            self._joined(_mpi)
        elif not self.nonblocking:
            with self._inside("ncclCommInitRank"):
                self._joined(self._join())
        else:
            self._in_background("ncclCommInitRankConfig", self._join, self._joined)

    def _join(self) -> Any:
        return join(self.uid, self._rank, self._size, self.device)

    def _joined(self, mpi: Any) -> None:
        self.mpi = mpi
        self.handshake = self.mpi.Dup()
        self.tokens = self.mpi.Dup()  # liveness handshakes (nccl_core.waitall_confirmed)
        self.world_ranks = self.mpi.Get_group().Translate_ranks(
            list(range(self._size)), MPI.COMM_WORLD.Get_group())

    # ---------------------------------------------------------------- what it is
    def rank_id(self) -> int:
        self._null_after_free("rank_id")
        return self._rank

    def size(self) -> int:
        self._null_after_free("size")
        return self._size

    def device_id(self) -> int:
        self._null_after_free("device_id")
        return self.device

    # ---------------------------------------------------------------- checks at the call
    def _check_call(self, method: str, real_args: tuple, stream_ptr: int) -> dev.Stream:
        getattr(self._real, method)  # AttributeError where the installed CuPy lacks it
        if self.in_progress is not None:
            raise dev.EmulationError(f"nccl {method} on rank {self._rank} while the previous "
                                     "call is in progress (ncclInProgress): NCCL requires "
                                     "ncclCommGetAsyncError to report it done first")
        for value in real_args:  # pointers, counts, enums, ranks, streams: all C integers
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"nccl {method}: argument {value!r} is not an integer (the "
                                "binding would truncate or reject it)")
        try:
            getattr(self._real, method)(*real_args)
        except STATE["real"].NcclError:
            pass  # NCCL's own argument error: names, arity, types and enums were accepted
        else:
            raise dev.EmulationError(f"real {method} on a null communicator did not fail")
        if self.aborted or self.destroyed:
            raise dev.EmulationError(f"{method} on a communicator that was "
                                     f"{'aborted' if self.aborted else 'destroyed'}")
        if dev.current_device() != self.device:
            raise dev.DeviceMismatch(f"nccl {method} on rank {self._rank}: device "
                                     f"{dev.current_device()} is current, the communicator's is "
                                     f"{self.device}")
        stream = dev.lookup_stream(stream_ptr)
        if stream.device != self.device:
            raise dev.DeviceMismatch(f"nccl {method}: {stream} is not on the communicator's "
                                     f"device {self.device}")
        return stream

    def _span(self, method: str, ptr: int, count: int, dtype: int, what: str) -> tuple:
        """(buffer, start, end) of ``count`` elements at ``ptr``; must be this device's memory."""
        nbytes = count * itemsize(dtype)
        found = buffer_at(int(ptr), nbytes)
        if found is None:
            raise dev.EmulationError(f"nccl {method} on rank {self._rank}: {what} {ptr:#x} + "
                                     f"{nbytes} bytes is not inside one live device allocation "
                                     "(host memory, a freed buffer, or count in wrong units)")
        buf = found[0]
        if buf.device != self.device:
            raise dev.DeviceMismatch(f"nccl {method} on rank {self._rank}: {what} is on device "
                                     f"{buf.device}, the communicator on {self.device}")
        return buf, int(ptr), int(ptr) + nbytes

    def _no_overlap(self, method: str, a: tuple, b: tuple, rule: str) -> None:
        if a[1] < b[2] and b[1] < a[2]:
            raise dev.EmulationError(f"nccl {method} on rank {self._rank}: send and receive "
                                     f"buffers overlap but are not in place ({rule})")

    # ---------------------------------------------------------------- collectives
    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                  stream: int) -> None:
        self._collective("allReduce", (sendbuf, recvbuf, count, datatype, op, stream),
                         ("allReduce", count, datatype, op), sendbuf, count, recvbuf, count,
                         datatype, stream, lambda s: reduce_rows(s, op, datatype), same=True)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, root: int,
               stream: int) -> None:
        self._root(root)
        at_root = self._rank == root
        self._collective("reduce", (sendbuf, recvbuf, count, datatype, op, root, stream),
                         ("reduce", count, datatype, op, root), sendbuf, count,
                         recvbuf if at_root else None, count, datatype, stream,
                         lambda s: reduce_rows(s, op, datatype), same=True)

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int,
                  stream: int) -> None:
        self._root(root)
        at_root = self._rank == root
        self._collective("broadcast", (sendbuff, recvbuff, count, datatype, root, stream),
                         ("broadcast", count, datatype, root), sendbuff if at_root else None,
                         count, recvbuff, count, datatype, stream, lambda s: s[root], same=True)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                  stream: int) -> None:
        place = recvbuf + self._rank * count * itemsize(datatype)
        self._collective("allGather", (sendbuf, recvbuf, count, datatype, stream),
                         ("allGather", count, datatype), sendbuf, count, recvbuf,
                         count * self._size, datatype, stream, lambda s: s.reshape(-1),
                         in_place=sendbuf == place)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int, op: int,
                      stream: int) -> None:
        place = sendbuf + self._rank * recvcount * itemsize(datatype)
        me, block = self._rank, recvcount
        self._collective("reduceScatter", (sendbuf, recvbuf, recvcount, datatype, op, stream),
                         ("reduceScatter", recvcount, datatype, op), sendbuf,
                         recvcount * self._size, recvbuf, recvcount, datatype, stream,
                         lambda s: reduce_rows(s, op, datatype)[me * block:(me + 1) * block],
                         in_place=recvbuf == place)

    def _root(self, root: int) -> None:
        if not 0 <= int(root) < self._size:
            raise error(INVALID_ARGUMENT)

    def _collective(self, method: str, real_args: tuple, entry: tuple, sendbuf: Any,
                    send_count: int, recvbuf: Any, recv_count: int, datatype: int,
                    stream_ptr: int, combine: Callable[[np.ndarray], np.ndarray],
                    same: bool = False, in_place: bool | None = None) -> None:
        stream = self._check_call(method, real_args, stream_ptr)
        dtype = dtype_of(datatype)
        send = None if sendbuf is None else self._span(method, sendbuf, send_count, datatype,
                                                       "sendbuff")
        recv = None if recvbuf is None else self._span(method, recvbuf, recv_count, datatype,
                                                       "recvbuff")
        if send is not None and recv is not None:
            if same:
                in_place = sendbuf == recvbuf
            if not in_place:
                self._no_overlap(method, send, recv, "NCCL: in place only with the documented "
                                 "pointers, other overlaps are undefined")
        comm, seq_holder = self, []

        def run() -> None:
            mine = raw_view(sendbuf, send_count, dtype).copy() if send is not None else None
            stack = exchange(comm, method, mine, send_count, dtype, seq_holder[0], entry)
            if recv is not None:
                raw_view(recvbuf, recv_count, dtype)[...] = combine(stack)

        self.coll_seq += 1
        seq_holder.append(self.coll_seq)
        op = _Op(entry, stream, [send] if send else [], [recv] if recv else [], run)
        self._issue(op)

    # ---------------------------------------------------------------- point to point
    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._p2p("send", sendbuf, count, datatype, peer, stream)

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._p2p("recv", recvbuf, count, datatype, peer, stream)

    def _p2p(self, method: str, ptr: int, count: int, datatype: int, peer: int,
             stream_ptr: int) -> None:
        stream = self._check_call(method, (ptr, count, datatype, peer, stream_ptr), stream_ptr)
        if not 0 <= int(peer) < self._size:  # to itself too (NCCL allows it, in a group)
            raise error(INVALID_ARGUMENT)
        span = self._span(method, ptr, count, datatype, "buffer")
        dtype, comm = dtype_of(datatype), self
        if method == "send":
            def run() -> Any:
                data = raw_view(ptr, count, dtype).copy()
                return [comm.mpi.Isend(data.view(np.uint8), dest=peer, tag=_P2P_TAG)], None
            op = _Op((method, peer, count, datatype), stream, [span], [], run, peer)
        else:
            def run() -> Any:  # into a private buffer, copied once the operation completes:
                # an aborted one writes nothing (the device memory may be freed and reused)
                data = np.empty(count, dtype)
                return ([comm.mpi.Irecv(data.view(np.uint8), source=peer, tag=_P2P_TAG)],
                        lambda: raw_view(ptr, count, dtype).__setitem__(..., data))
            op = _Op((method, peer, count, datatype), stream, [], [span], run, peer)
        self._issue(op)

    # ---------------------------------------------------------------- launching
    def _issue(self, op: _Op) -> None:
        self.log.append(op.entry)
        if getattr(_tls, "depth", 0):
            _tls.pending.append((self, op))
        else:
            GLOBAL_LOG.append([(self.uid, op.entry)])
            self._launch([op])

    def _connect(self, ops: list[_Op]) -> None:
        """NCCL >= 2.22 connects lazily: block until the new peers take part too."""
        requests = []
        if any(op.peer is None for op in ops) and "all" not in self.connected:
            requests.append(self.handshake.Ibarrier())
            self.connected.add("all")
        for peer in sorted({op.peer for op in ops if op.peer is not None} - self.connected):
            token = np.zeros(1, np.uint8)
            requests += [self.handshake.Isend(token, dest=peer, tag=_HANDSHAKE_TAG),
                         self.handshake.Irecv(np.zeros(1, np.uint8), source=peer,
                                              tag=_HANDSHAKE_TAG)]
            self.connected.add(peer)
        return requests

    def _launch(self, ops: list[_Op]) -> None:
        """One NCCL launch (a call, or a group): handshake, order, poison, enqueue one task."""
        stream = ops[0].stream
        spans = [s for op in ops for s in op.writes]
        for i, a in enumerate(spans):
            for b in spans[i + 1:]:
                self._no_overlap("group", a, b, "two receive buffers of one launch overlap")
        requests = self._connect(ops)
        if self.nonblocking and requests:
            self._in_background("connection handshake",
                                lambda: waitall(requests, self, "connection handshake"),
                                lambda _: self._enqueue(ops, stream, spans))
        with self._inside("connection handshake"):
            waitall(requests, self, "connection handshake")
        self._enqueue(ops, stream, spans)

    def _enqueue(self, ops: list[_Op], stream: dev.Stream, spans: list) -> None:
        """The launch proper, once connected: order, poison, enqueue one task. A group on
        several streams (legal in NCCL) runs on the first after every stream's prior work, and
        every stream's later work waits for it."""
        others = list(dict.fromkeys(op.stream for op in ops if op.stream is not stream))
        for other in others:
            dev.follow(stream, other)
        self._enqueue_one(ops, stream, spans)
        for other in others:
            dev.follow(other, stream)

    def _enqueue_one(self, ops: list[_Op], stream: dev.Stream, spans: list) -> None:
        comm = self

        waits: list = []

        def run() -> None:
            try:
                for other, seq in waits:  # implicit null-stream ordering
                    other.drain(seq)
                pending, deliver, links = [], [], []
                for op in ops:
                    if op.peer is None:
                        op.run()
                    else:
                        requests, done = op.run()
                        pending += requests
                        deliver += [done] if done is not None else []
                        links += p2p_links(op.entry[0], op.peer)
                if links:
                    waitall_confirmed(pending, comm, "send/recv", links)
                for done in deliver:
                    done()
            except BaseException as exc:
                comm.async_error = getattr(exc, "status", INTERNAL)
                raise

        name = "nccl " + "+".join(op.entry[0] for op in ops)
        reads = [s for op in ops for s in op.reads]
        with dev.LOCK:
            poison = [(start, end) for buf, start, end in spans
                      if not any(s[1] < end and start < s[2] for s in reads) and buffers.idle(buf)]
            waits += buffers.ordered_access([(s[0], False) for s in reads] +
                                            [(s[0], True) for s in spans], name, here=stream,
                                            task_seq=stream.seq + 1)
            for start, end in poison:  # what a missing wait reads: NaN, -1
                raw_view(start, end - start, np.dtype(np.uint8))[...] = 0xFF
            self.tasks = [t for t in self.tasks if not t.finished.is_set()]
            self.tasks.append(stream.enqueue(name, run))

    def commSplit(self, color: int, key: int) -> "NcclCommunicator | None":
        self._check_call("commSplit", (color, key), 0)
        if self.nonblocking:  # the child inherits blocking = 0: ncclInProgress, and CuPy's
            raise error(IN_PROGRESS)  # commSplit raises before wrapping it (the split is lost)
        self.splits += 1  # NCCL derives the child from the parent and the split's number
        self.log.append(("commSplit",))
        GLOBAL_LOG.append([(self.uid, ("commSplit",))])
        with self._inside("ncclCommSplit"):
            requests = self._connect([_Op(("commSplit",), dev.null_stream(), [], [],
                                          lambda: None)])
            waitall(requests, self, "connection handshake")
            child = self.handshake.Split(color if color >= 0 else MPI.UNDEFINED, key)
        if color < 0:
            return None
        uid = hashlib.blake2b(self.uid + np.int64([self.splits, color]).tobytes(),
                              digest_size=64).digest().ljust(128, b"\0")
        return type(self)(child.Get_size(), None, child.Get_rank(), _mpi=child, _uid=uid)
