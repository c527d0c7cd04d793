"""cupycoll's GPU path on emulated GPUs (cupycoll.testing.emulation) under mpiexec.

Usage: gpu_emulated.py MODE[,MODE...] [ARGS]
(CC_EMU_DEVICES: emulated devices per node, default 2; CC_EMU_CUPY: emulated CuPy major version,
default 14; CC_REAL_GPU=1: no emulation, the suites on real GPUs)

Modes:
  suites SEED NCASES [quick]  the dense, sparse (every algorithm, sync and async) and top-k
                              (every algorithm; Ok-Topk refresh and non-refresh steps) suites on
                              init("nccl") over emulated devices, against numpy references
  async_device                async sparse_allreduce runs on the communicator's device
  async_order                 async sparse_allreduce beside the caller's own collectives keeps
                              one launch order on every rank
  dup                         dup() on CuPy 13's binding (no commSplit); its errors
  missing_peer                a rank that never joins a collective: CollectiveTimeout, no hang
  peer_aborts                 without a timeout, a wait sees the abort of a peer on another
                              node (async error; CC_EMU_DEVICES=1)
  late_fetch                  a fetch that timed out keeps the pinned buffer its queued copy
                              writes (defect 7)
  init_fails                  ncclCommInitRank fails on one rank: every rank raises in time
                              (leaves the emulated NCCL released: run it last)
  init_given_up               an init past its timeout: every rank raises CollectiveTimeout
                              and aborts its communicator, the late rank's once its init
                              thread makes it (before: left, as garbage, unaborted)
  device_choice               init() keeps a device the application made current
  auto_agrees                 init("auto") picks NCCL only if every rank can
  rules                       every rule of the emulator fires on a program that breaks it
  wrong_device                an array on another GPU on one rank raises on every rank
  wire                        wire formats: compact == coo bitwise for every sparse and top-k
                              algorithm, rounded values identical on every rank
  late_named, late_after_abort, late_verbs, interrupt
                              issue 12 on NCCL: a late rank named, never matched against
                              aborted peers, for every front door; Ctrl-C in a wait
After every mode the ranks' NCCL call logs are compared (cupycoll.testing.emulation.check_logs).
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import threading
import time

import numpy as np

MODE = sys.argv[1]
REAL = os.environ.get("CC_REAL_GPU") == "1"  # the same suites on real GPUs (no emulation)
import cupycoll.testing.emulation as emu  # noqa: E402

if not REAL:
    emu.install(int(os.environ.get("CC_EMU_DEVICES", "2")),
                int(os.environ.get("CC_EMU_CUPY", "14")))
import cupy  # noqa: E402  (the emulated one, unless CC_REAL_GPU=1)
from mpi4py import MPI  # noqa: E402

from _common import expect_raises, host, napping_barrier, unique  # noqa: E402

import cupycoll as cc  # noqa: E402
from cupycoll._result import SparseResult  # noqa: E402
from cupycoll.testing.syncs import count_host_syncs  # noqa: E402
from cupycoll.errors import (BackendError, BackendUnavailable, CollectiveTimeout,  # noqa: E402
                             MismatchError)

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
DEVICES = (cupy.cuda.runtime.getDeviceCount() if REAL
           else int(os.environ.get("CC_EMU_DEVICES", "2")))


def check_logs():
    if not REAL:
        emu.check_logs()


def nccl_comm(timeout=60.0):
    comm = cc.init("nccl", timeout=timeout)
    assert comm.backend == "nccl" and comm.xp is cupy, comm
    assert comm.device_id == RANK % DEVICES == cupy.cuda.runtime.getDevice(), comm.device_id
    return comm


# ---------------------------------------------------------------- suites
def dense_suite(comm, quick):
    """Every verb; every dtype and op at P = 2 (the calls' enums are what the real binding
    checks), a few dtypes at larger P (many roots and ranks, fewer repeats)."""
    import nccl_worker as checks

    if P > 2:
        checks.DTYPES = ("float16", "float32", "int64", "uint8")
    checks.check_dense(comm, cupy, sizes=(7,) if P > 2 else (0, 7))
    checks.check_exchange(comm, cupy)
    checks.check_variable(comm, cupy)
    checks.check_stats_parity(comm, cupy)
    checks.check_errors(comm, cupy)
    if not quick:
        checks.check_dup(comm, cupy)


def sparse_suite(comm, seed, ncases):
    import sparse_random as sr
    from _common import digest

    algorithms = [a for a in os.environ.get("CC_EMU_SPARSE", "").split(",") if a] or \
        cc.algorithms("sparse")
    digests, dense_regions = [], 0
    for case in range(ncases):
        prm = sr.case_params(seed, case, P, algorithms)
        comm.stats.reset()
        inputs = [sr.rank_input(seed, case, r, P, prm) for r in range(P)]
        idx, val = (cupy.asarray(a) for a in inputs[RANK])
        into = None
        if prm["into"]:  # output="dense" into a device buffer of garbage
            into = cupy.full((prm["n"],) + ((prm["width"],) if prm["width"] else ()), 7,
                             prm["dtype"])
        out = cc.sparse_allreduce(idx, val, prm["n"], op=prm["op"], algorithm=prm["algorithm"],
                                  comm=comm, accumulate_dtype=prm["acc"],
                                  async_op=bool(case % 2), output=prm["output"], out=into)
        res = out.wait() if case % 2 else out
        for given, kept in zip((idx, val), inputs[RANK]):  # bitwise: NaN inputs stay NaN
            assert given.get().tobytes() == kept.tobytes(), f"input modified (case {prm})"
        if prm["output"] == "dense":
            assert isinstance(res, cupy.ndarray) and (into is None or res is into)
            got = sr.check_dense(res.get(), None, prm, inputs, P, case)
            digests.append(digest(got.indices, got.values))
            continue
        assert isinstance(res.indices, cupy.ndarray) and isinstance(res.values, cupy.ndarray)
        got = SparseResult(res.indices.get(), res.values.get(), res.n)
        sr.check(got, prm, inputs, P, case)
        digests.append(digest(got.indices, got.values))
        dense_regions += "split.presence" in comm.stats.by_op  # split's regions went dense
    every = WORLD.allgather(digests)
    assert all(d == every[0] for d in every), "sparse results differ across ranks"
    if RANK == 0:
        print(f"sparse results gathered as dense regions: {dense_regions}")


def topk_suite(comm, quick):
    import topk_results as tr

    def run_outcome(comm, x, k, alg, state=None, _run=tr.run_outcome):
        return host(_run(comm, cupy.asarray(x), k, alg, state))

    def topk_allreduce(x, k, _call=tr.topk_allreduce, **kwargs):
        return host(_call(cupy.asarray(x), k, **kwargs))

    tr.run_outcome, tr.topk_allreduce = run_outcome, topk_allreduce
    cases = [(2, 7, 3, "float64"), (4, 4099, 41, "float32"), (6, 300, 30, "float16")]
    for seed, n, k, dtype in cases[:2] if quick else cases:
        tr.check_case(comm, seed, n, k, dtype)
    steps = 3 if quick else 5  # refresh at even steps, non-refresh at odd ones
    native = tr.oktopk_sequence(comm, 11, 3000, 30, steps, padded=False)
    padded = tr.oktopk_sequence(comm, 11, 3000, 30, steps, padded=True)
    for (ai, av), (bi, bv) in zip(native, padded):
        assert np.array_equal(ai, bi) and np.array_equal(av, bv)
    tr.check_ties(comm)


def wire_suite(comm):
    """Wire formats on the device path: compact == coo bitwise (every sparse and top-k
    algorithm), rounded values identical on every rank."""
    from _common import digest

    rng = np.random.default_rng([5, RANK])
    idx = unique(rng.choice(4000, 300, replace=False)).astype(np.int32)
    val = rng.standard_normal((idx.size, 2)).astype(np.float32)
    digests = []
    for alg in cc.algorithms("sparse"):
        outs = [host(cc.sparse_allreduce(cupy.asarray(idx), cupy.asarray(val), 4000, comm=comm,
                                         algorithm=alg, wire=wire, wire_values=values))
                for wire, values in (("coo", None), ("compact", None), ("compact", "bfloat16"))]
        assert outs[0].indices.tobytes() == outs[1].indices.tobytes(), alg
        assert outs[0].values.tobytes() == outs[1].values.tobytes(), alg
        digests.append(digest(outs[2].indices, outs[2].values))
    for alg in cc.algorithms("topk"):
        states = [cc.TopkState(tau_prime=2, padded_allgather=True) for _ in range(2)]
        for t in range(3):
            x = cupy.asarray(np.random.default_rng([6, RANK, t]).standard_normal(3000)
                             .astype(np.float32))
            a, b = (host(cc.topk_allreduce(x, 30, algorithm=alg, comm=comm, state=st, wire=w))
                    for st, w in zip(states, ("coo", "compact")))
            assert a.indices.tobytes() == b.indices.tobytes(), (alg, t)
            assert a.values.tobytes() == b.values.tobytes(), (alg, t)
        comp = cc.TopkCompressor(3000, 0.01, algorithm=alg, comm=comm, wire="compact",
                                 wire_values="bfloat16")
        grads = [cupy.asarray(np.random.default_rng([7, RANK, t]).standard_normal(3000)
                              .astype(np.float32)) for t in range(3)]
        for t, grad in enumerate(grads):
            if t == 2:  # a checkpoint (the residual pickled through the host) steps alike
                restored = pickle.loads(pickle.dumps(comp))
                restored.comm = comm
                assert isinstance(restored.residual, cupy.ndarray), type(restored.residual)
                again = host(restored.step(grad))
            upd = host(comp.step(grad))
            digests.append(digest(upd.indices, upd.values))
        assert digest(again.indices, again.values) == digests[-1], alg
        assert host(restored.residual).tobytes() == host(comp.residual).tobytes(), alg
    every = WORLD.allgather(digests)
    assert all(d == every[0] for d in every), "rounded wire results differ across ranks"


def mode_suites():
    seed, ncases = int(sys.argv[2]), int(sys.argv[3])
    quick = "quick" in sys.argv[4:]
    comm = nccl_comm()
    from cupycoll.testing.emulation.kernels import LAUNCHES

    for name, suite in (("dense", lambda: dense_suite(comm, quick)),
                        ("sparse", lambda: sparse_suite(comm, seed, ncases)),
                        ("topk", lambda: topk_suite(comm, quick))):
        start = time.perf_counter()
        suite()
        check_logs()
        if RANK == 0:
            print(f"{name} suite: {time.perf_counter() - start:.1f} s")
    ran = {name.split("<")[0] for name in LAUNCHES}  # the cupy primitives ran the CUDA kernels
    assert REAL or {"cc_segment_fold", "cc_radix_histogram", "cc_rank_select"} <= ran, sorted(ran)


# ---------------------------------------------------------------- defects (failing first)
def sparse_case(seed=3):
    """Every rank's (indices, values) and the dense numpy sum over ranks (n = 50)."""
    parts = []
    for r in range(P):
        rng = np.random.default_rng([seed, r])
        idx = rng.choice(50, 6, replace=False).astype(np.int64)
        parts.append((idx, rng.integers(-9, 9, 6).astype(np.float32)))
    dense = np.zeros(50, np.float64)
    for idx, val in parts:
        dense[idx] += val
    want = unique(np.concatenate([i for i, _ in parts]))
    return parts, want, dense[want]


