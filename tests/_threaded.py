"""Ranks simulated by threads in one process, for in-process tests of multi-rank code paths
(mutation testing runs tests in its own process): point-to-point mailboxes, a barrier for the
collectives, sums in rank order, every booked operation logged as (op name, bytes)."""

from __future__ import annotations

import queue
import threading

import numpy as np

from cupycoll._types import ReduceOp

def _zero_tie(ufunc, plus_wins: bool):
    """``ufunc`` with the MPI backend's order-free +0/-0 tie of max (+0) and min (-0)."""
    def fold(a, b):
        out = ufunc(a, b)
        if out.dtype.kind == "f":
            tie = (a == 0) & (b == 0)
            minus = (np.signbit(a) & np.signbit(b) if plus_wins
                     else np.signbit(a) | np.signbit(b))
            out = np.where(tie, np.where(minus, out.dtype.type(-0.0), out.dtype.type(0.0)), out)
        return out
    return fold


_REDUCE = {ReduceOp.SUM: np.add, ReduceOp.MAX: _zero_tie(np.maximum, True),
           ReduceOp.MIN: _zero_tie(np.minimum, False), ReduceOp.PROD: np.multiply}


class _Done:
    def wait(self):
        return None


class _Net:
    """P ranks in threads: mailboxes per (sender, receiver) and a barrier for collectives."""

    def __init__(self, p: int) -> None:
        self.p, self.barrier = p, threading.Barrier(p, timeout=20)
        self.boxes = {(a, b): queue.Queue() for a in range(p) for b in range(p)}
        self.slots = [None] * p


class _Comm:
    """What the transfers use of a communicator, each call logged as (op name, bytes)."""

    xp = np

    def __init__(self, net: _Net, rank: int) -> None:
        self.net, self.rank, self.size, self.log = net, rank, net.p, []

    def _receive(self, peer: int, buf: np.ndarray, op_name: str) -> None:
        name, data = self.net.boxes[peer, self.rank].get(timeout=20)
        assert (name, data.dtype, data.shape) == (op_name, buf.dtype, buf.shape), (
            name, op_name, data.shape, buf.shape)
        buf[...] = data

    def exchange(self, sends, recvs, op_name):
        for peer, buf in sends:
            self.net.boxes[self.rank, peer].put((op_name, np.array(buf)))
        for peer, buf in recvs:
            self._receive(peer, buf, op_name)
            self.log.append((op_name, buf.nbytes))
        return _Done()

    def broadcast(self, send, recv, root, op_name):
        if self.rank == root:
            for peer in range(self.size):
                if peer != root:
                    self.net.boxes[root, peer].put((op_name, np.array(send)))
        else:
            self._receive(root, recv, op_name)
        self.log.append((op_name, recv.nbytes))
        return _Done()

    def run_fetch(self, verb, send, recv, root, *, result, op_name):
        assert verb == "broadcast"
        getattr(self, verb)(send, recv, root, op_name).wait()
        return result

    def _gather(self, item):
        self.net.slots[self.rank] = item
        self.net.barrier.wait()
        out = list(self.net.slots)
        self.net.barrier.wait()
        return out

    def allgather_counts(self, count, op_name):
        self.log.append((op_name, 8 * self.size))
        return [int(c) for c in self._gather(int(count))]

    def allreduce(self, send, recv, op, op_name):
        parts = self._gather(np.array(send))
        out = parts[0]
        for part in parts[1:]:  # in rank order, one rounding per step
            out = _REDUCE[op](out, part)
        recv[...] = out
        self.log.append((op_name, recv.nbytes))
        return _Done()

    def stream_order(self, work):
        work.wait()

    def allgather(self, send, recv, op_name):
        parts = self._gather(np.array(send))
        assert all(p.shape == send.shape and p.dtype == recv.dtype for p in parts)  # as MPI
        assert sum(p.nbytes for p in parts) == recv.nbytes
        recv[...] = np.concatenate(parts).reshape(recv.shape)
        self.log.append((op_name, recv.nbytes))
        return _Done()


def on_ranks(p: int, fn):
    """Run ``fn(comm)`` on p simulated ranks; return [(result, log)] in rank order."""
    net = _Net(p)
    comms = [_Comm(net, r) for r in range(p)]
    out, errors = [None] * p, []

    def main(r):
        try:
            out[r] = fn(comms[r])
        except BaseException as exc:  # noqa: BLE001 -- re-raised below
            errors.append(exc)
            net.barrier.abort()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return [(out[r], comms[r].log) for r in range(p)]


def on_communicators(p: int, fn):
    """Run ``fn(comm)`` on p simulated ranks of :class:`ThreadCommunicator`; [(result, log)]."""
    from cupycoll.comm._base import Communicator

    class ThreadCommunicator(Communicator):
        """The real base class over the simulated net: its derived verbs run unchanged; each
        primitive logs (op name, verb running it, bytes received)."""

        backend, xp = "threads", np

        def __init__(self, comm: _Comm) -> None:
            super().__init__()
            self.inner, self.rank, self.size, self.log = comm, comm.rank, comm.size, comm.log

        def exchange(self, sends, recvs, op_name="exchange"):
            self.log.append(("verb", self._verb))
            return self.inner.exchange(sends, recvs, op_name)

        def allgather(self, send, recv, op_name="allgather"):
            self.log.append(("verb", self._verb))
            return self.inner.allgather(send, recv, op_name)

        def allreduce(self, send, recv, op, op_name="allreduce"):
            return self.inner.allreduce(send, recv, op, op_name)

        def broadcast(self, send, recv, root, op_name="broadcast"):
            return self.inner.broadcast(send, recv, root, op_name)

        def reduce(self, send, recv, op, root, op_name="reduce"):
            raise NotImplementedError

        def reduce_scatter(self, send, recv, op, op_name="reduce_scatter"):
            raise NotImplementedError

        def barrier(self):
            self.inner._gather(None)

        def wait(self, handles, op_name):
            return None

    return on_ranks(p, lambda comm: fn(ThreadCommunicator(comm)))


def assert_mixed_verbs(topk_rank: int, topk_call, sparse_call) -> None:
    """Two simulated ranks at the same point, rank ``topk_rank`` in ``topk_call(comm)`` (a
    topk_allreduce) and the other in ``sparse_call(comm)`` (a sparse_allreduce): each raises
    MismatchError naming both verbs and its own, after booking its own validation."""
    from cupycoll.errors import CupycollError, MismatchError

    def fn(comm):
        try:
            return (topk_call if comm.rank == topk_rank else sparse_call)(comm)
        except CupycollError as exc:
            return exc

    for r, (e, log) in enumerate(on_communicators(2, fn)):
        verb = "topk_allreduce" if r == topk_rank else "sparse_allreduce"
        assert type(e) is MismatchError and str(e) == (
            "ranks called different collectives at the same point: sparse_allreduce and "
            f"topk_allreduce (rank {r} called {verb}); nothing was moved, every rank raises "
            "this"), (r, e)
        assert log[0][0] == ("topk.validate" if r == topk_rank else "sparse.validate")


def outcomes(p: int, call):
    """``call(comm)`` on p simulated communicators: each rank's raised CupycollError, or its
    result."""
    from cupycoll.errors import CupycollError

    def fn(comm):
        try:
            return call(comm)
        except CupycollError as exc:
            return exc

    return [out for out, _ in on_communicators(p, fn)]
