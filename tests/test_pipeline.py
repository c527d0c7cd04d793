"""The one call pipeline of the front doors (``cupycoll._pipeline``), in process.

``call``: the order of its steps (agree, plan, run or start, deliver), the verb the agreement
and the run count as, the plan's timer around a synchronous run, a started call delivered at
its wait. ``Delivery``: an array as the caller's ``out`` or type, entries into ``alloc_fn``
buffers with every bad buffer named, ``completion_fn``, and the caller's array type
(``callers``). Expected values come from numpy and the documented error format, never from
the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import cupycoll as cc
from cupycoll._pipeline import Delivery, Plan, call, callers
from cupycoll.errors import InvalidArgument, InvalidType
from tests.workers._common import DLPackOnly


@pytest.fixture(scope="module")
def comm():
    return cc.init("mpi", mpi_comm=MPI.COMM_SELF)


def _steps(comm, log, timer=None):
    """agree, plan and deliver functions that log what they see (the verb current at each)."""

    def agree():
        log.append(("agree", comm._verb))
        return "agreed"

    def run(on):
        log.append(("run", on._verb))
        return np.array([1.0, 2.0])

    def plan(agreed):
        log.append(("plan", agreed))
        return Plan("toy", None, run, timer)

    def deliver(agreed):
        log.append(("deliver", agreed))
        return Delivery(np.zeros(1), completion_fn=lambda i, v, c: log.append(("done", c)),
                        fn_ctx="ctx")

    return agree, plan, deliver


def test_call_agrees_plans_runs_and_delivers_in_order_under_its_verb(comm):
    """A synchronous call: the agreement, the plan, the timer and the run count as the verb (a
    timeout names it), the delivery does not; the timer starts before the run and stops after
    it."""
    log = []

    def timer(on):
        log.append(("start", on._verb))
        return lambda: log.append(("stop", on._verb))

    got = call(comm, "toy_verb", *_steps(comm, log, timer))
    assert got.tolist() == [1.0, 2.0]
    assert log == [("agree", "toy_verb"), ("plan", "agreed"), ("start", "toy_verb"),
                   ("run", "toy_verb"), ("stop", "toy_verb"), ("deliver", "agreed"),
                   ("done", "ctx")]
    assert comm._verb is None


@pytest.mark.parametrize("step", ["agree", "plan", "run"])
def test_a_keyboard_interrupt_anywhere_in_a_call_kills_the_communicator(step):
    """Ctrl-C in a call's local work, not only in a wait: its peers may be waiting in the call,
    so a later call of this rank would pair with theirs; the communicator is aborted (every
    later call raises BackendError at once, naming the verb and the interruption)."""
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    log = []
    agree, plan, deliver = _steps(comm, log)

    def interrupted(*args):
        raise KeyboardInterrupt

    steps = {"agree": interrupted if step == "agree" else agree,
             "plan": interrupted if step == "plan" else plan, "deliver": deliver}
    if step == "run":
        steps["plan"] = lambda agreed: Plan("toy", None, interrupted)
    with pytest.raises(KeyboardInterrupt):
        call(comm, "toy_verb", steps["agree"], steps["plan"], steps["deliver"])
    with pytest.raises(cc.errors.BackendError, match="toy_verb was interrupted on rank 0"):
        cc.allreduce(np.ones(2), comm=comm)


def test_a_started_call_runs_on_the_background_duplicate_and_delivers_at_its_wait(comm):
    """``async_op``: the agreement here, the run on the communicator's background duplicate
    (under the verb), the delivery when the caller waits; no timer runs."""
    log = []
    work = call(comm, "toy_verb", *_steps(comm, log, lambda on: log.append("timed")), True)
    got = work.wait()
    assert got.tolist() == [1.0, 2.0]
    assert log[:3] == [("agree", "toy_verb"), ("plan", "agreed"), ("deliver", "agreed")]
    assert log[3:] == [("run", "toy_verb"), ("done", "ctx")]


def test_a_plan_the_communicator_starts_itself_keeps_the_callers_stream(comm, monkeypatch):
    """A plan with ``start`` (a dense verb's own Work): ``async_op`` returns a Work over it that
    delivers its result at the wait, with no background run; ``stream=False`` never enters the
    communicator's stream, synchronous or not."""
    entered, log = [], []
    monkeypatch.setattr(comm, "in_stream", lambda join=True: entered.append(join),
                        raising=False)

    def plan(agreed):
        return Plan("toy", None, lambda on: log.append(("run", on)) or np.arange(2.0),
                    start=lambda on: log.append(("start", on)) or cc.comm.Work.completed(
                        np.arange(3.0)))

    def deliver(agreed):
        return Delivery(np.zeros(1), completion_fn=lambda i, v, c: log.append(("done", v.size)))

    work = call(comm, "toy_verb", lambda: "agreed", plan, deliver, True, stream=False)
    assert log == [("start", comm)]
    assert work.wait().tolist() == [0.0, 1.0, 2.0] and log[1:] == [("done", 3)]
    assert call(comm, "toy_verb", lambda: "agreed", plan, deliver, stream=False).size == 2
    assert log[2:] == [("run", comm), ("done", 2)] and entered == []


def test_delivery_of_an_array_is_the_callers_out_or_its_type():
    """An array result: ``out`` itself where the caller gave one (None stays None: a reduce
    off its root); ``completion_fn`` sees what the caller gets, with indices None."""
    res, out, seen = np.arange(3.0), np.zeros(3), []
    done = lambda i, v, c: seen.append((i, v, c))  # noqa: E731
    assert Delivery(np.zeros(3), out=out, completion_fn=done, fn_ctx=7)(res) is out
    assert Delivery(np.zeros(3), out=out)(None) is None
    assert Delivery(np.zeros(3))(res) is res
    assert len(seen) == 1 and seen[0][0] is None and seen[0][1] is out and seen[0][2] == 7


class _Device:
    """A result of another array library: numpy inside, its own namespace, ``get()`` to host."""

    __cupycoll_namespace__ = object()

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def get(self) -> np.ndarray:
        return self.a.copy()


class _Tensor(DLPackOnly):
    """A CPU tensor of a foreign library (module ``fakelib``) that speaks DLPack, like torch."""

    __module__ = "fakelib"


def test_callers_returns_results_in_the_callers_array_type(monkeypatch):
    """numpy in, numpy out (the same array); a result of another library comes to the host
    for numpy callers; a caller of a DLPack library gets its tensor type over the same memory
    (the library's ``from_dlpack``)."""
    import sys
    import types

    fakelib = types.ModuleType("fakelib")
    fakelib.from_dlpack = lambda x: _Tensor(np.from_dlpack(x))
    monkeypatch.setitem(sys.modules, "fakelib", fakelib)
    res = np.arange(4.0)
    assert callers(res, np.zeros(2)) is res
    back = callers(_Device(res), np.zeros(2))
    assert type(back) is np.ndarray and back.tolist() == res.tolist()
    t = callers(res, _Tensor(np.zeros(2)))
    assert type(t) is _Tensor and np.shares_memory(t.a, res) and t.a.tolist() == res.tolist()


def _deliver(alloc, idx=None, val=None, completion=None, ctx="ctx"):
    idx = np.array([1, 4, 6], np.int32) if idx is None else idx
    val = np.array([1.5, -2.0, 3.0], np.float32) if val is None else val
    return Delivery(val, idx, 100, alloc_fn=alloc, completion_fn=completion, fn_ctx=ctx,
                    rank=2)((idx, val))


def test_deliver_fills_the_alloc_fn_buffers_and_calls_completion_fn():
    """alloc_fn gets (nnz, index dtype, values shape, value dtype, fn_ctx) and its own buffers
    come back filled; completion_fn sees the result and fn_ctx."""
    calls, done = [], []

    def alloc(nnz, index_dtype, values_shape, value_dtype, ctx):
        calls.append((nnz, np.dtype(index_dtype), values_shape, np.dtype(value_dtype), ctx))
        return list(bufs)  # a list is accepted too

    bufs = (np.zeros(3, np.int32), np.zeros((3, 2), np.float32))
    val = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    res = _deliver(alloc, val=val, completion=lambda i, v, c: done.append((i, v, c)))
    assert calls == [(3, np.dtype(np.int32), (3, 2), np.dtype(np.float32), "ctx")]
    assert res.indices is bufs[0] and res.values is bufs[1] and res.n == 100
    assert bufs[0].tolist() == [1, 4, 6] and bufs[1].tolist() == val.tolist()
    assert len(done) == 1 and done[0][0] is bufs[0] and done[0][1] is bufs[1]
    assert done[0][2] == "ctx"


def _raises(cls, alloc):
    with pytest.raises(cls) as info:
        _deliver(alloc)
    return info.value


def test_fill_names_every_bad_alloc_fn_buffer():
    """Each way alloc_fn can fail is named: not a pair, a non-array, a wrong shape or dtype of
    either buffer, a read-only buffer (InvalidType/InvalidArgument, argument 'alloc_fn', the
    rank: it is raised on this rank only, the collective having completed everywhere)."""
    good_i, good_v = np.zeros(3, np.int32), np.zeros(3, np.float32)
    for bad in (good_i, (good_i,), (good_i, good_v, good_v)):
        e = _raises(InvalidType, lambda *a, b=bad: b)
        assert str(e) == ("argument 'alloc_fn' on rank 2 must be a callable returning "
                          f"(index_buf, value_buf), got {type(bad).__name__!r}")
    e = _raises(InvalidType, lambda *a: ([0, 0, 0], good_v))
    assert e.argument == "alloc_fn index_buf" and e.rank == 2
    e = _raises(InvalidType, lambda *a: (good_i, [0.0, 0.0, 0.0]))
    assert e.argument == "alloc_fn value_buf" and e.rank == 2
    cases = [((np.zeros(4, np.int32), good_v), "index_buf", (4,), "int32", (3,), "int32"),
             ((np.zeros(3, np.int64), good_v), "index_buf", (3,), "int64", (3,), "int32"),
             ((good_i, np.zeros(3, np.float64)), "value_buf", (3,), "float64", (3,), "float32"),
             ((good_i, np.zeros((3, 1), np.float32)), "value_buf", (3, 1), "float32", (3,),
              "float32")]
    for bufs, name, shape, dtype, want_shape, want_dtype in cases:
        e = _raises(InvalidArgument, lambda *a, b=bufs: b)
        assert str(e) == (f"invalid argument 'alloc_fn' on rank 2: must return {name} of "
                          f"shape {want_shape} and dtype {want_dtype} (got '{name} {shape} "
                          f"{dtype}')")
    for which in (0, 1):
        bufs = [np.zeros(3, np.int32), np.zeros(3, np.float32)]
        bufs[which].flags.writeable = False
        e = _raises(InvalidArgument, lambda *a, b=bufs: b)
        name = ("index_buf", "value_buf")[which]
        assert e.argument == "alloc_fn" and e.value == f"{name} (3,) {bufs[which].dtype}"
        assert e.reason == "must return writable buffers" and e.rank == 2
        assert not bufs[0].any(), "index_buf written before value_buf was refused"
    shared = np.zeros(3, np.int32)  # one array as both (int32 values): they would overwrite
    with pytest.raises(InvalidArgument) as info:  # each other
        _deliver(lambda *a: (shared, shared), val=np.array([7, 8, 9], np.int32))
    assert info.value.reason == "must return two buffers that do not overlap"
    assert info.value.rank == 2 and not shared.any()
    record = np.zeros(3, [("i", np.int32), ("v", np.float32)])  # one block, fields apart
    got = _deliver(lambda *a: (record["i"], record["v"]))
    assert record["i"].tolist() == [1, 4, 6] and record["v"].tolist() == [1.5, -2.0, 3.0]
    assert got.indices is not None