def check_sparse(res, want_idx, want_val):
    assert isinstance(res.values, cupy.ndarray)
    assert res.values.device.id == cupy.cuda.runtime.getDevice()
    assert np.array_equal(res.indices.get(), want_idx), res.indices.get()
    assert np.array_equal(res.values.get().astype(np.float64), want_val), res.values.get()


def mode_async_device():
    """Defect 1: the worker thread of async sparse_allreduce must use the communicator's GPU;
    an async call's delivery (alloc_fn's buffers filled, completion_fn) runs on its device
    whichever thread completes it and whatever device is current there."""
    import threading

    comm = nccl_comm()
    parts, want_idx, want_val = sparse_case()
    for algorithm in cc.algorithms("sparse"):
        idx, val = (cupy.asarray(a) for a in parts[RANK])
        work = cc.sparse_allreduce(idx, val, 50, algorithm=algorithm, comm=comm, async_op=True)
        check_sparse(work.wait(), want_idx, want_val)
    device, seen, got = comm.device_id, [], {}

    def alloc(nnz, index_dtype, values_shape, value_dtype, ctx):
        with cupy.cuda.Device(device):
            return cupy.empty(nnz, index_dtype), cupy.empty(values_shape, value_dtype)

    def done(indices, values, ctx):
        seen.append((values.device.id, cupy.cuda.runtime.getDevice()))

    idx, val = (cupy.asarray(a) for a in parts[RANK])
    work = cc.sparse_allreduce(idx, val, 50, comm=comm, async_op=True, alloc_fn=alloc,
                               completion_fn=done)

    def elsewhere():  # device 0 current in this thread, the call's is the rank's own
        cupy.cuda.Device(0).use()
        try:
            got["result"] = work.synchronize()
        except BaseException as exc:  # checked below, on the main thread
            got["error"] = exc

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert "error" not in got, got
    with cupy.cuda.Device(device):
        check_sparse(got["result"], want_idx, want_val)
    assert seen == [(device, device)], seen


