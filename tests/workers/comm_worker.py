"""Communicator checks on real ranks: exact stats on constructed exchanges, errors, timeouts."""

from __future__ import annotations

import numpy as np
from _common import expect_raises
from mpi4py import MPI

import cupycoll as cc
from cupycoll.errors import BackendError, CollectiveTimeout, InvalidArgument, InvalidType


def check_stats(comm) -> None:
    rank, p = comm.rank, comm.size
    comm.stats.reset()
    # exchange: rank r sends (r + 1) * (peer + 1) float64 to every peer
    sends = [(q, np.full((rank + 1) * (q + 1), rank, np.float64)) for q in range(p) if q != rank]
    recvs = [(q, np.empty((q + 1) * (rank + 1), np.float64)) for q in range(p) if q != rank]
    comm.exchange(sends, recvs, "probe").wait()
    for q, buf in recvs:
        assert np.all(buf == q)
    s = comm.stats.by_op["probe"]
    assert s.bytes_sent == 8 * (rank + 1) * sum(q + 1 for q in range(p) if q != rank)
    assert s.bytes_received == 8 * (rank + 1) * sum(q + 1 for q in range(p) if q != rank)
    assert s.messages_sent == s.messages_received == p - 1
    # allgatherv: rank r contributes r + 2 int32 rows of width 3; counts = one int64 per rank
    recv, counts = comm.allgatherv(np.full((rank + 2, 3), rank, np.int32))
    assert list(counts) == [r + 2 for r in range(p)]
    assert np.array_equal(recv[:, 0], np.repeat(np.arange(p), np.arange(p) + 2))
    s, c = comm.stats.by_op["allgatherv"], comm.stats.by_op["allgatherv.counts"]
    assert s.bytes_received == 12 * sum(r + 2 for r in range(p) if r != rank)
    assert s.bytes_sent == 12 * (rank + 2) * (p - 1)
    assert c.bytes_received == 8 * (p - 1)
    # allgatherv with empty blocks on even ranks: an empty block is no message
    comm.stats.reset()
    rows = 0 if rank % 2 == 0 else rank
    recv, counts = comm.allgatherv(np.full(rows, rank, np.float32), op_name="sparse_gv")
    assert np.array_equal(recv, np.repeat(np.arange(p), [0 if r % 2 == 0 else r for r in range(p)]))
    s = comm.stats.by_op["sparse_gv"]
    senders = [r for r in range(p) if r != rank and r % 2 == 1]
    assert s.messages_received == len(senders) and s.bytes_received == 4 * sum(senders)
    assert s.messages_sent == (p - 1 if rows else 0) and s.bytes_sent == 4 * rows * (p - 1)
    # alltoallv: rank r sends j + 1 int16 to rank j
    got = comm.alltoallv([np.full(j + 1, rank, np.int16) for j in range(p)])
    assert all(np.array_equal(g, np.full(rank + 1, src, np.int16)) for src, g in enumerate(got))
    s = comm.stats.by_op["alltoallv"]
    assert s.bytes_received == 2 * (rank + 1) * (p - 1)
    assert s.bytes_sent == 2 * sum(j + 1 for j in range(p) if j != rank)
    # native collectives: the bus-bandwidth rule on a 1000-element float32 buffer (4000 B)
    x = np.ones(1000, np.float32)
    cc.allreduce(x, comm=comm)
    cc.broadcast(x, root=p - 1, comm=comm)
    cc.reduce(x, root=0, comm=comm)
    assert comm.stats.by_op["allreduce"].bytes_received == 2 * (p - 1) * 4000 // p
    assert comm.stats.by_op["broadcast"].bytes_received == (0 if rank == p - 1 or p == 1 else 4000)
    assert comm.stats.by_op["reduce"].bytes_received == (4000 if rank == 0 and p > 1 else 0)
    assert comm.stats.by_op["reduce"].bytes_sent == (4000 if rank != 0 else 0)
    total = sum(v.bytes_received for v in comm.stats.by_op.values())
    assert comm.stats.bytes_received == total
    comm.stats.reset()
    assert comm.stats.bytes_received == 0 and comm.stats.by_op == {}


