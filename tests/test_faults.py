"""Fault injection under mpiexec: late ranks named, dead communicators, crossed verbs, stale
operations, interrupts, dying ranks, and a soak run (see each worker's docstring)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from mpi4py import MPI

import cupycoll as cc
from cupycoll._config import parse_timeout
from cupycoll.errors import CollectiveTimeout, InvalidArgument

from ._mpi import ROOT, WORKERS, mpiexec, run_mpi


def test_one_timeout_parser_for_keyword_and_variable(monkeypatch):
    """timeout=0 as keyword means no timeout, as CUPYCOLL_TIMEOUT=0 does; bad values raise."""
    assert [parse_timeout(v) for v in (None, 0, -1, "0", "2.5", 3, float("inf"), 10**400,
                                       -10**400)] == \
        [None, None, None, None, 2.5, 3.0, None, None, None]  # (ints past float: none, not
    # an OverflowError, which one rank raised alone while its peers waited in init)
    for bad in ("soon", True, float("nan"), [1]):
        with pytest.raises(InvalidArgument, match="timeout"):
            parse_timeout(bad)
    monkeypatch.setenv("CUPYCOLL_TIMEOUT", "0")
    assert cc.init("mpi", mpi_comm=MPI.COMM_SELF).timeout is None
    monkeypatch.setenv("CUPYCOLL_TIMEOUT", "4")
    assert cc.init("mpi", mpi_comm=MPI.COMM_SELF).timeout == 4.0
    assert cc.init("mpi", mpi_comm=MPI.COMM_SELF, timeout=0).timeout is None  # keyword first
    with pytest.raises(InvalidArgument, match="timeout"):
        cc.init("mpi", mpi_comm=MPI.COMM_SELF, timeout="soon")


def test_collective_timeout_fields():
    exc = CollectiveTimeout("late", missing_ranks=[3, 1], op_name="allreduce")
    assert exc.missing_ranks == [1, 3] and exc.op_name == "allreduce"
    assert CollectiveTimeout("x").missing_ranks == [] and isinstance(exc, TimeoutError)


def test_a_timeout_says_why_no_rank_is_named():
    """Every rank arrived and no peer owes a message (a peer gave the call up and went on): the
    message says so (it said "no arrival board", which there was)."""
    from types import SimpleNamespace

    from cupycoll.comm._watchdog import timeout_error

    board = SimpleNamespace(read=lambda: [(5, 0), (5, 0), (5, 0)])
    seen = timeout_error(board, 0, 3, "sparse_allreduce", "sparse_allreduce", 1.0, 5)
    assert seen.missing_ranks == [] and "no arrival board" not in str(seen)
    assert "every rank started it and no peer owes this rank a message" in str(seen)
    board = SimpleNamespace(read=lambda: [(5, 0), (5, 6), (5, 6)])  # ranks 1, 2 gave it up
    seen = timeout_error(board, 0, 3, "TopkCompressor.step", "topk.validate", 1.0, 5)
    assert seen.missing_ranks == [1, 2], seen.missing_ranks  # (before: [], named in the text)
    assert "rank 1 aborted or closed it at collective #5" in str(seen), str(seen)


def test_a_peer_that_closed_or_aborted_is_told_apart(monkeypatch):
    """The board's rules on peers' [arrived, died at + 1, finished, given up] slots: closed
    after collective 2 (died 4) or aborted before starting 3: "before starting" at once;
    aborted inside 3, unfinished (or given up: its Work failed or was dropped): named "without
    finishing" only once every live rank started 3 and the grace has passed since; aborted
    after finishing 3, or finishes not published: never."""
    from cupycoll.comm import _watchdog as w

    board = w.Board(MPI.COMM_SELF)
    clock = [100.0]
    monkeypatch.setattr(w.time, "monotonic", lambda: clock[0])

    def views(**slots):
        board._local = {0: np.array([3, 0, 2, 0])} | {
            int(r[1:]): np.array(v) for r, v in slots.items()}
        board._remote, board.size = None, 3

    views(r1=[2, 4, 2, 0], r2=[2, 0, 2, 0])  # rank 1 closed after 2, rank 2 alive before 3
    assert board.given_up_on(0, 3) == {1: (3, False)}
    error = w.forsaken_error(board.given_up_on(0, 3), 0, 3, "allreduce", 3)
    assert error.missing_ranks == [1] and "rank 1 aborted or closed it at collective #3, " \
        "before starting this one" in str(error), error
    views(r1=[3, 4, 2, 0], r2=[2, 0, 2, 0])  # aborted inside 3, unfinished; rank 2 not there
    clock[0] += 10 * w._INSIDE_GRACE
    assert board.given_up_on(0, 3) == {}  # rank 2's arrival may complete it
    views(r1=[3, 4, 2, 0], r2=[3, 0, 2, 0])
    assert board.given_up_on(0, 3) == {}
    clock[0] += w._INSIDE_GRACE - 0.1
    assert board.given_up_on(0, 3) == {}
    clock[0] += 0.2
    assert board.given_up_on(0, 3) == {1: (3, True)}
    error = w.forsaken_error(board.given_up_on(0, 3), 0, 3, "allreduce", 3)
    assert error.missing_ranks == [1] and "rank 1 aborted or closed it at collective #3, " \
        "without finishing this one" in str(error), error
    views(r1=[3, 4, 3, 0], r2=[3, 0, 2, 0])  # finished 3, then aborted: its part is in
    clock[0] += 10
    assert board.given_up_on(0, 3) == {}
    views(r1=[3, 4, w.UNTRACKED, 0], r2=[3, 0, 2, 0])  # finishes not published (NCCL)
    assert board.given_up_on(0, 3) == {}
    board._inside_seen.clear()  # finished 4 and 5, gave 3 up: inside, unfinished
    views(r1=[5, 6, 5, 1 << 2], r2=[3, 0, 2, 0])
    assert board.given_up_on(0, 3) == {}
    clock[0] += w._INSIDE_GRACE + 0.1
    assert board.given_up_on(0, 3) == {1: (5, True)}
    assert board.given_up_on(0, 4) == {}  # but 4 it finished


def test_the_finished_count_published_has_no_gap():
    """A collective started asynchronously and not finished holds the published finished
    count below itself, whatever finishes after it, until its Work is dropped; NCCL's board
    publishes none."""
    from cupycoll.comm import _watchdog as w

    board, slot = w.Board(MPI.COMM_SELF, sequence=4), np.zeros(w.SLOT_WORDS, np.int64)
    board.started(5)  # async 5, then 6 and 7 finish (6 blocking, 7 async)
    board.finish(6, slot)
    assert slot[2] == 4
    board.started(7)
    board.finish(7, slot)
    assert slot[2] == 4
    board.finish(5, slot)
    assert slot[2] == 7
    board.started(8)  # a Work dropped (or failed) unfinished: released from the next finish
    board.finish(9, slot)
    assert slot[2] == 7
    board.release(8)
    assert slot[2] == 7 and slot[3] == 0
    board.finish(10, slot)  # 8 holds the count down no more: published as given up
    assert slot[2] == 10 and slot[3] == 1 << 2
    board.release(11)  # a blocking one that failed
    board.finish(12, slot)
    assert slot[2] == 12 and slot[3] == 1 << 4 | 1 << 1
    board.finish(8, slot)  # a test of the dropped Work found it done
    assert slot[2] == 12 and slot[3] == 1 << 1
    for sequence in range(13, 74):  # a window of 62 behind the count
        board.finish(sequence, slot)
    assert slot[2] == 73 and slot[3] == 1 << 62
    board.finish(74, slot)
    assert slot[3] == 0
    untracked = w.Board(MPI.COMM_SELF, finishes=False)
    untracked.started(1)
    untracked.finish(1, slot)
    assert slot[2] == 74 and untracked.slot[2] == w.UNTRACKED


def test_a_given_up_collective_at_the_count_is_marked():
    """Async 1, 2 and 3 start, 2 is dropped, blocking 4 finishes, then 1: the count reads 2,
    and 2 itself is marked given up (bit 0), so a peer waiting in 2 is not told it finished."""
    from cupycoll.comm import _watchdog as w

    board, slot = w.Board(MPI.COMM_SELF), np.zeros(w.SLOT_WORDS, np.int64)
    for sequence in (1, 2, 3):
        board.started(sequence)
    board.release(2)
    board.finish(4, slot)
    assert slot[2] == 0
    board.finish(1, slot)
    assert slot[2] == 2 and slot[3] == 1
    assert w._finished(int(slot[2]), int(slot[3]), 1)
    assert not w._finished(int(slot[2]), int(slot[3]), 2)
    assert not w._finished(int(slot[2]), int(slot[3]), 3)
    board.finish(3, slot)
    assert slot[2] == 4 and slot[3] == 1 << 2
    assert [w._finished(4, int(slot[3]), s) for s in (1, 2, 3, 4, 5)] == [
        True, False, True, True, False]


@pytest.mark.parametrize("cpus, expected", [
    ([frozenset({0, 1})] * 2, False),  # two ranks free on two cores
    ([frozenset({0}), frozenset({1})], False),  # bound, one a core
    ([frozenset({0, 1})] * 4, True),  # four ranks on two cores
    ([frozenset({0}), frozenset({1}), frozenset({0}), frozenset({1})], True),  # bound, two a core
    ([frozenset({0, 1, 2, 3}), frozenset({0})], False),
    ([2, 2, 2], True), ([4, 4], False),  # core counts only (no affinity call)
])
def test_a_node_is_crowded_where_its_ranks_outnumber_their_cores(cpus, expected):
    from cupycoll.comm import _watchdog

    assert _watchdog.crowded(cpus) is expected


@pytest.mark.parametrize("spin_set", [False, True])
def test_waits_on_a_crowded_node_nap_unless_cupycoll_spin_says(monkeypatch, spin_set):
    """Where a node's ranks outnumber their cores, a wait spins CROWDED_SPIN at most before
    it naps (a spinning one holds a core a peer needs); CUPYCOLL_SPIN, where set, wins."""
    from cupycoll.comm import _watchdog

    monkeypatch.delenv("CUPYCOLL_SPIN", raising=False)
    if spin_set:
        monkeypatch.setenv("CUPYCOLL_SPIN", "0.02")
    assert not _watchdog.crowded([_watchdog._cpus()])  # one rank: never crowded
    spin = 0.02 if spin_set else 0.05
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    assert comm._spin == comm._spin_alone == spin
    monkeypatch.setattr(_watchdog, "crowded", lambda cpus: True)
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    assert (comm._spin, comm._spin_alone) == (spin, spin if spin_set else 0.001)


def test_the_board_tells_whether_every_rank_of_the_node_started_a_collective():
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    cc.allreduce(np.ones(2), comm=comm)
    assert comm.board.arrived(comm.sequence) and not comm.board.arrived(comm.sequence + 1)


class _Clock:
    """A fake ``time`` for a wait: every reading advances 10 us; ``naps`` holds when each
    sleep began."""

    def __init__(self) -> None:
        self.now, self.naps = 0.0, []

    def monotonic(self) -> float:
        self.now += 1e-5
        return self.now

    def sleep(self, seconds: float) -> None:
        self.naps.append(self.now)
        self.now += seconds


class _Pending:
    """A request that completes once ``clock`` reads past ``until`` seconds."""

    def __init__(self, clock: _Clock, until: float) -> None:
        self.clock, self.until = clock, until

    def Test(self) -> bool:
        return self.clock.now > self.until


@pytest.mark.parametrize("arrived, helper, naps_from", [
    (True, False, 0.05),  # the caller's wait, every rank of the node in the collective: spin
    (False, False, 0.001),  # a peer not there yet (it computes): nap after CROWDED_SPIN
    (True, True, 0.001),  # cupycoll's own thread (its caller's thread may compute): nap too
])
def test_a_crowded_wait_spins_on_only_while_its_caller_waits_for_peers_that_all_arrived(
        monkeypatch, arrived, helper, naps_from):
    """On a crowded node a wait naps after CROWDED_SPIN unless it is the calling thread's own
    and the board shows every rank of the node started the collective (then it spins
    CUPYCOLL_SPIN, as where each rank has a core)."""
    import threading

    from cupycoll.comm import _naps, _watchdog, mpi

    monkeypatch.delenv("CUPYCOLL_SPIN", raising=False)
    monkeypatch.setattr(_watchdog, "crowded", lambda cpus: True)
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    seen = []
    monkeypatch.setattr(comm.board, "arrived", lambda sequence: seen.append(sequence) or arrived)
    clock = _Clock()
    monkeypatch.setattr(mpi, "time", clock)

    def wait() -> None:
        if helper:
            _naps.helper_thread()
        comm._poll([_Pending(clock, 0.06)], [], "test", None, 5)

    thread = threading.Thread(target=wait)
    thread.start()
    thread.join()
    assert clock.naps and naps_from <= clock.naps[0] < naps_from + 1e-3
    assert not helper and set(seen) == {5} or helper and not seen


def test_a_blocking_collective_publishes_its_finish_once():
    """A blocking dense verb publishes on the board that it finished, also where its request
    is done at the first test (one rank: no wait), and only once."""
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    x, calls = np.ones(3), []
    finish = comm.board.finish
    comm.board.finish = lambda *args: (calls.append(args[0]), finish(*args))
    for verb in (lambda: cc.allreduce(x, out=x), lambda: cc.broadcast(x, root=0),
                 lambda: cc.allgather(x), lambda: cc.reduce(x, root=0)):
        verb()
        assert comm._slot[2] == comm.sequence and calls[-1] == comm.sequence
    assert calls == [1, 2, 3, 4]


def test_abort_kills_the_communicator_and_init_gives_a_fresh_one():
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    comm.abort()
    with pytest.raises(cc.errors.BackendError, match="aborted in abort"):
        cc.allreduce(np.ones(2), comm=comm)
    fresh = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    assert np.array_equal(cc.allreduce(np.ones(2), comm=fresh), np.ones(2))


@pytest.mark.parametrize("nprocs,prefix,late", [(2, 0, 1), (3, 3, 1), (4, 2, 2)])
def test_late_rank_named_for_every_verb(nprocs, prefix, late):
    """Every verb: the punctual ranks raise CollectiveTimeout naming the late ones after ~1 s;
    the communicator is dead at once afterwards; init() gives a working one."""
    out = run_mpi(nprocs, "fault_late.py", 1.0, prefix, late, timeout=150)
    assert out.count("LATE ") == 15 and "OK" in out, out


@pytest.mark.parametrize("nprocs,debug,scenarios", [
    (2, "0", ("crossed", "stale", "skip", "interrupt", "first", "local", "learned",
              "preempted", "dup", "async_late", "failed", "aborted", "forked", "gave_up",
              "remote")),
    (3, "1", ("crossed", "stale", "interrupt", "first", "local", "learned", "preempted", "dup",
              "async_late", "failed", "inside")),
    (4, "0", ("crossed", "skip", "first", "learned", "aborted", "gave_up", "remote")),
])
def test_crossed_stale_skip_interrupt(nprocs, debug, scenarios):
    out = run_mpi(nprocs, "fault_misc.py", *scenarios, timeout=150,
                  env={"CUPYCOLL_DEBUG": debug})
    assert "OK" in out, out
    if "crossed" in scenarios:
        assert "crossed allreduce/broadcast" in out if debug == "1" else "crossed sparse" in out


@pytest.mark.parametrize("nprocs,mode", [(3, "sigkill"), (2, "raise")])
def test_dying_rank_ends_the_job(nprocs, mode):
    """A SIGKILLed rank, or an uncaught exception on one rank, ends the whole job, nonzero."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                   "")]))
    start = time.monotonic()
    proc = subprocess.run([mpiexec(), "-n", str(nprocs), sys.executable, "-m", "mpi4py",
                           str(WORKERS / "fault_kill.py"), mode], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT, start_new_session=True)
    assert proc.returncode != 0, proc.stdout
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("nprocs", [2, 3])
def test_work_left_pending_at_exit_completes(nprocs):
    """An asynchronous dense call rank 0 never waits for completes as it exits (its peers
    wait in it); every rank's done-callbacks run before the process ends."""
    out = run_mpi(nprocs, "exit_pending.py", timeout=60)
    said = re.findall(r"EXIT rank \d+ (?:waited|callback True|callback False)", out)  # (lines
    # of several ranks may run together)
    assert sorted(said) == sorted(
        [f"EXIT rank {r} callback True" for r in range(nprocs)]
        + [f"EXIT rank {r} waited" for r in range(1, nprocs)]), out


