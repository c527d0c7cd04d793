"""The verbs of the NCCL backend: dense collectives posted natively (allgatherv as a group of
broadcasts) and point-to-point ``exchange`` as one group of send/recv.

:class:`_NcclVerbs` is mixed into :class:`~.nccl.NCCLCommunicator`, whose engine (``_post``,
``_work``, ``_group``, buffers and code tables) the verbs run on.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Sequence

import numpy as np

from .._types import ReduceOp, parse_op
from ..errors import InvalidArgument
from ._checks import rank_of
from ._nccl_setup import nccl_types
from ._work import Work

__all__: list[str] = []


class _NcclVerbs:
    """The verbs of :class:`~.nccl.NCCLCommunicator` (a mixin: it has no state of its own)."""

    # dense collectives (NCCL natively; in place when the pointers say so). Each ``_verb`` posts
    # and returns (event, buffers); the public verb wraps that in a Work, ``run`` orders the
    # caller's stream after it directly.
    def run(self, verb: str, *args: Any, op_name: str | None = None) -> None:
        """Run a dense verb in stream order: post it and make the caller's current stream wait
        for its event (NCCL's semantics: no host wait; see :meth:`synchronize`)."""
        name = op_name or verb
        poster = _POSTERS.get(verb)
        if poster is None:
            return super().run(verb, *args, op_name=op_name)
        event, _keep = poster(self, *args, name)
        self._order(event)

    def _apart(self, send: Any, dst: Any, in_place_at: int) -> Any:
        """``send`` as NCCL may read it beside ``dst``: contiguous, and a copy (on the
        communicator's stream, in the caller's stream order) where it overlaps ``dst`` other
        than in place (its pointer ``dst``'s plus
        ``in_place_at`` bytes): NCCL leaves any other overlap undefined."""
        src = self._contiguous(send)
        if src is send and src.nbytes and dst.nbytes:
            s, d = self._ptr(src), self._ptr(dst)
            if s != d + in_place_at and s < d + dst.nbytes and d < s + src.nbytes:
                return self._on_stream(src.copy)
        return src

    def _types(self, dtype: Any, op: Any) -> tuple[int, int | None]:
        """NCCL's (dtype, op) codes: from the tables built in ``_attach``, else nccl_types."""
        code = self._dtype_codes.get(dtype)
        red = self._op_codes.get(op) if op is not None else None
        if code is None or (red is None and op is not None):
            return nccl_types(dtype, op, nccl=self._nccl, rank=self.rank)
        return code, red

    def allreduce(self, send: Any, recv: Any, op: ReduceOp, op_name: str = "allreduce") -> Work:
        return self._work(*self._allreduce(send, recv, parse_op(op, rank=self.rank), op_name),
                          op_name)

    def _allreduce(self, send: Any, recv: Any, op: ReduceOp, op_name: str) -> tuple:
        return self._every_rank_reduces("allReduce", "allreduce", send, recv, op, op_name,
                                        int(send.size))

    def _every_rank_reduces(self, call: str, verb: str, send: Any, recv: Any, op: ReduceOp,
                            op_name: str, count: int) -> tuple:
        """allReduce or reduceScatter (NCCL's ``call``): every rank sends ``send`` and receives
        ``recv``; ``count`` is NCCL's element count (the input's, or each rank's block)."""
        dtype, red = self._types(send.dtype, op)
        dst = self._buffer(recv, "recv")
        # in place: allReduce's equal pointers, reduceScatter's block of the rank in the input
        src = self._apart(send, dst, 0 if call == "allReduce" else -self.rank * dst.nbytes)
        ptr = self._ptr
        event = self._post(op_name, lambda c, s: getattr(c, call)(
            ptr(src), ptr(dst), count, dtype, red, s), (src, dst), active=count > 0,
            arrival=True)
        self._record_collective(verb, send.nbytes, op_name=op_name)
        return event, src

    def reduce(self, send: Any, recv: Any, op: ReduceOp, root: int,
               op_name: str = "reduce") -> Work:
        return self._work(*self._reduce(send, recv, parse_op(op, rank=self.rank),
                                        rank_of(self, root, "root"), op_name), op_name)

    def _reduce(self, send: Any, recv: Any, op: ReduceOp, root: int, op_name: str) -> tuple:
        dtype, red = self._types(send.dtype, op)
        count = int(send.size)
        if recv is None or self.rank != root:
            src = dst = self._contiguous(send)
        else:
            dst = self._buffer(recv, "recv")
            src = self._apart(send, dst, 0)
        ptr = self._ptr
        event = self._post(op_name, lambda c, s: c.reduce(
            ptr(src), ptr(dst), count, dtype, red, root, s), (src, dst), active=count > 0,
            arrival=True)
        self._record_collective("reduce", send.nbytes, root, op_name=op_name)
        return event, src

    def reduce_scatter(self, send: Any, recv: Any, op: ReduceOp,
                       op_name: str = "reduce_scatter") -> Work:
        return self._work(*self._reduce_scatter(send, recv, parse_op(op, rank=self.rank),
                                                op_name), op_name)

    def _reduce_scatter(self, send: Any, recv: Any, op: ReduceOp, op_name: str) -> tuple:
        return self._every_rank_reduces("reduceScatter", "reduce_scatter", send, recv, op,
                                        op_name, int(recv.size))

    def broadcast(self, send: Any, recv: Any, root: int, op_name: str = "broadcast") -> Work:
        return self._work(*self._broadcast(send, recv, rank_of(self, root, "root"), op_name),
                          op_name)

    def _broadcast(self, send: Any, recv: Any, root: int, op_name: str) -> tuple:
        dst, nbytes = self._buffer(recv, "recv"), int(recv.nbytes)
        src = self._apart(send, dst, 0) if self.rank == root else dst  # only root's is read
        ptr = self._ptr
        event = self._post(op_name, lambda c, s: c.broadcast(
            ptr(src), ptr(dst), nbytes, self._bytes, root, s), (src, dst), active=nbytes > 0,
            arrival=True)
        self._record_collective("broadcast", recv.nbytes, root, op_name=op_name)
        return event, src

    def allgather(self, send: Any, recv: Any, op_name: str = "allgather") -> Work:
        return self._work(*self._allgather(send, recv, op_name), op_name)

    def _allgather(self, send: Any, recv: Any, op_name: str) -> tuple:
        dst, nbytes = self._buffer(recv, "recv"), int(send.nbytes)
        src = self._apart(send, dst, self.rank * nbytes)  # in place: the rank's own block
        ptr = self._ptr
        event = self._post(op_name, lambda c, s: c.allGather(
            ptr(src), ptr(dst), nbytes, self._bytes, s), (src, dst), active=nbytes > 0,
            arrival=True)
        self._record_collective("allgather", recv.nbytes, op_name=op_name)
        return event, src

    def _allgatherv_into(self, send: Any, recv: Any, counts: np.ndarray, op_name: str) -> Work:
        """NCCL has no allgatherv: one grouped broadcast from every rank that has rows.

        Booked like the MPI backend (this rank's rows sent to each of the P-1 others, their rows
        received), which is what a point-to-point allgatherv moves.
        """
        dst = self._buffer(recv, "recv")
        row = math.prod(recv.shape[1:]) * recv.dtype.itemsize
        nbytes = np.asarray(counts, dtype=np.int64) * row
        offsets = np.concatenate([[0], np.cumsum(nbytes)]).astype(np.int64)
        src = self._contiguous(send)
        if int(src.nbytes) != int(nbytes[self.rank]):
            raise InvalidArgument("counts", [int(c) for c in counts], f"entry {self.rank} must be "
                                  f"this rank's row count {send.shape[0]}", rank=self.rank)

        def launch(c: Any, s: int) -> None:
            base = self._ptr(dst) if dst.nbytes else 0
            with self._group():
                for r in np.flatnonzero(nbytes):
                    block = base + int(offsets[r])
                    c.broadcast(self._ptr(src) if r == self.rank else block, block,
                                int(nbytes[r]), self._bytes, int(r), s)

        event = self._post(op_name, launch, (src, dst), arrival=True)
        self._record_allgatherv(op_name, nbytes)
        return self._work(event, src, op_name)

    # point to point
    def exchange(self, sends: Sequence[tuple[int, Any]], recvs: Sequence[tuple[int, Any]],
                 op_name: str = "exchange") -> Work:
        """One NCCL group of send/recv on raw bytes; messages to this rank are device copies.

        Zero-byte messages are booked (like MPI's) but not posted: both sides know the size.
        """
        local = collections.deque(a for peer, a in sends if rank_of(self, peer, "sends") ==
                                  self.rank)
        posted_recvs, posted_sends, staged = [], [], []
        self.stats.record(op_name)  # the operation shows in by_op even with no remote peer
        for peer, buf in recvs:
            if rank_of(self, peer, "recvs") == self.rank:
                if not local:
                    raise InvalidArgument("recvs", peer, "a receive from this rank needs a send "
                                          "to this rank", rank=self.rank)
                with self.in_stream(join=False):  # on the communicator's stream
                    buf[...] = local.popleft()
                continue
            dst = buf if buf.flags.c_contiguous else self._on_stream(
                lambda: self.xp.empty(buf.shape, buf.dtype))
            if dst is not buf:
                staged.append((buf, dst))
            posted_recvs.append((int(peer), dst))
            self.stats.record(op_name, received=dst.nbytes, msgs_received=1)
        for peer, arr in sends:
            if int(peer) == self.rank:
                continue
            src = self._contiguous(arr)
            posted_sends.append((int(peer), src))
            self.stats.record(op_name, sent=src.nbytes, msgs_sent=1)

        def launch(c: Any, s: int) -> None:
            with self._group():
                for peer, dst in posted_recvs:
                    if dst.nbytes:
                        c.recv(self._ptr(dst), int(dst.nbytes), self._bytes, peer, s)
                for peer, src in posted_sends:
                    if src.nbytes:
                        c.send(self._ptr(src), int(src.nbytes), self._bytes, peer, s)

        def unstage() -> None:  # stream-ordered after the receives
            for buf, dst in staged:
                buf[...] = dst

        event = self._post(op_name, launch, (posted_recvs, posted_sends, staged),
                           then=unstage if staged else None,
                           peers=tuple(sorted({peer for peer, dst in posted_recvs if dst.nbytes})))
        return self._work(event, (posted_recvs, posted_sends), op_name)


#: verb -> the poster ``run`` calls (functions, not bound methods: a communicator holding its
#: own bound methods would be a reference cycle, freed only by the cyclic collector).
_POSTERS = {"allreduce": _NcclVerbs._allreduce, "broadcast": _NcclVerbs._broadcast,
            "reduce": _NcclVerbs._reduce, "allgather": _NcclVerbs._allgather,
            "reduce_scatter": _NcclVerbs._reduce_scatter}
