"""cupycoll.torch: DDP hooks and the sparse-embedding helper (torch CPU from the test extra).

The DDP runs (gloo for DDP's own bookkeeping) are in tests/workers/torch_ddp.py (2 and 4 ranks,
which also run every check of torch_sparse.py) and tests/workers/torch_sparse.py (1 and 3
ranks: sparse embeddings through both hooks, cct.sparse_allreduce against gloo), launched after
the backend's checks in test_torch_backend.py's jobs; here: in-process checks on one rank.
"""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import cupycoll as cc
import cupycoll.torch as cct
from cupycoll.errors import InvalidArgument, InvalidType
from cupycoll.torch._tensors import future_of
from tests._mpi import ROOT, mpiexec, run_mpi


def test_importing_cupycoll_does_not_import_torch():
    code = "import sys, cupycoll; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_work_futures_and_async_compressor(nprocs):
    run_mpi(nprocs, "async_futures.py", timeout=300)


class FakeBucket:
    """What DDP hands a hook (dist.GradBucket's methods the hooks use)."""

    def __init__(self, index, params, last=True):
        self._index, self._params, self._last = index, params, last
        sparse = params[0].grad.is_sparse  # DDP gives a sparse parameter a bucket of its own
        self._buffer = params[0].grad if sparse else torch.cat([p.grad.reshape(-1)
                                                                for p in params])

    def index(self):
        return self._index

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self._params

    def is_last(self):
        return self._last


def params_with_grads(sizes, seed):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    return params


def test_rebuilt_buckets_inherit_their_parameters_residuals():
    cc.init("mpi")
    a, b, c = params_with_grads([30, 20, 50], seed=0)
    state = cct.TopkHookState(density=0.1, warmup_steps=1)
    for bucket in (FakeBucket(0, [a, b], last=False), FakeBucket(1, [c])):  # warm-up
        cct.topk_hook(state, bucket).wait()
    first = [FakeBucket(0, [a, b], last=False), FakeBucket(1, [c])]
    for bucket in first:
        cct.topk_hook(state, bucket).wait()
    old = {id(p): r for bucket, key in zip(first, [(0, 50), (1, 50)])
           for p, r in zip(bucket.parameters(),
                           np.split(np.asarray(state.compressors[key].residual),
                                    np.cumsum([q.numel() for q in bucket.parameters()])[:-1]))}
    rebuilt = FakeBucket(0, [c, a], last=False)  # DDP re-buckets: c and a together, b alone
    fresh = state.compressor(rebuilt)
    assert np.array_equal(fresh.residual, np.concatenate([old[id(c)], old[id(a)]]))
    alone = state.compressor(FakeBucket(1, [b]))
    assert np.array_equal(alone.residual, old[id(b)])
    assert set(state.compressors) == {(0, 80), (1, 20)}
    (d,) = params_with_grads([20], seed=9)  # the key (1, 20) now holds another parameter (a
    other = state.compressor(FakeBucket(1, [d]))  # second DDP over this state): b's residual
    assert not np.asarray(other.residual).any()  # is not d's, it waits for b
    assert np.array_equal(state.compressor(FakeBucket(1, [b])).residual, old[id(b)])


def test_rebuilt_float64_buckets_keep_their_residuals_bits():
    """A float64 bucket's residual moves to its rebuilt bucket in float64 (no mass rounded)."""
    cc.init("mpi")
    a, b = (torch.nn.Parameter(torch.zeros(n, dtype=torch.float64)) for n in (30, 20))
    for p, seed in ((a, 5), (b, 6)):
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(seed),
                             dtype=torch.float64) / 3
    state = cct.TopkHookState(density=0.1, warmup_steps=1)
    for buckets in ([FakeBucket(0, [a, b])], [FakeBucket(0, [a, b])]):  # warm-up, then a step
        for bucket in buckets:
            cct.topk_hook(state, bucket).wait()
    before = np.asarray(state.compressors[(0, 50)].residual)
    assert before.dtype == np.float64
    moved = state.compressor(FakeBucket(0, [b, a]))  # re-bucketed: b first
    assert np.array_equal(np.asarray(moved.residual), np.concatenate([before[30:], before[:30]]))


