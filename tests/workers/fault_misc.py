"""Fault injection beyond late ranks, several scenarios per launch (every rank prints a row).

    fault_misc.py SCENARIO [SCENARIO ...]

stale      the notebook case: rank 0 (short timeout) gives up on an allreduce that rank 1 joins
           later; the next allreduce must not match the stale one: rank 0 raises at once, the
           others time out naming rank 0 as aborted; init() on every rank works again.
crossed    ranks call different verbs at the same point: sparse_allreduce vs topk_allreduce vs
           TopkCompressor.step always, dense verbs and ``comm.barrier()`` too when
           CUPYCOLL_DEBUG=1 is set; every rank
           raises MismatchError naming both verbs and the communicator stays usable.
skip       one rank raises (and catches) an exception between collectives and skips a call;
           calls match by order, so the others time out at the end naming it; init() recovers.
interrupt  a blocking wait without a timeout (``timeout=0``: none) raises KeyboardInterrupt
           within 1 s of SIGINT; the communicator is then dead; init() recovers. The same in
           an asynchronous call's ``wait(timeout=)`` (before: the communicator stayed alive
           and its next call hung in the pending one).
first      a rank arrives late at a fresh communicator's first sparse_allreduce (whose first
           use detects the nodes and broadcasts the profile: MPI calls without a timeout); the
           others give up and init() again; the late one must time out too, not hang there.
learned    rank 0 arrives late at learn.save (rank 0 writes, then broadcasts): the others time
           out naming rank 0; learn.load on every rank but rank 0, which makes another call:
           every rank times out, none waits in the broadcast forever.
preempted  a signal handler's exception (SLURM's --signal pattern) on rank 0 in a wait the others
           join later: rank 0's communicator is dead (its next call raised no error and read
           the others' data before), the others time out naming rank 0; and in a host barrier
           (before node detection or a dup): the others' barrier completes against rank 0's
           abandoned one, and they raise naming rank 0 instead of entering MPI's untimed calls;
           rank 0 closes its communicator and calls on: the others' timeout names it as closed.
dup        the last rank makes the background worker's duplicate (a first asynchronous call
           of cupycoll.torch's) while the others run a sparse_allreduce: the barrier before the
           duplicate completes against their validation, and the duplicate's own collectives
           (its settings, MPI_Comm_idup) time out there instead of hanging in MPI_Comm_dup.
async_late the last rank comes 2 s late to an asynchronous sparse_allreduce (1 s timeout):
           the others time out in its validation; the late rank's validation completes against
           their abandoned ones and its algorithm waits on the background worker's duplicate,
           whose board now says they gave the communicator up: its timeout names them so.
local      a KeyboardInterrupt on rank 0 in a sparse_allreduce's local work, outside any
           wait: rank 0's communicator is dead at once (the others wait in that call: a later
           call would pair with theirs), the others time out; init() recovers. The same in a
           dense allreduce's fast path (float16 widened before posting; before: the
           communicator stayed alive and its next call paired with the others' first).
failed     an asynchronous broadcast whose ranks pass different counts fails (MPI truncates):
           ``is_completed()``, ``wait(timeout=)`` and ``wait()`` report it done and every later
           ``wait()`` raises BackendError (before: a raw mpi4py exception, then a ``wait()``
           that returned the unfilled output); the same failure in a dropped Work leaves the
           next calls alone (before: raised on one rank only, so the ranks' calls paired out of
           order).
aborted    abort() from another thread on rank 0 while it waits, without a timeout, for late
           peers: its wait raises at once (before: it waited for ever); the peers' call
           completes against rank 0's abandoned one and their next call, under a 60 s timeout,
           times out within seconds naming rank 0, which gave the communicator up before it
           (before: after the 60 s). Then every rank queues ten asynchronous sparse calls and
           aborts: each wait returns the right sum or raises cupycoll's error (before: a
           worker waiting in a call its peer never posted hung the wait and the exit).
gave_up    the same early ends for a timed ``Work.wait(timeout=)`` (abort() from another thread on
           rank 0 ends it with BackendError, before: it ran its whole timeout and raised
           CollectiveTimeout saying "wait again"; the peers' timed wait on a collective rank 0
           never started ends at once naming it) and for a host wait (the peers' ``dup()``
           after rank 0 aborted, without a timeout: before, it waited for ever).
inside     (P >= 3) abort() from another thread on rank 0 inside a collective the last rank
           starts 4 s late, without a timeout. Small: what rank 0 posted lets every other rank
           complete once the late one comes (none raises while a live rank is still to come).
           8 MB (MPICH's schedule needs rank 0's later steps): the ranks that cannot complete
           raise naming rank 0, which left it unfinished, 2 s after the late rank started
           (before: they waited for ever), the others complete; the same when rank 0 aborts
           inside the first of two asynchronous collectives it started. A rank that finished
           its collective and aborted after (a reduce's non-root) leaves its root's wait to
           complete.
remote     every rank on a node of its own (the communicator torchrun's join makes): the last
           rank busy outside MPI for 3 s, the others time out after 1 s, their board reads
           given 0.5 s, naming the last rank (before: the read's lock waited for the busy
           rank, 3 s, and named nobody).
forked     rank 0 forks a child (a DataLoader worker) while its asynchronous call waits for the
           last rank on the background worker: the child ends at once (before: its exit waited
           5 s for the call it inherited), and the call completes.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import tempfile
import threading
import time

import numpy as np
from mpi4py import MPI

import cupycoll as cc
from cupycoll.errors import BackendError, CollectiveTimeout, CupycollError, MismatchError
from _common import napping_barrier

WORLD = MPI.COMM_WORLD
P, RANK = WORLD.size, WORLD.rank
DEBUG = os.environ.get("CUPYCOLL_DEBUG", "") not in ("", "0")


def report(name: str, outcome: str, took: float) -> None:
    napping_barrier()  # a rank kept waiting for a late peer leaves its core to the others
    every = WORLD.gather((outcome, took), root=0)
    if RANK == 0:
        cells = ", ".join(f"r{r}: {o} {t:.2f}s" for r, (o, t) in enumerate(every))
        print(f"MISC {name:<28} P={P}  {cells}", flush=True)


def dead_after_interrupt(comm, what: str) -> None:
    """An interrupted communicator's next call raises BackendError saying so (``what``: the
    failure if it answers)."""
    try:
        fresh_allreduce(comm)
        raise AssertionError(what)
    except cc.errors.BackendError as exc:
        assert "interrupted" in str(exc), str(exc)


def fresh_allreduce(comm) -> None:
    got = cc.allreduce(np.full(3, RANK + 1.0), comm=comm)
    assert np.array_equal(got, np.full(3, P * (P + 1) / 2)), got


def stale() -> None:
    comm = cc.init("mpi", timeout=0)
    fresh_allreduce(comm)
    comm.timeout = 1.0 if RANK == 0 else 4.0
    if RANK == 1:
        time.sleep(1.5)  # rank 0 gives up meanwhile
    start = time.monotonic()
    try:
        fresh_allreduce(comm)  # rank 1 joins rank 0's abandoned allreduce: right data
        first = "completed"
    except CollectiveTimeout as exc:
        # with CUPYCOLL_DEBUG the late rank's check allreduce pairs with the abandoned one, and
        # then its allreduce proper waits for rank 0, which gave up
        late_debug = DEBUG and RANK != 0 and exc.missing_ranks == [0]
        assert (RANK == 0 and exc.missing_ranks == [1]) or late_debug, (RANK, str(exc))
        first = f"CollectiveTimeout{exc.missing_ranks}"
    took_first = time.monotonic() - start
    report("stale: first allreduce", first, took_first)
    start = time.monotonic()
    try:
        fresh_allreduce(comm)
        raise AssertionError(f"rank {RANK}: the allreduce after a timeout matched a stale one")
    except CollectiveTimeout as exc:
        took = time.monotonic() - start
        if first != "completed":
            assert "aborted in allreduce" in str(exc) and took < 0.5, (took, str(exc))
        else:
            assert exc.missing_ranks == [0] and "rank 0 aborted or closed it" in str(exc), str(exc)
        outcome = f"CollectiveTimeout{exc.missing_ranks}"
    report("stale: next allreduce", outcome, took)
    fresh_allreduce(cc.init("mpi", timeout=5))


def crossed() -> None:
    comm = cc.init("mpi", timeout=5)
    x = np.arange(8, dtype=np.float32) + RANK
    idx, val = np.array([1, 5], np.int64), np.ones(2, np.float32)
    comp = cc.TopkCompressor(8, 0.25, comm=comm)
    verbs = {
        "sparse_allreduce": lambda: cc.sparse_allreduce(idx, val, 8, comm=comm),
        "topk_allreduce": lambda: cc.topk_allreduce(x, 2, comm=comm),
        "TopkCompressor.step": lambda: comp.step(x),
    }
    if DEBUG:
        verbs.update({
            "allreduce": lambda: cc.allreduce(x, comm=comm),
            "broadcast": lambda: cc.broadcast(x, root=0, comm=comm),
            "allgather": lambda: cc.allgather(x, comm=comm),
            "barrier": comm.barrier,  # (before: not checked, crossed ones timed out)
        })
    names = list(verbs)
    pairs = [(a, b) for a in names for b in names if a != b]
    for i, (a, b) in enumerate(pairs):
        mine = a if RANK == i % P else b  # one rank calls a, the others b
        start = time.monotonic()
        try:
            verbs[mine]()
            raise AssertionError(f"rank {RANK}: {a} crossed with {b} did not raise")
        except MismatchError as exc:
            assert a in str(exc) and b in str(exc), str(exc)
            outcome = "MismatchError"
        report(f"crossed {a}/{b}", outcome, time.monotonic() - start)
        fresh_allreduce(comm)  # still usable, nothing moved


def skip() -> None:
    """Calls match by order (as in MPI and NCCL): rank 1's next call pairs with the call it
    skipped on the others, so the others are left waiting at the end and name rank 1."""
    comm = cc.init("mpi", timeout=0)
    idx, val = np.array([RANK], np.int64), np.ones(1, np.float32)
    cc.sparse_allreduce(idx, val, P, comm=comm)
    comm.timeout = 1.5
    try:
        if RANK == 1:
            raise ValueError("a bug in this rank's own code")
        cc.sparse_allreduce(idx, val, P, comm=comm)  # rank 1 skips this call
    except ValueError:
        pass
    start = time.monotonic()
    try:
        cc.sparse_allreduce(idx, val, P, comm=comm)
        assert RANK == 1, "only the rank that skipped a call completes its last one"
        outcome = "completed (paired with the others' previous call)"
    except CollectiveTimeout as exc:
        assert exc.missing_ranks == [1], str(exc)
        outcome = f"CollectiveTimeout{exc.missing_ranks}"
    report("skip: exception between calls", outcome, time.monotonic() - start)
    fresh_allreduce(cc.init("mpi", timeout=5))


def interrupt() -> None:
    comm = cc.init("mpi", timeout=0)  # 0 as keyword: no timeout, like CUPYCOLL_TIMEOUT=0
    assert comm.timeout is None
    if RANK == 1:
        time.sleep(0.3)  # a short delay must not time out
    fresh_allreduce(comm)
    outcome, took = "waited", 0.0
    if RANK == 0:
        sent = []
        timer = threading.Timer(0.5, lambda: (sent.append(time.monotonic()),
                                              os.kill(os.getpid(), signal.SIGINT)))
        timer.start()
        try:
            fresh_allreduce(comm)  # rank 1 never comes
            raise AssertionError("the allreduce completed without rank 1")
        except KeyboardInterrupt:
            took = time.monotonic() - sent[0]
            assert took < 1.0, took
            outcome = "KeyboardInterrupt"
        dead_after_interrupt(comm, "an interrupted communicator answered")
    report("interrupt (no timeout)", outcome, took)
    comm = cc.init("mpi", timeout=5)
    fresh_allreduce(comm)
    if RANK == 0:
        ones = np.ones(4)  # rank 1 never comes (CUPYCOLL_DEBUG: the front door's agreement
        work = comm.allreduce(ones, ones, "sum") if DEBUG else cc.allreduce(  # would wait)
            ones, comm=comm, async_op=True)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            work.wait(timeout=30)
            raise AssertionError("the allreduce completed without rank 1")
        except KeyboardInterrupt:
            pass
        dead_after_interrupt(comm, "a communicator interrupted in wait(timeout) answered")
    report("interrupt in wait(timeout)", "KeyboardInterrupt, then dead" if RANK == 0 else
           "waited", 0.0)
    fresh_allreduce(cc.init("mpi", timeout=5))
    _interrupt_async_sparse()


def _interrupt_async_sparse() -> None:
    """An asynchronous sparse_allreduce whose rank 1 is 2 s late inside the algorithm (its
    validation done): rank 0's ``wait(timeout=0.3)`` names rank 1 (absent from the first
    collective of ``mask`` on the worker's duplicate) and the call (before: neither); then
    SIGINT in its ``wait()``: KeyboardInterrupt, and the communicator is dead (before: alive,
    its next call waited for the timeout, for ever without one, on the call left in the
    worker). The others complete (what rank 0's worker posted suffices) or raise."""
    from cupycoll.sparse import api

    comm = cc.init("mpi", timeout=5)
    run = api._run
    if RANK == 1:
        api._run = lambda *args, **kwargs: (time.sleep(2.0), run(*args, **kwargs))[1]
    idx = np.arange(RANK, 40, P, dtype=np.int64)
    work = cc.sparse_allreduce(idx, np.ones(idx.size), 40, algorithm="mask", comm=comm,
                               async_op=True)
    outcome = "waited"
    try:
        if RANK == 0:
            try:
                work.wait(timeout=0.3)
                raise AssertionError("the call completed without rank 1's algorithm")
            except CollectiveTimeout as exc:
                assert exc.missing_ranks == [1] and exc.op_name == "sparse_allreduce", exc
                assert "before sparse_allreduce completed; rank 1 had not started it" in \
                    str(exc), exc
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                work.wait()
                raise AssertionError("the call completed without rank 1's algorithm")
            except KeyboardInterrupt:
                pass
            dead_after_interrupt(comm, "a communicator interrupted in an async wait answered")
            outcome = "named, KeyboardInterrupt, then dead"
        else:  # completes where what rank 0's worker posted suffices, else raises
            assert np.array_equal(work.wait().values, np.ones(40)), "a wrong sum"
            outcome = "completed"
    except cc.errors.CupycollError as exc:
        assert RANK != 0, exc
        outcome = type(exc).__name__
    finally:
        api._run = run
    report("interrupt in an async sparse wait", outcome, 0.0)
    fresh_allreduce(cc.init("mpi", timeout=5))


class Preempted(Exception):
    """What a job's preemption handler raises (not a KeyboardInterrupt)."""


def _preempted_in(call, after: float = 0.3) -> str:
    """``call()`` on rank 0 with SIGUSR1 raising Preempted ``after`` s into it."""
    def handler(signum, frame):
        raise Preempted()

    previous = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(after, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        call()
        raise AssertionError("the call completed without its peers")
    except Preempted:
        return "Preempted"
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


def preempted() -> None:
    comm = cc.init("mpi", timeout=2.0)
    fresh_allreduce(comm)
    start = time.monotonic()
    if RANK == 0:
        outcome = _preempted_in(lambda: fresh_allreduce(comm))
        try:  # the "should we stop?" allreduce: before, it paired with the others' first one
            cc.allreduce(np.ones(1, np.int64), "max", comm=comm)
            raise AssertionError("a communicator left by Preempted answered")
        except cc.errors.BackendError as exc:
            assert "left by Preempted" in str(exc), str(exc)
    else:
        time.sleep(1.0)
        try:  # the first may pair with rank 0's abandoned (kept) call (with CUPYCOLL_DEBUG,
            fresh_allreduce(comm)  # its agreement round does)
            cc.allreduce(np.ones(1, np.int64), "max", comm=comm)
            raise AssertionError("an allreduce completed without rank 0")
        except CollectiveTimeout as exc:
            assert exc.missing_ranks == [0] and "rank 0 aborted or closed it" in str(exc), exc
            outcome = f"CollectiveTimeout{exc.missing_ranks}"
    report("preempted in a wait", outcome, time.monotonic() - start)
    comm = cc.init("mpi", timeout=2.0)
    start = time.monotonic()
    if RANK == 0:
        outcome = _preempted_in(lambda: comm.host_arrival("test.barrier"))
    else:
        time.sleep(1.0)
        try:
            comm.host_arrival("test.barrier")
            raise AssertionError("the barrier let this rank on after rank 0 gave it up")
        except cc.errors.BackendError as exc:
            assert "test.barrier on rank" in str(exc) and "rank 0 gave it up" in str(exc), exc
            outcome = "BackendError"
    report("preempted in a host barrier", outcome, time.monotonic() - start)
    comm = cc.init("mpi", timeout=5.0)
    fresh_allreduce(comm)
    if RANK == 0:
        comm.close()
    start = time.monotonic()
    try:
        fresh_allreduce(comm)
        raise AssertionError("an allreduce completed without rank 0")
    except cc.errors.BackendUnavailable:
        assert RANK == 0
        outcome = "BackendUnavailable"
    except CollectiveTimeout as exc:  # before: "every rank started it", missing nobody
        assert exc.missing_ranks == [0] and "rank 0 aborted or closed it at collective #" in \
            str(exc), exc
        outcome = f"CollectiveTimeout{exc.missing_ranks}"
    took = time.monotonic() - start  # the board says rank 0 closed it before this one: no
    assert took < 3.0, took  # wait for the whole timeout (before: 5 s)
    report("rank 0 closed, calls on", outcome, took)
    fresh_allreduce(cc.init("mpi", timeout=10))


def first() -> None:
    comm = cc.init("mpi", timeout=1.0)
    n = 100_000  # not a small call (which completes in the validation round)
    idx = np.arange(RANK, n, 3, dtype=np.int64)
    val = np.ones(idx.size, np.float32)
    if RANK == 1:
        time.sleep(2.5)  # the others give up and make a new communicator meanwhile
    start = time.monotonic()
    try:
        cc.sparse_allreduce(idx, val, n, comm=comm)
        outcome = "completed"
    except CollectiveTimeout as exc:
        outcome = f"CollectiveTimeout{exc.missing_ranks}"
    took = time.monotonic() - start
    assert outcome != "completed" and took < 6, (outcome, took)
    fresh_allreduce(cc.init("mpi", timeout=10))
    report("first call, a late rank", outcome, took)


def dup() -> None:
    from cupycoll._background import runner

    comm = cc.init("mpi", timeout=1.0)
    mine = np.arange(RANK, 50, P)
    times_out("duplicate against a call", lambda: runner(comm) if RANK == P - 1 else
              cc.sparse_allreduce(mine, np.ones(mine.size), 50, comm=comm))


def async_late() -> None:
    comm = cc.init("mpi", timeout=1.0)
    mine = np.arange(RANK, 5000, P)
    for async_op in (False, True):  # the first calls: nodes, profile, the worker's duplicate
        done = cc.sparse_allreduce(mine, np.ones(mine.size), 5000, comm=comm, async_op=async_op)
        if async_op:
            done.wait()
    napping_barrier()
    start = time.monotonic()
    if RANK == P - 1:
        time.sleep(2.0)
    try:
        cc.sparse_allreduce(mine, np.ones(mine.size), 5000, algorithm="allgather", comm=comm,
                            async_op=True).wait()
        outcome = "completed"
    except CollectiveTimeout as exc:
        outcome = "CollectiveTimeout"
        late = RANK == P - 1
        assert exc.missing_ranks == ([P - 1] if not late else list(range(P - 1))), str(exc)
        assert not late or "gave the communicator up" in str(exc), str(exc)
    assert outcome == "CollectiveTimeout", outcome
    report("async call, last rank late", outcome, time.monotonic() - start)
    fresh_allreduce(cc.init("mpi", timeout=10))


def times_out(name: str, call) -> None:
    """``call()`` raises CollectiveTimeout on this rank within 6 s; init() works again."""
    start = time.monotonic()
    try:
        call()
        outcome = "completed"
    except CollectiveTimeout:
        outcome = "CollectiveTimeout"
    took = time.monotonic() - start
    assert outcome == "CollectiveTimeout" and took < 6, (outcome, took)
    fresh_allreduce(cc.init("mpi", timeout=10))
    report(name, outcome, took)


def local() -> None:
    from cupycoll.comm import _mpi_staging
    from cupycoll.sparse import _validate

    idx, val = np.array([RANK], np.int64), np.ones(1, np.float32)
    widened = np.ones(2000, np.float16)  # contiguous: the dense fast path, staged to float32
    _local_interrupt("interrupt in local work", _validate, "_local",
                     lambda comm: cc.sparse_allreduce(idx, val, P, comm=comm))
    _local_interrupt("interrupt in a dense call's own work", _mpi_staging, "to_host",
                     lambda comm: cc.allreduce(widened, comm=comm))


def _local_interrupt(name: str, module, function: str, call) -> None:
    """``call(comm)`` with ``module.function`` raising KeyboardInterrupt on rank 0 (before
    anything is posted): rank 0's communicator is dead, the others time out."""
    comm = cc.init("mpi", timeout=1.0)
    call(comm)
    checks = getattr(module, function)
    if RANK == 0:  # Ctrl-C lands in the call's own work, before anything is posted
        setattr(module, function, lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
    start = time.monotonic()
    try:
        call(comm)
        raise AssertionError("the call completed")
    except KeyboardInterrupt:
        assert RANK == 0
        dead_after_interrupt(comm, "an interrupted communicator answered")
        outcome = "KeyboardInterrupt, then dead"
    except CollectiveTimeout as exc:
        assert RANK != 0
        outcome = f"CollectiveTimeout{exc.missing_ranks}"
    finally:
        setattr(module, function, checks)
    report(name, outcome, time.monotonic() - start)
    fresh_allreduce(cc.init("mpi", timeout=10))


def _mismatched_broadcast(comm):
    """An asynchronous broadcast whose count is 4 on rank 0, 400 elsewhere (with
    CUPYCOLL_DEBUG the front door's agreement would refuse it: the Communicator's own)."""
    x = np.ones(4 if RANK == 0 else 400, np.float32)
    return comm.broadcast(x, x, P - 1) if DEBUG else cc.broadcast(x, root=P - 1, comm=comm,
                                                                   async_op=True)


def failed() -> None:
    comm = cc.init("mpi", timeout=5.0)
    for how in ("is_completed", "wait_timeout", "wait"):
        work = _mismatched_broadcast(comm)
        try:
            if how == "is_completed":
                while not work.is_completed():
                    time.sleep(0.001)
            else:
                work.wait(timeout=4 if how == "wait_timeout" else None)
            outcomes = [how]
        except cc.errors.BackendError:
            outcomes = ["BackendError"]
        for _ in range(2):  # every later wait raises it, on the ranks whose transfer failed
            try:
                work.wait()
                outcomes.append("returned")
            except cc.errors.BackendError:
                outcomes.append("BackendError")
        assert outcomes[1:] in (["BackendError"] * 2, ["returned"] * 2), outcomes
        assert outcomes[0] == how or how != "is_completed", outcomes  # is_completed: True
        assert outcomes[0] != "BackendError" or outcomes[1] == "BackendError", outcomes
        if RANK == 0:
            assert outcomes[1:] == ["BackendError"] * 2, outcomes  # 4 floats for 400
        report(f"failed broadcast, {how}", "/".join(outcomes), 0.0)
        fresh_allreduce(comm)  # the failed one holds the published finished count down no more
        assert comm.board.slot[2] == comm.sequence, (int(comm.board.slot[2]), comm.sequence)
    comm = cc.init("mpi", timeout=5.0)
    work = _mismatched_broadcast(comm)
    time.sleep(0.3)
    del work  # dropped: kept until its transfers are done
    for _ in range(3):
        fresh_allreduce(comm)
    report("failed broadcast dropped, calls on", "completed", 0.0)


def learned() -> None:
    from cupycoll.sparse import learn

    comm = cc.init("mpi", timeout=1.0)
    path = os.path.join(WORLD.bcast(tempfile.mkdtemp() if RANK == 0 else None), "learned.json")
    if RANK == 0:
        time.sleep(2.5)  # rank 0 reads or writes, then broadcasts: the others wait for it
    start = time.monotonic()
    try:
        learn.save(comm, path)
        outcome = "completed"
    except CollectiveTimeout as exc:
        outcome = f"CollectiveTimeout{exc.missing_ranks}"
    took = time.monotonic() - start
    late = ("completed", "CollectiveTimeout[]")  # its broadcast may complete as their root
    assert (outcome in late if RANK == 0 else outcome == "CollectiveTimeout[0]") and took < 6, \
        (outcome, took)
    fresh_allreduce(cc.init("mpi", timeout=10))
    report("learn.save, rank 0 late", outcome, took)
    comm = cc.init("mpi", timeout=1.0)  # learn.load on every rank but rank 0: none hangs
    times_out("learn.load, not on rank 0", lambda: cc.sparse_allreduce(
        np.arange(3), np.ones(3), 10, comm=comm) if RANK == 0 else learn.load(comm, path))
    comm = cc.init("mpi", timeout=5.0)  # rank 0 closes as soon as its broadcast is out: the
    if RANK == 1:  # others' completed broadcast is no peer giving up
        time.sleep(0.5)
    learn.save(comm, path)
    comm.close()
    report("learn.save, then close", "completed", 0.0)


def aborted() -> None:
    comm = cc.init("mpi", timeout=0)  # no timeout: only the abort can end rank 0's wait
    fresh_allreduce(comm)
    start = time.monotonic()
    if RANK == 0:
        threading.Timer(0.5, comm.abort).start()
        try:
            fresh_allreduce(comm)
            outcome = "completed"
        except BackendError as exc:
            assert "abort() was called on rank 0" in str(exc), str(exc)
            outcome = "BackendError"
        assert outcome == "BackendError", outcome
    else:
        time.sleep(1.5)  # rank 0 has aborted meanwhile
        comm.timeout = 60.0
        fresh_allreduce(comm)  # rank 0 posted it before it aborted: the right data
        try:
            fresh_allreduce(comm)
            outcome = "completed"
        except CollectiveTimeout as exc:
            assert exc.missing_ranks == [0] and "rank 0 aborted or closed it" in str(exc), \
                str(exc)
            outcome = f"CollectiveTimeout{exc.missing_ranks}"
        assert outcome == "CollectiveTimeout[0]", outcome
    took = time.monotonic() - start
    assert took < 10, took
    report("abort from a thread, peers late", outcome, took)
    napping_barrier()
    comm = cc.init("mpi", timeout=0)
    mine = np.arange(RANK, 5000, P)
    expected = np.ones(5000)  # every index on one rank
    works, outcomes = [], set()
    for algorithm in ("split", "allgather") * 5:
        try:
            works.append(cc.sparse_allreduce(mine, np.ones(mine.size), 5000, comm=comm,
                                             algorithm=algorithm, output="dense", async_op=True))
        except CupycollError as exc:  # a peer that aborted first ends this rank's validation
            outcomes.add(type(exc).__name__)
            break
    comm.abort()
    start = time.monotonic()
    for work in works:
        try:
            assert np.array_equal(work.wait(), expected)
            outcomes.add("right")
        except CupycollError as exc:
            outcomes.add(type(exc).__name__)
    took = time.monotonic() - start
    assert took < 10, took
    report("ten async calls, then abort", "+".join(sorted(outcomes)), took)
    napping_barrier()
    comm = cc.init("mpi", timeout=0)  # abort() ends a host wait (a broadcast) on the others:
    magic = 0x0BADC0DE  # its request and buffer are kept, so the root's late broadcast writes
    if RANK == 0:  # no memory freed and reused meanwhile (before: an 8-byte array of theirs)
        time.sleep(1.0)
        comm.mpi_comm.Ibcast(np.array([magic], np.int64), root=0).Wait()
        outcome = "broadcast"
    else:
        threading.Timer(0.3, comm.abort).start()
        try:
            comm.host_bcast(None, "test.broadcast")
            raise AssertionError("the broadcast completed without its root")
        except BackendError:
            outcome = "BackendError"
        gc.collect()
        pool = [np.zeros(1, np.int64) for _ in range(2000)]
        start = time.monotonic()
        while time.monotonic() - start < 2.0:  # MPI progresses: the root's broadcast arrives
            WORLD.Iprobe()
            time.sleep(0.01)
        assert not any(a[0] == magic for a in pool), "MPI wrote into a freed buffer"
    report("abort in a host broadcast", outcome, 0.0)
    fresh_allreduce(cc.init("mpi", timeout=10))


def gave_up() -> None:
    comm = cc.init("mpi", timeout=0)
    fresh_allreduce(comm)
    start = time.monotonic()
    if RANK == 0:
        work = cc.allreduce(np.ones(4), comm=comm, async_op=True)  # the others come 1.5 s late
        threading.Timer(0.3, comm.abort).start()
        try:
            work.wait(timeout=30)
            outcome = "completed"
        except BackendError as exc:
            assert "abort() was called on rank 0" in str(exc), str(exc)
            outcome = "BackendError"
    else:
        time.sleep(1.5)
        cc.allreduce(np.ones(4), comm=comm)  # against rank 0's abandoned one
        work = cc.allreduce(np.ones(4), comm=comm, async_op=True)  # rank 0 never starts it
        try:
            work.wait(timeout=30)
            outcome = "completed"
        except CollectiveTimeout as exc:
            assert exc.missing_ranks == [0] and "rank 0 aborted or closed it" in str(exc), \
                str(exc)
            outcome = "CollectiveTimeout[0]"
    took = time.monotonic() - start
    assert outcome == ("BackendError" if RANK == 0 else "CollectiveTimeout[0]") and took < 5, \
        (outcome, took)
    report("abort, timed waits", outcome, took)
    napping_barrier()
    comm = cc.init("mpi", timeout=0)
    fresh_allreduce(comm)
    if RANK == 0:
        comm.abort()
    napping_barrier()
    start = time.monotonic()
    try:
        comm.dup()
        outcome = "completed"
    except CupycollError as exc:
        outcome = type(exc).__name__
        assert RANK == 0 or "rank 0 aborted or closed it" in str(exc), str(exc)
    took = time.monotonic() - start
    assert outcome == ("BackendError" if RANK == 0 else "CollectiveTimeout") and took < 5, \
        (outcome, took)
    report("abort, then the peers' dup", outcome, took)
    fresh_allreduce(cc.init("mpi", timeout=10))


def inside() -> None:
    # MPI's own allreduce, whose schedule needs the late rank's progress after the call (a
    # pairwise exchange's first round completes as a rank's next call posts its second)
    os.environ["CUPYCOLL_ALLREDUCE_PAIRWISE"] = "off"

    def late_peer_waits(two: bool, big: bool) -> str:
        comm = cc.init("mpi", timeout=0)  # no timeout: only the board can end the waits
        fresh_allreduce(comm)
        x = np.full(1 << 20 if big else 3, RANK + 1.0)  # 8 MB: needs rank 0's progress
        got = np.empty_like(x)  # (the Communicator's own verb: CUPYCOLL_DEBUG adds no check)
        start = time.monotonic()
        try:
            if RANK == 0:
                threading.Timer(0.3, comm.abort).start()
                works = [comm.allreduce(x, np.empty_like(x), "sum") for _ in range(1 + two)]
                works[0].wait()
            else:
                time.sleep(4.0 if RANK == P - 1 else 0.0)
                comm.allreduce(x, got, "sum").wait()
                assert np.array_equal(got, np.full(x.size, P * (P + 1) / 2)), got[:3]
            outcome = "completed"
        except BackendError as exc:
            assert RANK == 0 and "abort() was called" in str(exc), str(exc)
            outcome = "BackendError"
        except CollectiveTimeout as exc:
            assert exc.missing_ranks == [0] and "rank 0 aborted or closed it at collective #" \
                in str(exc) and "without finishing this one" in str(exc), str(exc)
            outcome = f"CollectiveTimeout{exc.missing_ranks}"
        took = time.monotonic() - start
        if RANK == 0:
            assert outcome == "BackendError", outcome
            time.sleep(9.0)  # no MPI call: its abandoned requests do not progress
        elif big:  # rank 0's part is missing (on some ranks: MPICH's schedule), known 2 s
            assert outcome == "completed" or outcome == "CollectiveTimeout[0]" and \
                5.5 < took < 8.5, (outcome, took)  # after the late rank started, not before
        else:  # what rank 0 posted lets it complete once the late rank comes
            assert outcome == "completed" and took < 7.5, (outcome, took)
        if big:
            napping_barrier()  # rank 0 sleeps
            assert "CollectiveTimeout[0]" in WORLD.allgather(outcome)  # one waited
        return outcome

    for two, big in ((False, False), (False, True), (True, True)):
        start = time.monotonic()
        outcome = late_peer_waits(two, big)
        report(f"abort inside{', two started' if two else ''}, {'8 MB' if big else 'small'}",
               outcome, time.monotonic() - start)
        napping_barrier()
    comm = cc.init("mpi")  # a pairwise reduce-scatter (messages) is published as a collective
    work = comm.reduce_scatter(np.ones(P << 15), np.empty(1 << 15), "sum")  # 256 KiB blocks
    first, small = comm.sequence, np.ones(2)
    comm.allreduce(small, small, "sum").wait()
    assert comm.board.slot[2] == first - 1, (int(comm.board.slot[2]), first)
    work.wait()
    assert comm.board.slot[2] == first + 1, (int(comm.board.slot[2]), first)
    work = comm.allreduce(small, np.empty(2), "sum")  # dropped unfinished: holds nothing down
    del work
    comm.allreduce(small, small, "sum").wait()
    assert comm.board.slot[2] == comm.sequence, (int(comm.board.slot[2]), comm.sequence)
    for dropped in (False, True):  # aborted in (or after dropping) an asynchronous one, after
        start = time.monotonic()  # finishing a later one
        outcome = _aborted_in_the_earlier(dropped)
        report(f"abort {'after dropping' if dropped else 'inside'} one, a later one finished",
               outcome, time.monotonic() - start)
        napping_barrier()
    comm = cc.init("mpi", timeout=0)  # a non-root that finished a reduce, then aborted
    fresh_allreduce(comm)
    if RANK == P - 1:
        time.sleep(2.5)  # past the board's grace
    got = cc.reduce(np.full(3, 1.0), 0, comm=comm)
    if RANK not in (0, P - 1):
        comm.abort()
    if RANK == 0:
        assert np.array_equal(got, np.full(3, float(P))), got
    report("abort after finishing a reduce", "completed", 0.0)
    napping_barrier()
    del os.environ["CUPYCOLL_ALLREDUCE_PAIRWISE"]
    fresh_allreduce(cc.init("mpi", timeout=10))


def _aborted_in_the_earlier(dropped: bool) -> str:
    """Every rank starts an 8 MB allreduce, then runs a small one to completion; rank 0 then
    aborts 0.5 s into its wait for the first (``dropped``: drops the first's Work before the
    small one and aborts after it), while the last rank makes no MPI call for 3 s (the first
    cannot complete without its progress). Rank 0 finished a later collective, not the one
    its peers wait in: they must not wait for ever (no timeout)."""
    comm = cc.init("mpi", timeout=0)
    fresh_allreduce(comm)
    x, got = np.full(1 << 20, RANK + 1.0), np.empty(1 << 20)
    small = np.ones(2)
    work = comm.allreduce(x, got, "sum")
    if dropped and RANK == 0:
        del work
    comm.allreduce(small, small, "sum").wait()
    start = time.monotonic()
    if RANK == 0 and not dropped:
        threading.Timer(0.5, comm.abort).start()
    elif RANK == P - 1:
        time.sleep(3.0)
    try:
        if dropped and RANK == 0:
            comm.abort()
            outcome = "aborted"
        else:
            work.wait()
            assert RANK != 0 and np.array_equal(got, np.full(x.size, P * (P + 1) / 2)), \
                got[:3]
            outcome = "completed"
    except BackendError as exc:
        assert RANK == 0 and "abort() was called" in str(exc), str(exc)
        outcome = "BackendError"
    except CollectiveTimeout as exc:
        assert exc.missing_ranks == [0] and "without finishing this one" in str(exc), str(exc)
        outcome = f"CollectiveTimeout{exc.missing_ranks}"
    if RANK == 0:
        time.sleep(8.0)  # no MPI call: its abandoned requests do not progress
    else:  # (they progress once rank 0 calls MPI again: the others would complete then)
        assert time.monotonic() - start < 7.0, outcome
    napping_barrier()  # rank 0 sleeps
    assert "CollectiveTimeout[0]" in WORLD.allgather(outcome)  # one waited for rank 0's part
    return outcome


def remote() -> None:
    from cupycoll._torch_world import _SeparateWorlds
    from cupycoll.comm.mpi import MPICommunicator

    comm = MPICommunicator(_SeparateWorlds(WORLD), timeout=1.0)
    fresh_allreduce(comm)
    start = time.monotonic()
    if RANK == P - 1:
        time.sleep(3.0)  # busy: no MPI call
    try:
        fresh_allreduce(comm)
        outcome = "completed"
    except CollectiveTimeout as exc:
        assert RANK != P - 1 and P - 1 in exc.missing_ranks, (exc.missing_ranks, str(exc))
        outcome = "CollectiveTimeout"
    took = time.monotonic() - start
    if RANK != P - 1:
        assert outcome == "CollectiveTimeout" and took < 2.5, (outcome, took)
    report("a busy rank on another node", outcome, took)
    napping_barrier()


def forked() -> None:
    import multiprocessing

    comm = cc.init("mpi", timeout=30)
    mine = np.array([RANK], np.int64)
    cc.sparse_allreduce(mine, np.ones(1), P, comm=comm, async_op=True).wait()  # (the worker)
    if RANK == P - 1:
        time.sleep(3.0)
    work = cc.sparse_allreduce(mine, np.ones(1), P, comm=comm, output="dense", async_op=True)
    took = 0.0
    if RANK == 0:  # a forked child (a DataLoader worker) that does nothing ends at once, though
        start = time.monotonic()  # the parent's call still waits on the background worker
        child = multiprocessing.get_context("fork").Process(target=lambda: None)
        child.start()  # (before: the child's exit waited 5 s for the inherited worker's call)
        child.join()
        took = time.monotonic() - start
        assert child.exitcode == 0 and took < 2.0, (child.exitcode, took)
    assert np.array_equal(work.wait(), np.ones(P))
    report("fork with a call in flight", "child ended", took)


for name in sys.argv[1:]:
    {"stale": stale, "crossed": crossed, "skip": skip, "interrupt": interrupt, "first": first,
     "local": local, "learned": learned, "preempted": preempted, "dup": dup,
     "async_late": async_late, "failed": failed, "aborted": aborted, "forked": forked,
     "gave_up": gave_up, "remote": remote, "inside": inside}[name]()
    napping_barrier()
if RANK == 0:
    print("OK")