@pytest.mark.parametrize("nprocs,scenario", [(2, "dropped"), (3, "dropped"), (4, "dropped"),
                                              (2, "crossed"), (3, "crossed"), (2, "closed"),
                                              (2, "polled"), (2, "timed"), (2, "left"),
                                              (2, "duplicated"), (3, "duplicated")])
def test_a_large_async_reduce_progresses_without_a_wait_of_its_own(nprocs, scenario):
    """The MPI backend's pairwise reduce posts its second phase while the rank waits on another
    communicator, settles at exit or closes the communicator (tests/workers/pairwise_progress.py)."""
    out = run_mpi(nprocs, "pairwise_progress.py", scenario, timeout=60)
    assert out.count(f"{scenario} ok") == nprocs, out


def test_exit_with_work_a_peer_gave_up_is_prompt():
    """Rank 0 leaves an allreduce pending that the others abort instead of joining: its exit
    does not wait for it (no timeout set: it would have waited forever)."""
    start = time.monotonic()
    out = run_mpi(2, "exit_pending.py", "aborted", timeout=60)
    assert out.count("leaves") == 2 and time.monotonic() - start < 30, out


def test_a_thread_of_the_program_calls_on_after_the_main_thread_returned():
    """A non-daemon thread's asynchronous calls and the numba pool's pieces of its synchronous
    one run after the main thread returned (before: the exit hook had shut both pools)."""
    out = run_mpi(2, "exit_pending.py", "thread", timeout=120,
                  env={"CUPYCOLL_THREADS": "2", "CUPYCOLL_NUMBA": "on"})
    assert out.count("thread done") == 2, out


