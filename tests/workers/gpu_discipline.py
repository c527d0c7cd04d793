"""The NCCL backend's stream, completion and lifetime discipline on emulated GPUs.

Usage: gpu_discipline.py MODE[,MODE...]   (2 emulated devices per node, CuPy 14's binding)

Modes (each failed before its fix, as noted):
  null_stream        no front door runs device work on the legacy NULL stream: with the NULL
                     stream current, only the events and stream waits that order it around the
                     call land there; with a stream of the caller's, only the events that
                     order the communicator's stream after the NULL stream, which earlier
                     calls handed results to (see stream_switch); the
                     communicator's stream is non-blocking (before: every NCCL call and kernel
                     ran on the caller's current stream, the NULL stream by default)
  completer_device   a future's callbacks (completion_fn, add_done_callback) run on the
                     communicator's device, after the device work completed (before: the
                     completer thread ran them on device 0: DeviceMismatch on rank 1)
  close_paths        close() on an error path, garbage collection and re-init() abort a
                     communicator whose operation waits for a peer that never comes, instead
                     of destroying it (before: ncclCommDestroy blocked forever)
  waits_per_stream   a Work waited on one stream (or in another thread) and again on another
                     stream orders the second stream too (before: only the first wait did:
                     StreamOrderError on the second stream's read); a wait in a thread on
                     another device orders the copy into alloc_fn's buffers (before: not)
  stream_switch      a result read on the stream current at its call and dropped, the next
                     call made from another stream: every front door's next allocation waits
                     for those reads (before: the communicator's stream followed only the new
                     caller's stream, and the pool handed the dropped block to the next call's
                     output under the pending reads: StreamOrderError)
  future_streams     completion_fn and a future's callbacks read the result on the completer
                     thread's stream and it is dropped: the next call waits for those reads
                     (before: StreamOrderError on the reused block)
  device_thread      a sparse_allreduce from a thread whose current device is not the
                     communicator's raises InvalidArgument naming device on every rank (before:
                     the emulator's DeviceMismatch on that rank, the others waiting)
  connecting         a first call past the connect timeout names the rank that never came
                     (before: none, and the previous collective's number); abort() from
                     another thread stops a call still connecting (before: it waited for the
                     connect timeout, 300 s by default)
  dup_board          a dup() and an NCCLCommunicator made directly have arrival boards (a
                     timeout names the late rank; before: ranks that did arrive) and a dup
                     shares its parent's fate (before: the parent went on); a bad
                     CUPYCOLL_CONNECT_TIMEOUT on one rank raises on every rank in both (before:
                     on that rank only, after the others had made their NCCL communicator)
  inflight_threads   the caller (a completed Work's is_completed()) and the completer thread
                     (futures' waits) release in-flight entries at once: the completed Work's
                     wait() returns and every future its result (before: "deque mutated during
                     iteration", stored as the operation's error); a communicator dropped after
                     its operations completed keeps nothing for good (before: each entry it
                     had not observed, with its arrays)
  alloc_synced       an asynchronous call with alloc_fn, completed by synchronize() or its
                     future with one stream current, its result read on another: the host
                     waited for the copy into alloc_fn's buffers too (before: only for the
                     operation: StreamOrderError on the read)
  result_after_abort a Work whose synchronize() returned gives its result again after an abort
                     of its communicator, as on MPI (before: BackendError "aborted")
  null_stream_copies the copies NCCL reads instead of a strided input and barrier()'s token
                     are made on the communicator's stream (before: on the caller's, the
                     legacy NULL stream: "ascontiguousarray", "zeros" there)
  future_wait        a Work whose future was asked for (the completer thread waits for it on
                     the host) is still waited by the caller's stream at once: rank 0's wait()
                     returns before rank 1 has posted, which it does only after that (before:
                     wait() waited for the completer's host wait, on the Work's lock: a
                     CollectiveTimeout, the peer never posting)
  connect_waits      a host wait of a complete operation in one thread while another thread's
                     call waits for its peers to connect (up to the connect timeout) returns
                     at once (before: it waited for the connection, on the communicator's lock)
  late_step          a rank late inside an algorithm's point-to-point step (split's
                     reduce-scatter): a punctual rank that waits for its messages names it
                     (before: "step fetch", no rank named: the wait was on the host copy, no
                     operation's entry)
After every mode the ranks' NCCL call logs are compared (cupycoll.testing.emulation.check_logs).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time

import numpy as np

import cupycoll.testing.emulation as emu

emu.install(2, 14)
import cupy  # noqa: E402  (the emulated one)
from mpi4py import MPI  # noqa: E402

import cupycoll as cc  # noqa: E402
from cupycoll.testing.emulation import buffers as emu_buffers  # noqa: E402
from cupycoll.testing.emulation import device as emu_device  # noqa: E402

MODE = sys.argv[1]
WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()


def case(n=60, nnz=9, seed=5):
    """Every rank's (indices, values) and the float64 dense sum over ranks."""
    parts, dense = [], np.zeros(n)
    for r in range(P):
        rng = np.random.default_rng([seed, r])
        idx = np.sort(rng.choice(n, nnz, replace=False)).astype(np.int64)
        val = rng.integers(-9, 9, nnz).astype(np.float32)
        parts.append((idx, val))
        dense[idx] += val
    return parts, dense


