"""The emulation tier's strict points (cupycoll.testing.emulation) under mpiexec, each where it is
as strict as the hardware and where a kinder emulator let a defect pass.

Usage: gpu_strict.py MODE[,MODE...]   (CC_EMU_DEVICES: emulated devices per node, default 2)

Modes:
  pool          the stream-ordered pool: immediate, poisoned reuse on the freeing stream, the
                unordered work of another stream following the block to its next allocation
  oktopk        Ok-Topk on init("nccl") with THROTTLE = 1 (one step per bucket, so P >= 3 has
                three buckets or more): stateless calls, a stateful sequence (refresh and
                non-refresh steps) and TopkCompressor steps against numpy references. The
                stream-ordered pool hands a receive slot dropped while its unpack is only queued
                on the side stream to the next bucket's receive (defect: StreamOrderError)
  nccl_math     NCCL's arithmetic: float max/min drop NaN (fmaxf/fminf), sums accumulate each
                chunk in ring order from a rotating rank (allReduce, reduce, reduceScatter),
                float avg is a premultiplied sum, integer avg a wrapping sum truncated
  peer_dead     a peer's abort is a remote error across nodes only (P = 4, 2 devices per node)
  fidelity      CuPy behaviour the algorithms rely on: argsort is stable (numpy's default is
                not: duplicates would be folded in another order); the MPI backend's in-place
                broadcast of a device array at the root stages the root's data (it sent an
                unfilled staging buffer); device work never raises numpy's floating-point
                errors (an overflowing cast under np.errstate(all="raise") raised)
  mpi_devices   the MPI backend with device arrays on two devices: its asynchronous reductions
                copy their results back on the arrays' device whichever device is current
                where they complete, its asynchronous sparse calls and compressor steps run and
                deliver on the caller's device (each raised DeviceMismatch)
  destroy       ncclCommDestroy with an operation a dead peer never joins blocks, without error,
                until the emulated NCCL is released (P = 4, 2 devices per node; run it last)
  counts        an allreduce of mismatched counts fails on every rank and check_logs names it
                (before: the rank with the longer count returned a sum, nothing reported)
After every mode the ranks' NCCL call logs are compared (cupycoll.testing.emulation.check_logs).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

import cupycoll.testing.emulation as emu

DEVICES = int(os.environ.get("CC_EMU_DEVICES", "2"))
emu.install(DEVICES)
import cupy  # noqa: E402  (the emulated one)
from mpi4py import MPI  # noqa: E402

import cupycoll as cc  # noqa: E402

from _common import host  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
NCCL = cupy.cuda.nccl


# ---------------------------------------------------------------- Ok-Topk, one step per bucket
def mode_oktopk():
    """split_and_reduce with a bucket per step: stateless calls (k large enough for the full
    algorithm, not the validation round alone), a stateful sequence and TopkCompressor steps,
    every result against numpy references built from every rank's input."""
    import topk_ref as ref
    import topk_results as tr

    from cupycoll.topk import _oktopk_phases

    _oktopk_phases.THROTTLE = 1
    comm = cc.init("nccl", timeout=60.0)

    def run_outcome(comm, x, k, alg, state=None, _run=tr.run_outcome):
        return host(_run(comm, cupy.asarray(x), k, alg, state))

    tr.run_outcome = run_outcome
    for seed, n, k, dtype in ((21, 4000, 150, "float32"), (22, 2500, 300, "float64")):
        xs = ref.inputs(seed, P, n, dtype)
        res = host(cc.topk_allreduce(cupy.asarray(xs[RANK]), k, algorithm="oktopk", comm=comm))
        tr.check_shape(res, n, dtype)
        ui, uv = ref.union_sum([(i, x[i]) for x in xs for i in [ref.quantile_local(x, k)]])
        nz = uv != 0
        tr.assert_equal(res, *ref.top_of(ui[nz], uv[nz], k))
    tr.oktopk_sequence(comm, 23, 3000, 120, 4, padded=False)
    tr.oktopk_sequence(comm, 24, 3000, 120, 3, padded=True)
    compressor_steps(comm, 3000, 0.04, 4)
    if RANK == 0:
        print(f"oktopk with a bucket per step: {P} buckets")


