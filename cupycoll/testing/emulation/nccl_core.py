"""The emulated NCCL's plumbing: state, errors, abortable waits, unique ids, the bootstrap, and
NCCL's arithmetic (:func:`reduce_rows`): sums and products in ring order from a rotating rank,
not rank order; float avg premultiplied, integer avg a wrapping sum truncated toward zero; float
max/min that drop NaN (``fmaxf``/``fminf``). Every rank computes the same bits, as NCCL does."""

from __future__ import annotations

import itertools
import os
import threading
import time
import zlib
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

__all__ = ["STATE", "MISMATCHED", "release_blocked", "error", "poll", "waitall", "waitall_confirmed",
           "collective_links", "exchange", "p2p_links", "get_unique_id", "uid_bytes",
           "join", "dtype_of", "itemsize", "reduce_rows", "ring_fold", "INTERNAL",
           "INVALID_ARGUMENT", "INVALID_USAGE", "REMOTE"]

STATE: dict[str, Any] = {}
_ids = itertools.count(1)
_SHUTDOWN = threading.Event()
# ncclResult_t values
INTERNAL, INVALID_ARGUMENT, INVALID_USAGE, REMOTE = 3, 4, 5, 6
_GRACE_TESTS, _GRACE_SECONDS = 20, 0.1


def release_blocked() -> None:
    """Make every blocked emulated NCCL call fail (end of a test that left a peer missing)."""
    _SHUTDOWN.set()


def error(status: int) -> BaseException:
    return STATE["real"].NcclError(status)


def poll(done: Callable[[], bool], comm: Any, what: str, kernel: bool = False) -> None:
    """Wait for ``done()``; an abort of ``comm`` (or a release) makes it raise NcclError.

    A peer's abort sets ``comm``'s asynchronous error; a host call then fails, while a
    ``kernel`` (a task on a stream) keeps spinning, as NCCL's kernels do, until ``comm`` aborts.
    The abort notice travels apart from what the peer sent before it and can overtake it, so a
    host call fails only after ``done()`` stayed false for a grace of at least
    ``_GRACE_TESTS`` tests and ``_GRACE_SECONDS`` (a handshake every peer finished completes).
    """
    pause, tests_left, until = 2e-5, _GRACE_TESTS, None
    while not done():
        if (comm is not None and comm.aborted) or _SHUTDOWN.is_set():
            raise error(INTERNAL if comm is not None and comm.aborted else REMOTE)
        if comm is not None and comm.peer_aborted() and not kernel:  # sets the async error
            until = until or time.monotonic() + _GRACE_SECONDS
            tests_left -= 1
            if tests_left < 0 and time.monotonic() > until:
                raise error(REMOTE)
        time.sleep(pause)
        pause = min(pause * 2, 2e-3)


def waitall(requests: list, comm: Any, what: str, kernel: bool = False) -> None:
    if requests:
        poll(lambda: MPI.Request.Testall(requests), comm, what, kernel)


def collective_links(seq: int, partners: list) -> list:
    """The (peer, tags) a collective's liveness handshake uses: one pair of tags per collective
    number, the same at both ends."""
    arrive, confirm = 1000 + seq % 15000, 16000 + seq % 15000
    return [(peer, (arrive, arrive, confirm, confirm)) for peer in partners]


def p2p_links(method: str, peer: int) -> list:
    """A send's or recv's liveness handshake: direction-specific tags, so the k-th send a->b
    pairs with the k-th recv at b (MPI's non-overtaking order), not with b's own sends."""
    return [(peer, (1, 2, 3, 4) if method == "send" else (2, 1, 4, 3))]


#: collectives whose ranks posted different calls (count, dtype, op, root): real NCCL hangs or
#: reads past the smaller buffers; here both ends fail and check_logs names it.
MISMATCHED: list[str] = []