def front_doors(comm, parts):
    """name -> call on ``comm``: every front door, dense results ordered on the caller's
    stream, sparse ones as returned."""
    idx, val = (cupy.asarray(a) for a in parts[RANK])
    x = cupy.arange(8 * P, dtype=cupy.float32) + RANK
    calls = {verb: (lambda v=verb: getattr(cc, v)(x, comm=comm))
             for verb in ("allreduce", "allgather", "reduce_scatter")}
    calls["broadcast"] = lambda: cc.broadcast(x, root=P - 1, comm=comm)
    calls["reduce"] = lambda: cc.reduce(x, root=0, comm=comm)
    # an op the fast path does not take: the general path (the call pipeline, no stream)
    calls["allreduce general"] = lambda: cc.allreduce(x, op="SUM", comm=comm)
    calls["allreduce general async"] = lambda: cc.allreduce(x, op="SUM", comm=comm,
                                                            async_op=True).wait()
    for algorithm in cc.algorithms("sparse"):
        calls[f"sparse {algorithm}"] = lambda a=algorithm: cc.sparse_allreduce(
            idx, val, 60, algorithm=a, comm=comm)
        calls[f"sparse {algorithm} async"] = lambda a=algorithm: cc.sparse_allreduce(
            idx, val, 60, algorithm=a, comm=comm, async_op=True).wait()
    grad = cupy.arange(64, dtype=cupy.float32) * (RANK + 1)
    calls["topk_allreduce"] = lambda: cc.topk_allreduce(grad, 8, comm=comm)
    compressor = cc.TopkCompressor(64, 0.25, comm=comm)
    calls["TopkCompressor.step"] = lambda: compressor.step(grad)
    started = cc.TopkCompressor(64, 0.25, comm=comm)
    calls["TopkCompressor.step async"] = lambda: started.step(grad, async_op=True).wait()
    return calls


class NullStreamLog:
    """What is issued on this device's legacy NULL stream: enqueued tasks (NCCL, copies,
    events, waits) and eager operations (array operations, kernels), by name."""

    #: what a front door may leave on the caller's NULL stream: its output's allocation (CuPy
    #: allocates on the current stream, as torch does) and the events and waits that order the
    #: caller's stream around the call.
    ALLOWED = ("empty", "event", "wait ")

    def __init__(self):
        self.null = emu_device.null_stream()
        self.entries = []
        enqueue, ordered_access = self.null.enqueue, emu_buffers.ordered_access

        def logged_enqueue(name, run):
            self.entries.append(name)
            return enqueue(name, run)

        def logged_access(buffers, what, here=None, task_seq=None):
            if task_seq is None and (here or emu_device.current_stream()) is self.null:
                self.entries.append(what)
            return ordered_access(buffers, what, here, task_seq)

        self.null.enqueue = logged_enqueue
        emu_buffers.ordered_access = logged_access

    def work(self):
        """The entries that are device work the caller did not ask for on NULL."""
        return [e for e in self.entries if not e.startswith(self.ALLOWED)]


