"""cupycoll.torch's sparse path on every rank: DDP with a sparse embedding through both hooks,
and ``cct.sparse_allreduce`` against gloo's sparse ``all_reduce`` and a numpy reference.

    mpiexec -n P python -m mpi4py tests/workers/torch_sparse.py

* DDP (an ``nn.Embedding(sparse=True)`` and a dense head; float32, and bfloat16 through
  ``allreduce_hook``) through ``allreduce_hook`` and ``topk_hook``: parameters bitwise identical
  on every rank after every step; every averaged sparse gradient has the union of the ranks'
  rows and the values of the numpy reference (float64 sum of every rank's raw gradient / P)
  within float32 (bfloat16) rounding of the sums, bitwise at P = 1; the gradient DDP leaves on
  the parameter is exactly the tensor the hook returned. Some steps give one rank, or every
  rank, no rows.
* The hooks do not wait for other ranks: rank 0 gets its Future back, still pending, before
  rank 1 calls (rank 1 waits for rank 0's word, and fails after 60 s without it).
* ``cct.sparse_allreduce``: integer values (float32 and int64 tensors) bitwise equal to gloo
  at any P, through every algorithm and keyword; float32 gradients within float32 summation
  bounds of gloo at any P (rank 0 prints the share that differs) and, at P <= 2, bitwise equal
  to a reference that adds each rank's duplicate rows in input order, then the two ranks;
  trailing dense dimensions; ranks with no rows; uncoalesced input; output="dense" with and
  without ``out`` (``out`` returned itself); ``async_op``; ``op="avg"``; bfloat16.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import cupycoll as cc
import cupycoll.torch as cct

world = MPI.COMM_WORLD
RANK, P = world.Get_rank(), world.Get_size()
V, WIDTH = 1000, 8
U = 2.0 ** -24  # float32 unit roundoff


def init_gloo() -> str:
    """torch.distributed over gloo, rendezvous through a file in a fresh directory of rank 0's
    (a port picked by binding to 0 and closing could be taken by another job before gloo
    listened on it: CI saw EADDRINUSE); returns the directory, for rank 0 to remove at the end."""
    where = world.bcast(tempfile.mkdtemp(prefix="cupycoll-gloo-") if RANK == 0 else None)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(where, 'store')}",
                            rank=RANK, world_size=P)
    return where


def zipf_tokens(rng: np.random.Generator, shape: tuple[int, ...], n: int = V) -> torch.Tensor:
    """Zipf-distributed token ids in [0, n): hot rows repeat (duplicates in the gradient)."""
    ranks = np.minimum(rng.zipf(1.3, size=shape), n) - 1
    return torch.as_tensor(np.random.default_rng(7).permutation(n)[ranks])


class FakeBucket:
    """The part of dist.GradBucket the hooks read, around one gradient."""

    def __init__(self, grad: torch.Tensor, index: int = 0, last: bool = True) -> None:
        self._grad, self._index, self._last = grad, index, last

    def buffer(self) -> torch.Tensor:
        return self._grad

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def parameters(self) -> list:
        return []


# ------------------------------------------------------------------------------ DDP
class SparseNet(torch.nn.Module):
    """Embedding rows summed per sample (a sparse gradient), then a dense head."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(V, WIDTH, sparse=True)
        self.head = torch.nn.Linear(WIDTH, 4)
        self.to(dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(tokens).sum(1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's tokens and labels at ``step``; no tokens (no gradient rows) for every rank
    at step 2 and for rank ``step % P`` from step 3 on (at P > 1)."""
    rng = np.random.default_rng([step, RANK])
    empty = step == 2 or (P > 1 and step > 2 and step % P == RANK)
    tokens = zipf_tokens(rng, (4, 0 if empty else 6))
    return tokens, torch.as_tensor(rng.integers(0, 4, 4))


def params_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_average(raw: tuple, averaged: torch.Tensor, rounding: float) -> None:
    """``averaged`` (coalesced) against the numpy reference built from every rank's ``raw``
    (indices, values) gradient: the union of rows, and values within the float32 summation
    bound (m entries of a row: m u sum|x| / P, plus u |ref|) and ``rounding`` x |ref|."""
    everyone = world.allgather(raw)
    total = np.zeros((V, WIDTH))
    size = np.zeros((V, WIDTH))
    count = np.zeros(V)
    for idx, val in everyone:
        np.add.at(total, idx, val)
        np.add.at(size, idx, np.abs(val))
        np.add.at(count, idx, 1)
    rows = np.flatnonzero(count)
    assert averaged.is_coalesced()
    assert np.array_equal(averaged.indices()[0].numpy(), rows), "rows are not the union"
    got = averaged.values().double().numpy()
    reference = total[rows] / P
    bound = (count[rows, None] + 1) * U * size[rows] / P + (U + rounding) * np.abs(reference)
    worst = np.max(np.abs(got - reference) - bound, initial=-1.0)
    assert worst <= 0, f"averaged sparse gradient off the reference by {worst} beyond bound"


def train(hook: str, dtype: torch.dtype, steps: int) -> None:
    """DDP through ``hook`` with the checks of the module docstring at every step."""
    model = SparseNet(dtype)
    ddp = DDP(model)
    state = cct.TopkHookState(density=0.25, warmup_steps=1) if hook == "topk" else None
    run = cct.topk_hook if hook == "topk" else cct.allreduce_hook
    seen: dict = {}

    def recording(state, bucket):
        buffer = bucket.buffer()
        if not buffer.is_sparse:
            return run(state, bucket)
        seen["raw"] = (buffer._indices()[0].numpy().copy(),
                       buffer._values().double().numpy().copy())  # summed exactly there
        seen["local"] = (buffer._indices()[0].numpy().copy(),
                         buffer._values().float().numpy().copy())  # bfloat16 summed in float32

        def keep(fut):
            seen["averaged"] = fut.value()
            return fut.value()

        return run(state, bucket).then(keep)

    ddp.register_comm_hook(state, recording)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    rounding = 2.0 ** -8 if dtype == torch.bfloat16 else 0.0
    for step in range(steps):
        tokens, labels = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(tokens).float(), labels).backward()
        averaged = seen.pop("averaged")
        grad = model.emb.weight.grad
        assert torch.equal(grad.indices(), averaged.indices()) and torch.equal(
            grad.values(), averaged.values()), f"{hook}: DDP's gradient is not the hook's"
        check_average(seen.pop("raw"), averaged, rounding)
        local = seen.pop("local")
        if P == 1:  # the average of one rank: its own duplicates added in input order
            rows = input_order_sums([local])
            assert averaged.indices()[0].tolist() == sorted(rows)
            want = np.array([rows[i] for i in sorted(rows)], np.float32).reshape(-1, WIDTH)
            assert torch.equal(averaged.values(), torch.as_tensor(want).to(dtype))
        opt.step()
        hashes = world.allgather(params_hash(model))
        assert len(set(hashes)) == 1, f"{hook} {dtype}: parameters differ at step {step}"


def check_hooks_do_not_wait() -> None:
    """Rank 0's hook returns a pending Future before rank 1 has called it, for a bucket that is
    not DDP's last (the last one runs in the hook when the worker is idle)."""
    rng = np.random.default_rng([99, RANK])
    emb = torch.nn.Embedding(V, WIDTH, sparse=True)
    emb(zipf_tokens(rng, (50,))).sum().backward()
    grad = emb.weight.grad
    cct.allreduce_hook(None, FakeBucket(grad.clone())).wait()  # its communicator: made here
    for hook, state in ((cct.allreduce_hook, None),
                        (cct.topk_hook, cct.TopkHookState(density=0.5))):
        if RANK == 1:
            deadline = time.monotonic() + 60
            while not world.Iprobe(source=0, tag=5):
                assert time.monotonic() < deadline, "rank 0's hook waited for rank 1"
                time.sleep(0.01)
            assert world.recv(source=0, tag=5) is False, "rank 0's Future completed alone"
        future = hook(state, FakeBucket(grad.clone(), last=False))  # it holds the result
        if RANK == 0:
            world.send(future.done(), dest=1, tag=5)
        mine = future.wait()
        theirs = world.allgather((mine.indices().numpy(), mine.values().numpy()))
        assert all(np.array_equal(i, theirs[0][0]) and np.array_equal(v, theirs[0][1])
                   for i, v in theirs)


# ------------------------------------------------------------------ sparse_allreduce
def case(kind: str, seed: int) -> torch.Tensor:
    """This rank's sparse tensor of case ``kind`` (uncoalesced: duplicate rows)."""
    rng = np.random.default_rng([seed, RANK])
    shape = {"trailing": (40, 3, 2), "vector": (80,), "float": (5000, 8)}.get(kind, (60, 3))
    nnz = int(rng.integers(2000, 3000)) if kind == "float" else int(rng.integers(5, 30))
    if kind == "no rows here" and RANK % 2 == 0 or kind == "no rows anywhere":
        nnz = 0
    indices = zipf_tokens(rng, (1, nnz), shape[0])
    if kind == "float":
        values = torch.as_tensor(rng.standard_normal((nnz, *shape[1:])), dtype=torch.float32)
    else:
        values = torch.as_tensor(rng.integers(-4, 5, (nnz, *shape[1:])))
        values = values if kind == "int64" else values.float()
    return torch.sparse_coo_tensor(indices, values, shape, check_invariants=True)


def gloo(tensor: torch.Tensor) -> torch.Tensor:
    """gloo's sparse all_reduce (a sum), coalesced."""
    result = tensor.clone()
    dist.all_reduce(result)
    return result.coalesce()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal sparse (indices and values) or strided tensors."""
    if a.is_sparse:
        return b.is_sparse and a.is_coalesced() and torch.equal(a.indices(), b.indices()) \
            and a.dtype == b.dtype and torch.equal(a.values(), b.values())
    return a.dtype == b.dtype and torch.equal(a, b)


def check_exact_case(kind: str, seed: int) -> None:
    """Integer values (sums exact in any order): every path bitwise equal to gloo."""
    tensor = case(kind, seed)
    expected = gloo(tensor)
    dense = expected.to_dense()
    assert same(cct.sparse_allreduce(tensor), expected), kind
    assert same(cct.sparse_allreduce(tensor.coalesce()), expected), kind
    assert same(cct.sparse_allreduce(tensor, output="dense"), dense), kind
    out = torch.full(tensor.shape, 7, dtype=tensor.dtype)
    assert cct.sparse_allreduce(tensor, output="dense", out=out) is out and same(out, dense)
    work = cct.sparse_allreduce(tensor, async_op=True)
    assert isinstance(work, cc.Work) and same(work.wait(), expected), kind
    out = torch.empty(tensor.shape, dtype=tensor.dtype)
    work = cct.sparse_allreduce(tensor, output="dense", out=out, async_op=True)
    assert work.wait() is out and same(out, dense), kind
    avg = cct.sparse_allreduce(tensor, op="avg")
    quotient = expected.values() / P if tensor.dtype.is_floating_point else torch.div(
        expected.values(), P, rounding_mode="trunc")
    assert torch.equal(avg.indices(), expected.indices()) and torch.equal(avg.values(), quotient)


def check_keywords() -> None:
    """Every algorithm and documented keyword, bitwise equal to gloo on integer values."""
    tensor = case("rows", 11)
    expected = gloo(tensor)
    for algorithm in cc.algorithms("sparse"):
        assert same(cct.sparse_allreduce(tensor, algorithm=algorithm), expected), algorithm
    for kwargs in ({"accumulate_dtype": "float64"}, {"wire": "compact"},
                   {"wire_values": "bfloat16"}):  # small integers: exact in bfloat16
        assert same(cct.sparse_allreduce(tensor, **kwargs), expected), kwargs
    made, told = [], []

    def alloc(nnz, index_dtype, values_shape, value_dtype, ctx):
        made.append((nnz, np.dtype(index_dtype), tuple(values_shape), np.dtype(value_dtype), ctx))
        return torch.empty(nnz, dtype=torch.int64), torch.empty(values_shape)

    def completion(indices, values, ctx):
        told.append((torch.as_tensor(indices).clone(), torch.as_tensor(values).clone(), ctx))

    ours = cct.sparse_allreduce(tensor, alloc_fn=alloc, completion_fn=completion, fn_ctx="ctx")
    nnz = expected._nnz()
    assert same(ours, expected)
    assert made == [(nnz, np.dtype(np.int64), (nnz, 3), np.dtype(np.float32), "ctx")], made
    assert len(told) == 1 and told[0][2] == "ctx"
    assert torch.equal(told[0][0], expected.indices()[0]) and torch.equal(
        told[0][1], expected.values())
    bf16 = cct.sparse_allreduce(tensor.bfloat16(), op="avg")
    assert same(bf16, cct.sparse_allreduce(tensor, op="avg").bfloat16())
    out = torch.empty(tensor.shape, dtype=torch.bfloat16)
    assert cct.sparse_allreduce(tensor.bfloat16(), output="dense", out=out) is out
    assert same(out, expected.to_dense().bfloat16())


def check_one_rank_passes_a_dense_tensor() -> None:
    """A dense tensor, a sparse one on the ``meta`` device (before: a bare TypeError there,
    the others timed out), or an unknown keyword, on the last rank alone, sync and async:
    every rank raises at once (the others used to run on against that rank's next call),
    naming ``tensor`` (the keyword on that rank); the next call works everywhere."""
    from cupycoll.errors import InvalidArgument, InvalidType

    tensor = case("rows", 5)
    for async_op, bad in ((False, "dense"), (True, "dense"), (False, "meta"), (True, "meta")):
        mine = tensor if RANK != P - 1 else tensor.to_dense() if bad == "dense" else \
            tensor.to("meta")
        try:
            got = cct.sparse_allreduce(mine, async_op=async_op)
            got.wait() if async_op else None
        except InvalidType as exc:
            assert exc.argument == "tensor" and exc.rank == P - 1, exc
        else:
            raise AssertionError(f"rank {RANK}: no error (async_op={async_op})")
    assert same(cct.sparse_allreduce(tensor), gloo(tensor))
    for async_op in (False, True):  # an unknown keyword on the last rank alone: the same
        extra = {"foo": 1} if RANK == P - 1 else {}
        try:
            got = cct.sparse_allreduce(tensor, async_op=async_op, **extra)
            got.wait() if async_op else None
        except InvalidArgument as exc:
            assert exc.rank == P - 1 and (RANK != P - 1 or exc.argument == "foo"), exc
        else:
            raise AssertionError(f"rank {RANK}: no error (async_op={async_op})")
    assert same(cct.sparse_allreduce(tensor), gloo(tensor))


def check_async_op_differs_across_ranks() -> None:
    """``async_op`` True on some ranks, False on the others (even ranks async, then rank 0
    alone, then every rank but 0), a sync call after pending async ones: every rank gets
    gloo's sum of each call, in call order (before: the async ranks validated on the worker's
    duplicate, the others on the communicator, and all timed out, or hung without a
    timeout)."""
    from cupycoll.comm.mpi import MPICommunicator

    comm = MPICommunicator(timeout=20)  # not the default communicator: closed at the end
    tensors = [case("rows", 40 + i) for i in range(3)]
    expected = [gloo(t) for t in tensors]
    for pattern in (lambda r: r % 2 == 0, lambda r: r == 0, lambda r: r != 0):
        got = [cct.sparse_allreduce(t, comm=comm, async_op=pattern(RANK)) for t in tensors]
        got = [g.wait() if isinstance(g, cc.Work) else g for g in got]
        assert all(same(a, b) for a, b in zip(got, expected)), RANK
    pending = cct.sparse_allreduce(tensors[0], comm=comm, async_op=True)
    assert same(cct.sparse_allreduce(tensors[1], comm=comm), expected[1])
    assert same(pending.wait(), expected[0])
    nested = []  # a synchronous call in an async call's completion_fn (on the worker's thread)
    work = cct.sparse_allreduce(tensors[0], comm=comm, async_op=True, completion_fn=lambda *_:
                                nested.append(cct.sparse_allreduce(tensors[2], comm=comm)))
    assert same(work.wait(), expected[0]) and same(nested[0], expected[2])
    from cupycoll.errors import InvalidArgument

    def waits(*_):  # an async call waited for there: queued behind the running one
        cct.sparse_allreduce(tensors[2], comm=comm, async_op=True).wait()

    try:  # (before: the worker waited for itself, for ever)
        cct.sparse_allreduce(tensors[0], comm=comm, async_op=True, completion_fn=waits).wait()
        raise AssertionError("a wait on the worker for a call queued behind it returned")
    except InvalidArgument as exc:
        assert exc.argument == "completion_fn", exc
    if P > 1:  # a callback's error in a queued synchronous call: that rank's alone
        def boom(*_):
            if RANK == 0:
                raise ValueError("boom")

        if RANK:
            time.sleep(0.5)  # rank 0's sync call waits behind its async one meanwhile
        late = cct.sparse_allreduce(tensors[0], comm=comm, async_op=True)
        try:
            cct.sparse_allreduce(tensors[1], comm=comm, completion_fn=boom)
            outcome = "ok"
        except ValueError:
            outcome = "ValueError"
        assert outcome == ("ValueError" if RANK == 0 else "ok"), (RANK, outcome)
        assert same(late.wait(), expected[0])
        assert same(cct.sparse_allreduce(tensors[2], comm=comm), expected[2])  # usable
    if P > 1:  # Ctrl-C while a synchronous call waits behind an async one: comm aborted
        import signal
        import threading

        from cupycoll.errors import CupycollError

        if RANK == 0:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        else:
            time.sleep(2.0)  # rank 0's async call waits for this rank meanwhile
        late = cct.sparse_allreduce(tensors[0], comm=comm, async_op=True)
        try:
            cct.sparse_allreduce(tensors[1], comm=comm)  # rank 0: queued behind ``late``
            outcome = "completed"
        except KeyboardInterrupt:
            outcome = "interrupted"
        except CupycollError:
            outcome = "error"
        assert outcome == ("interrupted" if RANK == 0 else "error"), (RANK, outcome)
        try:
            late.wait()
        except CupycollError:
            pass
        try:
            cct.sparse_allreduce(tensors[2], comm=comm)
            raise AssertionError(f"rank {RANK}: an interrupted communicator ran a call")
        except CupycollError:
            pass
    comm.close()


def check_float_gradients() -> float:
    """Float32 sums: within the summation bound of gloo's; at P <= 2 bitwise equal to each
    rank's duplicates added in input order, then the ranks' rows added (a + b = b + a); returns
    the share of values that differ from gloo's (whose local sums follow torch's sort)."""
    tensor = case("float", 23)
    expected, ours = gloo(tensor), cct.sparse_allreduce(tensor)
    assert torch.equal(ours.indices(), expected.indices())
    a, b = ours.values().double(), expected.values().double()
    magnitude = gloo(torch.sparse_coo_tensor(tensor._indices(), tensor._values().abs(),
                                             tensor.shape, check_invariants=True))
    magnitude = magnitude.values().double()
    assert bool(((a - b).abs() <= 2 * (P + 2) * U * magnitude).all())
    if P <= 2:
        rows = input_order_sums(world.allgather((tensor._indices()[0].numpy(),
                                                 tensor._values().numpy())))
        want = np.stack([rows[i] for i in ours.indices()[0].tolist()])
        assert np.array_equal(ours.values().numpy().view(np.int32), want.view(np.int32))
    return float((ours.values() != expected.values()).float().mean())


def input_order_sums(parts: list) -> dict:
    """index -> each rank's rows of it added in input order, then the ranks' sums in rank
    order (float32 numpy rows, one addition at a time)."""
    total: dict = {}
    for indices, values in parts:
        local: dict = {}
        for i, row in zip(indices.tolist(), values):
            local[i] = local[i] + row if i in local else row.copy()
        for i, row in local.items():
            total[i] = total[i] + row if i in total else row
    return total


def sparse_allreduce_checks() -> None:
    for seed, kind in enumerate(("rows", "int64", "trailing", "vector", "no rows here",
                                 "no rows anywhere")):
        check_exact_case(kind, seed)
    check_keywords()
    check_one_rank_passes_a_dense_tensor()
    check_async_op_differs_across_ranks()
    differ = check_float_gradients()
    if RANK == 0:
        print(f"P = {P}: float32 values differing from gloo in the last bits: {differ:.2%}")


def run_all() -> None:
    """Every check of the module docstring (torch.distributed over gloo already up)."""
    sparse_allreduce_checks()
    if P > 1:
        check_hooks_do_not_wait()
    for hook in ("allreduce", "topk"):
        train(hook, torch.float32, 8)
    train("allreduce", torch.bfloat16, 4)


def main() -> None:
    cc.init("mpi")
    store = init_gloo()
    run_all()
    dist.destroy_process_group()
    world.Barrier()  # every rank is done with the store's file
    if RANK == 0:
        shutil.rmtree(store, ignore_errors=True)
        print(f"torch_sparse: P = {P} ok")


if __name__ == "__main__":
    main()
