"""In-process unit tests of the op/dtype tables, configuration and a one-rank communicator."""

import numpy as np
import pytest
from mpi4py import MPI

import cupycoll as cc
from cupycoll import errors
from cupycoll._config import SETTINGS, check_environment, setting
from cupycoll._types import ReduceOp, as_array, check_dtype, parse_op
from cupycoll.comm import Stats, Work, bus_factor
from cupycoll._types import trunc_divide
from cupycoll.comm.mpi import MPICommunicator
from tests.workers._common import DLPackOnly


@pytest.mark.parametrize("spec, want", [("sum", ReduceOp.SUM), ("AVG", ReduceOp.AVG),
                                        (ReduceOp.MAX, ReduceOp.MAX), (MPI.MIN, ReduceOp.MIN),
                                        (MPI.PROD, ReduceOp.PROD)])
def test_parse_op_accepts_strings_enums_and_mpi_ops(spec, want):
    assert parse_op(spec) is want


def test_parse_op_rejects_unknown():
    with pytest.raises(errors.InvalidArgument, match="'op'.*rank 3"):
        parse_op("xor", rank=3)
    with pytest.raises(errors.InvalidArgument, match="'op' on rank 3: only MPI.SUM") as info:
        parse_op(MPI.BAND, rank=3)
    assert info.value.rank == 3
    with pytest.raises(errors.InvalidType, match="'op'"):
        parse_op(3.5)


def test_error_hierarchy():
    assert issubclass(errors.InvalidArgument, ValueError)
    assert issubclass(errors.InvalidType, TypeError)
    assert issubclass(errors.CollectiveTimeout, errors.CupycollError)
    e = errors.InvalidArgument("n", -1, "must be positive", rank=2)
    assert "'n'" in str(e) and "rank 2" in str(e) and "-1" in str(e)