def mode_null_stream():
    comm = cc.init("nccl", timeout=60.0)
    parts, _ = case()
    log = NullStreamLog()
    calls = front_doors(comm, parts)
    for name, call in calls.items():
        call()  # warm: compiled kernels, the compressor's state, connections
    comm.barrier()
    for name, call in calls.items():
        log.entries.clear()
        call()
        work = log.work()
        assert not work, f"{name} put device work on the legacy NULL stream: {work}"
        assert log.entries, f"{name}: the caller's NULL stream is not ordered around the call"
    mine = cupy.cuda.Stream(non_blocking=True)
    with mine:
        calls = front_doors(comm, parts)
        for name, call in calls.items():
            log.entries.clear()
            call()
            # only events: the NULL stream got results above (see stream_switch)
            assert all(e == "event" for e in log.entries), \
                f"{name} with the caller's own stream touched NULL: {log.entries}"
    comm.barrier()
    assert comm._stream.blocking is False and comm._stream.null is False, comm._stream


def mode_completer_device():
    comm = cc.init("nccl", timeout=60.0)
    parts, dense = case()
    idx, val = (cupy.asarray(a) for a in parts[RANK])
    seen = []

    def completion(indices, values, ctx):  # device work in the thread that completes
        seen.append((threading.current_thread().name, cupy.cuda.runtime.getDevice(),
                     float((values * 2).sum().get())))

    work = cc.sparse_allreduce(idx, val, 60, comm=comm, async_op=True, completion_fn=completion)
    done = threading.Event()
    work.add_done_callback(lambda w: done.set())
    work.get_future().result(timeout=60)
    assert done.wait(60)
    res = work.synchronize()  # this thread learns the completion too (emulated knowledge is
    # per host thread: the completer's does not order this thread's reads)
    thread, device, doubled = seen[0]
    assert thread == "cupycoll-completer" and device == comm.device_id, seen
    assert doubled == 2 * dense.sum(), (doubled, dense.sum())
    assert np.array_equal(res.indices.get(), np.flatnonzero(
        np.isin(np.arange(60), np.concatenate([i for i, _ in parts])))), res.indices.get()


def pending_comm(default):
    """A communicator (the default one, or one of the application's own) whose allreduce waits
    for the last rank, which never calls it; the last rank gets None for the raw NCCL
    communicator (it joins the others' communicator only)."""
    from cupycoll.comm.nccl import NCCLCommunicator

    comm = cc.init("nccl", timeout=None) if default else NCCLCommunicator(timeout=None)
    x = cupy.ones(4, cupy.float32)
    comm.barrier()  # connected
    WORLD.Barrier()
    if RANK == P - 1:
        return comm, None
    raw = comm._comm
    cc.allreduce(x, out=x, comm=comm)  # stream-ordered: pending on the device
    return comm, raw


def mode_close_paths():
    """Each way of letting go of a communicator with a pending operation must abort it (the
    call returns at once; ncclCommDestroy would block forever)."""
    for how in ("with", "gc", "reinit"):
        comm, raw = pending_comm(default=how == "reinit")
        start = time.monotonic()
        if how == "with" and raw is not None:
            try:
                with comm:
                    raise RuntimeError("the application's own error")
            except RuntimeError:
                pass
        elif how == "gc" and raw is not None:
            comm = None
            gc.collect()
        elif how == "reinit":  # init is collective: every rank replaces its default
            comm = None
            cc.init("nccl", timeout=None)
            gc.collect()
        if raw is not None:  # the last reference may be the watchdog's, for one round
            while not raw.aborted and time.monotonic() - start < 5:
                time.sleep(0.01)
            assert raw.aborted and not raw.destroyed, (how, raw.aborted, raw.destroyed)
        WORLD.Barrier()
        if comm is not None:
            comm.abort()
        gc.collect()