def test_hook_writes_the_averaged_sparse_update_densely():
    cc.init("mpi")
    (p,) = params_with_grads([200], seed=1)
    state = cct.TopkHookState(density=0.05, warmup_steps=1)
    grad = p.grad.clone()
    warm = cct.topk_hook(state, FakeBucket(0, [p])).wait()
    assert torch.equal(warm, grad)  # one rank: the average is the gradient
    p.grad = grad.clone()
    out = cct.topk_hook(state, FakeBucket(0, [p])).wait()
    top = torch.topk(grad.abs(), 10).indices
    expected = torch.zeros_like(grad)
    expected[top] = grad[top]
    assert torch.equal(out, expected)
    residual = np.asarray(state.compressors[(0, 200)].residual)
    assert np.array_equal(residual + out.numpy(), grad.numpy())  # nothing lost


def test_hook_with_compact_bfloat16_wire_loses_nothing():
    """wire="compact" + bfloat16 values on one rank: nothing travels, so nothing is rounded
    (rounding happens on transfers; the DDP worker covers 2 and 4 ranks), and the residual
    keeps the rest, so residual + update == gradient bit for bit."""
    cc.init("mpi")
    (p,) = params_with_grads([300], seed=2)
    state = cct.TopkHookState(density=0.05, warmup_steps=1, wire="compact",
                              wire_values="bfloat16")
    grad = p.grad.clone()
    cct.topk_hook(state, FakeBucket(0, [p])).wait()
    p.grad = grad.clone()
    out = cct.topk_hook(state, FakeBucket(0, [p])).wait()
    top = torch.topk(grad.abs(), 15).indices
    assert set(torch.nonzero(out).flatten().tolist()) <= set(top.tolist())
    assert torch.equal(out[top], grad[top])
    residual = np.asarray(state.compressors[(0, 300)].residual)
    assert np.array_equal(residual + out.numpy(), grad.numpy())


def bfloat16_params(sizes, seed):
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.bfloat16)) for s in sizes]
    for q, r in zip(params, params_with_grads(sizes, seed)):
        q.grad = r.grad.to(torch.bfloat16)
    return params


def test_bfloat16_buckets_through_both_hooks():
    """One rank: the average is the gradient, so the float32 round trip must give it back bit
    for bit; top-k sends the gradient's own top entries (exact in float32) and the float32
    residual keeps the rest exactly. The DDP worker covers 2 and 4 ranks."""
    cc.init("mpi")
    (p,) = bfloat16_params([300], seed=3)
    grad = p.grad.clone()
    bucket = FakeBucket(0, [p])
    out = cct.allreduce_hook(None, bucket).wait()
    assert out is bucket.buffer() and out.dtype == torch.bfloat16 and torch.equal(out, grad)
    state = cct.TopkHookState(density=0.05, warmup_steps=1)
    assert torch.equal(cct.topk_hook(state, FakeBucket(0, [p])).wait(), grad)  # warm-up
    out = cct.topk_hook(state, FakeBucket(0, [p])).wait()
    top = torch.topk(grad.float().abs(), 15).indices
    expected = torch.zeros_like(grad)
    expected[top] = grad[top]
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
    residual = np.asarray(state.compressors[(0, 300)].residual)
    assert residual.dtype == np.float32
    assert np.array_equal(residual + out.float().numpy(), grad.float().numpy())


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int32, torch.uint8])
def test_hooks_reject_bucket_dtypes_they_cannot_reduce(dtype):
    cc.init("mpi")
    bucket = FakeBucket(0, [SimpleNamespace(grad=torch.ones(4, dtype=dtype))])
    state = cct.TopkHookState(density=0.5)
    for hook, hook_state in ((cct.allreduce_hook, None), (cct.topk_hook, state)):
        with pytest.raises(InvalidType, match=f"'bucket' on rank 0 .*{dtype}") as info:
            hook(hook_state, bucket)
        assert info.value.got == str(dtype)
    assert state.iteration == 0  # rejected before it counts