def test_every_error_pickles_and_copies_with_its_fields():
    """Errors cross processes (an mpi4py gather, a process pool) and are copied: each comes
    back of its type, with its message and fields (the default pickling passed the message
    alone to constructors that take the fields)."""
    import copy
    import pickle

    made = [errors.InvalidArgument("n", -1, "must be positive", rank=2),
            errors.InvalidType("x", "list", "an array"),
            errors.MismatchError("ranks disagree on n"),
            errors.CollectiveTimeout("late", missing_ranks=[3, 1], op_name="allreduce"),
            errors.BackendError("MPI failed"), errors.BackendUnavailable("no GPU")]
    made[0].note = "kept"  # attributes set after construction travel too
    for e in made:
        for again in (pickle.loads(pickle.dumps(e)), copy.copy(e), copy.deepcopy(e)):
            assert type(again) is type(e) and str(again) == str(e), (e, again)
            assert vars(again) == vars(e), (vars(again), vars(e))


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix's own
def test_numpy_subclasses_are_taken_as_plain_arrays_or_refused(tmp_path):
    """A memmap or a matrix is taken as a plain ndarray over the same memory (a matrix's own
    reshape and indexing broke allgather's merge of rows: a numpy ValueError on some ranks);
    a masked array with masked entries is refused naming the argument (its mask would be
    ignored: ValueError deep in the wire packing, or the raw data summed), one without is not."""
    rows = np.matrix([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    got = as_array(rows, "values")
    assert type(got) is np.ndarray and got.shape == (2, 2) and np.shares_memory(got, rows)
    mapped = np.memmap(tmp_path / "m.bin", np.float32, "w+", shape=(3,))
    assert type(as_array(mapped, "values")) is np.ndarray
    assert type(as_array(np.ma.masked_array([1.0, 2.0]), "values")) is np.ndarray
    with pytest.raises(errors.InvalidType, match="'values' on rank 3 must be a plain array"):
        as_array(np.ma.masked_array([1.0, 2.0], mask=[0, 1]), "values", rank=3)


def test_check_dtype_and_as_array():
    for dt in ("float16", "float32", "float64", "int8", "uint8", "int32", "int64"):
        assert check_dtype(np.zeros(1, dt), "x") == np.dtype(dt)
    for dt in ("complex64", "bool", "uint16", object):
        with pytest.raises(errors.InvalidType, match="'x'"):
            check_dtype(np.zeros(1, dt), "x")
    with pytest.raises(errors.InvalidType, match="'values'"):
        as_array([1, 2], "values")
    memview = np.arange(3.0)
    assert as_array(memview, "x") is memview



def test_dlpack_objects_are_zero_copy():
    base = np.arange(4, dtype=np.float32)
    view = as_array(DLPackOnly(base), "x")
    view[0] = 42
    assert base[0] == 42


def test_trunc_divide_matches_c_integer_division():
    x = np.array([-7, -6, -1, 0, 1, 7, -128, 127], np.int8)
    want = np.array([int(v / 3) for v in x.astype(int)], np.int8)
    assert np.array_equal(trunc_divide(x.copy(), 3), want)
    assert np.allclose(trunc_divide(np.array([1.0, -3.0]), 2), [0.5, -1.5])


def test_stats_books_dense_collectives_from_threads_exactly():
    """Dense bookings go through a lock-free queue folded on read: none is lost when threads
    book and read at once, reads see every earlier booking, and reset drops the queued ones."""
    import threading
    stats = Stats()
    threads, per_thread, nbytes, size = 4, 3000, 1000, 4  # 3000 > the fold threshold (1024)

    def book():
        for i in range(per_thread):
            stats.book_collective("allreduce", "allreduce", nbytes, False, size)
            stats.book_collective("bc", "broadcast", 8, i % 2 == 0, size)
            if i % 500 == 0:
                stats.record("x", sent=1)  # the locked path, interleaved
                _ = stats.bytes_sent  # a read folds while others append

    workers = [threading.Thread(target=book) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    calls = threads * per_thread
    ring = 2 * (size - 1) * nbytes // size  # allreduce: 2(P-1)/P * N each way, floored
    roots = calls // 2  # broadcast: the root sends N, the others receive N
    assert stats.by_op["allreduce"].bytes_sent == calls * ring
    assert stats.by_op["allreduce"].messages_received == calls * 2 * (size - 1)
    assert (stats.by_op["bc"].bytes_sent, stats.by_op["bc"].bytes_received) == (8 * roots, 8 * roots)
    assert stats.by_op["x"].bytes_sent == threads * len(range(0, per_thread, 500))
    assert stats.bytes_sent == calls * ring + 8 * roots + stats.by_op["x"].bytes_sent
    assert stats.snapshot()["by_op"]["bc"]["messages_sent"] == roots
    stats.book_collective("allreduce", "allreduce", nbytes, False, size)
    stats.reset()
    assert stats.bytes_sent == 0 and stats.by_op == {}


def test_stats_by_op_and_calls_iterate_while_another_thread_books():
    """``by_op`` and ``calls`` are copies: a loop over them while a background call books new
    operations and algorithms does not raise "dictionary changed size during iteration"."""
    import sys
    import threading
    stats = Stats()

    def book():
        for i in range(3000):
            stats.record(f"op{i}", sent=1)
            stats.count_call("sparse_allreduce", f"algorithm{i}", "coo")

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    worker = threading.Thread(target=book)
    worker.start()
    try:
        while worker.is_alive():
            assert sum(per.bytes_sent for per in stats.by_op.values()) >= 0
            assert sum(count for count in stats.calls.values()) >= 0
    finally:
        worker.join()
        sys.setswitchinterval(before)
    taken = stats.by_op
    taken[next(iter(taken))].bytes_sent += 100  # a copy: the counters stay
    assert stats.bytes_sent == sum(per.bytes_sent for per in stats.by_op.values())


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("allreduce", 4) == 1.5
    assert bus_factor("allgather", 4) == bus_factor("reduce_scatter", 4) == 0.75
    assert bus_factor("broadcast", 4) == bus_factor("reduce", 4) == 1.0


def test_work_runs_finalize_once():
    calls = []
    w = Work(lambda: calls.append("wait"), lambda: False, lambda: calls.append("fin") or 7)
    assert not w.is_completed()
    assert w.wait() == 7 and w.result() == 7 and w.is_completed()
    assert calls == ["wait", "fin"]


def test_work_whose_finalize_raised_raises_again_without_rerunning():
    """A completion callback that raised is not called a second time by a retried wait()."""
    calls = []

    def finalize():
        calls.append("fin")
        raise ValueError("callback failed")

    w = Work(lambda: calls.append("wait"), lambda: False, finalize)
    for _ in range(3):
        with pytest.raises(ValueError, match="callback failed"):
            w.wait()
    assert calls == ["wait", "fin"] and w.is_completed()


@pytest.mark.parametrize("timeout", ["abc", "1", float("nan"), -1.0, True, [1]])
def test_work_wait_refuses_a_timeout_that_is_not_seconds(timeout):
    """``wait(timeout=...)`` takes seconds >= 0, checked whether or not the Work is done (a
    check on pending Works only raised on one rank and not another): text raised numpy's bare
    ValueError, NaN waited forever."""
    w = Work(lambda: None, lambda: True)
    with pytest.raises(errors.InvalidArgument, match="'timeout'"):
        w.wait(timeout=timeout)
    assert w.wait(timeout=0) is None and w.wait(timeout=10**400) is None  # (no OverflowError)
    with pytest.raises(errors.InvalidArgument, match="'timeout'"):
        w.wait(timeout=timeout)


@pytest.mark.parametrize("how", ["result", "wait_timeout", "synchronize", "get_future",
                                 "add_done_callback"])
def test_a_callback_that_waits_for_its_own_work_raises_instead_of_deadlocking(how):
    """A finalizer (a completion_fn) that waits for its own Work would wait for itself on the
    Work's lock (or poll it for the whole timeout): it raises, and the Work raises that error
    from then on."""
    box = {}
    calls = {"result": lambda w: w.result(), "wait_timeout": lambda w: w.wait(timeout=30),
             "synchronize": lambda w: w.synchronize(), "get_future": lambda w: w.get_future(),
             "add_done_callback": lambda w: w.add_done_callback(lambda _: None)}

    def finalize():
        return calls[how](box["work"])

    box["work"] = Work(lambda: None, lambda: False, finalize)
    for _ in range(2):
        with pytest.raises(errors.InvalidArgument, match="cannot wait for that Work"):
            box["work"].wait()


def test_a_work_dropped_before_it_completed_hands_over_what_it_holds():
    """Garbage-collected unfinished, a Work calls ``on_drop`` (the backend keeps its buffers);
    finished, it does not."""
    dropped = []
    Work(lambda: None, lambda: False, on_drop=lambda: dropped.append("kept"))
    done = Work(lambda: None, lambda: True, on_drop=lambda: dropped.append("late"))
    done.wait()
    del done
    assert dropped == ["kept"]


def test_config_keyword_env_default(monkeypatch):
    assert setting("CUPYCOLL_BACKEND", "mpi") == "mpi"
    monkeypatch.setenv("CUPYCOLL_TIMEOUT", "2.5")
    assert setting("CUPYCOLL_TIMEOUT") == 2.5
    monkeypatch.setenv("CUPYCOLL_TIMEOUT", "soon")
    with pytest.raises(errors.InvalidArgument, match="CUPYCOLL_TIMEOUT"):
        setting("CUPYCOLL_TIMEOUT")
    monkeypatch.delenv("CUPYCOLL_TIMEOUT")
    monkeypatch.setenv("CUPYCOLL_BAKEND", "mpi")
    with pytest.raises(errors.InvalidArgument, match="CUPYCOLL_BAKEND"):
        check_environment()
    assert set(SETTINGS) >= {"CUPYCOLL_BACKEND", "CUPYCOLL_TIMEOUT", "CUPYCOLL_ALGORITHM"}


def test_a_setting_follows_every_change_of_the_environment(monkeypatch):
    """setting() parses a variable once per value stored, and sees every change at once:
    set, set again (also to the same text), to a bad value, back, unset, and through a
    replaced os.environ."""
    import os

    for text, want in [("estimate", "estimate"), ("learn", "learn"), (" Measure ", "measure"),
                       ("learn", "learn"), ("learn", "learn")]:
        monkeypatch.setenv("CUPYCOLL_AUTO", text)
        assert setting("CUPYCOLL_AUTO") == want and setting("CUPYCOLL_AUTO") == want
    monkeypatch.setenv("CUPYCOLL_AUTO", "guess")
    for _ in range(2):
        with pytest.raises(errors.InvalidArgument, match="CUPYCOLL_AUTO"):
            setting("CUPYCOLL_AUTO")
    monkeypatch.setenv("CUPYCOLL_AUTO", "estimate")
    assert setting("CUPYCOLL_AUTO") == "estimate"
    monkeypatch.delenv("CUPYCOLL_AUTO")
    assert setting("CUPYCOLL_AUTO") == SETTINGS["CUPYCOLL_AUTO"][1]
    monkeypatch.setattr(os, "environ", {"CUPYCOLL_AUTO": "measure"})
    assert setting("CUPYCOLL_AUTO") == "measure"


def test_init_one_rank_and_errors(monkeypatch):
    with pytest.raises(errors.InvalidArgument, match="'backend'"):
        cc.init("gloo")
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF, timeout=5)
    assert cc.get_comm() is comm and comm.size == 1 and comm.backend == "mpi"
    x = np.arange(6, dtype=np.float16)
    assert np.array_equal(cc.allreduce(x, "avg"), x)
    assert np.array_equal(cc.allgather(x), x) and np.array_equal(cc.reduce_scatter(x), x)
    if not cc.comm.nccl_usable():
        with pytest.raises(errors.BackendUnavailable):
            cc.init("nccl", mpi_comm=MPI.COMM_SELF)
    monkeypatch.setenv("CUPYCOLL_BACKEND", "gloo")
    with pytest.raises(errors.InvalidArgument, match="'CUPYCOLL_BACKEND'.*got 'gloo'"):
        cc.init(mpi_comm=MPI.COMM_SELF)
    monkeypatch.setenv("CUPYCOLL_BACKEND", "auto")
    assert cc.init(mpi_comm=MPI.COMM_SELF).backend in ("mpi", "nccl")


def test_dup_has_own_stats_and_frees():
    comm = MPICommunicator(MPI.COMM_SELF)
    twin = comm.dup()
    cc.allreduce(np.ones(3), comm=twin)
    assert "allreduce" in twin.stats.by_op and not comm.stats.by_op
    twin.close()
    twin.close()


def test_log_level_from_environment(monkeypatch):
    import logging

    logger = logging.getLogger("cupycoll")
    before = logger.level
    try:
        monkeypatch.setenv("CUPYCOLL_LOG_LEVEL", "debug")
        cc.init("mpi", mpi_comm=MPI.COMM_SELF)
        assert logger.level == logging.DEBUG
        monkeypatch.setenv("CUPYCOLL_LOG_LEVEL", "chatty")
        with pytest.raises(errors.InvalidArgument, match="CUPYCOLL_LOG_LEVEL"):
            cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    finally:
        logger.setLevel(before)


def test_host_address_of_views_and_non_contiguous_arrays():
    """``_address`` (buffer protocol, numpy's interface as fallback) is the first element's."""
    from cupycoll.comm._mpi_types import _address
    base = np.zeros(64, np.float32)
    for a in (base, base[8:24], base[::2], base.reshape(8, 8)[:, 1:3], base[5:5]):
        assert _address(a) == a.ctypes.data
    frozen = base.copy()
    frozen.flags.writeable = False
    assert _address(frozen) == frozen.ctypes.data


def test_mpi_out_of_communicators_is_backend_unavailable():
    """MPI refusing a new communicator (after about 2,000 init() calls: each holds one for
    good) raises BackendUnavailable saying why, not mpi4py's bare exception."""
    class Exhausted(MPI.Intracomm):
        def Dup(self, *args):
            raise MPI.Exception(MPI.ERR_OTHER)

    with pytest.raises(errors.BackendUnavailable, match="MPI could not make a communicator "
                       "on rank 0 .*make communicators once and reuse them"):
        MPICommunicator(Exhausted(MPI.COMM_SELF))


def test_mpi_failing_to_post_a_collective_is_backend_error():
    """MPI refusing to start a collective (MPICH out of memory for its temporary buffer, seen
    with a 2.2e9-element allreduce) raises BackendError naming the operation and the rank, with
    MPI's exception as the cause, blocking or not; the communicator goes on."""
    class NoMemory(MPI.Intracomm):
        def Iallreduce(self, *args):
            raise MPI.Exception(MPI.ERR_NO_MEM)

    comm = MPICommunicator(MPI.COMM_SELF)
    x = np.ones(4, np.float32)
    working, comm.mpi_comm = comm.mpi_comm, NoMemory(comm.mpi_comm)
    for run in (lambda: comm.run("allreduce", x, x.copy(), ReduceOp.SUM),
                lambda: comm.allreduce(x, x.copy(), ReduceOp.SUM)):
        with pytest.raises(errors.BackendError, match="MPI failed allreduce on rank 0") as got:
            run()
        assert isinstance(got.value.__cause__, MPI.Exception)
    comm.mpi_comm = working
    out = np.zeros(4, np.float32)
    comm.allreduce(x, out, ReduceOp.SUM).wait()
    assert out.tolist() == [1.0] * 4


@pytest.mark.parametrize("call", [{"algorithm": "dense"}, {"output": "dense"},
                                  {"output": "dense", "algorithm": "split"}])
def test_a_dense_buffer_past_what_an_array_holds_names_n(call):
    """n = 2**62 - 1 (allowed) with the dense algorithm or a dense output: its n-long buffer
    cannot exist; InvalidArgument naming n and the rank, not numpy's ValueError; the
    communicator goes on."""
    comm = MPICommunicator(MPI.COMM_SELF)
    n = 2**62 - 1
    with pytest.raises(errors.InvalidArgument, match="'n' on rank 0: a buffer of this call "
                       "cannot be allocated") as got:
        cc.sparse_allreduce(np.array([1, n - 1]), np.ones(2, np.float32), n, comm=comm, **call)
    assert got.value.argument == "n" and got.value.rank == 0
    result = cc.sparse_allreduce(np.array([1, 3]), np.ones(2, np.float32), 8, comm=comm)
    assert result.indices.tolist() == [1, 3]


def test_a_sparse_algorithms_buffer_past_this_ranks_memory_is_out_of_memory(monkeypatch):
    """A MemoryError inside a sparse algorithm (no n-row buffer in the call) is OutOfMemory
    naming the algorithm and the rank, not an invalid n; raised mid-call, it aborts the
    communicator (its peers may wait in the call); a new one works."""
    import cupycoll.sparse.allgather as allgather

    def short_of_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 22.9 MiB")

    comm = MPICommunicator(MPI.COMM_SELF)
    with monkeypatch.context() as patch:
        patch.setattr(allgather, "reduce_parts", short_of_memory)
        with pytest.raises(errors.OutOfMemory, match=r"sparse_allreduce \(allgather\) on rank 0: "
                           "a buffer of this call cannot be allocated") as got:
            cc.sparse_allreduce(np.array([1, 5]), np.ones(2, np.float32), 2**40, comm=comm,
                                algorithm="allgather")
    assert isinstance(got.value, MemoryError) and isinstance(got.value.__cause__, MemoryError)
    with pytest.raises(errors.BackendError, match="left by OutOfMemory"):
        cc.sparse_allreduce(np.array([1, 3]), np.ones(2, np.float32), 8, comm=comm)
    result = cc.sparse_allreduce(np.array([1, 3]), np.ones(2, np.float32), 8, algorithm=
                                 "allgather", comm=MPICommunicator(MPI.COMM_SELF))
    assert result.indices.tolist() == [1, 3]


def test_close_ends_the_background_worker_and_closes_its_duplicate():
    """The worker thread and duplicate of a communicator's asynchronous calls end with it."""
    import threading

    from cupycoll._background import runner

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    work = cc.sparse_allreduce(np.array([1]), np.array([2.0]), 4, comm=comm, async_op=True)
    assert work.wait().values.tolist() == [2.0]
    worker = runner(comm)
    comm.close()
    worker._pool.shutdown(wait=True)  # the queued close has run
    assert not [t for t in threading.enumerate() if t.name.startswith("cupycoll-background")
                and t.is_alive() and t in worker._pool._threads]
    with pytest.raises(errors.BackendUnavailable):
        worker.comm.barrier()


def test_a_work_completed_by_polling_gives_its_result_after_an_abort():
    """``is_completed()`` finished the operation (a monitor thread polling it); the
    communicator is aborted later: ``synchronize()`` and the future give the result, as
    ``wait()`` does (they waited again and raised BackendError)."""
    comm = MPICommunicator(MPI.COMM_SELF)
    works = []
    for _ in range(3):
        y = np.empty(4)
        work = comm.allreduce(np.ones(4), y, "sum")
        while not work.is_completed():
            pass
        works.append((work, y))
    comm.abort()
    assert works[0][0].wait() is None and works[1][0].synchronize() is None
    assert works[2][0].get_future().result(timeout=30) is None
    assert all(np.array_equal(y, np.ones(4)) for _, y in works)