def mode_waits_per_stream():
    comm = cc.init("nccl", timeout=60.0)
    parts, dense = case()
    idx, val = (cupy.asarray(a) for a in parts[RANK])
    x = cupy.full(64, RANK + 1.0, cupy.float32)
    want = P * (P + 1) / 2
    first, second = (cupy.cuda.Stream(non_blocking=True) for _ in range(2))
    for how in ("stream", "thread"):
        y = cupy.empty_like(x)
        works = [cc.allreduce(x, out=y, async_op=True),
                 cc.sparse_allreduce(idx, val, 60, comm=comm, async_op=True),
                 cc.sparse_allreduce(idx, val, 60, comm=comm, async_op=True, algorithm="split",
                                     alloc_fn=lambda nnz, it, shape, vt, ctx: (
                                         cupy.empty(nnz, it), cupy.empty(shape, vt)))]
        for work in works:
            if how == "thread":  # the first wait in another thread, on its own stream
                def elsewhere():
                    cupy.cuda.Device(comm.device_id).use()
                    with first:
                        work.wait()
                waiter = threading.Thread(target=elsewhere)
                waiter.start()
                waiter.join()
            else:
                with first:
                    work.wait()
            with second:  # the second wait orders this stream too: its reads are safe
                got = work.wait()
                if isinstance(got, cupy.ndarray):
                    assert (cupy.asnumpy(y) == want).all(), (how, y)
                else:
                    sums = np.zeros(60)
                    sums[cupy.asnumpy(got.indices)] = cupy.asnumpy(got.values)
                    assert np.array_equal(sums, dense), (how, sums)
    comm.synchronize()


def switching_calls(comm, parts):
    """name -> call that reads its result on the current stream (queued work) and keeps only
    what it computed (the result itself is dropped)."""
    idx, val = (cupy.asarray(a) for a in parts[RANK])
    grad = cupy.arange(64, dtype=cupy.float32) * (RANK + 1)
    compressor = cc.TopkCompressor(64, 0.25, comm=comm)
    cupy.cuda.runtime.deviceSynchronize()  # the uploads, before other streams read them
    calls = {f"sparse {a}": (lambda a=a: cc.sparse_allreduce(idx, val, 60, algorithm=a,
                                                              comm=comm).values * 2)
             for a in cc.algorithms("sparse")}
    calls["sparse dense output"] = lambda: cc.sparse_allreduce(idx, val, 60, output="dense",
                                                               comm=comm) * 2
    calls["sparse async"] = lambda: cc.sparse_allreduce(idx, val, 60, comm=comm,
                                                        async_op=True).wait().values * 2
    for a in cc.algorithms("topk"):
        calls[f"topk {a}"] = lambda a=a: cc.topk_allreduce(grad, 8, algorithm=a,
                                                           comm=comm).values * 2
    calls["TopkCompressor.step"] = lambda: compressor.step(grad).values * 2
    return calls


def mode_stream_switch():
    comm = cc.init("nccl", timeout=60.0)
    parts, _ = case()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(3)]
    for name, call in switching_calls(comm, parts).items():
        kept = []
        for step in range(4):
            with streams[step % len(streams)]:
                kept.append(call())
        comm.synchronize()
        for stream in streams:
            stream.synchronize()
        if name != "TopkCompressor.step":  # (its residuals change every step's result)
            assert all(bool((k == kept[0]).all()) for k in kept), name


def mode_future_streams():
    comm = cc.init("nccl", timeout=60.0)
    parts, dense = case()
    idx, val = (cupy.asarray(a) for a in parts[RANK])
    mine = cupy.cuda.Stream(non_blocking=True)
    kept = []
    cupy.cuda.runtime.deviceSynchronize()
    with mine:
        for how in ("completion_fn", "callback") * 2:
            def completion(indices, values, ctx):
                kept.append(values.copy())  # what the docs say to do with what one keeps
            work = cc.sparse_allreduce(idx, val, 60, comm=comm, async_op=True,
                                       completion_fn=completion if how == "completion_fn"
                                       else None)
            future = work.get_future()
            if how == "callback":
                future.add_done_callback(lambda f: kept.append(f.result().values * 1))
            future.result(timeout=60)
            del work, future
        mine.synchronize()
    want = dense[np.unique(np.concatenate([i for i, _ in parts]))].astype(np.float32)
    for got in kept:
        assert np.array_equal(cupy.asnumpy(got), want), (got, want)