def test_futures_of_cuda_buckets_carry_their_device(monkeypatch):
    """DDP's wait synchronises its stream with the value only when the Future names the
    device; CPU buckets name none. (No GPU here: a stand-in bucket claims CUDA.)"""
    made = []

    class RecordingFuture:
        def __init__(self, *, devices=None):
            made.append(devices)

    class PendingWork:
        def add_done_callback(self, fn):
            pass

    monkeypatch.setattr(torch.futures, "Future", RecordingFuture)
    cuda = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 1))
    future_of(PendingWork(), lambda _: None, cuda)
    future_of(PendingWork(), lambda _: None, torch.zeros(2))
    assert made == [[torch.device("cuda", 1)], None]


def test_hooks_name_a_state_that_is_not_theirs():
    """torch's own hooks take the process group as their state: given one (here any other
    object), cupycoll's hooks say what they take instead of failing inside a call."""
    for hook, state in ((cct.allreduce_hook, object()), (cct.topk_hook, None),
                        (cct.topk_hook, object())):
        with pytest.raises(InvalidType, match="'state'.*no process group"):
            hook(state, None)


@pytest.mark.parametrize("kwargs", [{"density": 0.0}, {"density": 1.5},
                                    {"density": 0.1, "warmup_steps": 0},
                                    {"density": 0.1, "wire": "zip"},
                                    {"density": 0.1, "wire_values": "int8"}])
def test_hook_state_rejects_bad_arguments(kwargs):
    cc.init("mpi")
    with pytest.raises(InvalidArgument):
        cct.TopkHookState(**kwargs)


def test_sparse_helper_one_rank_and_errors():
    cc.init("mpi")
    i = torch.tensor([[3, 1, 3]])
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    out = cct.sparse_allreduce(torch.sparse_coo_tensor(i, v, (5, 2), check_invariants=True))
    assert out.is_coalesced() and out.indices().tolist() == [[1, 3]]
    assert out.values().tolist() == [[3.0, 4.0], [6.0, 8.0]]
    with pytest.raises(InvalidType, match="'tensor' on rank 0"):
        cct.sparse_allreduce(torch.zeros(3))
    with pytest.raises(InvalidArgument, match="'tensor' on rank 0"):
        cct.sparse_allreduce(torch.zeros(2, 2).to_sparse())
    with pytest.raises(InvalidArgument, match="'out'"):  # cupycoll's check, on every rank
        cct.sparse_allreduce(torch.sparse_coo_tensor(i, v, (5, 2), check_invariants=True),
                             output="dense",
                             out=torch.zeros(4, 2))
    with pytest.raises(InvalidType, match="'out' on rank 0.*torch.float32.*bfloat16"):
        cct.sparse_allreduce(torch.sparse_coo_tensor(i, v, (5, 2), check_invariants=True),
                             output="dense", out=torch.zeros(5, 2, dtype=torch.bfloat16))
    bf16 = torch.sparse_coo_tensor(i, v, (5, 2), check_invariants=True).to(torch.bfloat16)
    with pytest.raises(InvalidArgument, match=r"'out' on rank 0.*shape \(5, 2\)"):  # (before:
        cct.sparse_allreduce(bf16, output="dense",  # a dtype error naming bfloat16 twice)
                             out=torch.zeros(5, 3, dtype=torch.bfloat16))
    with pytest.raises(InvalidType, match="'out' on rank 0.*torch.bfloat16"):  # (before: a
        cct.sparse_allreduce(bf16, output="dense", out=torch.zeros(5, 2))  # float32 result)
    cube = torch.sparse_coo_tensor(i, torch.ones(3, 2, 2, 2), (5, 2, 2, 2), check_invariants=True)
    with pytest.raises(InvalidArgument, match="'out' on rank 0.*contiguous"):  # (before: a
        cct.sparse_allreduce(cube, output="dense",  # shape (5, 8) the caller never gave)
                             out=torch.zeros(5, 2, 2, 2).to(memory_format=torch.channels_last))
    with pytest.raises(InvalidType, match="'async_op' on rank 0 must be True or False"):
        cct.sparse_allreduce(torch.sparse_coo_tensor(i, v, (5, 2), check_invariants=True),
                             async_op="no")