def compressor_steps(comm, n: int, density: float, steps: int) -> None:
    """TopkCompressor (Ok-Topk) mass conservation: the ranks' residuals plus P times the update
    equal the ranks' previous residuals plus their gradients (float64 on the host)."""
    import topk_ref as ref

    comp = cc.TopkCompressor(n, density, algorithm="oktopk", comm=comm, tau=3, tau_prime=2)
    before = np.zeros(n)
    for t in range(steps):
        grads = ref.inputs(500 + t, P, n)
        upd = comp.step(cupy.asarray(grads[RANK]))
        idx, val = upd.indices.get(), upd.values.get()
        from _common import assert_identical_across_ranks

        assert_identical_across_ranks(idx, val)
        after = WORLD.allreduce(host(comp.residual).astype(np.float64), op=MPI.SUM)
        dense = np.zeros(n)
        dense[idx] = val
        incoming = before + np.sum([g.astype(np.float64) for g in grads], axis=0)
        np.testing.assert_allclose(after + P * dense, incoming, rtol=0,
                                   atol=1e-5 * max(1.0, float(np.abs(incoming).max())),
                                   err_msg=f"mass not conserved at step {t}")
        before = after


# ---------------------------------------------------------------- the stream-ordered pool
def mode_pool():
    """CuPy's pool as the emulator enforces it: a freed block comes back at once, poisoned, to
    the next allocation of its size on its stream (the emulator's finished NCCL task holds no
    array); another stream's unordered work on it follows it (StreamOrderError at the new
    owner's first touch), an ordered one does not; the reuse stays within its stream; a smaller
    request splits a larger free block (the block's stream work follows both parts)."""
    from cupycoll.testing.emulation import StreamOrderError
    from _common import expect_raises

    comm = raw_comm()
    stream = cupy.cuda.get_current_stream()
    x = cupy.arange(100, dtype=cupy.float32)
    comm.allReduce(x.data.ptr, x.data.ptr, 100, NCCL.NCCL_FLOAT32, NCCL.NCCL_SUM, stream.ptr)
    stream.synchronize()
    assert x.get().tolist() == [P * v for v in range(100)]
    ptr = x.data.ptr
    del x
    y = cupy.empty(100, cupy.float32)
    assert y.data.ptr == ptr and bool(cupy.isnan(y).all()), "no immediate, poisoned reuse"
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        z = cupy.empty(100, cupy.float32)
    assert z.data.ptr != ptr, "a block freed on one stream reused by another"
    side.wait_event(stream.record())
    with side:
        total = y.sum()  # the side stream reads y
    ptr = y.data.ptr
    del y
    err = expect_raises(StreamOrderError, cupy.zeros, 100, cupy.float32)
    assert "previous allocation" in str(err), err
    del err  # its traceback holds the failed allocation
    stream.wait_event(side.record())  # ordered now: the same block, no error
    w = cupy.zeros(100, cupy.float32)
    assert w.data.ptr == ptr and not bool(w.any())
    del total, z
    # a smaller request splits a larger free block, as CuPy's pool does: the side stream's
    # unordered read of the freed 4 KiB block follows its first 512 bytes
    big = cupy.ones(1024, cupy.float32)
    ptr = big.data.ptr
    side.wait_event(stream.record())
    with side:
        total = big.sum()
    del big
    err = expect_raises(StreamOrderError, cupy.zeros, 384, cupy.float32)  # 1.5 KiB: a size
    assert "previous allocation" in str(err), err  # no block of the arena has
    del err
    stream.wait_event(side.record())
    small = cupy.zeros(384, cupy.float32)
    rest = cupy.zeros(640, cupy.float32)  # the 2.5 KiB left of the split block
    assert small.data.ptr == ptr and rest.data.ptr == ptr + 1536, (small.data.ptr, ptr)
    del total, small, rest
    pool_frees_from_threads()
    streams_end_idle()
    WORLD.Barrier()
    comm.destroy()