def test_exit_after_an_async_call_leaves_threads_that_end_after_the_exit_hooks_alone():
    """After an asynchronous call (which registers cupycoll's exit hook) the program leaves a
    process pool open (its manager thread ends in a later exit hook) and a thread that ends
    once the main thread has: the process exits at once (a hook joining them hung)."""
    code = ("import concurrent.futures, threading, time\n"
            "import numpy as np\nimport cupycoll as cc\n"
            "comm = cc.init('mpi', timeout=20)\n"
            "cc.sparse_allreduce(np.array([0]), np.ones(1), 4, comm=comm, async_op=True).wait()\n"
            "pool = concurrent.futures.ProcessPoolExecutor(1)\n"
            "assert pool.submit(abs, -3).result() == 3\n"
            "def heartbeat():\n"
            "    while threading.main_thread().is_alive():\n"
            "        time.sleep(0.01)\n"
            "    print('heartbeat ends', flush=True)\n"
            "threading.Thread(target=heartbeat).start()\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, start_new_session=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "heartbeat ends" in done.stdout, done.stderr[-2000:]
    assert time.monotonic() - start < 30


def test_soak_memory_flat():
    """2,000 random calls (dense, sparse, top-k; sync and async) at P=2: RSS grows < 3% over
    the last two thirds (a leak of ~1.5 KB per call fails it)."""
    out = run_mpi(2, "soak.py", 2000, 0.03, timeout=240)
    assert "SOAK calls=2000" in out, out


@pytest.mark.parametrize("nprocs", [1, 2])
def test_properties_match_numpy_or_raise_typed_everywhere(nprocs):
    """hypothesis over the public API's arguments: numpy's answer or a typed error on every
    rank (tests/workers/props.py)."""
    out = run_mpi(nprocs, "props.py", 40, timeout=240)
    assert "OK" in out, out