def sparse_grad(seed, dtype=torch.float32, rows=50, tokens=40):
    """An nn.Embedding(sparse=True) gradient: uncoalesced, duplicate rows."""
    gen = torch.Generator().manual_seed(seed)
    emb = torch.nn.Embedding(rows, 3, sparse=True).to(dtype)
    idx = torch.randint(0, rows // 4, (tokens,), generator=gen)  # many duplicates
    (emb(idx) * torch.randn(tokens, 3, generator=gen).to(dtype)).sum().backward()
    return emb.weight.grad


def input_order_sums(grad: torch.Tensor) -> tuple[list, np.ndarray]:
    """The reference coalescing of ``grad``: its sorted distinct rows and, for each, its
    entries' numpy rows added one at a time in input order (the first copied)."""
    rows: dict = {}
    with np.errstate(over="ignore"):  # float16 sums of hot rows overflow to inf, as ours do
        for i, row in zip(grad._indices()[0].tolist(), grad._values().numpy()):
            rows[i] = rows[i] + row if i in rows else row.copy()
    keys = sorted(rows)
    return keys, np.stack([rows[i] for i in keys])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_hooks_average_a_sparse_bucket_exactly(dtype):
    """One rank: the average is the gradient, coalesced (duplicates added in input order;
    bfloat16 summed in float32 and rounded once), as the coalesced sparse tensor DDP copies
    into the parameter's gradient; topk_hook passes it through the same path, in warm-up and
    after, and counts the bucket."""
    cc.init("mpi")
    grad = sparse_grad(4, dtype)
    assert not grad.is_coalesced()
    keys, rows = input_order_sums(grad.float() if dtype == torch.bfloat16 else grad)
    expected = torch.sparse_coo_tensor([keys], torch.as_tensor(rows), grad.shape,
                                       is_coalesced=True, check_invariants=True)
    state = cct.TopkHookState(density=0.1, warmup_steps=1)
    for hook, hook_state in ((cct.allreduce_hook, None), (cct.topk_hook, state),
                             (cct.topk_hook, state)):
        out = hook(hook_state, FakeBucket(0, [SimpleNamespace(grad=grad)])).wait()
        assert out.is_sparse and out.is_coalesced() and out.dtype == dtype
        assert torch.equal(out.indices(), expected.indices())
        assert torch.equal(out.values(), expected.values().to(dtype))
    assert state.iteration == 2 and not state.compressors  # counted, never compressed


def test_hooks_reject_sparse_buckets_of_other_dtypes():
    cc.init("mpi")
    grad = sparse_grad(5).to(torch.int64)
    state = cct.TopkHookState(density=0.5)
    for hook, hook_state in ((cct.allreduce_hook, None), (cct.topk_hook, state)):
        with pytest.raises(InvalidType, match="'bucket' on rank 0 .*int64"):
            hook(hook_state, FakeBucket(0, [SimpleNamespace(grad=grad)]))
    assert state.iteration == 0


@pytest.mark.parametrize("verb", ["allreduce", "broadcast", "reduce", "allgather",
                                  "reduce_scatter"])
@pytest.mark.parametrize("async_op", [False, True])
def test_out_is_the_callers_tensor(verb, async_op):
    """``out=t`` returns ``t`` itself (the same torch object), not a new tensor over it."""
    cc.init("mpi")
    x = torch.arange(6.0)
    out = x if verb != "allgather" else torch.empty(6)
    got = getattr(cc, verb)(x, out=out, async_op=async_op)
    got = got.wait() if async_op else got
    assert got is out and torch.equal(out, torch.arange(6.0))


@pytest.mark.parametrize("width", [0, 3])
def test_a_sparse_result_of_tensors_densifies_to_a_tensor(width):
    """``sparse_allreduce`` on torch tensors returns tensors; the result's ``to_dense()``
    gives a tensor too (it raised InvalidType naming 'indices', an argument never passed)."""
    comm = cc.init("mpi")
    idx = torch.tensor([4, 1, 4], dtype=torch.int64)
    val = torch.arange(3 * max(width, 1), dtype=torch.float32).reshape((3, width) if width
                                                                      else (3,))
    for async_op in (False, True):
        res = cc.sparse_allreduce(idx, val, 6, comm=comm, async_op=async_op)
        res = res.wait() if async_op else res
        want = np.zeros((6, width) if width else 6, np.float32)
        np.add.at(want, idx.numpy(), val.numpy())
        dense = res.to_dense()
        assert isinstance(dense, torch.Tensor) and np.array_equal(dense.numpy(), want)


@pytest.mark.parametrize("hook", ["allreduce", "topk"])
def test_the_last_sparse_bucket_runs_in_the_hook_once_the_worker_is_idle(hook, monkeypatch):
    """A sparse bucket runs on the background worker, except DDP's last one while the worker
    has nothing queued: that one runs in the hook's thread (on the worker's communicator, so
    in call order); behind a busy worker it queues. One rank: the average is the coalesced
    gradient either way."""
    import threading

    from cupycoll._background import runner
    from cupycoll.torch import _sparse

    comm = cc.init("mpi").dup()
    state = cct.TopkHookState(comm=comm, density=0.5) if hook == "topk" else comm
    call = cct.topk_hook if hook == "topk" else cct.allreduce_hook
    ran = []
    real = _sparse.reduce
    monkeypatch.setattr(_sparse, "reduce", lambda tensor, on, **kw: (
        ran.append((threading.current_thread(), on)), real(tensor, on, **kw))[1])
    want = sparse_grad(3).coalesce()
    worker = runner(state.comm if hook == "topk" else comm)
    for last, busy, here in ((False, False, False), (True, False, True), (True, True, False)):
        gate = threading.Event()
        if busy:
            worker.submit(gate.wait)
        grad = sparse_grad(3)
        got = call(state, FakeBucket(0, [SimpleNamespace(grad=grad)], last=last))
        gate.set()
        got = got.wait()
        assert got is grad, "the average is held by the bucket's tensor (DDP copies nothing)"
        assert torch.equal(got.indices(), want.indices()) and torch.allclose(got.values(),
                                                                              want.values())
        thread, on = ran.pop()
        assert (thread is threading.current_thread()) == here and on is worker.comm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.float16])