def waitall_confirmed(requests: list, comm: Any, what: str, links: list,
                      call: tuple | None = None) -> None:
    """Wait (as a kernel) for the data ``requests`` AND for each link's peer to confirm, from
    its live operation, that it saw this operation arrive.

    Data moves eagerly, so a late rank can receive what a peer sent before it aborted; NCCL
    never completes an operation against an aborted communicator (its kernels were killed).
    Each end sends "arrived" (arrive tag) and answers the other's "arrived" with "confirm"
    (confirm tag) only while its own operation is alive, so a peer that aborted before this
    one arrived never confirms: the late operation spins until its own abort or timeout. The
    requests of an operation that fails are kept (their buffers must outlive MPI's use).
    ``call`` (a collective's log entry) travels with "arrived": a peer that posted another
    call fails the operation here and is recorded in :data:`MISMATCHED`.
    """
    signature = zlib.crc32(repr(call).encode()) + 1 if call else 0  # 0: unchecked (p2p)
    tokens, mark = comm.tokens, np.array([signature], np.int64)
    pending, answer = list(requests), []
    for peer, (arrive_out, arrive_in, confirm_out, confirm_in) in links:
        pending += [tokens.Isend(mark, dest=peer, tag=arrive_out),
                    tokens.Irecv(np.zeros(1, np.int64), source=peer, tag=confirm_in)]
        theirs = np.zeros(1, np.int64)
        answer.append((tokens.Irecv(theirs, source=peer, tag=arrive_in), peer, confirm_out,
                       theirs))

    def done() -> bool:
        for item in list(answer):
            if comm.aborted:  # an aborted operation confirms nothing (poll raises next)
                return False
            if item[0].Test():
                answer.remove(item)
                if signature and item[3][0] and item[3][0] != signature:
                    MISMATCHED.append(f"{what}: rank {item[1]} of the communicator posted "
                                      "another call (count, dtype, op or root) than this rank")
                    raise error(INTERNAL)  # never completed against a different call
                pending.append(tokens.Isend(mark, dest=item[1], tag=item[2]))
        return not answer and MPI.Request.Testall(pending)

    try:
        poll(done, comm, what, kernel=True)
    except BaseException:
        comm.stale.append((pending, answer))
        raise


def exchange(comm: Any, method: str, mine: np.ndarray | None, count: int, dtype: np.dtype,
              seq: int, entry: tuple) -> np.ndarray:
    """Every rank's contribution, stacked in rank order (who sends to whom by ``method``);
    done only when every partner's operation confirmed it was alive (no match across an
    aborted communicator)."""
    tag = 1000 + seq % 20000
    p, me = comm._size, comm._rank
    root = entry[-1] if method in ("reduce", "broadcast") else None
    senders = [root] if method == "broadcast" else list(range(p))
    receivers = [root] if method == "reduce" else list(range(p))
    stack = np.zeros((p, count), dtype)
    requests = []
    if me in senders:
        stack[me] = mine
        requests += [comm.mpi.Isend(stack[me].view(np.uint8), dest=r, tag=tag)
                     for r in receivers if r != me]
    if me in receivers:
        requests += [comm.mpi.Irecv(stack[s].view(np.uint8), source=s, tag=tag)
                     for s in senders if s != me]
    partners = sorted(({r for r in receivers if r != me} if me in senders else set()) |
                      ({s for s in senders if s != me} if me in receivers else set()))
    waitall_confirmed(requests, comm, method, collective_links(seq, partners), entry)
    return stack


def get_unique_id() -> Any:
    """128 bytes naming the creating world rank and a counter (a tuple in CuPy 13 style)."""
    raw = np.zeros(128, np.uint8)
    raw[:16] = np.frombuffer(np.array([0x454D55, MPI.COMM_WORLD.Get_rank(), next(_ids), 0],
                                      np.int32).tobytes(), np.uint8)
    raw[16:] = np.frombuffer(os.urandom(112), np.uint8)
    return bytes(raw) if STATE["version"] >= 14 else tuple(int(b) for b in raw.view(np.int8))


def uid_bytes(uid: Any) -> bytes:
    if STATE["version"] >= 14:
        if not isinstance(uid, bytes) or len(uid) != 128:
            raise TypeError(f"commId must be the 128 bytes of get_unique_id(), got {type(uid)}")
        return uid
    if not isinstance(uid, tuple) or len(uid) != 128:
        raise TypeError(f"commId must be the 128-tuple of get_unique_id(), got {type(uid)}")
    return np.array(uid, np.int8).tobytes()


