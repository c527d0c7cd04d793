"""NCCL backend checks under mpiexec.  Usage: nccl_worker.py MODE [SEED]

Modes:
  bootstrap  unique-id broadcast, readiness agreement, node-local rank (no device needed); without a
             device, NCCLCommunicator() and init(backend="nccl") raise BackendUnavailable everywhere
  nocupy     the same with CuPy hidden: the module imports, every rank raises BackendUnavailable
  emulated   the backend's own code (tables, pointers, groups, staging, booking, waits) over a host
             stand-in for NCCL built on mpi4py: numpy arrays, real NCCL constants
  gpu        the real backend on CUDA devices (the launching test skips without them)
Every result is compared with a dense numpy reference rebuilt on every rank from the shared seed.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import time
from pathlib import Path

MODE = sys.argv[1]
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 1234
if MODE == "nocupy":  # must happen before anything imports cupy
    sys.modules["cupy"] = None  # type: ignore[assignment]

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from _common import assert_identical_across_ranks, expect_raises, rng_for  # noqa: E402

import cupycoll  # noqa: E402
from cupycoll import ReduceOp  # noqa: E402
from cupycoll.comm import nccl_usable  # noqa: E402
from cupycoll.comm import nccl as backend  # noqa: E402
from cupycoll.comm.mpi import MPICommunicator  # noqa: E402
from cupycoll.errors import (BackendError, BackendUnavailable, CollectiveTimeout,  # noqa: E402
                             InvalidArgument, InvalidType)

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64", "uint32", "uint64")
OPS = tuple(ReduceOp)


def to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


# ---------------------------------------------------------------- host stand-in for NCCL
class HostNccl:
    """Stand-in for ``cupy.cuda.nccl``: the real constants; p2p is posted at the outer groupEnd."""

    def __init__(self):
        from cupy.cuda import nccl

        for name in dir(nccl):
            if name.startswith("NCCL_"):
                setattr(self, name, getattr(nccl, name))
        self.NcclError = nccl.NcclError
        self.depth, self.pending, self.groups = 0, [], 0

    def groupStart(self):
        self.depth += 1

    def groupEnd(self):
        self.depth -= 1
        if self.depth == 0:
            self.groups += 1
            posts, self.pending = self.pending, []
            MPI.Request.Waitall([post() for post in posts])


class HostDevice:
    """Host stand-in for CudaDevice: numpy addresses, sentinel streams, events already done
    (or never, ``stuck``). The NCCL calls must run on the communicator's stream (STREAM)."""

    STREAM = 0x5EED
    errors = ()

    class Stream:
        def __init__(self, ptr):
            self.ptr = ptr
            self.waits = 0

    class Done:
        done = True

        def __init__(self):
            self.when = time.perf_counter()  # what a timing event records

        def synchronize(self):
            pass

    class Never:
        done = False

        def synchronize(self):  # the timeout path must poll, never block
            raise AssertionError("synchronize() called although a timeout is set")

    def __init__(self, stuck=False):
        self.stuck = stuck
        self.caller = self.Stream(0x1)
        self.current_stream = self.caller

    def pointer(self, a):
        return a.ctypes.data

    def current(self):
        return self.current_stream

    def new_stream(self):
        return self.Stream(self.STREAM)

    @staticmethod
    def handle(stream):
        return stream.ptr

    def record(self, stream=None, timing=False):
        return self.Never() if self.stuck else self.Done()

    @staticmethod
    def elapsed(start, end):
        return end.when - start.when

    @staticmethod
    def wait_event(stream, event):
        stream.waits += 1

    @contextlib.contextmanager
    def using(self, stream):
        outer, self.current_stream = self.current_stream, stream
        try:
            yield
        finally:
            self.current_stream = outer

    def activate(self, device_id):
        self._device_id = device_id

    def current_device(self):
        return getattr(self, "_device_id", 0)  # the one activated (per thread on a GPU)

    def download(self, a):
        return a.copy(), self.record()

    def side_stream(self):
        return HostSideStream()


class HostSideStream:
    """Host stand-in for SideStream: the events it is told to wait for must exist and be done
    (the stand-in's transfers complete inside groupEnd), and joins are counted."""

    def __init__(self):
        self.waited = self.joins = 0

    @contextlib.contextmanager
    def after(self, events):
        assert all(e.done for e in events), "side stream work before its transfers are done"
        self.waited += len(events)
        yield

    def join(self):
        self.joins += 1