@pytest.mark.parametrize("numba", ["on", "off"])
@pytest.mark.parametrize("entries", [5000, 40000])
@pytest.mark.parametrize("algorithm, op", [("mask", "sum"), ("allgather", "avg"),
                                           ("allgather", "max")])
def test_coalescing_adds_each_rows_duplicates_in_input_order(dtype, numba, entries, algorithm,
                                                             op, monkeypatch):
    """One rank's sparse allreduce of an uncoalesced gradient (numba's table from 0 entries
    here, numpy's sort with CUPYCOLL_NUMBA=off; summed where mask's rows land, coalesced
    first for allgather, by cupycoll.torch for a max) gives the sorted unique rows and, for
    each, its entries added one at a time in input order (:func:`input_order_sums`), -0 kept.
    Zipf ids: hot rows repeat hundreds of times, so the order of the additions shows in the
    bits. Where torch's sort keeps equal ids in input order (40,000 entries) that is torch's
    coalesce() bit for bit."""
    from cupycoll.primitives import _accel

    monkeypatch.setenv("CUPYCOLL_NUMBA", numba)
    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    rng = np.random.default_rng(0)
    ids = torch.as_tensor(np.minimum(rng.zipf(1.1, entries), 5000) - 1)
    values = torch.randn(entries, 3, 2, generator=torch.Generator().manual_seed(1)) * 1e3
    values[ids == ids[-1]] = -0.0  # a row of -0 (once or many times)
    grad = torch.sparse_coo_tensor(ids[None], values.to(dtype), (5000, 3, 2),
                                   check_invariants=True)
    reduced = cct.sparse_allreduce(grad, op=op, algorithm=algorithm, comm=cc.init("mpi"),
                                   accumulate_dtype=torch.empty(0, dtype=dtype).numpy().dtype)
    indices, summed = reduced._indices()[0], reduced._values()
    keys, want = input_order_sums(grad)
    assert indices.tolist() == keys
    assert summed.dtype == dtype and summed.shape == (len(keys), 3, 2)
    bits = f"u{want.dtype.itemsize}"
    assert np.array_equal(summed.numpy().view(bits), want.view(bits))
    if entries >= 1 << 15:
        assert torch.equal(summed, grad.coalesce().values())