def mode_device_thread():
    comm = cc.init("nccl", timeout=60.0)
    parts, _ = case()
    idx, val = (cupy.asarray(a) for a in parts[RANK])
    errors = []

    def call():
        try:
            cc.sparse_allreduce(idx, val, 60, comm=comm)
        except cc.errors.InvalidArgument as exc:
            errors.append(exc)

    if RANK == 1 % P and comm.device_id != 0:  # a new thread starts on device 0
        caller = threading.Thread(target=call)
        caller.start()
        caller.join()
    else:
        call()
    refused = WORLD.allreduce(int(bool(errors)))
    assert refused in (0, P), refused  # every rank refuses, or none (device 0 everywhere)
    assert not errors or "device" in str(errors[0]), errors


def mode_null_stream_copies():
    comm = cc.init("nccl", timeout=60.0)
    wide = cupy.arange(16 * P, dtype=cupy.float32) + RANK
    x = wide[::2]  # strided: NCCL reads a contiguous copy of it
    calls = {verb: (lambda v=verb: getattr(cc, v)(x, comm=comm))
             for verb in ("allreduce", "allgather", "reduce_scatter")}
    calls["broadcast"] = lambda: cc.broadcast(x, root=P - 1, comm=comm)
    calls["reduce"] = lambda: cc.reduce(x, root=0, comm=comm)
    calls["allreduce async"] = lambda: cc.allreduce(x, comm=comm, async_op=True).wait()
    calls["barrier"] = comm.barrier
    for call in calls.values():
        call()  # warm
    log = NullStreamLog()
    for name, call in calls.items():
        log.entries.clear()
        got = call()
        work = log.work()
        assert not work, f"{name} put device work on the legacy NULL stream: {work}"
        if name == "allreduce":
            want = sum(cupy.asnumpy(wide[::2]) - RANK + r for r in range(P))
            assert np.array_equal(cupy.asnumpy(got), want), (got, want)
    comm.barrier()


def mode_future_wait():
    comm = cc.init("nccl", timeout=15.0)
    x = cupy.ones(4, cupy.float32)
    cc.allreduce(x, comm=comm)  # connected
    comm.synchronize()
    WORLD.Barrier()
    if RANK == 1:
        WORLD.recv(source=0)  # posts only once rank 0's wait() has returned
    work = cc.allreduce(x, comm=comm, async_op=True)
    if RANK == 0:
        future = work.get_future()
        time.sleep(0.3)  # the completer thread is in its host wait now
        start = time.monotonic()
        work.wait()
        took = time.monotonic() - start
        if P > 1:
            WORLD.send(took, dest=1)
        assert took < 2.0, f"wait() took {took:.2f} s: it waited on the host"
        got = future.result(timeout=30)
        assert np.array_equal(cupy.asnumpy(got), np.full(4, P, np.float32)), got
    else:
        work.synchronize()
    WORLD.Barrier()


def mode_connect_waits():
    comm = cc.init("nccl", timeout=20.0)
    x = cupy.ones(8, cupy.float32)
    cc.allreduce(x, comm=comm)
    comm.synchronize()  # the collectives' connections are made
    WORLD.Barrier()
    done = cc.allreduce(x, comm=comm, async_op=True)  # every rank posts it: it completes
    if P == 1 or RANK > 1:
        done.synchronize()
        WORLD.Barrier()
        return
    if RANK == 1:
        time.sleep(3.0)  # late for the first point-to-point call: rank 0's waits to connect
    took = []

    def waiter():
        cupy.cuda.Device(comm.device_id).use()
        time.sleep(0.5)  # rank 0's exchange is connecting now
        start = time.monotonic()
        done.synchronize()
        took.append(time.monotonic() - start)

    thread = threading.Thread(target=waiter)
    if RANK == 0:
        thread.start()
    peer, got = 1 - RANK, cupy.zeros(4, cupy.float32)
    comm.exchange([(peer, cupy.full(4, RANK + 0.5, cupy.float32))], [(peer, got)]).synchronize()
    assert np.array_equal(cupy.asnumpy(got), np.full(4, peer + 0.5, np.float32)), got
    if RANK == 0:
        thread.join()
        assert took and took[0] < 1.5, f"the wait of a complete operation took {took} s"
    WORLD.Barrier()