class HostNcclComm:
    """What ncclComm does, done with mpi4py on memory named by host addresses."""

    def __init__(self, mpi_comm, mod):
        self.mpi, self.mod = mpi_comm.Dup(), mod
        self.aborted = self.destroyed = False
        self.async_error = self.fail_next = None
        self.calls = []
        self.dtypes = {getattr(mod, "NCCL_" + n.upper()): np.dtype(n) for n in DTYPES}
        self.combine = {mod.NCCL_SUM: lambda s: s.sum(axis=0, dtype=s.dtype),
                        mod.NCCL_PROD: lambda s: s.prod(axis=0, dtype=s.dtype),
                        mod.NCCL_MAX: lambda s: s.max(axis=0),
                        mod.NCCL_MIN: lambda s: s.min(axis=0),
                        mod.NCCL_AVG: self._avg}

    def rank_id(self):
        return self.mpi.Get_rank()

    def size(self):
        return self.mpi.Get_size()

    def device_id(self):
        return 0

    def _avg(self, stack):
        total = stack.astype(np.float64 if stack.dtype.kind == "f" else np.int64).sum(axis=0)
        p = stack.shape[0]
        if stack.dtype.kind == "f":
            return (total / p).astype(stack.dtype)
        return (np.sign(total) * (np.abs(total) // p)).astype(stack.dtype)

    def _enter(self, name, stream, count):
        assert not (self.aborted or self.destroyed), f"{name} on a dead communicator"
        assert stream == HostDevice.STREAM, f"{name}: not on the current stream ({stream})"
        assert count > 0, f"{name}: zero-element calls must be skipped, not posted"
        self.calls.append(name)
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            raise self.mod.NcclError(status)

    def _view(self, ptr, count, dtype):
        dtype = self.dtypes[dtype]
        raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
        return np.frombuffer(raw, dtype=dtype)

    def _stack(self, ptr, count, dtype):
        mine = self._view(ptr, count, dtype).copy()
        stack = np.empty((self.size(), count), mine.dtype)
        self.mpi.Allgather(mine.view(np.uint8), stack.view(np.uint8))
        return stack

    def allReduce(self, sptr, rptr, count, dtype, op, stream):
        self._enter("allReduce", stream, count)
        self._view(rptr, count, dtype)[...] = self.combine[op](self._stack(sptr, count, dtype))

    def reduce(self, sptr, rptr, count, dtype, op, root, stream):
        self._enter("reduce", stream, count)
        result = self.combine[op](self._stack(sptr, count, dtype))
        if self.rank_id() == root:
            self._view(rptr, count, dtype)[...] = result

    def reduceScatter(self, sptr, rptr, count, dtype, op, stream):
        self._enter("reduceScatter", stream, count)
        result = self.combine[op](self._stack(sptr, count * self.size(), dtype))
        me = self.rank_id()
        self._view(rptr, count, dtype)[...] = result[me * count:(me + 1) * count]

    def broadcast(self, sptr, rptr, count, dtype, root, stream):
        self._enter("broadcast", stream, count)
        data = self._view(sptr, count, dtype).copy() if self.rank_id() == root else \
            np.empty(count, self.dtypes[dtype])
        self.mpi.Bcast(data.view(np.uint8), root=root)
        self._view(rptr, count, dtype)[...] = data

    def allGather(self, sptr, rptr, count, dtype, stream):
        self._enter("allGather", stream, count)
        self._view(rptr, count * self.size(), dtype)[...] = self._stack(sptr, count, dtype).ravel()

    def send(self, ptr, count, dtype, peer, stream):
        self._enter("send", stream, count)
        assert self.mod.depth > 0, "send outside groupStart/groupEnd"
        data = self._view(ptr, count, dtype).copy()
        self.mod.pending.append(lambda: self.mpi.Isend(data.view(np.uint8), dest=peer))

    def recv(self, ptr, count, dtype, peer, stream):
        self._enter("recv", stream, count)
        assert self.mod.depth > 0, "recv outside groupStart/groupEnd"
        buf = self._view(ptr, count, dtype)
        self.mod.pending.append(lambda: self.mpi.Irecv(buf.view(np.uint8), source=peer))

    def commSplit(self, color, key):
        return HostNcclComm(self.mpi.Split(color, key), self.mod)

    def check_async_error(self):
        if self.async_error is not None:
            raise self.mod.NcclError(self.async_error)

    def abort(self):
        self.aborted = True

    def destroy(self):
        self.destroyed = True


def emulated(timeout=None, stuck=False):
    mod = HostNccl()
    fake = HostNcclComm(WORLD, mod)
    comm = backend.NCCLCommunicator.wrap(fake, timeout=timeout, nccl=mod,
                                         device=HostDevice(stuck), xp=np)
    return comm, fake, mod


# ---------------------------------------------------------------- inputs and references
def inputs(dtype, n, op, case):
    """Every rank's input of one case: small integers, so sums and products are exact."""
    dt = np.dtype(dtype)
    out = []
    for r in range(P):
        rng = rng_for(SEED, r, case)
        if op is ReduceOp.PROD:
            vals = rng.choice([1, 2] if dt.kind == "u" else [-2, -1, 1, 2], size=n)
        else:
            vals = rng.integers(0 if dt.kind == "u" else -4, 5, size=n)
        out.append(vals.astype(dt))
    return out


def reference(stack, op):
    wide = stack.astype(np.float64 if stack.dtype.kind == "f" else np.int64)
    if op is ReduceOp.AVG:
        total = wide.sum(axis=0)
        if stack.dtype.kind == "f":
            return total / len(stack)
        return np.sign(total) * (np.abs(total) // len(stack))  # NCCL truncates toward zero
    return {ReduceOp.SUM: np.sum, ReduceOp.PROD: np.prod, ReduceOp.MAX: np.max,
            ReduceOp.MIN: np.min}[op](wide, axis=0)


def check_equal(got, want, dtype, op, what):
    got = to_host(got)
    assert got.dtype == np.dtype(dtype), f"{what}: dtype {got.dtype}"
    if op is ReduceOp.AVG and np.dtype(dtype).kind == "f":  # NCCL pre-multiplies by 1/P
        tol = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}[np.dtype(dtype).name]
        ok = np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, np.asarray(want).astype(dtype))
    assert ok, f"rank {RANK}: {what} differs from the numpy reference\n{got[:8]}\n{want[:8]}"


# ---------------------------------------------------------------- checks over any NCCL comm
def check_dense(comm, xp, sizes):
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            for n in sizes:
                case += 1
                per_rank = inputs(dtype, n * P, op, case)
                want = reference(np.stack(per_rank), op)
                mine = per_rank[RANK]
                what = f"{dtype} {op.value} n={n * P}"
                for in_place in (False, True):
                    x = xp.array(mine)
                    out = x if in_place else xp.empty_like(x)
                    comm.allreduce(x, out, op).wait()
                    check_equal(out, want, dtype, op, f"allreduce {what} in_place={in_place}")
                    assert_identical_across_ranks(to_host(out))
                    if not in_place:
                        assert np.array_equal(to_host(x), mine), "allreduce modified its input"
                    x = xp.array(mine)
                    block = x[RANK * n:(RANK + 1) * n] if in_place else xp.empty(n, x.dtype)
                    comm.reduce_scatter(x, block, op).wait()
                    check_equal(block, want[RANK * n:(RANK + 1) * n], dtype, op,
                                f"reduce_scatter {what} in_place={in_place}")
                    for root in range(P):
                        x = xp.array(mine)
                        out = x if in_place else (xp.empty_like(x) if RANK == root else None)
                        comm.reduce(x, out, op, root).wait()
                        if RANK == root:
                            check_equal(out, want, dtype, op, f"reduce root={root} {what}")
                        else:
                            assert np.array_equal(to_host(x), mine), "reduce changed a non-root"
            check_movement(comm, xp, dtype, sizes, case)


def check_movement(comm, xp, dtype, sizes, case):
    for n in sizes:
        per_rank = inputs(dtype, n, ReduceOp.SUM, case + 1000 + n)
        for in_place in (False, True):
            for root in range(P):
                x = xp.array(per_rank[RANK])
                out = x if in_place else xp.empty_like(x)
                comm.broadcast(x, out, root).wait()
                check_equal(out, per_rank[root], dtype, None, f"broadcast {dtype} root={root}")
            recv = xp.empty(n * P, dtype)
            if in_place:
                recv[RANK * n:(RANK + 1) * n] = xp.array(per_rank[RANK])
                send = recv[RANK * n:(RANK + 1) * n]
            else:
                send = xp.array(per_rank[RANK])
            comm.allgather(send, recv).wait()
            check_equal(recv, np.concatenate(per_rank), dtype, None, f"allgather {dtype} n={n}")


def message(src, dst, k, width):
    """The k-th message src sends dst: some are empty, sizes differ per pair."""
    rows = (3 * src + 5 * dst + 7 * k) % 6
    return rng_for(SEED, src, dst, k).integers(-99, 99, size=(rows, width)).astype(np.float32)


def check_exchange(comm, xp):
    comm.stats.reset()
    width = 3
    sends = [(d, xp.array(message(RANK, d, k, width))) for d in range(P) for k in range(2)]
    sends[0] = (sends[0][0], xp.array(np.repeat(message(RANK, 0, 0, width), 2, axis=1))[:, ::2])
    recvs = []
    for s in range(P):
        for k in range(2):
            rows = message(s, RANK, k, width).shape[0]
            buf = xp.zeros((rows, 2 * width), np.float32)[:, ::2] if k else \
                xp.zeros((rows, width), np.float32)  # second message lands in a strided view
            recvs.append((s, buf))
    comm.exchange(sends, recvs, "ex").wait()
    for (s, buf), k in zip(recvs, [0, 1] * P, strict=True):
        got = to_host(buf)
        assert np.array_equal(got, message(s, RANK, k, width)), f"exchange from {s} message {k}"
    sent = sum(message(RANK, d, k, width).nbytes for d in range(P) for k in range(2) if d != RANK)
    received = sum(message(s, RANK, k, width).nbytes for s in range(P) for k in range(2)
                   if s != RANK)
    by = comm.stats.by_op["ex"]  # P == 1: local copies only, booked as an empty entry
    assert (by.bytes_sent, by.bytes_received) == (sent, received), (by, sent, received)
    assert by.messages_sent == by.messages_received == 2 * (P - 1), by
    assert comm.stats.bytes_sent == sent and comm.stats.messages_received == 2 * (P - 1)
    expect_raises(InvalidArgument, comm.exchange, [(P, xp.zeros(1))], [], "ex")


def check_variable(comm, xp):
    width = 2
    rows = [(3 * r + 1) % 4 for r in range(P)]  # includes ranks with no rows when P > 1
    data = [rng_for(SEED, r, 77).integers(-9, 9, size=(rows[r], width)).astype(np.int64)
            for r in range(P)]
    for counts in (None, rows):
        recv, got_counts = comm.allgatherv(xp.array(data[RANK]), counts, "agv")
        assert list(got_counts) == rows, got_counts
        assert np.array_equal(to_host(recv), np.concatenate(data)), "allgatherv"
    sends = [xp.array(message(RANK, d, 3, 4)) for d in range(P)]
    got = comm.alltoallv(sends, "a2a")
    for s in range(P):
        assert np.array_equal(to_host(got[s]), message(s, RANK, 3, 4)), f"alltoallv from {s}"
    assert list(comm.allgather_counts(RANK + 10, "cnt")) == [r + 10 for r in range(P)]
    comm.barrier()


def stats_sequence(comm, xp):
    """A fixed mix of every verb; both backends must book it identically."""
    comm.stats.reset()
    x = xp.array(np.arange(6 * P, dtype=np.float32))
    comm.allreduce(x, xp.empty_like(x), ReduceOp.SUM).wait()
    for root in range(P):
        comm.reduce(x, xp.empty_like(x) if RANK == root else None, ReduceOp.MAX, root).wait()
        comm.broadcast(x, xp.empty_like(x), root).wait()
    comm.allgather(x[:5], xp.empty(5 * P, np.float32), "gather_named").wait()
    comm.reduce_scatter(x, xp.empty(6, np.float32), ReduceOp.SUM).wait()
    comm.exchange([(d, x[:d]) for d in range(P)], [(s, xp.empty(RANK, np.float32))
                                                   for s in range(P)], "ex").wait()
    comm.allgatherv(x[:RANK + 1], None, "agv")
    comm.allgatherv(x[:2 * RANK], [2 * r for r in range(P)], "agv2")
    comm.alltoallv([x[:d + RANK] for d in range(P)], "a2a")
    comm.barrier()
    return comm.stats.snapshot()


def check_stats_parity(comm, xp):
    mpi = MPICommunicator(WORLD)
    want = stats_sequence(mpi, np)
    got = stats_sequence(comm, xp)
    assert got == want, f"rank {RANK}: NCCL booking {got} != MPI booking {want}"
    assert got["by_op"]["agv"]["bytes_received"] == sum(4 * (r + 1) for r in range(P) if r != RANK)


def check_errors(comm, xp):
    x = xp.zeros(4, np.int16)
    err = expect_raises(InvalidType, comm.allreduce, x, x, ReduceOp.SUM)
    assert "dtype" in str(err) and f"rank {RANK}" in str(err), err
    y = xp.zeros((4, 2), np.float32)
    err = expect_raises(InvalidArgument, comm.broadcast, y[:, 0], y[:, 1], 0)
    assert "recv" in str(err) and "contiguous" in str(err), err


def check_dup(comm, xp):
    twin = comm.dup()
    assert (twin.rank, twin.size, twin.timeout, twin.xp) == (RANK, P, comm.timeout, xp)
    comm.stats.reset()
    x = xp.full(3, RANK + 1, np.int32)
    twin.allreduce(x, x, ReduceOp.SUM).wait()
    assert to_host(x).tolist() == [P * (P + 1) // 2] * 3
    assert twin.stats.by_op["allreduce"].messages_sent == 2 * (P - 1) and not comm.stats.by_op
    twin.close()
    comm.barrier()  # the original is untouched by closing its twin


# ---------------------------------------------------------------- modes
def mode_bootstrap():
    uid = backend.broadcast_unique_id(WORLD)
    assert isinstance(uid, (bytes, tuple)) and len(uid) == 128, (type(uid), len(uid))
    assert_identical_across_ranks(np.frombuffer(bytes(uid), np.uint8) if isinstance(uid, bytes)
                                  else np.asarray(uid))
    assert backend.broadcast_unique_id(WORLD) != uid, "ids must be fresh per call"

    for root in sorted({0, P - 1}):
        calls = []
        got = backend.broadcast_unique_id(
            WORLD, lambda calls=calls: calls.append(RANK) or f"id made on {RANK}".encode(),
            root=root)
        assert got == f"id made on {root}".encode(), got
        assert calls == ([root] if RANK == root else []), calls

    def broken():
        raise RuntimeError("no NCCL here")
    err = expect_raises(BackendUnavailable, backend.broadcast_unique_id, WORLD, broken)
    assert "rank 0" in str(err) and "no NCCL here" in str(err), err

    backend.agree(WORLD, None, "nothing")
    err = expect_raises(BackendUnavailable, backend.agree, WORLD,
                        "lost my GPU" if RANK == P - 1 else None, "starting")
    assert f"[{P - 1}]" in str(err) and "lost my GPU" in str(err), err

    names = WORLD.allgather(MPI.Get_processor_name())
    local = sum(1 for r in range(RANK) if names[r] == names[RANK])
    assert backend.node_local_rank(WORLD) == (local, names.count(names[RANK]))
    assert backend.device_for(local, 1) == 0 and backend.device_for(local, 64) == local

    if nccl_usable():  # a GPU machine: with a device per rank the real bootstrap must work
        import cupy

        if cupy.cuda.runtime.getDeviceCount() >= P:
            with backend.NCCLCommunicator() as comm:
                assert (comm.rank, comm.size, comm.backend) == (RANK, P, "nccl")
                assert comm.device_id == RANK  # one node: device = local rank
        return
    err = expect_raises(BackendUnavailable, backend.NCCLCommunicator)
    assert "needs a CUDA device" in str(err) and str(list(range(P))) in str(err), err
    err = expect_raises(BackendUnavailable, cupycoll.init, backend="nccl")
    assert "nccl" in str(err), err
    assert cupycoll.init(backend="auto").backend == "mpi"


def mode_nocupy():
    assert "cupy" not in {m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}
    err = expect_raises(BackendUnavailable, backend.NCCLCommunicator)
    assert "CuPy" in str(err) and "gpu-cu12" in str(err), err
    expect_raises(BackendUnavailable, backend.nccl_types, np.float32, "sum")
    expect_raises(BackendUnavailable, cupycoll.init, backend="nccl")
    assert cupycoll.init().backend == "mpi"


def check_waits():
    from cupycoll.primitives._accel import ready

    ready()  # numba's import in the background would hold the GIL in the timed calls below
    comm, fake, _ = emulated(timeout=0.2, stuck=True)
    x = np.ones(3, np.float32)
    work = comm.allreduce(x, x, ReduceOp.SUM)
    assert not work.is_completed()
    work.wait()  # stream order only: the host does not wait
    assert comm._stream.waits == 1, "the communicator's stream waits for the caller's first"
    assert comm._device.caller.waits == 1, "the caller's stream waits for the operation"
    err = expect_raises(CollectiveTimeout, work.synchronize)  # or the watchdog timed it out
    assert "allreduce" in str(err) and err.op_name == "allreduce", err
    assert fake.aborted, "a timeout must abort the NCCL communicator"
    err = expect_raises(CollectiveTimeout, comm.allreduce, x, x, ReduceOp.SUM)
    assert "aborted in allreduce" in str(err), err

    # nobody waits on the host: the watchdog aborts once the timeout has passed, and the next
    # call raises the timeout of the operation that never completed (not of the next one)
    comm, fake, _ = emulated(timeout=0.2, stuck=True)
    started = time.monotonic()
    comm.run("broadcast", x, x, 0)
    assert time.monotonic() - started < 0.1, "a stream-ordered call must not wait on the host"
    while not fake.aborted and time.monotonic() - started < 5:
        time.sleep(0.01)
    assert fake.aborted and time.monotonic() - started >= 0.2, "the watchdog must abort in time"
    err = expect_raises(CollectiveTimeout, comm.run, "allreduce", x, x, ReduceOp.SUM)
    assert "aborted in broadcast" in str(err), err

    comm, fake, _ = emulated()
    try:
        with comm:
            comm.barrier()
            raise KeyError("the application's own error")
    except KeyError:
        pass
    assert fake.aborted and not fake.destroyed, "close on an error path must abort, not destroy"

    for timeout in (None, 5.0):
        comm, fake, _ = emulated(timeout=timeout)
        fake.async_error = 3
        err = expect_raises(BackendError, comm.barrier)
        assert isinstance(err.__cause__, fake.mod.NcclError) and f"rank {RANK} of" in str(err)
        assert fake.aborted, "an asynchronous NCCL error must abort"

    comm, fake, _ = emulated()
    fake.fail_next = 5
    err = expect_raises(BackendError, comm.allreduce, x, x, ReduceOp.SUM)
    assert isinstance(err.__cause__, fake.mod.NcclError) and "allreduce" in str(err)
    assert fake.aborted, "an NCCL error at enqueue must abort"

    comm, fake, _ = emulated()
    with comm:
        comm.barrier()
    assert fake.destroyed and not fake.aborted
    comm.close()
    expect_raises(BackendUnavailable, comm.barrier)


def mode_emulated():
    comm, fake, mod = emulated(timeout=30.0)
    assert (comm.rank, comm.size, comm.backend, comm.xp) == (RANK, P, "nccl", np)
    check_dense(comm, np, sizes=(0, 1, 7, 1000))
    n_big = 65537
    x = np.asarray(inputs("float32", n_big, ReduceOp.SUM, 9)[RANK])
    comm.allreduce(x, x, ReduceOp.SUM).wait()
    check_equal(x, reference(np.stack(inputs("float32", n_big, ReduceOp.SUM, 9)), ReduceOp.SUM),
                "float32", ReduceOp.SUM, "allreduce 65537")
    groups = mod.groups
    check_exchange(comm, np)
    assert mod.groups == groups + 1, "exchange must be one NCCL group"
    assert P == 1 or {"send", "recv"} <= set(fake.calls)
    check_variable(comm, np)
    check_stats_parity(comm, np)
    check_errors(comm, np)
    check_dup(comm, np)
    check_algorithms(comm)
    check_learned_file(comm)
    comm.close()
    check_waits()


def check_learned_file(comm):
    """A wrapped communicator (no host MPI communicator) broadcasts rank 0's object over its
    own broadcast: learn.save and learn.load give every rank rank 0's records."""
    import tempfile

    from cupycoll.sparse import learn

    assert comm.mpi_comm is None
    assert comm.host_bcast({"from": RANK, "list": [1.5] * 3} if RANK == 0 else None,
                           "probe") == {"from": 0, "list": [1.5] * 3}
    idx = np.arange(RANK, 4000, 3, dtype=np.int64)
    for _ in range(3):
        cupycoll.sparse_allreduce(idx, np.ones(idx.size, np.float32), 10000, comm=comm)
    folder = WORLD.bcast(tempfile.mkdtemp() if RANK == 0 else None)
    path = str(Path(folder) / "learned.json")
    assert learn.save(comm, path) is None
    learn.records(comm).clear()  # rank 0's file, not what each rank kept, comes back
    assert learn.load(comm, path) == 1
    mine = {key: record.candidates for key, record in learn.records(comm).items()}
    assert WORLD.allgather(repr(mine)) == [repr(mine)] * P
    if P > 1:
        bad = str(Path(folder) / "missing.json") if RANK == 0 else 7  # rank 0's path counts
        err = expect_raises(InvalidArgument, learn.load, comm, bad)
        assert "is not a table learn.save wrote" in str(err) and f"rank {RANK}" in str(err)


def check_algorithms(comm):
    """split and Ok-Topk (three steps, padded allgather, side-stream reduce) over the NCCL
    backend equal, bit for bit, the same calls over MPI; the reduce's consumers waited for
    their transfers' events and were joined once per Ok-Topk step."""
    from cupycoll.topk import TopkState, topk_allreduce

    mpi = MPICommunicator()
    rng = rng_for(31, RANK)
    idx = np.sort(rng.choice(5000, 300, replace=False)).astype(np.int32)
    val = rng.standard_normal(300).astype(np.float32)
    got = cupycoll.sparse_allreduce(idx, val, 5000, algorithm="split", comm=comm)
    want = cupycoll.sparse_allreduce(idx, val, 5000, algorithm="split", comm=mpi)
    assert got.indices.tobytes() == want.indices.tobytes()
    assert got.values.tobytes() == want.values.tobytes()
    states = TopkState(tau_prime=2), TopkState(tau_prime=2)
    for t in range(3):
        x = (rng_for(32, 0, t).standard_t(3, 4000) + rng_for(33, RANK, t).standard_normal(4000)
             ).astype(np.float32)
        got = topk_allreduce(x, 40, algorithm="oktopk", comm=comm, state=states[0])
        want = topk_allreduce(x, 40, algorithm="oktopk", comm=mpi, state=states[1])
        assert got.indices.tobytes() == want.indices.tobytes(), f"oktopk step {t}"
        assert got.values.tobytes() == want.values.tobytes(), f"oktopk step {t}"
    side = comm._side
    assert side is not None and side.joins == 3
    assert side.waited == 3 * -(-P // 4), side.waited  # one event per bucket, each step


def mode_gpu():
    import cupy

    comm = backend.NCCLCommunicator(timeout=120.0)
    assert comm.xp is cupy and comm.device_id == cupy.cuda.Device().id
    check_dense(comm, cupy, sizes=(0, 1, 7, 1000, 65537))
    check_exchange(comm, cupy)
    check_variable(comm, cupy)
    check_stats_parity(comm, cupy)
    check_errors(comm, cupy)
    check_dup(comm, cupy)
    y = cupycoll.allreduce(cupy.full(5, RANK + 1, cupy.int32), "avg", comm=comm)
    assert to_host(y).tolist() == [(P + 1) // 2] * 5
    if P > 1:  # peers that never arrive: rank 1 times out and aborts, nobody hangs
        lonely = backend.NCCLCommunicator(timeout=2.0)
        if RANK == 1:
            z = cupy.ones(4, cupy.float32)
            err = expect_raises(CollectiveTimeout, lonely.allreduce(z, z, ReduceOp.SUM).wait)
            assert "allreduce" in str(err) and "rank 1" in str(err), err
        WORLD.Barrier()
        lonely.abort()
    comm.close()


if __name__ == "__main__":  # tests/workers/gpu_emulated.py imports the checks
    {"bootstrap": mode_bootstrap, "nocupy": mode_nocupy, "emulated": mode_emulated,
     "gpu": mode_gpu}[MODE]()
    WORLD.Barrier()
    if RANK == 0:
        print(f"nccl_worker {MODE}: ok on {P} ranks")