def test_bench_torch_runs_every_column_on_two_ranks(tmp_path):
    """``cupycoll bench torch`` at a small V: every reduction and DDP row, none wrong."""
    out = tmp_path / "torch.json"
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "cupycoll", "bench",
           "torch", "--vocab", "8K", "-n", "2", "-w", "1", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    reduced = {r["algorithm"]: r for r in rows if "algorithm" in r}
    assert {"hook", "cupycoll", "coalesce+cupycoll", "gloo", "gloo dense"} <= set(reduced)
    assert all(r["#wrong"] == 0 for r in reduced.values()), reduced
    assert {"hook", "gloo", "gloo dense"} <= {r["ddp"] for r in rows if "ddp" in r}
    assert "hook / gloo" in proc.stdout


def test_a_loaded_hook_state_warms_up_then_takes_its_saved_residuals():
    """A state loaded in a fresh process (pickled: no parameters kept, their shapes) averages
    its first iteration densely (DDP hands it in its initial buckets, another layout than the
    saved residuals'), then each rebuilt bucket takes its saved compressor, residual intact;
    buckets of other parameters than the saved ones are refused, never fed a residual."""
    import pickle

    cc.init("mpi")
    a, b, c = params_with_grads([30, 20, 50], seed=3)
    state = cct.TopkHookState(density=0.1, warmup_steps=1)
    for buckets in ([FakeBucket(0, [a, b], last=False), FakeBucket(1, [c])],  # warm-up
                    [FakeBucket(0, [c, a], last=False), FakeBucket(1, [b])]):  # rebuilt
        for bucket in buckets:
            cct.topk_hook(state, bucket).wait()
    saved = pickle.dumps(state)
    assert b"Parameter" not in saved  # shapes, not the parameters themselves
    again = pickle.loads(pickle.dumps(pickle.loads(saved)))  # a loaded state saves again
    assert again._shapes == pickle.loads(saved)._shapes == {(0, 80): [(50,), (30,)],
                                                             (1, 20): [(20,)]}
    want = {key: np.asarray(comp.residual).copy() for key, comp in state.compressors.items()}
    loaded = pickle.loads(saved)
    assert loaded.comm is None and loaded.bytes_sent == 0  # nothing collective in a load: one
    initial = [FakeBucket(0, [a, b], last=False), FakeBucket(1, [c])]  # rank may load alone
    grads = [bucket.buffer().clone() for bucket in initial]
    for bucket, grad in zip(initial, grads):  # the initial layout: a dense average (P = 1)
        assert torch.equal(cct.topk_hook(loaded, bucket).wait(), grad)
    assert {k: np.asarray(v.residual) for k, v in loaded.compressors.items()}.keys() == \
        want.keys()
    for key, comp in loaded.compressors.items():
        assert np.array_equal(np.asarray(comp.residual), want[key])  # untouched so far
    pickle.loads(pickle.dumps(loaded))  # after its warm-up, its buckets not adopted yet
    rebuilt = FakeBucket(0, [c, a], last=False)
    assert loaded.compressor(rebuilt) is loaded.compressors[(0, 80)]
    pickle.loads(pickle.dumps(loaded))  # one bucket adopted, the other not yet
    for bucket in (FakeBucket(1, params_with_grads([(4, 5)], seed=4)),  # saved key, other shape
                   FakeBucket(1, [a])):  # a key the state never saw
        other = pickle.loads(saved)
        with pytest.raises(InvalidArgument, match=r"'state' on rank 0.*loaded state's"):
            other.compressor(bucket)