def mode_connecting():
    """A fresh communicator's first call waits for its peers to connect: past the connect
    timeout it names the rank that never came; abort() from another thread stops it at once."""
    late = P - 1
    comm = cc.init("nccl", timeout=30.0)
    comm.connect_timeout = 2.0
    x = cupy.ones(4, cupy.float32)
    if RANK != late:
        start = time.monotonic()
        try:
            cc.allreduce(x, comm=comm)
            raise AssertionError("a call without its peer completed")
        except cc.errors.CollectiveTimeout as exc:
            assert exc.missing_ranks == [late], exc
            assert "within 2.0 s" in str(exc) and time.monotonic() - start < 10, exc
    WORLD.Barrier()
    comm.abort()
    comm = cc.init("nccl", timeout=30.0)
    if RANK == 0 and P > 1:
        aborter = threading.Timer(0.5, comm.abort)
        aborter.start()
        start = time.monotonic()
        try:
            cc.allreduce(x, comm=comm)
            raise AssertionError("a call without its peers completed")
        except cc.errors.BackendError as exc:
            assert time.monotonic() - start < 5, (time.monotonic() - start, exc)
        aborter.join()
    WORLD.Barrier()
    comm.abort()


def mode_dup_board():
    """A dup() (and an NCCLCommunicator made directly) has an arrival board, so a timeout on it
    names the late rank, and shares its parent's fate."""
    from cupycoll.comm.nccl import NCCLCommunicator

    direct = NCCLCommunicator(timeout=30.0)
    assert direct.board is not None
    direct.abort()
    comm = cc.init("nccl", timeout=2.0)
    os.environ["CUPYCOLL_CONNECT_TIMEOUT"] = "soon" if RANK == P - 1 else "5"
    for make in (lambda: NCCLCommunicator(timeout=30.0), comm.dup):
        try:
            make()
            raise AssertionError("a bad CUPYCOLL_CONNECT_TIMEOUT was taken")
        except cc.errors.InvalidArgument as exc:
            assert exc.argument == "CUPYCOLL_CONNECT_TIMEOUT" and exc.rank == P - 1, exc
    del os.environ["CUPYCOLL_CONNECT_TIMEOUT"]
    twin = comm.dup()
    x = cupy.ones(4, cupy.float32)
    cc.allreduce(x, comm=twin)  # connected
    twin.synchronize()
    if RANK != P - 1 and P > 1:
        try:
            cc.allreduce(x, comm=twin)
            twin.synchronize()
            raise AssertionError("a call without its peer completed")
        except cc.errors.CollectiveTimeout as exc:
            assert exc.missing_ranks == [P - 1], exc
        try:
            cc.allreduce(x, comm=comm)
            raise AssertionError("the parent of a dead duplicate answered")
        except cc.errors.CollectiveTimeout as exc:
            assert "aborted" in str(exc), exc
    WORLD.Barrier()
    comm.abort()


def mode_inflight_threads():
    """Threads releasing in-flight entries at once (see the module docstring)."""
    from cupycoll.comm import _watchdog

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads interleave often
    try:
        comm = cc.init("nccl", timeout=60.0)
        x = cupy.ones(8, cupy.float32)
        done = comm.allreduce(x, x, "sum")
        comm.synchronize()
        futures = []
        for _ in range(60):
            for _ in range(8):
                comm.run("allreduce", x, x, "sum")  # stream order: the list grows
            futures.append(comm.allreduce(x, x, "sum").get_future())  # the completer's
            for _ in range(30):
                assert done.is_completed()  # the caller's
            done.wait()
        assert [f.exception(timeout=60) for f in futures] == [None] * len(futures)
    finally:
        sys.setswitchinterval(switch)
    for _ in range(5):
        comm.run("allreduce", x, x, "sum")  # complete below, never observed by the comm
    cupy.cuda.runtime.deviceSynchronize()
    kept = len(_watchdog._ABANDONED)
    del comm, done, futures
    gc.collect()
    assert len(_watchdog._ABANDONED) == kept, "a dropped communicator kept completed work"


