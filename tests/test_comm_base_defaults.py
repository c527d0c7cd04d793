"""In-process tests of cupycoll/comm/_base.py (also the mutation run's selection, tests/mutation/run.py):
the base class's defaults that the MPI backend overrides."""

from __future__ import annotations

import numpy as np
import pytest


def test_base_run_runs_the_verb_to_completion():
    """``Communicator.run`` (the default the MPI backend overrides): the verb's result, with and
    without an op name (one rank: the allreduce is a copy)."""
    from mpi4py import MPI

    import cupycoll as cc
    from cupycoll._types import ReduceOp
    from cupycoll.comm._base import Communicator

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    send = np.arange(5, dtype=np.float64)
    for op_name in (None, "test.run"):
        recv = np.zeros(5)
        Communicator.run(comm, "allreduce", send, recv, ReduceOp.SUM, op_name=op_name)
        np.testing.assert_array_equal(recv, send)


def test_an_interrupted_wait_aborts_the_communicator_naming_the_call():
    """A wait interrupted by KeyboardInterrupt leaves its operation pending: the communicator is
    aborted, and every later call raises, naming the operation, its collective number and the
    interruption (a fresh one-rank communicator, other communicators unaffected)."""
    import pytest
    from mpi4py import MPI

    import cupycoll as cc
    from cupycoll.errors import BackendError

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    comm._interrupted("test.op")
    with pytest.raises(BackendError, match=r"aborted in test\.op \(collective #0, interrupted\)"):
        comm._check_alive()
    cc.init("mpi", mpi_comm=MPI.COMM_SELF)._check_alive()


def test_count_exchange_books_under_its_name():
    """``alltoall_counts`` books its traffic under the op name it is given (one rank)."""
    from mpi4py import MPI

    import cupycoll as cc
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    got = comm.alltoall_counts([7], "test.counts")
    assert got.tolist() == [7] and "test.counts" in comm.stats.by_op


def _fresh(timeout=None):
    from mpi4py import MPI

    from cupycoll.comm.mpi import MPICommunicator
    return MPICommunicator(MPI.COMM_SELF, timeout=timeout)


def test_a_timed_out_wait_names_the_call_step_wait_and_missing_ranks_then_aborts():
    """``_timed_out``: the CollectiveTimeout names the front-door verb, the step (op name), the
    collective number (the latest, or the one given), the wait, the rank, and the peers that
    still owe messages; the communicator is aborted, and later calls say where."""
    import pytest

    from cupycoll.errors import CollectiveTimeout
    comm = _fresh(timeout=2.5)
    comm._record_collective("allreduce", 8)
    comm._record_collective("allreduce", 8)
    with comm.calling("sparse_allreduce"):
        error = comm._timed_out("split.exchange", pending=[3, 1, 3])
    assert type(error) is CollectiveTimeout and error.op_name == "sparse_allreduce"
    assert error.missing_ranks == [1, 3]
    assert str(error) == (
        "sparse_allreduce (step split.exchange, collective #2) did not complete within 2.5 s "
        "on rank 0 of 1: every rank started it, but ranks 1, 3 still owe this rank messages. "
        "The communicator is aborted: every later call on it raises at once; call "
        "cupycoll.init() on every rank for a new one")
    with pytest.raises(CollectiveTimeout) as info:
        comm._check_alive()
    assert str(info.value).startswith("this communicator was aborted in sparse_allreduce "
                                      "(collective #2) (timed out; missing ranks 1, 3)")
    assert info.value.op_name == "sparse_allreduce"
    other = _fresh()  # no verb, the collective given, no wait limit, one peer
    error = other._timed_out("allgather", sequence=7, pending=[5])
    assert str(error).startswith("allgather (collective #7) did not complete on rank 0 of 1: "
                                 "every rank started it, but rank 5 still owes this rank")
    assert error.op_name == "allgather" and other._fate.where == "allgather (collective #7)"


def test_abort_kills_the_communicator_naming_the_rank():
    import pytest

    from cupycoll.errors import BackendError
    comm = _fresh()
    comm.abort()
    with pytest.raises(BackendError) as info:
        comm._check_alive()
    assert str(info.value) == (
        "this communicator was aborted in abort() (abort() was called on rank 0); every call "
        "on it raises now: call cupycoll.init() on every rank for a new one")
    comm._interrupted("x.y")  # the first cause wins
    assert comm._fate.where == "abort()"
    other = _fresh()
    other._interrupted("x.y")
    assert str(other._fate.error) == "x.y was interrupted on rank 0"