def check_errors(comm) -> None:
    rank, p = comm.rank, comm.size
    x = np.ones(4 * p, np.float32)
    e = expect_raises(InvalidArgument, cc.allreduce, x, op="xor", comm=comm)
    assert "'op'" in str(e) and f"rank {rank}" in str(e)
    e = expect_raises(InvalidArgument, cc.broadcast, x, root=p, comm=comm)
    assert "'root'" in str(e)
    expect_raises(InvalidArgument, cc.reduce, x, root=-1, comm=comm)
    expect_raises(InvalidType, cc.reduce, x, root="0", comm=comm)
    expect_raises(InvalidType, cc.broadcast, x, root=False, comm=comm)  # a bool is not a rank
    expect_raises(InvalidType, cc.reduce, x, root=np.True_, comm=comm)
    if p > 1:
        e = expect_raises(InvalidArgument, cc.reduce_scatter, np.ones(4 * p + 1, np.float32),
                          comm=comm)
        assert "divisible" in str(e)
    e = expect_raises(InvalidType, cc.allreduce, x.astype(np.complex64), comm=comm)
    assert "'x'" in str(e)
    expect_raises(InvalidType, cc.allreduce, np.array([object()]), comm=comm)
    expect_raises(InvalidType, cc.allreduce, [1.0, 2.0], comm=comm)
    expect_raises(InvalidArgument, cc.allreduce, x, out=np.empty(3, np.float32), comm=comm)
    expect_raises(InvalidType, cc.allreduce, x, out=np.empty(4 * p, np.float64), comm=comm)
    if p > 1:
        expect_raises(InvalidArgument, cc.allgather, x, out=x, comm=comm)
    assert isinstance(expect_raises(ValueError, cc.allreduce, x, op="xor", comm=comm), cc.errors.CupycollError)
    assert isinstance(expect_raises(TypeError, cc.allreduce, "x", comm=comm), cc.errors.CupycollError)
    # nothing was sent: a following collective still matches up on every rank
    assert float(cc.allreduce(np.ones(1, np.float32), comm=comm)[0]) == p
    # exchange: a bad peer is refused before anything is posted (a message posted for a bad
    # call would match the next one's); a strided receive buffer gets its bytes
    nxt, prv = (rank + 1) % p, (rank - 1) % p
    for bad in (p, -1, -2, True, 1.0):
        for sends, recvs in (([(bad, np.ones(2))], [(prv, np.zeros(2))]),
                             ([(nxt, np.ones(2))], [(prv, np.zeros(2)), (bad, np.zeros(2))])):
            err = expect_raises(InvalidArgument, comm.exchange, sends, recvs)
            assert err.argument == ("sends" if sends[0][0] is bad else "recvs"), err
    for bad in (p, -1, True):  # a root, the counts, the sends: named, nothing posted
        expect_raises(InvalidArgument, comm.broadcast, np.ones(2), np.ones(2), bad)
        expect_raises(InvalidArgument, comm.reduce, np.ones(2), np.ones(2), "sum", bad)
    for counts in ([2] * (p + 1), [-1] + [2] * (p - 1), [3] * p, [2.0] * p):
        err = expect_raises(InvalidArgument, comm.allgatherv, np.ones(2), counts)
        assert err.argument == "counts" and err.rank == rank, err
    err = expect_raises(InvalidArgument, comm.alltoallv, [np.ones(1)] * (p + 1))
    assert err.argument == "sends", err
    strided = np.zeros((4, 2))[:, 1]
    comm.exchange([(nxt, np.arange(4.0) + rank)], [(prv, strided)]).wait()
    assert strided.tolist() == (np.arange(4.0) + prv).tolist(), strided
    # the Communicator's own verbs take an op's name too ("avg" is no sum), a bad one named
    mine = np.full(2 * p, rank + 1.0)
    for verb, out, args in ((comm.allreduce, np.empty(2 * p), ()),
                            (comm.reduce, np.empty(2 * p), (0,)),
                            (comm.reduce_scatter, np.empty(2), ())):
        verb(mine, out, "avg", *args).wait()
        assert (verb == comm.reduce and rank != 0) or (out == (p + 1) / 2).all(), (verb, out)
        expect_raises(InvalidArgument, verb, mine, out, "mean", *args)


def check_backend_error(comm) -> None:
    """A broadcast into smaller buffers than root's raises BackendError on those ranks (MPICH
    detects it at the receiver), naming the verb and the rank; the communicator stays usable."""
    if comm.size < 2:
        return
    x = np.ones(4 if comm.rank == 0 else 2, np.float32)
    if comm.rank == 0:
        cc.broadcast(x, root=0, comm=comm)
    else:
        e = expect_raises(BackendError, cc.broadcast, x, root=0, comm=comm)
        assert "broadcast" in str(e) and f"rank {comm.rank} of" in str(e), str(e)
        assert isinstance(e.__cause__, MPI.Exception)
    comm.barrier()
    assert float(cc.allreduce(np.ones(1, np.float32), comm=comm)[0]) == comm.size