def mode_alloc_synced():
    """alloc_fn's buffers of a synchronized asynchronous call (see the module docstring)."""
    comm = cc.init("nccl", timeout=60.0)
    first, second = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    for seed, complete in ((11, lambda w: w.synchronize()),
                           (12, lambda w: w.get_future().result())):
        parts, want = case(seed=seed)
        idx, val = parts[RANK]
        with first:
            work = cc.sparse_allreduce(cupy.asarray(idx), cupy.asarray(val), 60, comm=comm,
                                       algorithm="allgather", async_op=True,
                                       alloc_fn=lambda nnz, it, vs, vt, ctx: (
                                           cupy.empty(nnz, it), cupy.empty(vs, vt)))
            res = complete(work)
        with second:
            got = cupy.zeros(60, cupy.float64)
            got[res.indices] = res.values  # no wait of its own: the host saw it complete
            np.testing.assert_allclose(got.get(), want, rtol=1e-6, atol=1e-6)
    comm.synchronize()


def mode_result_after_abort():
    """A synchronized Work's result after an abort (see the module docstring)."""
    comm = cc.init("nccl", timeout=60.0)
    work = cc.allreduce(cupy.ones(3, cupy.float32), comm=comm, async_op=True)
    assert work.synchronize().get().tolist() == [P] * 3
    WORLD.Barrier()
    comm.abort()
    assert work.result().get().tolist() == [P] * 3 and work.wait() is not None


def mode_late_step():
    """A rank late inside split's reduce-scatter (see the module docstring)."""
    from cupycoll.sparse import split

    comm = cc.init("nccl", timeout=60.0)
    parts, _ = case(seed=13)
    idx, val = (cupy.asarray(a) for a in parts[RANK])
    cc.sparse_allreduce(idx, val, 60, algorithm="split", comm=comm)  # connected, compiled
    comm.synchronize()
    WORLD.Barrier()
    comm.timeout, late, original = 1.5, P - 1, split.reduce_scatter
    if RANK == late:
        split.reduce_scatter = lambda *a, **k: time.sleep(4.5) or original(*a, **k)
    named = []
    try:
        cc.sparse_allreduce(idx, val, 60, algorithm="split", comm=comm)
    except cc.errors.CollectiveTimeout as exc:  # its wait's, or the watchdog's first
        named = exc.missing_ranks
    except cc.errors.BackendError:
        pass  # a peer's abort reached this rank first
    finally:
        split.reduce_scatter = original
    assert P == 1 or any(late in n for n in WORLD.allgather(named)), "no rank named the late one"
    comm.abort()


MODES = {"inflight_threads": mode_inflight_threads, "alloc_synced": mode_alloc_synced,
         "late_step": mode_late_step,
         "result_after_abort": mode_result_after_abort,
         "null_stream": mode_null_stream, "connecting": mode_connecting,
         "dup_board": mode_dup_board, "completer_device": mode_completer_device,
         "close_paths": mode_close_paths, "waits_per_stream": mode_waits_per_stream,
         "device_thread": mode_device_thread, "stream_switch": mode_stream_switch,
         "future_streams": mode_future_streams, "null_stream_copies": mode_null_stream_copies,
         "future_wait": mode_future_wait, "connect_waits": mode_connect_waits}
for mode in MODE.split(","):
    MODES[mode]()
    if mode not in ("close_paths", "connecting", "dup_board", "result_after_abort",
                    "late_step"):
        emu.check_logs()  # (aborted communicators' logs are not compared anyway)
WORLD.Barrier()
if RANK == 0:
    print(f"gpu_discipline {MODE}: ok on {P} ranks")