def streams_end_idle():
    """A stream's emulated server thread ends once idle (a program making a stream per step
    kept a thread per stream ever used: 202 threads after 200 steps)."""
    from cupycoll.testing.emulation import device as emu_device

    before = threading.active_count()
    for _ in range(20):
        stream = cupy.cuda.Stream(non_blocking=True)
        stream.record().synchronize()  # an event: a task on the stream's own thread
    deadline = time.monotonic() + 10 * emu_device.IDLE
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before, (before, threading.active_count())


def pool_frees_from_threads():
    """An allocation that scans its arena's size classes for a block to split while another
    thread frees arrays of new sizes there (a finalizer takes no lock): no error (before:
    "dictionary changed size during iteration" on most runs)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        spread = [cupy.empty(512 * k, cupy.uint8) for k in range(2, 202)]
        del spread  # 200 size classes free in the arena
        fresh = [cupy.empty(512 * k, cupy.uint8) for k in range(202, 302)]
        errors, held = [], []

        def free():
            while fresh:
                fresh.pop()  # a new size class appears in the arena
                time.sleep(0.001)

        freer = threading.Thread(target=free)
        freer.start()
        try:
            while fresh:
                held.append(cupy.empty(512, cupy.uint8))  # none of 512 free: scans, splits
        except RuntimeError as exc:
            errors.append(exc)
        freer.join()
        assert not errors, errors
    finally:
        sys.setswitchinterval(interval)


# ---------------------------------------------------------------- NCCL's arithmetic
def raw_comm():
    """An emulated NcclCommunicator of every rank on its node-local device."""
    cupy.cuda.Device(RANK % DEVICES).use()
    uid = WORLD.bcast(NCCL.get_unique_id() if RANK == 0 else None, root=0)
    return NCCL.NcclCommunicator(P, uid, RANK)


def ring_reference(rows: np.ndarray, fold) -> np.ndarray:
    """The documented order, element by element in plain Python: the element range is cut in
    P chunks of ceil(n / P); chunk c starts at rank (c + 1) % P and adds the ranks after it in
    ring order, rounding to the dtype after every step."""
    p, n = rows.shape
    size = max(1, -(-n // p))
    out = np.empty(n, rows.dtype)
    for i in range(n):
        first = (i // size + 1) % p
        acc = rows[first, i]
        for j in range(1, p):
            with np.errstate(over="ignore"):  # float16 products overflow to inf, as NCCL's
                acc = rows.dtype.type(fold(acc, rows[(first + j) % p, i]))
        out[i] = acc
    return out


def nccl_inputs(dtype: str, n: int) -> np.ndarray:
    """Every rank's row. Floats: small values plus +B on rank i % P and -B on the next rank at
    element i (B = 2 ** (mantissa bits + 1): small terms added to B round away, so the sum
    depends on the order); integers: small values."""
    rng = np.random.default_rng([31, n])
    if np.dtype(dtype).kind in "iu":
        low = -100 if dtype[0] == "i" else 0
        return rng.integers(low, 100, (P, n)).astype(dtype)
    rows = rng.standard_normal((P, n)) + 0.5
    big = 2.0 ** (np.finfo(dtype).nmant + 1)
    cols = np.arange(n)
    rows[cols % P, cols] += big
    rows[(cols + 1) % P, cols] -= big
    return rows.astype(dtype)


def allreduce(comm, rows: np.ndarray, op: int) -> np.ndarray:
    dtype = rows.dtype
    code = getattr(NCCL, "NCCL_" + dtype.name.upper())
    send, recv = cupy.asarray(rows[RANK]), cupy.empty(rows.shape[1], dtype)
    stream = cupy.cuda.get_current_stream()
    comm.allReduce(send.data.ptr, recv.data.ptr, rows.shape[1], code, op, stream.ptr)
    stream.synchronize()
    return recv.get()


def mode_nccl_math():
    """Float max/min drop NaN; sums, products and averages in the ring order (documented in
    nccl_core.reduce_rows), the same bits on every rank, not the rank order."""
    comm = raw_comm()
    n = 4 * P + 3
    for dtype in ("float16", "float32", "float64"):
        rows = nccl_inputs(dtype, n)
        rows[0, :3] = np.nan  # NaN on one rank: the others' value wins
        rows[:, 3] = np.nan  # NaN everywhere: NaN
        rows[1 % P, 4] = np.nan
        for op, fold in ((NCCL.NCCL_MAX, np.fmax), (NCCL.NCCL_MIN, np.fmin)):
            got = allreduce(comm, rows, op)
            want = fold.reduce(rows, axis=0)
            assert np.array_equal(got, want, equal_nan=True), (dtype, op, got, want)
        rows = nccl_inputs(dtype, n)
        got = allreduce(comm, rows, NCCL.NCCL_SUM)
        assert got.tobytes() == ring_reference(rows, np.add).tobytes(), (dtype, got)
        in_rank_order = np.add.reduce(rows, axis=0)  # numpy adds rows in rank order
        assert P < 3 or got.tobytes() != in_rank_order.tobytes(), "summed in rank order"
        scale = rows.dtype.type(1.0 / P)
        got = allreduce(comm, rows, NCCL.NCCL_AVG)
        assert got.tobytes() == ring_reference(rows * scale, np.add).tobytes(), (dtype, got)
        got = allreduce(comm, rows, NCCL.NCCL_PROD)
        assert got.tobytes() == ring_reference(rows, np.multiply).tobytes(), (dtype, got)
        reduce_scatter_and_reduce(comm, rows)
    for dtype in ("int8", "int32", "uint32", "int64"):
        rows = nccl_inputs(dtype, n)
        total = np.add.reduce(rows, axis=0, dtype=rows.dtype)  # wraps like NCCL's sum in T
        quotient = np.abs(total.astype(np.int64)) // P * np.sign(total.astype(np.int64))
        got = allreduce(comm, rows, NCCL.NCCL_AVG)
        assert np.array_equal(got, quotient.astype(dtype)), (dtype, got, quotient)
    WORLD.Barrier()
    comm.destroy()


def reduce_scatter_and_reduce(comm, rows: np.ndarray) -> None:
    """reduceScatter: rank r's block of the ring-ordered sum; reduce: the root's sum."""
    dtype, block = rows.dtype, rows.shape[1] // P
    code = getattr(NCCL, "NCCL_" + dtype.name.upper())
    full = rows[:, :block * P]
    want = ring_reference(full, np.add)
    stream = cupy.cuda.get_current_stream()
    send, recv = cupy.asarray(full[RANK]), cupy.empty(block, dtype)
    comm.reduceScatter(send.data.ptr, recv.data.ptr, block, code, NCCL.NCCL_SUM, stream.ptr)
    out = cupy.empty(block * P, dtype)
    comm.reduce(send.data.ptr, out.data.ptr, block * P, code, NCCL.NCCL_SUM, P - 1, stream.ptr)
    stream.synchronize()
    assert recv.get().tobytes() == want[RANK * block:(RANK + 1) * block].tobytes()
    if RANK == P - 1:
        assert out.get().tobytes() == want.tobytes()


# ---------------------------------------------------------------- dead peers and destroy
def node_of(world_rank: int) -> int:
    return world_rank // DEVICES


def connected_then_aborted(aborter):
    """A raw communicator, connected by one allReduce of every rank; then rank ``aborter``
    aborts it. Returns (communicator, its 4-float buffer, the current stream)."""
    comm = raw_comm()
    x = cupy.ones(4, cupy.float32)
    stream = cupy.cuda.get_current_stream()
    comm.allReduce(x.data.ptr, x.data.ptr, 4, NCCL.NCCL_FLOAT32, NCCL.NCCL_SUM, stream.ptr)
    stream.synchronize()  # connected: the next allReduce needs no handshake
    WORLD.Barrier()
    if RANK == aborter:
        comm.abort()
    WORLD.Barrier()
    return comm, x, stream


def mode_peer_dead():
    """Rank 1 aborts while the others have an allReduce in flight: only ranks on another node
    see NCCL's remote error (its socket proxies); on its node-mates' communicators the kernel
    spins and no asynchronous error comes, however long they poll (their own abort ends it)."""
    comm, x, stream = connected_then_aborted(1)
    if RANK != 1:
        comm.allReduce(x.data.ptr, x.data.ptr, 4, NCCL.NCCL_FLOAT32, NCCL.NCCL_SUM, stream.ptr)
        remote = node_of(RANK) != node_of(1)
        deadline = time.monotonic() + (10 if remote else 1.5)
        seen = None
        while seen is None and time.monotonic() < deadline:
            try:
                comm.check_async_error()
            except NCCL.NcclError as exc:
                seen = exc
            time.sleep(0.01)
        if remote:
            assert seen is not None and "REMOTE" in str(seen), seen
        else:
            assert seen is None, f"rank {RANK}: a same-node peer's abort reported: {seen}"
        assert not stream.done, "the allReduce completed without rank 1"
    WORLD.Barrier()
    comm.abort()


def mode_destroy():
    """The last rank aborts; the others post an allReduce it never joins, then destroy their
    communicator in a helper thread: still blocked after 2 s (no error), on a node-mate and on
    another node alike; release_blocked() ends the kernels and destroy returns."""
    comm, x, stream = connected_then_aborted(P - 1)
    outcome = []
    if RANK != P - 1:
        comm.allReduce(x.data.ptr, x.data.ptr, 4, NCCL.NCCL_FLOAT32, NCCL.NCCL_SUM, stream.ptr)

        def destroy():
            try:
                comm.destroy()
                outcome.append("returned")
            except BaseException as exc:  # noqa: BLE001  (reported below)
                outcome.append(repr(exc))

        thread = threading.Thread(target=destroy, daemon=True)
        thread.start()
        thread.join(2.0)
        assert thread.is_alive(), f"rank {RANK}: destroy() did not block: {outcome}"
    WORLD.Barrier()
    emu.release_blocked()
    if RANK != P - 1:
        thread.join(10.0)
        assert outcome == ["returned"], f"rank {RANK}: destroy() after the release: {outcome}"


def mode_fidelity():
    """Stable argsort (function and method) against numpy's stable sort, on runs of equal keys
    long enough that an unstable sort reorders them; an in-place broadcast of cupy arrays over
    the MPI backend (host staging) against root's data, every root; a float16 sum that
    overflows in its cast back is inf with numpy's errors raised, as CUDA never warns
    (before: FloatingPointError in the emulator only)."""
    from cupycoll import primitives
    from cupycoll.comm.mpi import MPICommunicator

    with np.errstate(all="raise"):
        _, summed = primitives.coo_reduce(cupy.asarray(np.array([0, 0, 1])), cupy.asarray(
            np.array([6e4, 6e4, 1], np.float16)), "sum", accumulate_dtype="float32")
    assert summed.get().tolist() == [np.inf, 1.0], summed

    keys = np.random.default_rng(1).integers(0, 4, 5000)
    want = np.argsort(keys, kind="stable")
    assert np.array_equal(cupy.argsort(cupy.asarray(keys)).get(), want)
    assert np.array_equal(cupy.asarray(keys).argsort().get(), want)
    comm = MPICommunicator(xp=cupy)
    for root in range(P):
        x = cupy.full(17, float(RANK + 1), cupy.float32)
        comm.broadcast(x, x, root).wait()
        assert x.get().tolist() == [root + 1.0] * 17, (root, x.get())


def mode_mpi_devices():
    """Asynchronous reductions of device arrays on the MPI backend (staged through the host:
    native, pairwise reduce and reduce_scatter), completed while another device is current (a
    wait inside ``with Device(other)``, a future, on cupycoll's thread): the copy back runs on
    the arrays' device (before: DeviceMismatch in the finalizer)."""
    from cupycoll.comm.mpi import MPICommunicator

    comm = MPICommunicator(xp=cupy)
    mine = RANK % DEVICES
    with cupy.cuda.Device(mine):
        for n in (4 * P, (1 << 16) * P):  # native; from the pairwise thresholds
            x = cupy.full(n, float(RANK + 1), cupy.float32)
            total = P * (P + 1) / 2
            for how in ("switched", "future"):
                calls = [("allreduce", cc.allreduce(x, "sum", comm=comm, async_op=True), n),
                         ("reduce", cc.reduce(x, P - 1, "sum", comm=comm, async_op=True), n),
                         ("reduce_scatter", cc.reduce_scatter(x, "sum", comm=comm,
                                                              async_op=True), n // P)]
                for verb, work, size in calls:
                    if how == "future":
                        got = work.get_future().result(timeout=60)
                    else:
                        with cupy.cuda.Device((mine + 1) % DEVICES):
                            got = work.wait()
                    if got is None:  # reduce off the root
                        continue
                    assert got.device.id == mine, (verb, how, n, got.device.id)
                    assert got.get().tolist() == [total] * size, (verb, how, n)
        # the asynchronous sparse calls and compressor steps run on the background worker,
        # whose current device is its own (before: device 0, DeviceMismatch on the others)
        idx = cupy.asarray(np.array([RANK, P + RANK], np.int64))
        for how in ("wait", "future"):
            work = cc.sparse_allreduce(idx, cupy.ones(2, cupy.float32), 2 * P, comm=comm,
                                       async_op=True)
            got = work.wait() if how == "wait" else work.get_future().result(timeout=60)
            assert got.indices.device.id == got.values.device.id == mine, (how, got)
            assert got.indices.get().tolist() == list(range(2 * P)), (how, got)
        comp = cc.TopkCompressor(64, 0.25, comm=comm, algorithm="topka")
        for step in range(2):
            got = comp.step(cupy.arange(64, dtype=cupy.float32), async_op=True).wait()
            assert got.values.device.id == got.indices.device.id == mine, (step, got)
            assert step or got.indices.get().tolist() == list(range(48, 64)), got


def mode_counts():
    """An allreduce whose last rank posts a longer count than the others (a caller's bug that
    real NCCL answers with a hang or with reads past the shorter buffers): no rank completes
    it, and check_logs names it on every rank (before: the longer rank returned its sum with
    zeros for the others' missing tail, and nothing was reported)."""
    comm = raw_comm()
    count = 16 + 4 * (RANK == P - 1)
    send, recv = cupy.ones(count, cupy.float32), cupy.empty(count, cupy.float32)
    stream = cupy.cuda.get_current_stream()
    comm.allReduce(send.data.ptr, recv.data.ptr, count, NCCL.NCCL_FLOAT32, NCCL.NCCL_SUM,
                   stream.ptr)
    try:
        stream.synchronize()
        comm.check_async_error()
        raise AssertionError("an allreduce of mismatched counts completed")
    except NCCL.NcclError:
        pass
    except cupy.cuda.runtime.CUDARuntimeError:
        pass
    comm.abort()
    try:
        emu.check_logs()
        raise AssertionError("check_logs missed the mismatched counts")
    except emu.EmulationError as exc:
        assert "posted another call" in str(exc), exc


MODES = {"fidelity": mode_fidelity, "mpi_devices": mode_mpi_devices, "counts": mode_counts, "pool": mode_pool, "oktopk": mode_oktopk, "nccl_math": mode_nccl_math, "peer_dead": mode_peer_dead,
         "destroy": mode_destroy}
MODE = sys.argv[1]
for mode in MODE.split(","):  # several modes per launch: each launch costs seconds
    start = time.perf_counter()
    MODES[mode]()
    emu.check_logs()
    if RANK == 0:
        print(f"{mode}: {time.perf_counter() - start:.1f} s")
WORLD.Barrier()
if RANK == 0:
    print(f"gpu_strict {MODE}: ok on {P} ranks")