def check_timeout(comm):
    """A receive from a late peer raises CollectiveTimeout naming it; the communicator is then
    dead (every call raises at once) and init() gives a working one. Returns that one."""
    if comm.size < 2:
        return comm
    buf = np.zeros(3)
    if comm.rank == 0:
        comm.timeout = 0.5
        work = comm.exchange([], [(1, buf)], "late")
        e = expect_raises(CollectiveTimeout, work.wait)
        assert "late" in str(e) and "rank 0" in str(e)
        assert "rank 1 still owes" in str(e) and e.missing_ranks == [1], str(e)  # by name
        assert e.op_name == "late"
        e = expect_raises(CollectiveTimeout, work.wait)  # dead: at once, saying where
        assert "aborted in late" in str(e), str(e)
        expect_raises(CollectiveTimeout, comm.barrier)
    MPI.COMM_WORLD.Barrier()  # rank 1 is late: it sends only after rank 0 gave up
    if comm.rank == 1:
        comm.exchange([(0, np.arange(3.0))], [], "late").wait()  # lands in the abandoned buffer
    comm = cc.init("mpi")
    assert float(cc.allreduce(np.ones(1, np.float32), comm=comm)[0]) == comm.size
    return comm


def check_works(comm) -> None:
    """Async calls as threads and loops use them: two pairwise reduces (256 KiB: their second
    phase is posted at the first wait or test) waited in different orders on different ranks
    and polled at the root; is_completed() beside the completer thread that waits the same
    Work; wait(timeout) while a rank is late; a reduce waited after close(); allgatherv counted
    in the arrival board; an mpi4py object that is not an intracommunicator."""
    import time

    p, rank, n = comm.size, comm.rank, 1 << 16
    works = [cc.reduce(np.full(n, value, np.float32), root=0, comm=comm, async_op=True)
             for value in (1.0, 100.0)]
    if rank == 0:
        while not works[1].is_completed():
            time.sleep(1e-4)
    results = [works[i].wait() for i in ((0, 1) if rank % 2 else (1, 0))]
    if rank == 0:
        assert {float(r[0]) for r in results} == {p * 1.0, p * 100.0}, results
        assert all((r == r[0]).all() for r in results)
    for _ in range(50):
        work = cc.allreduce(np.ones(4, np.float32), comm=comm, async_op=True)
        future = work.get_future()
        while not work.is_completed():
            pass
        assert (future.result(timeout=60) == p).all()
    late = cc.allreduce(np.ones(4, np.float32), comm=comm, async_op=True) \
        if rank != p - 1 or p == 1 else None
    if late is not None and p > 1:
        err = expect_raises(CollectiveTimeout, late.wait, timeout=0.2)  # rank P-1 is late
        assert err.missing_ranks == [p - 1] and f"rank {p - 1} had not started it" in str(err)
    MPI.COMM_WORLD.Barrier()
    if late is None:
        late = cc.allreduce(np.ones(4, np.float32), comm=comm, async_op=True)
    assert (late.wait(timeout=60) == p).all()
    before = comm.sequence
    comm.allgatherv(np.ones(2), counts=[2] * p)
    assert comm.sequence == before + 1
    twin = comm.dup()
    work = cc.reduce(np.ones(n, np.float32), root=0, comm=twin, async_op=True)
    MPI.COMM_WORLD.Barrier()
    twin.close()  # started before it: completes (a pairwise reduce from 256 KiB included)
    reduced = work.wait()
    assert rank != 0 or (reduced == p).all()
    for bad, kind in ((MPI.COMM_NULL, InvalidType), (3, InvalidType)):
        for backend in ("mpi", None):  # the default agrees on the backend over it first
            err = expect_raises(kind, cc.init, backend, mpi_comm=bad)
            assert err.argument == "mpi_comm" and err.rank == MPI.COMM_WORLD.Get_rank(), err


def check_progress_without_waits(comm) -> None:
    """Works dropped before they completed keep their buffers until MPI is done with them
    (freed under MPI's writes, later arrays were overwritten and the heap corrupted); a
    pairwise reduce whose non-root starts another collective before waiting it completes (its
    second phase was posted only at a wait or test: both ranks timed out)."""
    import gc

    p, rank, m = comm.size, comm.rank, 1 << 16
    for it in range(8):
        cc.allgather(np.full(m, rank + 1.0), comm=comm, async_op=True)
        cc.reduce(np.ones(m, np.float32), root=0, comm=comm, async_op=True)  # pairwise
        cc.allreduce(np.ones(m, np.float32), comm=comm, async_op=True)
        gc.collect()
        junk = [np.full(m, 12345.0) for _ in range(4)]  # where the dropped outputs were
        assert (cc.allreduce(np.ones(1000), comm=comm) == p).all()
        assert all((j == 12345.0).all() for j in junk), f"rank {rank}: overwritten at {it}"
    timeout, comm.timeout = comm.timeout, 20.0
    work = cc.reduce(np.full(m, 2.0, np.float32), root=0, comm=comm, async_op=True)
    got = work.wait() if rank == 0 else None
    assert (cc.allreduce(np.ones(4), comm=comm) == p).all()  # before the non-roots' waits
    if rank != 0:
        assert work.wait() is None
    else:
        assert (got == 2.0 * p).all(), got
    comm.timeout = timeout