def join(uid: bytes, rank: int, size: int, device: int) -> Any:
    """Rendezvous at the id's creator (NCCL's bootstrap root), then an MPI group of us."""
    boot, world = STATE["boot"], MPI.COMM_WORLD.Get_rank()
    head = np.frombuffer(uid[:16], np.int32)
    root, tag = int(head[1]), int(head[2]) % 30000 + 100
    me = (rank, world, STATE["node"], device)
    if world == root:
        table = {rank: me}
        while len(table) < size:
            req = boot.irecv(source=MPI.ANY_SOURCE, tag=tag)
            got: list = []
            poll(lambda: got.append(req.test()) or got[-1][0], None, "ncclCommInitRank")
            info = got[-1][1]
            if info[0] in table:
                raise error(INVALID_ARGUMENT)
            table[info[0]] = info
        placed = [(node, gpu) for _, _, node, gpu in table.values()]
        if len(set(placed)) < len(placed):  # NCCL: "Duplicate GPU detected"
            table = None
        for _, rank_world, _, _ in (table or {}).values():
            if rank_world != world:
                boot.send(table, dest=rank_world, tag=tag)
        if table is None:
            raise error(INVALID_USAGE)
    else:
        boot.send(me, dest=root, tag=tag)
        req = boot.irecv(source=root, tag=tag)
        got = []
        poll(lambda: got.append(req.test()) or got[-1][0], None, "ncclCommInitRank")
        table = got[-1][1]
    order = [table[r][1] for r in range(size)]
    group = MPI.COMM_WORLD.Get_group().Incl(order)
    return boot.Create_group(group, tag)


def itemsize(datatype: int) -> int:
    return dtype_of(datatype).itemsize


def dtype_of(datatype: int) -> np.dtype:
    try:
        return STATE["dtypes"][int(datatype)]
    except KeyError:
        raise error(INVALID_ARGUMENT) from None


def reduce_rows(stack: np.ndarray, op: int, datatype: int) -> np.ndarray:
    """NCCL's reduction of the ranks' rows (``stack[rank]``), the same bits on every rank.

    Sum and product accumulate in NCCL's ring order, not rank order (:func:`ring_fold`); float
    avg is NCCL's premultiplied sum (each row times 1/P in the dtype, then summed), integer avg
    a sum that wraps in the dtype, divided with truncation toward zero (``FuncSumPostDiv``);
    float max/min drop NaN like ``fmaxf``/``fminf``/``__hmax`` (NaN only where every rank has
    NaN; a tie of zeros gives +0 for max and -0 for min).
    """
    with np.errstate(all="ignore"):  # a GPU's arithmetic raises no floating-point warnings
        return _reduce(stack, int(op))


def _reduce(stack: np.ndarray, op: int) -> np.ndarray:
    real = STATE["real"]
    if op == real.NCCL_AVG:
        if stack.dtype.kind == "f":
            return ring_fold(stack * stack.dtype.type(1.0 / stack.shape[0]), np.add)
        return _truncated_mean(ring_fold(stack, np.add), stack.shape[0])
    if op in (real.NCCL_MAX, real.NCCL_MIN):
        biggest = op == real.NCCL_MAX
        if stack.dtype.kind != "f":
            return (np.maximum if biggest else np.minimum).reduce(stack, axis=0)
        return _nan_dropping(stack, biggest)
    ufunc = {real.NCCL_SUM: np.add, real.NCCL_PROD: np.multiply}.get(op)
    if ufunc is None:
        raise error(INVALID_ARGUMENT)
    return ring_fold(stack, ufunc)


def ring_fold(stack: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """Fold the rows as a ring reduction accumulates: the element range is cut in P chunks of
    ceil(n / P) elements; chunk c starts at rank (c + 1) % P and adds the next ranks around the
    ring, rounding to the dtype at every step. So an element's sum depends on its chunk, never
    plainly on rank order (a float result compared bit for bit with a rank-order sum fails)."""
    p, n = stack.shape
    out = stack[0].copy()
    if p == 1 or n == 0:
        return out
    cols = np.arange(n)
    first = (cols // -(-n // p) + 1) % p
    out[...] = stack[first, cols]
    for step in range(1, p):
        ufunc(out, stack[(first + step) % p, cols], out=out)
    return out


def _truncated_mean(total: np.ndarray, p: int) -> np.ndarray:
    """``total // p`` rounded toward zero, on the dtype's bits (NCCL's integer avg)."""
    unsigned = total.view(total.dtype.str.replace("i", "u"))
    negative = total < 0
    magnitude = np.where(negative, -unsigned, unsigned) // unsigned.dtype.type(p)
    return np.where(negative, -magnitude, magnitude).astype(unsigned.dtype).view(total.dtype)


def _nan_dropping(stack: np.ndarray, biggest: bool) -> np.ndarray:
    """fmax/fmin over the rows; zeros of both signs give +0 (max) or -0 (min)."""
    out = (np.fmax if biggest else np.fmin).reduce(stack, axis=0)
    zero = out == 0
    if zero.any():
        rows = stack[:, zero]
        minus = (rows == 0) & np.signbit(rows)
        plus = (rows == 0) & ~np.signbit(rows)
        negative = ~plus.any(axis=0) if biggest else minus.any(axis=0)
        out[zero] = np.where(negative, -0.0, 0.0).astype(out.dtype)
    return out
