"""The emulation tier against what CuPy, CUDA and NCCL do (review rv_emu): in-place writes booked
as writes, commSplit ids, per-thread `with` stacks and events' devices, CuPy's NaN and cast
bits, get/set, host syncs, a destroyed communicator, legal programs accepted, empty's order,
a peer's abort notice that overtakes what it sent before.
Each case failed on the emulator before its fix. This file is also the worker: pytest launches
it under mpiexec with the emulation installed (``main``), one job per rank count."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

P1 = ["inplace_writes", "contexts", "arith", "get_set", "syncs", "legacy_null", "empty_order",
      "shares_memory", "overtaken_abort"]
P2 = ["after_destroy", "legal_groups"]
P3 = ["split_uid"]
_OUT: dict[int, str] = {}


def _output(nprocs: int, cases: list[str]) -> str:
    from tests._mpi import run_mpi

    if nprocs not in _OUT:
        _OUT[nprocs] = run_mpi(nprocs, "../test_emulation_fidelity.py", ",".join(cases),
                               timeout=240)
    return _OUT[nprocs]


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs,case", [(1, c) for c in P1] + [(2, c) for c in P2] +
                         [(3, c) for c in P3])
def test_emulation_fidelity(nprocs, case):
    out = _output(nprocs, {1: P1, 2: P2, 3: P3}[nprocs])
    assert out.count(f"case {case} ok") == nprocs, out


# ------------------------------------------------------------------ the worker (emulated cupy)
def _comm(cupy, world):
    nccl = cupy.cuda.nccl
    cupy.cuda.Device(world.Get_rank() % 2).use()
    uid = world.bcast(nccl.get_unique_id() if world.Get_rank() == 0 else None, root=0)
    return nccl.NcclCommunicator(world.Get_size(), uid, world.Get_rank())


def inplace_writes(cupy, emu, world):
    """Every in-place writer races a pending read on another stream (StreamOrderError)."""
    writers = [lambda v: cupy.copyto(v, cupy.float32(7)),
               lambda v: cupy.copyto(v, cupy.float32(7), where=v > 0),
               lambda v: cupy.add(v, 1, v), lambda v: cupy.add.at(v, cupy.arange(2), 1),
               lambda v: cupy.put(v, cupy.arange(2), 0), lambda v: cupy.putmask(v, v > 0, 0),
               lambda v: cupy.cumsum(v, 0, None, v), lambda v: v.clip(0, 1, v)]
    for i, write in enumerate(writers):
        v = cupy.arange(8, dtype=cupy.float32) + 1
        cupy.cuda.runtime.deviceSynchronize()
        gate, s1 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
        hold = threading.Event()
        gate.enqueue("slow kernel", hold.wait)
        s1.wait_event(gate.record())
        host = cupyx_pinned(v)
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, v.data.ptr, v.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToHost, s1.ptr)
        with cupy.cuda.Stream(non_blocking=True):
            with pytest.raises(emu.StreamOrderError):
                write(v)
        hold.set()
        s1.synchronize()


def cupyx_pinned(v):
    import cupyx

    return cupyx.empty_pinned((v.size,), v.dtype)


def contexts(cupy, emu, world):
    null, s = cupy.cuda.get_current_stream(), cupy.cuda.Stream(non_blocking=True)
    with s:
        with s:
            pass
        assert cupy.cuda.get_current_stream() is s
    assert cupy.cuda.get_current_stream() is null
    d1 = cupy.cuda.Device(1)
    with d1:
        with d1:
            pass
        assert cupy.cuda.runtime.getDevice() == 1
    assert cupy.cuda.runtime.getDevice() == 0
    inside, done, seen = threading.Barrier(2), threading.Barrier(2), {}

    def thread(name):
        mine = cupy.cuda.Stream(non_blocking=True)
        mine.use()
        with s:
            inside.wait()
        done.wait()
        seen[name] = cupy.cuda.get_current_stream() is mine
    threads = [threading.Thread(target=thread, args=(n,)) for n in "ab"]
    [t.start() for t in threads], [t.join() for t in threads]
    assert seen == {"a": True, "b": True}, seen
    event = cupy.cuda.Event()  # device 0's
    with cupy.cuda.Device(1):
        with pytest.raises(emu.DeviceMismatch, match="event and stream on one device"):
            event.record(cupy.cuda.Stream(non_blocking=True))


def arith(cupy, emu, world):
    bits = {np.float16: (np.uint16, 0x7FFF), np.float32: (np.uint32, 0x7FFFFFFF),
            np.float64: (np.uint64, 0x7FFFFFFFE0000000)}
    for dtype, (uint, nan) in bits.items():
        neg_nan = np.array([np.nan], dtype).view(uint) | uint(1 << (8 * uint(0).itemsize - 1))
        x = cupy.asarray(np.array([neg_nan.view(dtype)[0], 2], dtype))
        y = cupy.asarray(np.array([1, np.nan], dtype))
        for f in (cupy.maximum, cupy.minimum):
            assert f(x, y).get().view(uint).tolist() == [nan, nan], (f, dtype)
        if dtype != np.float64:
            assert cupy.fmax(x, x).get().view(uint)[0] == nan
    f = cupy.asarray(np.array([-1.0, np.inf, 3e9, np.nan, -np.inf], np.float32))
    assert f.astype(np.uint32).get().tolist() == [0, 2**32 - 1, 3000000000, 0, 0]
    want = [-1, 2**31 - 1, 2**31 - 1, 0, -2**31]
    into = cupy.empty(5, cupy.int32)
    cupy.copyto(into, f, casting="unsafe")
    for got in (f.astype(np.int32), f.astype(np.int32, copy=False), f.astype(np.int32, "C"),
                cupy.array(f, dtype=np.int32), cupy.asarray(f, dtype=np.int32), into):
        assert got.get().tolist() == want  # every path runs CUDA's conversion
    for narrow in (lambda: f.astype(np.int8), lambda: f.astype(np.int8, copy=False)):
        with pytest.raises(emu.EmulationError, match="undefined"):
            narrow()


def get_set(cupy, emu, world):
    with cupy.cuda.Device(1):
        a1 = cupy.arange(3, dtype=cupy.float32)
        one = a1[1:2]
    assert a1.get().tolist() == [0, 1, 2] and one.item() == 1.0  # device 0 current
    out = np.zeros(3, np.float32)
    assert cupy.arange(3, dtype=cupy.float32).get(out=out) is out and out.tolist() == [0, 1, 2]
    a = cupy.zeros(3, cupy.float32)
    with pytest.raises(TypeError):
        a.set(np.ones(3, np.float64))
    with pytest.raises(ValueError):
        a.set(np.ones(1, np.float32))
    a.set(np.ones(3, np.float32))
    assert a.get().tolist() == [1, 1, 1]


def syncs(cupy, emu, world):
    from cupycoll.testing import syncs as counting
    from cupycoll.testing.sync_counting import xp

    for ns in (cupy, xp):
        x = ns.arange(12, dtype="float32")
        m, n = x > 3, ns.sum(x[:3] > 0)
        for op in (lambda: ns.where(m), lambda: m.nonzero(), lambda: x.compress(m),
                   lambda: ns.unique_values(x), lambda: ns.trim_zeros(x),
                   lambda: x.__setitem__(m, x[:8] * 1), lambda: x[:n], lambda: x.reshape(n, -1),
                   lambda: ns.empty(n)):
            with counting.count_host_syncs() as c:
                op()
            assert c.total == 1, (ns, c.by_kind)


def legacy_null(cupy, emu, world):
    for case in "ab":
        x, other = cupy.zeros(4, cupy.float32), cupy.zeros(4, cupy.float32)
        cupy.cuda.runtime.deviceSynchronize()
        with cupy.cuda.Stream():  # blocking
            x += 1
        if case == "a":
            other += 1  # the null stream: after the blocking streams' work
            with cupy.cuda.Stream():
                assert (x * 2).get().tolist() == [2] * 4
        else:
            event = cupy.cuda.get_current_stream().record()
            s = cupy.cuda.Stream(non_blocking=True)
            s.wait_event(event)
            with s:
                assert (x * 2).get().tolist() == [2] * 4


def empty_order(cupy, emu, world):
    f = cupy.asfortranarray(cupy.arange(6, dtype=cupy.float32).reshape(2, 3))
    for a in (cupy.empty((2, 3), cupy.float32, order="F"), cupy.empty_like(f)):
        assert a.flags.f_contiguous and not a.flags.c_contiguous


def shares_memory(cupy, emu, world):
    """CuPy's shares_memory takes no integer search bound (NotImplementedError; numpy takes
    one); its exact search and bounds check answer as numpy's. A sparse call's ``alloc_fn``
    returning two views of one buffer is refused on device arrays too (before: the bound's
    error read as "no overlap", and the values overwrote the indices)."""
    import cupycoll as cc
    from cupycoll.comm.mpi import MPICommunicator
    from cupycoll.errors import InvalidArgument

    whole = cupy.zeros(8, cupy.int64)
    with pytest.raises(NotImplementedError):
        cupy.shares_memory(whole[:4], whole[2:], max_work=10_000)
    assert cupy.shares_memory(whole[:4], whole[2:]) and not cupy.shares_memory(whole[::2],
                                                                                 whole[1::2])
    assert cupy.shares_memory(whole[::2], whole[1::2], max_work="MAY_SHARE_BOUNDS")
    comm = MPICommunicator(world, xp=cupy)
    idx = cupy.asarray(np.array([1, 3, 5, 7], np.int64))
    with pytest.raises(InvalidArgument, match="do not overlap"):
        cc.sparse_allreduce(idx, cupy.ones(4, cupy.int64), 8, comm=comm,
                            alloc_fn=lambda nnz, it, shape, vt, ctx: (whole[:nnz], whole[:nnz]))
    buf = cupy.zeros(8, cupy.int64)  # interleaved, apart: taken
    got = cc.sparse_allreduce(idx, cupy.ones(4, cupy.int64), 8, comm=comm,
                              alloc_fn=lambda nnz, it, shape, vt, ctx: (buf[0::2], buf[1::2]))
    assert got.indices.get().tolist() == [1, 3, 5, 7] and buf.get()[1::2].tolist() == [1] * 4


def overtaken_abort(cupy, emu, world):
    """A host wait that sees a peer's abort notice still completes what the peer sent before
    aborting (the notice can overtake it: a rank in a lazy connect's handshake failed with
    ncclRemoteError although every peer had finished it); with nothing coming it fails."""
    from cupycoll.testing.emulation import nccl_core

    class PeerGone:
        aborted = False

        def peer_aborted(self):
            return True

    tests = []
    nccl_core.poll(lambda: tests.append(1) or len(tests) > 3, PeerGone(), "handshake")
    assert len(tests) == 4, tests
    try:
        nccl_core.poll(lambda: False, PeerGone(), "handshake")
    except cupy.cuda.nccl.NcclError as exc:
        assert "REMOTE" in str(exc), exc
    else:
        raise AssertionError("a wait on a dead peer returned")


def after_destroy(cupy, emu, world):
    for end in ("destroy", "abort"):
        c = _comm(cupy, world)
        getattr(c, end)()
        for method in (c.check_async_error, c.rank_id, c.size):
            with pytest.raises(cupy.cuda.nccl.NcclError, match="INVALID_ARGUMENT"):
                method()


def legal_groups(cupy, emu, world):
    nccl, rank = cupy.cuda.nccl, world.Get_rank()
    c = _comm(cupy, world)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    x = cupy.ones(4, cupy.float32)
    y, z = cupy.empty(4, cupy.float32), cupy.empty(4, cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    F, SUM = nccl.NCCL_FLOAT32, nccl.NCCL_SUM
    with s2:
        x2 = x * 3  # s2's prior work, read by the group
    nccl.groupStart()
    c.allReduce(x.data.ptr, y.data.ptr, 4, F, SUM, s1.ptr)
    c.allReduce(x2.data.ptr, z.data.ptr, 4, F, SUM, s2.ptr)
    nccl.groupEnd()
    with s2:  # s2 waits for the group, s1's operation included
        assert (y + z).get().tolist() == [4 * world.Get_size()] * 4
    nccl.groupStart()
    c.send(x2.data.ptr, 4, F, rank, s1.ptr)
    c.recv(y.data.ptr, 4, F, rank, s1.ptr)
    nccl.groupEnd()
    with s1:
        assert y.get().tolist() == [3] * 4
    s1.synchronize(), s2.synchronize()


def split_uid(cupy, emu, world):
    nccl, rank = cupy.cuda.nccl, world.Get_rank()
    a = _comm(cupy, world)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    x, y, z = (cupy.ones(4, cupy.float32) for _ in range(3))
    F, SUM = nccl.NCCL_FLOAT32, nccl.NCCL_SUM
    cupy.cuda.runtime.deviceSynchronize()
    nccl.groupStart()  # rank 0 sends to every other rank: logs of different lengths
    for r in range(1, world.Get_size()) if rank == 0 else ():
        a.send(x.data.ptr, 4, F, r, s1.ptr)
    if rank:
        a.recv(y.data.ptr, 4, F, 0, s1.ptr)
    nccl.groupEnd()
    child = a.commSplit(0, rank)
    pair = (lambda: a.allReduce(x.data.ptr, y.data.ptr, 4, F, SUM, s1.ptr),
            lambda: child.allReduce(x.data.ptr, z.data.ptr, 4, F, SUM, s2.ptr))
    for call in pair:
        call()
    s1.synchronize(), s2.synchronize()
    emu.check_logs()
    for call in (pair[::-1] if rank == 0 else pair):  # opposite launch orders
        call()
    s1.synchronize(), s2.synchronize()
    with pytest.raises(emu.EmulationError, match="launch order"):
        emu.check_logs()
    from cupycoll.testing.emulation.logs import COMMS

    odd = type(a)(world.Get_size(), None, rank, _mpi=world.Dup(), _uid=bytes([rank]) * 128)
    with pytest.raises(emu.EmulationError, match="does not exist on world rank"):
        emu.check_logs()  # one communicator, a different id on every rank: not skipped
    COMMS.remove(odd)


def main() -> None:
    import cupycoll.testing.emulation as emu

    emu.install(2)
    import cupy
    from mpi4py import MPI

    for case in sys.argv[1].split(","):
        try:
            globals()[case](cupy, emu, MPI.COMM_WORLD)
            emu.check_logs()
        except BaseException as exc:  # noqa: BLE001  (reported, the next case runs)
            print(f"case {case} FAILED: {type(exc).__name__}: {exc}", flush=True)
        else:
            print(f"case {case} ok", flush=True)


if __name__ == "__main__":
    main()