def check_threads_making_runners() -> None:
    """Communicators used from threads of their own, each thread's first call asynchronous:
    each makes its communicator's worker (a barrier and a dup, collective) in whatever order
    the threads run on each rank, without waiting for one another's."""
    import threading

    for _ in range(3):
        comms = [cc.init("mpi", timeout=30) for _ in range(3)]
        got, start = {}, threading.Barrier(len(comms))

        def call(i: int, on) -> None:
            start.wait()
            idx = np.array([on.rank, on.size + i], np.int64)
            got[i] = cc.sparse_allreduce(idx, np.ones(2), on.size + 3, comm=on,
                                         async_op=True).result()

        threads = [threading.Thread(target=call, args=(i, c)) for i, c in enumerate(comms)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i, c in enumerate(comms):
            p = c.size
            assert got[i].indices.tolist() == [*range(p), p + i], got
            assert got[i].values.tolist() == [1.0] * p + [float(p)], got
            c.close()


def check_settings_refused_on_one_rank(comm) -> None:
    """A bad setting read as a communicator is made, on rank 0 only (init() and dup()): every
    rank raises InvalidArgument naming it and rank 0, none hangs in the making, none is left
    with a communicator (no duplicate is made: none leaks); the old one works on."""
    import os

    from cupycoll.errors import InvalidArgument

    for name, value in (("CUPYCOLL_TIMEOUT", "abc"), ("CUPYCOLL_SPIN", "abc"),
                        ("CUPYCOLL_REDUCE_PAIRWISE", "-5"), ("CUPYCOLL_BACKEND", "bogus"),
                        ("CUPYCOLL_CONNECT_TIMEOUT", "junk"), ("CUPYCOLL_TYPO", "1")):
        for make in (cc.init, comm.dup):
            if comm.rank == 0:
                os.environ[name] = value
            try:
                make()
            except InvalidArgument as exc:
                assert exc.argument in (name, "backend") and exc.rank == 0, (name, exc)
                made = False
            else:
                made = True
            finally:
                os.environ.pop(name, None)
            refused = name in ("CUPYCOLL_SPIN", "CUPYCOLL_REDUCE_PAIRWISE") or make == cc.init
            assert made != refused, (name, make, made)
    try:  # the keyword likewise (before: rank 0 raised alone, the others hung in the making)
        cc.init(timeout="abc" if comm.rank == 0 else 5)
        raise AssertionError("init() took timeout='abc'")
    except InvalidArgument as exc:
        assert exc.argument == "timeout" and exc.rank == 0, exc
    from cupycoll.errors import MismatchError

    for make in (cc.init, comm.dup) if comm.size > 1 else ():  # a threshold on rank 0 apart
        os.environ["CUPYCOLL_REDUCE_PAIRWISE"] = "off" if comm.rank == 0 else "1048576"
        try:
            make()
            raise AssertionError(f"{make} made a communicator of different thresholds")
        except MismatchError as exc:
            assert "CUPYCOLL_REDUCE_PAIRWISE (None on rank 0; 1048576 on rank" in str(exc), exc
        finally:
            os.environ.pop("CUPYCOLL_REDUCE_PAIRWISE")
    for asked in (["mpi", "auto"], [None, "mpi"]) if comm.size > 1 else ():  # rank 0 apart
        if comm.rank == 0 and asked[0] is None:
            os.environ["CUPYCOLL_BACKEND"] = "auto"
        try:
            cc.init(asked[min(comm.rank, 1)])
            raise AssertionError(f"init made a communicator of backends {asked}")
        except MismatchError as exc:
            assert "backend ('mpi' on rank" in str(exc) or "backend ('auto' on rank" in str(exc), \
                exc
        finally:
            os.environ.pop("CUPYCOLL_BACKEND", None)
    assert cc.allreduce(np.ones(2), comm=comm).tolist() == [comm.size] * 2


if __name__ == "__main__":
    comm = cc.init("mpi")
    check_settings_refused_on_one_rank(comm)
    assert cc.get_comm() is comm
    check_stats(comm)
    check_errors(comm)
    check_backend_error(comm)
    check_works(comm)
    check_progress_without_waits(comm)
    check_threads_making_runners()
    comm = check_timeout(comm)
    print(f"rank {comm.rank}: comm ok")