def mode_async_order():
    """Defect 2: async sparse_allreduce beside the caller's own collectives: one launch order."""
    comm = nccl_comm(timeout=5.0)
    parts, want_idx, want_val = sparse_case()
    idx, val = (cupy.asarray(a) for a in parts[RANK])
    work = cc.sparse_allreduce(idx, val, 50, algorithm="allgather", comm=comm, async_op=True)
    if RANK == 0:
        time.sleep(0.3)  # the caller's next collective comes late here, early elsewhere
    x = cupy.full(4, RANK + 1.0, cupy.float32)
    assert cc.allreduce(x, comm=comm).get().tolist() == [P * (P + 1) / 2] * 4
    check_sparse(work.wait(), want_idx, want_val)


def mode_dup():
    """Defect 3: dup() on CuPy 13 (no commSplit); a failing dup raises BackendError."""
    comm = nccl_comm()
    twin = comm.dup()
    x = cupy.full(3, RANK + 1, cupy.int32)
    twin.allreduce(x, x, "sum").wait()
    assert x.get().tolist() == [P * (P + 1) // 2] * 3
    twin.close()
    comm.barrier()
    if os.environ.get("CC_EMU_CUPY", "14") != "13":  # non-blocking: dup makes a new init
        assert comm._handle.nonblocking and twin._handle.nonblocking
        real = cupy.cuda.nccl.NcclCommunicator

        class Broken(real):
            def __init__(self, *args):
                raise cupy.cuda.nccl.NcclError(5)

        cupy.cuda.nccl.NcclCommunicator = Broken
        try:
            err = expect_raises(BackendUnavailable, comm.dup)
        finally:
            cupy.cuda.nccl.NcclCommunicator = real
        assert "ncclCommInitRank failed" in str(err) and "INVALID_USAGE" in str(err), err


def mode_missing_peer():
    """Defect 4: the last rank never joins: the others' first collective stays in NCCL's
    connection handshake (ncclInProgress on the non-blocking communicator, the host is not
    blocked); CUPYCOLL_CONNECT_TIMEOUT ends it (CollectiveTimeout, no hang)."""
    from cupycoll.comm.nccl import NCCLCommunicator

    lonely = NCCLCommunicator(timeout=2.0)
    lonely.connect_timeout = 2.0
    if RANK != P - 1:
        start = time.monotonic()
        x = cupy.ones(4, cupy.float32)
        # the first rank whose watchdog fires aborts; a peer still blocked may see that abort
        # first, as NCCL's remote error (BackendError) instead of its own timeout
        err = expect_raises((CollectiveTimeout, BackendError),
                            lambda: cc.allreduce(x, comm=lonely))
        assert "allreduce" in str(err) and f"rank {RANK}" in str(err), err
        assert isinstance(err, CollectiveTimeout) or "REMOTE" in str(err), err
        assert time.monotonic() - start < 30, "the timeout fired far too late"
    napping_barrier()
    lonely.abort()


def mode_late_fetch():
    """Defect 7: a fetch given up on freed the pinned host buffer that its device-to-host copy,
    queued behind the failed NCCL operation, still writes: on the emulator the copy overwrote
    freed heap memory once the operation ended (malloc aborted, or a later WORLD.gather read
    stray bytes), on a GPU it overwrites what CuPy's pinned pool hands that block to next. The
    punctual ranks' fetch (16 KiB, past numpy's small-block cache, which hid it for the 480-byte
    agreement vectors before sparse/small.py) times out; then the last rank's fails at once on
    their abort (NCCL's remote error) when one of them is on another node, else (node-mates
    only: no remote error) on its own timeout. check_logs() fails if a rank freed a buffer
    before it knew the copy into it finished."""
    comm = nccl_comm(timeout=60.0)
    x = cupy.arange(4096, dtype=cupy.float32)
    comm.fetch(comm.allreduce(x, x, "sum"), x)  # connected
    napping_barrier()
    comm.timeout = 1.0
    fetch = lambda: comm.fetch(comm.allreduce(x, x, "sum"), x)  # noqa: E731
    if RANK != P - 1:
        expect_raises((CollectiveTimeout, BackendError), fetch)
    napping_barrier()
    if RANK == P - 1:
        err = expect_raises((CollectiveTimeout, BackendError), fetch)
        if any(r // DEVICES != RANK // DEVICES for r in range(P - 1)):  # NCCL's remote error
            assert isinstance(err, BackendError) and "REMOTE" in str(err), err
        else:  # only node-mates aborted: no remote error, its own timeout ends the wait
            assert isinstance(err, CollectiveTimeout), err
        del err
        gc.collect()  # the error's traceback held the fetch's frame
    napping_barrier()
    comm.abort()


def mode_peer_aborts():
    """Defect 4: without a timeout, a wait must still see NCCL's asynchronous error (a peer
    on another node aborted) instead of waiting forever for a kernel that spins. NCCL reports
    a dead peer across nodes only (socket proxies): run it with one device per node."""
    assert (P - 1) // DEVICES != 0, "the aborting rank must be on another node than rank 0"
    comm = nccl_comm(timeout=None)
    x = cupy.ones(4, cupy.float32)
    comm.allreduce(x, x, "sum").wait()  # connected
    if RANK == P - 1:
        comm.abort()
    else:
        err = expect_raises(BackendError, comm.allreduce(x, x, "sum").synchronize)
        assert "allreduce" in str(err), err
    napping_barrier()


def mode_init_fails():
    """Defect 4: ncclCommInitRank fails on the last rank: every rank raises, none waits."""
    from cupycoll.comm.nccl import NCCLCommunicator

    if RANK == P - 1:
        def broken(*args, **kwargs):
            raise cupy.cuda.nccl.NcclError(5)
        cupy.cuda.nccl.NcclCommunicator = broken
    start = time.monotonic()
    err = expect_raises(BackendUnavailable, NCCLCommunicator, timeout=3.0)
    assert f"rank {P - 1}" in str(err) or f"rank(s) [{P - 1}]" in str(err), err
    assert time.monotonic() - start < 30
    emu.release_blocked()  # the init threads of the others stop waiting for the last rank


def mode_init_given_up():
    """agreed_init past its timeout (the last rank's init takes 1.5 s, the timeout is 0.5 s):
    every rank raises CollectiveTimeout and aborts the communicator its init made, the last
    rank once its init thread has made it."""
    from cupycoll.comm._nccl_guard import agreed_init

    class Made:
        aborted = False

        def abort(self):
            self.aborted = True

    made = Made()

    def init():
        if RANK == P - 1:
            time.sleep(1.5)
        return made

    status = WORLD.Dup()
    expect_raises(cc.errors.CollectiveTimeout, agreed_init, status, init, 0.5, "fake init")
    time.sleep(2.0 if RANK == P - 1 else 0.1)
    assert made.aborted, f"rank {RANK}: the communicator of an init given up was not aborted"
    status.Free()


def mode_device_choice():
    """init() keeps a device the application made current (here: the other one); its timeout
    keyword reads as CUPYCOLL_TIMEOUT does (0 or less: none; text: seconds)."""
    chosen = DEVICES - 1 - RANK  # run with 3 devices per node: rank 0 picks 2, rank 1 picks 1
    cupy.cuda.Device(chosen).use()
    comm = cc.init("nccl", timeout=30.0)
    assert comm.device_id == chosen == cupy.cuda.runtime.getDevice(), (comm.device_id, chosen)
    x = cupy.full(2, 1.0, cupy.float32)
    assert cc.allreduce(x, comm=comm).get().tolist() == [float(P)] * 2
    from cupycoll.topk import Threshold

    g = np.random.default_rng(RANK).standard_normal(1 << 17).astype(np.float32)
    picked = []
    for device in (0, 1):  # a sampled selection of one length on two GPUs: the sample's
        with cupy.cuda.Device(device):  # positions are each device's own (before: device 1
            picked.append(Threshold().select(cupy.asarray(g), 1000).indices.get())  # read 0's)
    assert np.array_equal(*picked), [a.size for a in picked]
    for keyword, seconds in ((0, None), (-1, None), ("5", 5.0)):  # read as CUPYCOLL_TIMEOUT is
        made = cc.init("nccl", timeout=keyword)  # (before: 0 timed out the init at once)
        assert made.timeout == seconds, (keyword, made.timeout)
        assert cc.allreduce(x, comm=made).get().tolist() == [float(P)] * 2
        made.close()


def mode_auto_agrees():
    """init("auto"): NCCL only if every rank can use it (here the last rank cannot)."""
    import cupycoll.comm as comm_module

    if RANK == P - 1:
        comm_module.nccl_usable = lambda: False
    comm = cc.init("auto", timeout=10.0)
    assert comm.backend == "mpi", comm.backend
    assert cc.allreduce(np.ones(2) if comm.backend == "mpi" else cupy.ones(2),
                        comm=comm).sum() == 2 * P


# ---------------------------------------------------------------- the emulator's own rules
def mode_rules():
    """Every rule the emulator enforces fires on a program that breaks it (P = 2)."""
    from cupycoll.testing.emulation import DeviceMismatch, EmulationError, StreamOrderError

    comm = nccl_comm()
    comm.barrier()  # connected: the raw non-blocking calls below are issued at once
    raw, nccl = comm._comm, cupy.cuda.nccl
    f32, total = nccl.NCCL_FLOAT32, nccl.NCCL_SUM
    stream = cupy.cuda.get_current_stream().ptr
    # devices: another device's array, a kernel or NCCL call from a thread on the wrong device
    with cupy.cuda.Device(1 - comm.device_id):
        elsewhere = cupy.zeros(3, cupy.float32)
    expect_raises(DeviceMismatch, lambda: elsewhere + 1)
    x = cupy.arange(6, dtype=cupy.float32)
    expect_raises(DeviceMismatch, raw.allReduce, elsewhere.data.ptr, elsewhere.data.ptr, 3,
                  f32, total, stream)
    # cupy's own rules: no host arrays in device operations, no implicit conversion
    expect_raises(TypeError, lambda: x + np.ones(6, np.float32))
    expect_raises(TypeError, np.asarray, x)
    draw = cupy.random.default_rng(0).standard_normal(4, dtype=cupy.float32)  # a device array
    assert isinstance(draw, cupy.ndarray) and draw.dtype == cupy.float32, type(draw)
    expect_raises(TypeError, np.asarray, draw)
    # NCCL's rules: device memory only, counts in elements, in-place pointers exactly
    host = np.zeros(6, np.float32)
    expect_raises(EmulationError, raw.allReduce, host.ctypes.data, host.ctypes.data, 6, f32,
                  total, stream)
    expect_raises(EmulationError, raw.allReduce, x.data.ptr, x.data.ptr, x.nbytes, f32,
                  total, stream)  # bytes where NCCL counts elements
    expect_raises(EmulationError, raw.allReduce, x.data.ptr, x.data.ptr + 4, 5, f32, total,
                  stream)  # overlapping, not in place
    expect_raises(TypeError, raw.allReduce, x.data.ptr, x.data.ptr, 6.0, f32, total, stream)
    # streams: a result read on another stream before its work is ordered there
    side = cupy.cuda.Stream(non_blocking=True)
    y = cupy.zeros(6, cupy.float32)
    expect_raises(StreamOrderError, raw.allReduce, x.data.ptr, y.data.ptr, 6, f32, total,
                  side.ptr)  # x and y were written on the null stream, unordered with side
    ready = cupy.cuda.Event()
    ready.record()
    side.wait_event(ready)
    with side:
        raw.allReduce(x.data.ptr, y.data.ptr, 6, f32, total, side.ptr)
        event = cupy.cuda.Event()
        event.record(side)
    expect_raises(StreamOrderError, lambda: y + 1)  # no wait: the read is a race
    cupy.cuda.get_current_stream().wait_event(event)
    assert (y + 0).get().tolist() == [P * v for v in range(6)]  # ordered: correct
    with side:  # the blocking read waited for the null stream: y is free to overwrite
        raw.allReduce(x.data.ptr, y.data.ptr, 6, f32, total, side.ptr)
    cupy.cuda.get_current_stream().wait_event(side.record())
    y * 1  # a read of y on the null stream that the host does not wait for
    expect_raises(StreamOrderError, raw.allReduce, x.data.ptr, y.data.ptr, 6, f32, total,
                  side.ptr)  # overwriting y on side while the null stream's read is unordered
    side.wait_event(cupy.cuda.get_current_stream().record())
    with side:
        raw.allReduce(x.data.ptr, y.data.ptr, 6, f32, total, side.ptr)
    event.record(side)
    event.synchronize()  # the host knows it is done: reading is fine
    assert y.get().tolist() == [P * v for v in range(6)]
    # host synchronizations reach cupycoll's one sync counter
    with count_host_syncs() as syncs:
        int(y.sum()), y[y > 1], cupy.flatnonzero(y), y.get(), y + 1, y.sum()
    kinds = dict(syncs.by_kind)
    assert kinds == {"scalar": 1, "boolean mask": 1, "flatnonzero (data-dependent size)": 1,
                     "get": 1}, kinds
    check_p2p_order(comm, x)
    # the logs: ranks calling different collectives are caught at the end
    z = cupy.zeros(4, cupy.int32 if RANK else cupy.float32)
    comm.allreduce(z, z, "sum").wait()
    err = expect_raises(EmulationError, emu.check_logs)
    assert "differ across ranks" in str(err), err
    check_abort_rules(x, stream)


def check_p2p_order(comm, x):
    """Point-to-point calls take part in the launch order across communicators (NCCL's kernels
    block: rank 0 exchanging on one communicator before a collective on another, rank 1 after
    it, can hang a GPU); the calls of one group count as one launch (before: send and recv
    were left out of the order, so this passed)."""
    from cupycoll.testing.emulation import EmulationError

    twin = comm.dup()
    first, second = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    peer = (RANK + 1) % P
    got = cupy.zeros_like(x)
    cupy.cuda.runtime.deviceSynchronize()

    def exchange():
        with first:
            comm.exchange([(peer, x)], [((RANK - 1) % P, got)]).wait()

    def allreduce():
        with second:
            twin.allreduce(x, cupy.empty_like(x), "sum").wait()

    def both(order):
        for step in order:
            step()
        comm.synchronize(), twin.synchronize()

    both((exchange, allreduce))  # connected (lazily, as NCCL does), in one order: fine
    emu.check_logs()
    both((exchange, allreduce) if RANK == 0 else (allreduce, exchange))
    err = expect_raises(EmulationError, emu.check_logs)
    assert "launch order of what two ranks share" in str(err), err
    # legal: a send in a group on rank 0, the matching plain recv on rank 1 (one launch each)
    nccl, raw = cupy.cuda.nccl, comm._comm
    stream = cupy.cuda.get_current_stream().ptr
    if RANK == 0:
        nccl.groupStart()
        raw.send(x.data.ptr, x.size, nccl.NCCL_FLOAT32, 1, stream)
        nccl.groupEnd()
    elif RANK == 1:
        raw.recv(got.data.ptr, got.size, nccl.NCCL_FLOAT32, 0, stream)
    cupy.cuda.runtime.deviceSynchronize()
    emu.check_logs()
    twin.close()


def check_abort_rules(x, stream):
    """NCCL allows ncclCommAbort at any point only on a non-blocking communicator: aborting a
    blocking one while another thread is inside its call (here: blocked connecting to a peer
    that never calls) is recorded and fails check_logs; a non-blocking one returns
    ncclInProgress at once (CuPy raises KeyError(7)), stays in progress while the peer is
    missing, and may be aborted from any thread."""
    import threading

    from cupycoll.testing.emulation import EmulationError
    from cupycoll.comm._nccl_config import in_progress
    from cupycoll.comm.nccl import NCCLCommunicator

    nccl = cupy.cuda.nccl
    f32, total = nccl.NCCL_FLOAT32, nccl.NCCL_SUM
    uid = WORLD.bcast(nccl.get_unique_id() if RANK == 0 else None)
    blocking = nccl.NcclCommunicator(P, uid, RANK)
    if RANK == 0:
        timer = threading.Timer(0.5, blocking.abort)
        timer.start()
        expect_raises(nccl.NcclError, blocking.allReduce, x.data.ptr, x.data.ptr, 6, f32,
                      total, stream)
        timer.join()
    napping_barrier()
    blocking.abort()
    err = expect_raises(EmulationError, emu.check_logs)
    assert ("ncclCommAbort" in str(err) and "blocking communicator" in str(err)) == (RANK == 0) \
        or "world rank 0" in str(err), err

    fresh = NCCLCommunicator(timeout=None)
    assert fresh._handle.nonblocking, "CuPy 14's NcclConfig makes non-blocking communicators"
    if RANK == 0:
        started = time.monotonic()
        try:
            fresh._comm.allReduce(x.data.ptr, x.data.ptr, 6, f32, total, stream)
        except KeyError as exc:  # what CuPy's NcclError(7) raises
            assert in_progress(exc), exc
        else:
            raise AssertionError("an unconnected non-blocking call must return ncclInProgress")
        assert time.monotonic() - started < 0.5, "a non-blocking call must not block the host"
        time.sleep(0.3)
        expect_raises(KeyError, fresh._comm.check_async_error)  # still connecting
        timer = threading.Timer(0.1, fresh._handle.abort)
        timer.start()
        timer.join()
    napping_barrier()
    fresh.abort()
    emu.check_logs()  # aborting a non-blocking communicator from another thread is allowed


def synced(result, comm):
    """``result`` once the host has seen every operation of ``comm`` complete (dense calls on
    NCCL return in stream order, like NCCL's own; the timeout is met in the host wait or by
    the communicator's watchdog, whichever sees it first)."""
    comm.synchronize()
    return result


def mode_late_named():
    """Issue 12 on NCCL: after good calls, the last rank is late; the others' CollectiveTimeout
    names it (arrival board), the communicator is then dead at once, and the late rank fails
    (its peers aborted: nothing to match)."""
    comm = nccl_comm(timeout=1.5)
    x = cupy.ones(4, cupy.float32)
    for _ in range(2):
        cc.allreduce(x, comm=comm)
    named = False
    if RANK == P - 1:
        time.sleep(4)  # its peers aborted: their pending operations are gone (strict NCCL)
        expect_raises((CollectiveTimeout, BackendError), lambda: synced(cc.allreduce(x, comm=comm),
                                                                       comm))
    else:
        start = time.monotonic()
        # the first rank to time out aborts its NCCL communicator; a peer still waiting may see
        # that abort (NCCL's remote error) before its own timeout, as on real NCCL
        err = expect_raises((CollectiveTimeout, BackendError),
                            lambda: synced(cc.allreduce(x, comm=comm), comm))
        if isinstance(err, CollectiveTimeout):
            assert err.missing_ranks == [P - 1], (err.missing_ranks, str(err))
            assert err.op_name == "allreduce" and 1.4 < time.monotonic() - start < 10, err
            named = True
        else:
            assert "REMOTE" in str(err), err
        again = time.monotonic()
        expect_raises((CollectiveTimeout, BackendError, BackendUnavailable),
                      lambda: cc.allreduce(x, comm=comm))
        assert time.monotonic() - again < 0.5, "a dead communicator must raise at once"
    napping_barrier()  # the late rank is still asleep
    assert P == 1 or any(WORLD.allgather(named)), "no rank named the late one"
    napping_barrier()


def mode_late_after_abort():
    """Issue 12, strict NCCL: the last rank calls only after its peers timed out and aborted.
    Their pending operations are cancelled with their communicator, so the late call (a
    collective, then a point-to-point exchange) must not complete against them: it raises
    (the peers' abort as NCCL's remote error, or its own timeout), it never returns data."""
    steps = {"allreduce": lambda c: synced(cc.allreduce(cupy.ones(4, cupy.float32), comm=c),
                                           c).get(),
             "exchange": lambda c: c.exchange([(r, cupy.ones(4)) for r in range(P) if r != RANK],
                                              [(r, cupy.empty(4)) for r in range(P)
                                               if r != RANK]).synchronize()}
    seen = {}
    for verb, call in steps.items():
        comm = nccl_comm(timeout=30.0)
        call(comm)  # connected (the late call needs no handshake), kernels compiled
        comm.timeout = 1.0
        if RANK == P - 1:
            napping_barrier()  # every peer has timed out and aborted
            start = time.monotonic()
            try:
                got = call(comm)
            except (CollectiveTimeout, BackendError) as exc:
                seen[verb] = (type(exc).__name__, round(time.monotonic() - start, 2), str(exc))
            else:
                raise AssertionError(f"late {verb} completed against aborted peers: {got}")
        else:
            expect_raises((CollectiveTimeout, BackendError), lambda: call(comm))
            napping_barrier()
        napping_barrier()
        comm.abort()
    if RANK == P - 1:
        print(f"late rank after its peers aborted: {seen}")


def late_verbs():
    """Every front door on NCCL: name -> call(comm, compressors). Roots make a punctual rank
    wait for the late one (broadcast from it, reduce to a punctual rank)."""
    late, n = P - 1, 64

    def inputs():  # on the communicator's device (current once it exists)
        x = cupy.arange(n, dtype=cupy.float32) + RANK
        return x, cupy.arange(RANK, n, P, dtype=cupy.int64)

    def compress(c, state):
        x, _ = inputs()
        comp = state.setdefault(id(c), cc.TopkCompressor(n, 0.25, comm=c))
        return comp.step(x)

    return {  # dense calls are stream-ordered: the host waits in comm.synchronize()
        "allreduce": lambda c, st: synced(cc.allreduce(inputs()[0], comm=c), c),
        "broadcast": lambda c, st: synced(cc.broadcast(inputs()[0], root=late, comm=c), c),
        "reduce": lambda c, st: synced(cc.reduce(inputs()[0], root=0, comm=c), c),
        "allgather": lambda c, st: synced(cc.allgather(inputs()[0], comm=c), c),
        "reduce_scatter": lambda c, st: synced(cc.reduce_scatter(inputs()[0][:4 * P], comm=c),
                                               c),
        "sparse_allreduce": lambda c, st: cc.sparse_allreduce(
            inputs()[1], inputs()[0][:inputs()[1].shape[0]], n, comm=c),
        "sparse_allreduce/async": lambda c, st: cc.sparse_allreduce(
            inputs()[1], inputs()[0][:inputs()[1].shape[0]], n, comm=c,
            async_op=True).synchronize(),
        "topk_allreduce": lambda c, st: cc.topk_allreduce(inputs()[0], 8, comm=c),
        "TopkCompressor.step": compress,
        "allgatherv": lambda c, st: synced(c.allgatherv(inputs()[0], [n] * P), c),
        "barrier": lambda c, st: c.barrier(),
        "exchange": lambda c, st: late_star(c, inputs()[0]),
    }


def late_star(comm, x):
    """The late rank sends ``x`` to every other rank, which receives only from it (its
    timeout names the one peer that owes it a message)."""
    late = P - 1
    got = [cupy.empty_like(x) for _ in range(P)]
    sends = [(r, x) for r in range(P) if r != late] if RANK == late else []
    recvs = [(late, got[late])] if RANK != late else []
    comm.exchange(sends, recvs, "exchange").synchronize()


def mode_late_verbs():
    """Issue 12 on NCCL, every front door, in one launch: per verb a fresh communicator
    (cc.init()), one good call with every rank and a generous timeout (connects, compiles the
    kernels: a short timeout must not race that), then CC_EMU_LATE_TIMEOUT seconds and the last
    rank late. It joins only after every punctual rank raised: they raise CollectiveTimeout
    naming it (missing_ranks, op_name), or NCCL's remote error when a peer's abort came first
    (at least one names it); a dead communicator raises at once; the late call never completes
    against the aborted peers (strict NCCL). Rank 0 prints one line per verb."""
    timeout = float(os.environ.get("CC_EMU_LATE_TIMEOUT", "1.5"))
    rows = []
    for verb, call in late_verbs().items():
        name, state = verb.split("/")[0], {}
        comm = nccl_comm(timeout=60.0)
        call(comm, state)  # all present: connection, kernels, compressor state
        napping_barrier()
        comm.timeout = timeout
        if RANK == P - 1:
            napping_barrier()  # every punctual rank has raised (or completed: reduce non-roots)
            start = time.monotonic()
            try:
                call(comm, state)
                outcome = "completed"
            except (CollectiveTimeout, BackendError, BackendUnavailable) as exc:
                outcome = type(exc).__name__
                if "REMOTE" in str(exc):  # the communicator died of NCCL's error
                    err = expect_raises(BackendError, lambda: call(comm, state))
                    assert "NCCL failed" in str(err), f"{verb}: not dead of it: {err!r}"
            took = time.monotonic() - start
            assert outcome != "completed", f"late {verb} completed against aborted peers"
        else:
            start = time.monotonic()
            try:
                call(comm, state)
                outcome = "completed"
            except CollectiveTimeout as exc:
                assert exc.missing_ranks == [P - 1] and exc.op_name == name, (verb, str(exc))
                outcome = f"CollectiveTimeout{exc.missing_ranks}"
            except BackendError as exc:
                assert "REMOTE" in str(exc), (verb, str(exc))
                outcome = "BackendError(remote)"
            took = time.monotonic() - start
            if outcome.startswith("CollectiveTimeout"):
                assert 0.9 * timeout <= took <= timeout + 15, (verb, took)
            if outcome != "completed":
                again = time.monotonic()
                err = expect_raises((CollectiveTimeout, BackendError, BackendUnavailable),
                                    lambda: call(comm, state))
                assert time.monotonic() - again < 0.5, "a dead communicator must raise at once"
                assert outcome != "BackendError(remote)" or "NCCL failed" in str(err), \
                    f"{verb}: not dead of NCCL's error: {err!r}"
            else:
                assert name == "reduce" and RANK != 0, f"{verb} completed without the late rank"
            napping_barrier()
        every = WORLD.gather((outcome, took), root=0)
        if RANK == 0:
            assert any(o.startswith("CollectiveTimeout") for o, _ in every), \
                f"{verb}: no rank named the late one: {every}"
            rows.append(f"LATE {verb:<24} P={P} timeout={timeout:g}s  " + ", ".join(
                f"r{r}: {o} {t:.2f}s" for r, (o, t) in enumerate(every)))
        napping_barrier()
        comm.abort()
    if RANK == 0:
        print("\n".join(rows))


def mode_interrupt():
    """Issue 12 on NCCL: a wait without a timeout raises KeyboardInterrupt within 1 s of SIGINT
    (rank 0 waits on an allreduce the others join only 1.5 s later)."""
    import signal
    import threading

    comm = nccl_comm(timeout=None if RANK == 0 else 20.0)
    x = cupy.ones(4, cupy.float32)
    cc.allreduce(x, comm=comm)  # connected
    if RANK == 0:
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        start = time.monotonic()
        timer.start()
        expect_raises(KeyboardInterrupt, lambda: synced(cc.allreduce(x, comm=comm), comm))
        assert time.monotonic() - start < 1.3, time.monotonic() - start
    else:
        time.sleep(1.5)
        try:  # rank 0 left its operation pending (kept alive) or aborted it: either is fine
            cc.allreduce(x, comm=comm)
        except (BackendError, CollectiveTimeout, BackendUnavailable):
            pass
    napping_barrier()
    comm.abort()


def mode_wire():
    wire_suite(nccl_comm())
    check_logs()


def mode_wrong_device():
    """The last rank passes an array on the other GPU: every front door that validates
    collectively raises InvalidArgument on every rank, naming the argument and that rank
    (its NCCL calls would read it on the wrong device; one rank alone used to raise)."""
    from cupycoll.errors import InvalidArgument

    comm = nccl_comm()
    comm.barrier()  # connected: a rank that raised alone would leave the others waiting
    bad = RANK == P - 1

    def placed(a):
        if not bad:
            return cupy.asarray(a)
        with cupy.cuda.Device(1 - comm.device_id):
            return cupy.asarray(a)

    idx, val = np.array([RANK, 5]), np.array([1.0, 2.0], np.float32)
    calls = {
        "indices": lambda: cc.sparse_allreduce(placed(idx), cupy.asarray(val), 20, comm=comm),
        "values": lambda: cc.sparse_allreduce(cupy.asarray(idx), placed(val), 20, comm=comm,
                                              algorithm="dense"),
        "out": lambda: cc.sparse_allreduce(cupy.asarray(idx), cupy.asarray(val), 20, comm=comm,
                                           output="dense", out=placed(np.zeros(20, np.float32))),
        "x": lambda: cc.topk_allreduce(placed(np.arange(10, dtype=np.float32)), 3, comm=comm),
        "grad": lambda: cc.TopkCompressor(10, 0.3, comm=comm).step(
            placed(np.arange(10, dtype=np.float32))),
    }
    for argument, call in calls.items():
        err = expect_raises(InvalidArgument, call)
        assert err.argument == argument and err.rank == P - 1, (argument, err)
    # the dense verbs name it on that rank; with CUPYCOLL_DEBUG every other rank raises too
    dense = {"x": lambda: cc.allreduce(placed(np.ones(4, np.float32)), comm=comm),
             "out": lambda: cc.allgather(cupy.ones(2, cupy.float32), comm=comm,
                                         out=placed(np.zeros(2 * P, np.float32)))}
    os.environ["CUPYCOLL_DEBUG"] = "1"
    try:
        for argument, call in dense.items():
            err = expect_raises(InvalidArgument if bad else MismatchError, call)
            assert not bad or (err.argument, err.rank) == (argument, P - 1), (argument, err)
        # a thread whose current device is not the communicator's (a new thread starts on
        # device 0): with arrays on the right device, the call names "device" there
        x = cupy.ones(4, cupy.float32)
        box: dict = {}

        def in_thread():
            try:
                box["result"] = cc.allreduce(x, comm=comm)
            except Exception as exc:  # noqa: BLE001 - examined below
                box["error"] = exc

        thread = threading.Thread(target=in_thread)
        thread.start()
        thread.join()
        if any(r % DEVICES for r in range(P)):  # some rank's device is not 0
            err = box.get("error")
            if RANK % DEVICES:
                assert isinstance(err, InvalidArgument) and err.argument == "device", box
            else:
                assert isinstance(err, MismatchError), box
    finally:
        del os.environ["CUPYCOLL_DEBUG"]
    comm.synchronize()


def mode_dense_views():
    """``out`` overlapping ``x`` other than in place, which NCCL leaves undefined (the emulator
    raises on it): every verb reads a copy of ``x`` there, and in place stays in place. A
    result the completer thread synchronized (``get_future``) is read by the main thread with
    no wait of its own, as on a GPU."""
    comm = nccl_comm()
    n, m, other = 4 * P, 4, (RANK + 1) % P
    xs = [np.arange(n, dtype=np.float32) % 7 + q for q in range(P)]
    total = np.sum(xs, axis=0)

    def shifted():  # x at base[:n], out at base[1:]: a partial overlap
        base = cupy.zeros(n + 1, cupy.float32)
        base[:n] = cupy.asarray(xs[RANK])
        return base

    base = shifted()
    cc.allreduce(base[:n], out=base[1:], comm=comm)
    assert np.array_equal(base[1:].get(), total)
    base = shifted()
    cc.broadcast(base[:n], root=P - 1, out=base[1:], comm=comm)
    assert np.array_equal(base[1:].get(), xs[P - 1])
    base = shifted()
    cc.reduce(base[:n], root=0, out=base[1:] if RANK == 0 else None, comm=comm)
    assert RANK != 0 or np.array_equal(base[1:].get(), total)
    for block in (RANK, other):  # in place, then x at another rank's block of out
        out = cupy.zeros(n * P, cupy.float32)
        out[block * n:(block + 1) * n] = cupy.asarray(xs[RANK])
        cc.allgather(out[block * n:(block + 1) * n], out=out, comm=comm)
        assert np.array_equal(out.get(), np.concatenate(xs)), block
        x = cupy.asarray(xs[RANK])
        cc.reduce_scatter(x, out=x[block * m:(block + 1) * m], comm=comm)
        assert np.array_equal(x[block * m:(block + 1) * m].get(), total[RANK * m:(RANK + 1) * m])
    work = cc.allreduce(cupy.asarray(xs[RANK]), comm=comm, async_op=True)
    result = work.get_future().result(timeout=60)
    assert work.is_completed() and np.array_equal(result.get(), total)
    comm.synchronize()


MODES = {"wire": mode_wire, "late_named": mode_late_named, "late_after_abort": mode_late_after_abort,
         "late_verbs": mode_late_verbs, "interrupt": mode_interrupt, "suites": mode_suites, "rules": mode_rules, "async_device": mode_async_device,
         "async_order": mode_async_order, "dup": mode_dup, "missing_peer": mode_missing_peer,
         "peer_aborts": mode_peer_aborts, "late_fetch": mode_late_fetch, "init_fails": mode_init_fails,
         "init_given_up": mode_init_given_up,
         "device_choice": mode_device_choice, "auto_agrees": mode_auto_agrees,
         "wrong_device": mode_wrong_device, "dense_views": mode_dense_views}
from cupycoll.primitives._accel import ready  # noqa: E402

ready()  # numba's import in the background would hold the GIL in the timed checks below
for mode in MODE.split(","):  # several modes per launch: each launch costs seconds
    MODES[mode]()
    check_logs()
napping_barrier()
if RANK == 0:
    print(f"gpu_emulated {MODE}: ok on {P} ranks (NCCL calls checked against the real "
          f"binding of CuPy {cupy.__version__ if REAL else emu.real_cupy_version()})")