def test_native_collectives_publish_their_count_and_book_by_the_root_rule():
    """``_record_collective``: the count goes to this rank's arrival slot (word 0, word 1 is
    the death notice); the booking rule: tests/test_comm_derived_verbs.py."""
    comm = _fresh()
    comm._record_collective("allreduce", 16, op_name="t.ar")
    assert comm.sequence == 1 and comm._slot[0] == 1 and comm._slot[1] == 0
    comm._record_collective("reduce", 24, root=0, op_name="t.red")
    assert comm.sequence == 2 and comm._slot[0] == 2 and comm._slot[1] == 0


def test_send_buffers_come_from_the_mpi_pool_and_never_twice_at_once():
    """A packed block's buffer (``send_buffer``): the base default is a new array each time;
    the MPI backend takes it from its staging pool, so a buffer handed back is the next one's
    memory (no fresh pages), while two taken together never share memory; small ones are
    not pooled."""
    from cupycoll.comm._base import Communicator

    comm = _fresh()
    first = Communicator.send_buffer(comm, 1 << 20)
    assert first.dtype == np.uint8 and first.shape == (1 << 20,)
    assert not np.shares_memory(first, Communicator.send_buffer(comm, 1 << 20))
    taken = comm.send_buffer(1 << 20)
    other = comm.send_buffer(1 << 20)
    assert taken.shape == other.shape == (1 << 20,) and taken.dtype == np.uint8
    assert not np.shares_memory(taken, other)  # both in use
    comm.release_send_buffer(taken)
    again = comm.send_buffer(3 << 18)  # smaller: a view of the buffer handed back
    assert again.shape == (3 << 18,) and np.shares_memory(again, taken)
    assert not np.shares_memory(again, other)
    pooled = len(comm._spare)
    comm.release_send_buffer(comm.send_buffer(64))
    assert len(comm._spare) == pooled  # a small block is a new array, not kept
    comm.release_send_buffer(again)
    comm.release_send_buffer(other)
    large = comm.send_buffer(4 << 20)
    comm.release_send_buffer(large)
    fits = comm.send_buffer(1 << 19)  # the smallest pooled buffer that fits, not the largest
    assert not np.shares_memory(fits, large)


def test_a_closed_mpi_communicator_raises_backend_unavailable_and_never_dups_the_world():
    """After close() (twice is fine) every verb and dup() raise BackendUnavailable naming the
    rank: no AttributeError, and no dup() silently over COMM_WORLD instead of the closed
    communicator's ranks."""
    import cupycoll as cc
    from cupycoll.errors import BackendUnavailable

    comm = _fresh()
    comm.close()
    comm.close()
    x = np.ones(4, np.float32)
    for call in (lambda: cc.allreduce(x, comm=comm), comm.barrier, comm.dup,
                 lambda: cc.sparse_allreduce(np.arange(2), x[:2], 4, comm=comm)):
        with pytest.raises(BackendUnavailable, match="rank 0: this communicator is closed"):
            call()


def test_a_communicator_without_its_own_dup_refuses_background_work():
    """The base ``dup`` (typed for every Communicator) raises BackendUnavailable; a
    communicator that has no ``dup`` of its own is refused background work naming
    ``async_op`` (a one-rank MPI communicator whose class keeps the base's)."""
    from mpi4py import MPI

    import cupycoll as cc
    from cupycoll._background import run_async
    from cupycoll.comm._base import Communicator
    from cupycoll.comm.mpi import MPICommunicator
    from cupycoll.errors import BackendUnavailable, InvalidArgument

    class NoDup(MPICommunicator):
        dup = Communicator.dup

    comm = NoDup(MPI.COMM_SELF)
    assert comm.mpi_comm is not None and Communicator.mpi_comm is None
    with pytest.raises(BackendUnavailable, match="dup on rank 0: a NoDup cannot be duplicated"):
        comm.dup()
    with pytest.raises(InvalidArgument, match="'async_op' on rank 0.*cannot be duplicated"):
        run_async(comm, lambda on: None, op_name="test")
    assert cc.init("mpi", mpi_comm=MPI.COMM_SELF).dup().size == 1


def test_a_forked_child_cannot_use_its_parents_communicator():
    """A forked child (a DataLoader worker) that calls on its parent's communicator gets
    BackendError saying so, posts nothing and leaves the parent's arrival board alone; the
    parent's communicator goes on working."""
    import os

    from mpi4py import MPI

    import cupycoll as cc

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    x = np.arange(3.0)
    cc.allreduce(x, comm=comm)
    board = comm.board.slot.tolist()
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, skip MPI's atexit finalize
        try:
            cc.allreduce(x, comm=comm)
            code = 2
        except cc.errors.BackendError as exc:
            code = 0 if "forked child" in str(exc) else 3
        except BaseException:  # noqa: BLE001  anything else is a failure too
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert comm.board.slot.tolist() == board
    np.testing.assert_array_equal(cc.allreduce(x, comm=comm), x)
