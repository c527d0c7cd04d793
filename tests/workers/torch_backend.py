"""The ``cupycoll`` process group against gloo and numpy: every verb, then DDP, in one job.

    mpiexec -n P python -m mpi4py tests/workers/torch_backend.py SEED [sparse | ddp STEPS]

The default group is cupycoll's (``cupycoll://``: rank and size from MPI); a gloo group over
the same ranks runs the same calls on clones of the same inputs. Inputs are small integers
(seeded per rank), so sums, products and averages are exact and results are compared bit for
bit with numpy on every rank's gathered inputs (gathered over mpi4py, not the code under test)
and with gloo wherever gloo has the operation. Cases cover float16/32/64, bfloat16, int8,
uint8, int32, int64, complex64, bool (or for SUM, and for PRODUCT), empty and zero-row tensors, dense trailing
dimensions, tensors that are not contiguous, the first and last roots, uneven all-to-all
splits, sparse COO tensors with duplicates and ranks without rows, async Works and their
futures, unsupported ops and verbs, and a group timeout naming the late rank. The DDP part is in
torch_backend_ddp.py. Rank 0 prints one JSON line: its checks per verb, and how many ranks
timed out as they should (P - 1). Then, in the same job (one start of torch a rank for all of
them), ``sparse`` runs every check of torch_sparse.py and ``ddp STEPS`` every check of
torch_ddp.py with its report, each over its own default group.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.nn.parallel import DistributedDataParallel as DDP
from _common import napping_barrier, rng_for
from mpi4py import MPI
from torch_backend_ddp import check_ddp
import torch_ddp
import torch_sparse

import cupycoll._torch_backend  # noqa: F401  registers "cupycoll" and cupycoll://
from cupycoll.errors import CollectiveTimeout, InvalidArgument, InvalidType, MismatchError

warnings.simplefilter("ignore")  # torch's deprecation notices of the verbs' old names
SEED = int(sys.argv[1])
THEN = sys.argv[2:]  # the hooks' checks that follow in this job
WORLD = MPI.COMM_WORLD
if WORLD.Get_size() > 1:  # a rank given on every rank, MPI's on the middle one: all raise
    try:
        dist.init_process_group("cupycoll", init_method="cupycoll://",
                                rank=WORLD.Get_size() - 1 - WORLD.Get_rank(),
                                world_size=WORLD.Get_size())
    except InvalidArgument as exc:
        assert "'rank'" in str(exc) and "takes it from MPI" in str(exc), exc
    else:
        raise AssertionError("a rank that is not MPI's was taken")
    if WORLD.Get_rank() == WORLD.Get_size() - 1:  # a bad setting on the last rank: every
        os.environ["CUPYCOLL_TIMEOUT"] = "soon"  # rank raises naming it (before: that rank
    try:  # alone, the others waiting in the group's making)
        dist.init_process_group("cupycoll", init_method="cupycoll://")
    except InvalidArgument as exc:
        assert exc.argument == "CUPYCOLL_TIMEOUT" and exc.rank == WORLD.Get_size() - 1, exc
    else:
        raise AssertionError("a bad CUPYCOLL_TIMEOUT was taken")
    finally:
        os.environ.pop("CUPYCOLL_TIMEOUT", None)
dist.init_process_group("cupycoll", init_method="cupycoll://")
RANK, P = dist.get_rank(), dist.get_world_size()
CC, GLOO = dist.group.WORLD, dist.new_group(backend="gloo")
O = dist.ReduceOp
OPS = {O.SUM: np.sum, O.PRODUCT: np.prod, O.MIN: np.min, O.MAX: np.max, O.AVG: None}
REDUCED = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
           torch.uint8, torch.int32, torch.int64)
SHAPES = ((0,), (7,), (3, 5))
ROOTS = sorted({0, P - 1})  # the first and the last rank (every rank at P <= 2)
CHECKS: collections.Counter = collections.Counter()
_case = 0


def values(shape: tuple, dtype: torch.dtype, rank: int = RANK) -> torch.Tensor:
    """Rank ``rank``'s input of one case: small integers (exact in every dtype)."""
    rng = rng_for(SEED, rank, _case)
    low = 0 if dtype in (torch.uint8, torch.bool) else -3
    data = torch.from_numpy(rng.integers(low, 4, shape))
    if dtype == torch.complex64:
        return torch.complex(data.float(), torch.from_numpy(rng.integers(-3, 4, shape)).float())
    return data.to(dtype)


def next_case() -> None:
    global _case
    _case += 1


def gathered(tensor: torch.Tensor) -> list[np.ndarray]:
    """Every rank's ``tensor`` as float64/complex128 numpy, over mpi4py (after a napping
    barrier: ranks that come first do not spin in MPI's allgather while the others work)."""
    wide = torch.complex128 if tensor.is_complex() else torch.float64
    napping_barrier()
    return WORLD.allgather(tensor.to(wide).numpy())


def reduced(arrays: list[np.ndarray], op, dtype: torch.dtype) -> torch.Tensor:
    """numpy's reduction of the ranks' arrays with torch's ``op`` (AVG of integers truncates
    toward zero), in ``dtype``."""
    stack = np.stack(arrays)
    if op == O.AVG:
        total = stack.sum(0)
        out = np.trunc(total / P) if not dtype.is_floating_point and not dtype.is_complex \
            else total / P
    else:
        out = OPS[op](stack, axis=0)
    return torch.from_numpy(np.asarray(out)).to(dtype)


def same(verb: str, got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Assert equal dtype, shape and values, and count the check under ``verb``."""
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), \
        f"rank {RANK}: {verb} {what} case {_case}: got {got} want {want}"
    CHECKS[verb] += 1


def ops_for(dtype: torch.dtype) -> tuple:
    """The ops a dtype reduces with: complex SUM and AVG; bool all but AVG (SUM is or,
    PRODUCT and: numpy's sum and product of bools, cast back)."""
    if dtype.is_complex:
        return (O.SUM, O.AVG)
    return tuple(op for op in OPS if dtype != torch.bool or op != O.AVG)


def gloo_has(op, dtype: torch.dtype) -> bool:
    """Whether gloo reduces ``dtype`` with ``op`` (it has no AVG of integers)."""
    return not (op == O.AVG and not dtype.is_floating_point and not dtype.is_complex)


def check_allreduce() -> None:
    for dtype in REDUCED + (torch.complex64, torch.bool):
        for op in ops_for(dtype):
            for shape in SHAPES:
                next_case()
                x = values(shape, dtype)
                want = reduced(gathered(x), op, dtype)
                mine, theirs, later = x.clone(), x.clone(), x.clone()
                dist.all_reduce(mine, op=op)
                same("allreduce", mine, want, f"{dtype} {op}")
                work = dist.all_reduce(later, op=op, async_op=True)  # completed by cupycoll's
                assert work.wait() is True  # completer thread; the future's value is the
                value = work.get_future().wait()  # tensor (complex: torch's real view of it)
                assert len(value) == 1 and value[0].data_ptr() == later.data_ptr()
                same("allreduce", later, want, "async")
                if gloo_has(op, dtype):
                    dist.all_reduce(theirs, op=op, group=GLOO)
                    same("allreduce", mine, theirs, f"{dtype} {op} vs gloo")
        next_case()
        y = values((4, 6), dtype).t()  # not contiguous: worked on a copy, written back
        want = reduced(gathered(y), O.SUM, dtype)
        dist.all_reduce(y)
        same("allreduce", y, want, "transposed")
        next_case()  # expanded: elements that share memory hold their one result (gloo
        mine = values((3, 1), dtype).expand(3, 4)  # writes 12 elements into 3: not compared)
        want = reduced(gathered(values((3, 1), dtype)), O.SUM, dtype).expand(3, 4)
        dist.all_reduce(mine)
        same("allreduce", mine, want, "expanded")


def check_reduce() -> None:
    for dtype in REDUCED + (torch.bool,):
        for op in ops_for(dtype):
            for root in ROOTS:
                next_case()
                x = values((5,), dtype)
                want = reduced(gathered(x), op, dtype)
                mine, theirs = x.clone(), x.clone()
                dist.reduce(mine, root, op=op)
                if RANK == root:
                    same("reduce", mine, want, f"{dtype} {op} root {root}")
                    if gloo_has(op, dtype):
                        dist.reduce(theirs, root, op=op, group=GLOO)
                        same("reduce", mine, theirs, "vs gloo")
                else:
                    same("reduce", mine, x, "off the root: untouched")
                    if gloo_has(op, dtype):
                        dist.reduce(theirs, root, op=op, group=GLOO)


def check_broadcast() -> None:
    for dtype in REDUCED + (torch.bool, torch.complex64):
        for shape in SHAPES + ((),):
            for root in ROOTS:
                next_case()
                x = values(shape, dtype)
                want = values(shape, dtype, rank=root)
                mine, theirs = x.clone(), x.clone()
                dist.broadcast(mine, root)
                dist.broadcast(theirs, root, group=GLOO)
                same("broadcast", mine, want, f"{dtype} {shape} root {root}")
                same("broadcast", mine, theirs, "vs gloo")
    next_case()
    y = values((3, 4), torch.float32).t()
    dist.broadcast(y, 0)
    same("broadcast", y, values((3, 4), torch.float32, rank=0).t(), "transposed")
    next_case()  # expanded: each shared location holds the root's value
    mine = values((1, 3), torch.int32).expand(2, 3)
    dist.broadcast(mine, P - 1)
    same("broadcast", mine, values((1, 3), torch.int32, rank=P - 1).expand(2, 3), "expanded")


def check_allgather() -> None:
    for dtype in REDUCED + (torch.bool, torch.complex64):
        for shape in SHAPES:
            next_case()
            x = values(shape, dtype)
            want = [values(shape, dtype, rank=r) for r in range(P)]
            for group, tag in ((CC, ""), (GLOO, " gloo")):
                outs = [torch.full(shape, 1, dtype=dtype) for _ in range(P)]
                work = dist.all_gather(outs, x, group=group, async_op=True)
                value = work.get_future().wait()  # the output list itself, as gloo's (before:
                assert [v.data_ptr() for v in value] == [o.data_ptr() for o in outs], value
                for o, w in zip(outs, want):  # a list holding that list)
                    same("allgather", o, w, f"{dtype} {shape}{tag}")
                flat = torch.empty((P * shape[0],) + shape[1:], dtype=dtype)
                dist.all_gather_into_tensor(flat, x, group=group)
                same("all_gather_single", flat, torch.cat(want), tag)
            stacked = torch.empty((P,) + shape, dtype=dtype)
            dist.all_gather_single(stacked, x)  # the 2.13 name; a (P, ...) output
            same("all_gather_single", stacked, torch.stack(want), "stacked")
            if dtype in (torch.float32, torch.bool):  # functional: the coalesced verb
                got = fc.all_gather_tensor(x, 0, CC)
                same("all_gather_single_coalesced", torch.as_tensor(got), torch.cat(want))


def check_reduce_scatter() -> None:
    for dtype in REDUCED + (torch.bool,):
        for op in ops_for(dtype):
            next_case()
            inputs = [(values((3, 2), dtype).long() + r).to(dtype) for r in range(P)]
            want = reduced(gathered(torch.stack(inputs)), op, dtype)
            out, lst = torch.empty((3, 2), dtype=dtype), torch.empty((3, 2), dtype=dtype)
            dist.reduce_scatter_tensor(out, torch.cat(inputs), op=op)
            same("reduce_scatter_single", out, want[RANK], f"{dtype} {op}")
            dist.reduce_scatter(lst, [t.clone() for t in inputs], op=op)
            same("reduce_scatter", lst, want[RANK], f"{dtype} {op}")
            if gloo_has(op, dtype):
                theirs = torch.empty((3, 2), dtype=dtype)
                dist.reduce_scatter_tensor(theirs, torch.cat(inputs), op=op, group=GLOO)
                same("reduce_scatter_single", out, theirs, "vs gloo")
            if op == O.SUM and dtype in (torch.float32, torch.bfloat16):
                got = fc.reduce_scatter_tensor(torch.cat(inputs), "sum", 0, CC)
                same("reduce_scatter_single_coalesced", torch.as_tensor(got), want[RANK])
    next_case()
    x = values((0, 2), torch.float32)
    out = torch.empty((0, 2))
    dist.reduce_scatter_tensor(out, x)
    same("reduce_scatter_single", out, torch.empty((0, 2)), "empty")


def check_all_to_all() -> None:
    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
        for uneven in (False, True):
            next_case()
            rng = np.random.default_rng([SEED, _case])  # the same counts matrix on every rank
            counts = rng.integers(0, 3, (P, P)) if uneven else np.full((P, P), 2)
            x = values((int(counts[RANK].sum()), 3), dtype)
            want = torch.cat([values((int(counts[r].sum()), 3), dtype, rank=r)
                              [counts[r, :RANK].sum():counts[r, :RANK + 1].sum()]
                              for r in range(P)])
            splits_in = counts[RANK].tolist() if uneven else None
            splits_out = counts[:, RANK].tolist() if uneven else None
            for group in (CC, GLOO):
                out = torch.empty_like(want)
                dist.all_to_all_single(out, x, splits_out, splits_in, group=group)
                same("all_to_all_single", out, want, f"{dtype} uneven={uneven}")
                if uneven and group is GLOO:
                    continue  # gloo's list all-to-all takes equal sizes only
                outs = [torch.empty_like(w) for w in want.split(counts[:, RANK].tolist())]
                dist.all_to_all(outs, list(x.split(counts[RANK].tolist())), group=group)
                same("alltoall", torch.cat(outs), want)


def check_gather_scatter() -> None:
    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
        for shape in ((0,), (3, 2)):
            for root in ROOTS:
                next_case()
                x = values(shape, dtype)
                want = [values(shape, dtype, rank=r) for r in range(P)]
                for group in (CC, GLOO):
                    outs = [torch.zeros(shape, dtype=dtype) for _ in range(P)]
                    dist.gather(x, outs if RANK == root else None, root, group=group)
                    for o, w in zip(outs, want):
                        same("gather", o, w if RANK == root else torch.zeros(shape, dtype=dtype))
                    out = torch.zeros(shape, dtype=dtype)
                    pieces = [values(shape, dtype, rank=100 + r) for r in range(P)]
                    dist.scatter(out, pieces if RANK == root else None, root, group=group)
                    same("scatter", out, values(shape, dtype, rank=100 + RANK))
    next_case()
    gathered_objects = [None] * P if RANK == 0 else None
    dist.gather_object({"rank": RANK}, gathered_objects, dst=0)
    if RANK == 0:
        assert gathered_objects == [{"rank": r} for r in range(P)], gathered_objects
        CHECKS["gather"] += 1


def check_coalesced_and_barrier() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        next_case()
        xs = [values(s, dtype) for s in ((3,), (0,), (2, 2))]
        wants = [reduced(gathered(x), O.SUM, dtype) for x in xs]
        gathers = [[torch.empty_like(x) for x in xs] for _ in range(P)]
        dist.all_gather_coalesced(gathers, xs)
        for r, outs in enumerate(gathers):
            for o, x in zip(outs, xs):
                same("allgather_coalesced", o, values(x.shape, dtype, rank=r))
        dist.all_reduce_coalesced(xs)
        for x, w in zip(xs, wants):
            same("allreduce_coalesced", x, w, str(dtype))
    next_case()  # dtypes of several sizes in one allgather (at P = 1: views at odd offsets)
    xs = [values((3,), torch.int8), values((2,), torch.float32), values((1,), torch.int64)]
    outs = [torch.empty(P * x.numel(), dtype=x.dtype) for x in xs]
    with dist._coalescing_manager():
        for out, x in zip(outs, xs):
            dist.all_gather_into_tensor(out, x)
    for out, x in zip(outs, xs):
        same("allgather_coalesced", out, torch.from_numpy(np.concatenate(gathered(x))).to(x.dtype))
    with contextlib.suppress(NotImplementedError):  # refused; the group's calls still run
        with dist._coalescing_manager(device=torch.device("cpu")):
            pass
    y = torch.ones(2)
    dist.all_reduce(y)
    same("allreduce_coalesced", y, torch.full((2,), float(P)))
    try:
        dist.all_gather_coalesced([[] for _ in range(P)], [])
    except InvalidArgument as exc:
        assert "input_tensor_list" in str(exc), exc
    else:
        raise AssertionError("no error for no tensors")
    for _ in range(3):
        dist.barrier()
        CHECKS["barrier"] += 1


def check_nested_wait() -> None:
    """A Future's callback that waits for a second collective, through its Future (as torch's
    PowerSGD hook does) or its Work, dense and sparse (before: the callback ran in the thread
    that completes the second one: a hang that no timeout ended)."""
    def then(future, sparse, by_work):
        second = (torch.eye(3).to_sparse() if sparse else torch.ones(3)) * (RANK + 1)
        work = dist.all_reduce(second, async_op=True)
        if by_work:
            work.wait()
            return second
        return work.get_future().wait()[0]

    for sparse in (False, True):
        for by_work in (False, True):
            first = torch.ones(2)
            got = dist.all_reduce(first, async_op=True).get_future().then(
                lambda f: then(f, sparse, by_work)).wait()
            want = torch.eye(3) * (P * (P + 1) / 2) if sparse else torch.full((3,), P * (P + 1) / 2)
            same("nested wait", got.to_dense() if sparse else got, want)
    for _ in range(20):  # two operations completing together, the first's callback waiting for
        # the second (before: the watcher missed that every slot was taken: a hang in 1-17)
        first, second = torch.ones(2), torch.ones(3)
        works = [dist.all_reduce(t, async_op=True) for t in (first, second)]
        got = works[0].get_future().then(lambda f: (works[1].wait(), f.value())[1]).wait()
        same("nested wait", second, torch.full((3,), float(P)))


def check_hook_then_wait() -> None:
    """A callback on the Future of cupycoll's DDP hook (a dense bucket, a sparse one) that
    waits for a collective of the cupycoll group, as torch's PowerSGD hook does (before: it ran
    in cupycoll's completer thread, which that collective needed: a hang no timeout ended);
    the gradients are the average, DDP over gloo."""
    import cupycoll.torch as cct

    def waiting(future):
        x = torch.ones(3)
        dist.all_reduce(x, async_op=True).get_future().wait()
        assert x.tolist() == [float(P)] * 3, x
        return future.value()

    for sparse in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(16, 4, sparse=sparse),
                                    torch.nn.Linear(4, 2))
        ddp = DDP(model, process_group=GLOO)
        ddp.register_comm_hook(None, lambda _, bucket: cct.allreduce_hook(None, bucket).then(
            waiting))
        tokens = torch.tensor([RANK, RANK + 3, 7])
        ddp(tokens).sum().backward()
        local = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 2))
        local.load_state_dict(model.state_dict())
        local(tokens).sum().backward()
        for mine, theirs in zip(model.parameters(), local.parameters()):
            want = theirs.grad.clone()
            dist.all_reduce(want, group=GLOO)
            got = mine.grad.to_dense() if mine.grad.is_sparse else mine.grad
            assert torch.allclose(got, want / P), (sparse, got, want / P)
            CHECKS["nested wait"] += 1


def sparse_input(n: int, row: tuple, dtype: torch.dtype, empty_rank: int) -> torch.Tensor:
    """An uncoalesced COO tensor (duplicate rows) of ``n`` rows; no rows on ``empty_rank``."""
    rng = rng_for(SEED, RANK, _case)
    nnz = 0 if RANK == empty_rank else int(rng.integers(1, 2 * n))
    index = torch.from_numpy(rng.integers(0, n, (1, nnz)))
    return torch.sparse_coo_tensor(index, values((nnz,) + row, dtype), (n,) + row,
                                   check_invariants=True)


def check_sparse() -> None:
    """SUM in every dtype, row shape and empty rank (none, the first, the last); the other ops
    in float32 and int64 (AVG: float32)."""
    cases = [(dtype, row, empty_rank, O.SUM)
             for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64,
                           torch.float16)
             for row in ((), (4,), (2, 3)) for empty_rank in (-1, 0, P - 1)]
    cases += [(dtype, row, 0, op) for dtype in (torch.float32, torch.int64)
              for row in ((), (2, 3)) for op in (O.AVG, O.MAX, O.MIN, O.PRODUCT)
              if op != O.AVG or dtype.is_floating_point]
    for dtype, row, empty_rank, op in cases:
        next_case()
        check_sparse_case(sparse_input(9, row, dtype, empty_rank), op, dtype)
    next_case()  # two sparse dimensions, linearised
    index = torch.from_numpy(rng_for(SEED, RANK, _case).integers(0, 4, (2, 6)))
    check_sparse_case(torch.sparse_coo_tensor(index, values((6, 2), torch.float32), (4, 4, 2)),
                      O.SUM, torch.float32)
    next_case()  # no sparse dimension (sparse_dim 0): one value
    x = torch.sparse_coo_tensor(torch.zeros(0, 1, dtype=torch.long), values((1,), torch.float32),
                                ())
    dense = gathered(x.to_dense())
    dist.all_reduce(x)
    same("sparse allreduce", x.to_dense(), reduced(dense, O.SUM, torch.float32), "sparse_dim 0")
    for shape, sparse_dims in (((0, 4), 1), ((5, 0), 1), ((0,), 1), ((3, 0, 2), 2)):
        next_case()  # no elements (no rows, or rows of width 0): empty
        nnz = 2 if shape[0] and RANK % 2 else 0
        index = torch.zeros(sparse_dims, nnz, dtype=torch.long)
        mine, theirs = (torch.sparse_coo_tensor(index, torch.zeros((nnz, *shape[sparse_dims:])),
                                                shape) for _ in range(2))
        dist.all_reduce(mine)
        assert mine.is_coalesced() and not mine._nnz(), f"rank {RANK}: {shape}"
        same("sparse allreduce", mine.to_dense(), torch.zeros(shape), f"{shape}")
        if sparse_dims == 1:  # (gloo's result of two sparse dimensions is no valid tensor)
            dist.all_reduce(theirs, group=GLOO)
            same("sparse allreduce", mine.to_dense(), theirs.to_dense(), f"{shape} vs gloo")
    for op in (O.SUM, O.AVG):  # complex: torch hands the backend view_as_real(x), a new
        next_case()  # sparse tensor; x itself holds the result (gloo leaves x as it was)
        x = sparse_input(9, (2,), torch.complex64, 0)
        dense = gathered(x.to_dense())
        dist.all_reduce(x, op=op)
        same("sparse allreduce", x.to_dense(), reduced(dense, op, torch.complex64),
             f"complex64 {op}")


def check_sparse_case(x: torch.Tensor, op, dtype: torch.dtype) -> None:
    """cupycoll's result: the union of every rank's rows, each the dense reduction of the
    densified inputs (an absent row counts as 0), coalesced; equal to gloo's (SUM)."""
    dense = gathered(x.to_dense())
    rows = WORLD.allgather(x.coalesce().indices().numpy())
    union = np.unique(np.concatenate([r for r in rows], axis=1), axis=1)
    mine, theirs = x.clone(), x.clone()
    work = dist.all_reduce(mine, op=op, async_op=True)
    assert work.wait() is True and work.is_completed()
    value = work.get_future().wait()
    assert value[0] is mine and mine.is_coalesced(), f"rank {RANK}: sparse future value"
    same("sparse allreduce", mine.indices(), torch.from_numpy(union), f"{dtype} {op} indices")
    same("sparse allreduce", mine.to_dense(), reduced(dense, op, dtype), f"{dtype} {op} values")
    if op == O.SUM and dtype != torch.float16:  # gloo: SUM only, no float16 sparse sum
        dist.all_reduce(theirs, group=GLOO)
        same("sparse allreduce", mine.indices(), theirs.indices(), "vs gloo")
        same("sparse allreduce", mine.values(), theirs.values(), "vs gloo")


def check_sparse_async_differs() -> None:
    """A sparse ``dist.all_reduce`` with ``async_op`` True on some ranks and False on the
    others (the even ranks, then rank 0 alone): every rank gets gloo's sum (before: the
    asynchronous ranks ran on the background worker's communicator, the others on the
    group's, and every rank timed out)."""
    for overlaps in (RANK % 2 == 0, RANK == 0):
        next_case()
        x = sparse_input(9, (4,), torch.float32, -1)
        mine, theirs = x.clone(), x.clone()
        work = dist.all_reduce(mine, async_op=overlaps)
        if overlaps:
            work.wait()
        dist.all_reduce(theirs, group=GLOO)
        same("sparse allreduce", mine.indices(), theirs.indices(), "async differs, indices")
        same("sparse allreduce", mine.values(), theirs.values(), "async differs, values")


def check_errors() -> None:
    """Bad calls raise on every rank before anything travels, naming what was wrong."""
    for call, kind, words in (
            (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=O.BAND),
             InvalidArgument, "op"),
            (lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), op=O.AVG),
             InvalidArgument, "a bool tensor reduces with SUM, PRODUCT, MIN or MAX"),
            (lambda: dist.recv(torch.empty(1)), NotImplementedError, "has no recv_anysource"),
            (lambda: dist.all_gather_into_tensor(torch.empty(P + 1), torch.ones(1)),
             InvalidArgument, "all_gather_into_tensor"),
            (lambda: dist.all_to_all_single(torch.zeros(P), torch.arange(2.0 * P), [1] * P,
                                            [2] * P),  # 2 rows to itself, 1 expected from it
             InvalidArgument, "block to itself"),
            # a layout a verb does not take, named with the verb (before: torch's
            # "unsupported memory format option Contiguous", or CSR's is_contiguous error)
            (lambda: dist.broadcast(torch.eye(3).to_sparse(), src=0), InvalidType,
             "'broadcast: tensor'"),
            (lambda: dist.all_gather([torch.eye(3).to_sparse()] * P, torch.eye(3).to_sparse()),
             InvalidType, "'allgather: tensor'"),
            (lambda: dist.reduce(torch.eye(3).to_sparse(), dst=0), InvalidType,
             "'reduce: tensor'"),
            (lambda: dist.all_reduce(torch.eye(3).to_sparse_csr()), InvalidType,
             "torch.sparse_csr")):
        try:
            call()
        except kind as exc:
            assert words in str(exc) and f"rank {RANK}" in str(exc), str(exc)
            CHECKS["errors"] += 1
        else:
            raise AssertionError(f"rank {RANK}: no {kind.__name__} ({words})")


def check_sparse_errors() -> None:
    """Ranks that disagree on a sparse tensor's shape: every rank raises torch's
    DistBackendError that is cupycoll's MismatchError, naming the field, from the call
    (blocking) or from the Work's wait (async: the call runs on the background worker)."""
    rows = 9 if RANK == 0 and P > 1 else 10
    x = torch.sparse_coo_tensor([[0, 2]], torch.ones(2, 3), (rows, 3))
    for async_op in (False, True):
        try:
            work = dist.all_reduce(x.clone(), async_op=async_op)
            work.wait() if async_op else None
        except dist.DistBackendError as exc:
            assert isinstance(exc, MismatchError) and "n (" in str(exc), repr(exc)
            CHECKS["sparse errors"] += 1
        else:
            assert P == 1, f"rank {RANK}: no MismatchError (async_op={async_op})"
            CHECKS["sparse errors"] += 1


def check_one_rank_refuses() -> None:
    """A bad argument on rank 0 alone raises on every rank at once (no rank waits for the
    others' timeout): a sparse tensor's dtype or op, always (sync and async); a dense tensor's,
    with CUPYCOLL_DEBUG (all_to_all_single, scatter and gather too)."""
    group = dist.new_group(backend="cupycoll", timeout=datetime.timedelta(seconds=60))
    bad = RANK == 0

    def sparse(dtype):
        return torch.sparse_coo_tensor([[1, 2]], torch.ones(2, 3, dtype=dtype), (10, 3))

    def rowless(dtype, width=3):
        return torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long),
                                       torch.ones(0, width, dtype=dtype), (0, width))

    cases = [(lambda a: dist.all_reduce(sparse(torch.int8 if bad else torch.float32),
                                        group=group, async_op=a), InvalidType),
             (lambda a: dist.all_reduce(sparse(torch.int32), op=O.BAND if bad else O.SUM,
                                        group=group, async_op=a), InvalidArgument),
             # no rows anywhere, a bad dtype on rank 0; no rows on rank 0 alone, or rows of
             # another width (mismatches)
             (lambda a: dist.all_reduce(rowless(torch.int8 if bad else torch.float32),
                                        group=group, async_op=a), InvalidType),
             (lambda a: dist.all_reduce(rowless(torch.float32) if bad else sparse(
                 torch.float32), group=group, async_op=a), MismatchError),
             (lambda a: dist.all_reduce(rowless(torch.float32, 4 if bad else 3), group=group,
                                        async_op=a), MismatchError)][:3 if P == 1 else 5]
    dense = [(lambda a: dist.all_reduce(torch.ones(4, dtype=torch.int16 if bad else torch.int32),
                                        group=group, async_op=a), InvalidType),
             (lambda a: dist.all_reduce(torch.ones(4, dtype=torch.int32),
                                        op=O.BAND if bad else O.SUM, group=group, async_op=a),
              InvalidArgument),
             (lambda a: dist.reduce_scatter_tensor(torch.zeros(1), torch.ones(P + bad),
                                                   group=group, async_op=a), InvalidArgument),
             # the verbs over exchange: a split that does not fill the rows; a root's list
             (lambda a: dist.all_to_all_single(torch.zeros(P), torch.ones(P),
                                               input_split_sizes=[P + bad] + [0] * (P - 1)
                                               if bad else None, group=group, async_op=a),
              InvalidArgument),
             (lambda a: dist.scatter(torch.zeros(3), [torch.ones(3 + bad)] * P if bad else None,
                                     src=0, group=group, async_op=a), InvalidArgument),
             (lambda a: dist.gather(torch.ones(3), [torch.zeros(3 + bad)] * P if bad else None,
                                    dst=0, group=group, async_op=a), InvalidArgument),
             # a layout the verb does not take, on one rank (before: the others waited)
             (lambda a: dist.broadcast(torch.eye(3).to_sparse() if bad else torch.eye(3),
                                       src=0, group=group, async_op=a), InvalidType),
             (lambda a: dist.all_reduce(torch.eye(3).to_sparse_csr() if bad else torch.eye(3),
                                        group=group, async_op=a), InvalidType)]
    os.environ["CUPYCOLL_DEBUG"] = "1"
    try:
        for (call, kind), debugging in [(c, False) for c in cases] + [(c, True) for c in dense]:
            for async_op in (False, True):
                start = time.monotonic()
                try:
                    work = call(async_op)
                    work.wait() if async_op else None
                except (kind, MismatchError) as exc:
                    assert time.monotonic() - start < 30, f"rank {RANK} waited: {exc!r}"
                    assert isinstance(exc, kind) or not bad, repr(exc)
                    CHECKS["one rank refuses"] += 1
                else:
                    raise AssertionError(f"rank {RANK}: no error (debug={debugging})")
        # crossed calls that move the same bytes: barrier against a one-element int32
        # all_reduce, a broadcast of float32[4] against one of int64[2]
        crossings = [lambda: dist.barrier(group=group) if bad else dist.all_reduce(
                         torch.ones(1, dtype=torch.int32), group=group),
                     lambda: dist.broadcast(torch.zeros(4) if bad else torch.zeros(
                         2, dtype=torch.int64), src=0, group=group)]
        for crossing in crossings if P > 1 else ():
            try:
                crossing()
            except MismatchError:
                CHECKS["one rank refuses"] += 1
            else:
                raise AssertionError(f"rank {RANK}: a crossing passed")
    finally:
        del os.environ["CUPYCOLL_DEBUG"]


def check_bfloat16_duplicates() -> None:
    """bfloat16 duplicates are summed in float32 and rounded once, as cupycoll.torch sums
    them: 256 + 1 + 1 on every rank is P x 258 rounded to bfloat16 (summed in bfloat16, each
    rank's 256 + 1 would round back to 256)."""
    x = torch.sparse_coo_tensor([[0, 0, 0]], torch.tensor([256.0, 1.0, 1.0],
                                                          dtype=torch.bfloat16), (4,))
    dist.all_reduce(x)
    assert x.values().tolist() == [torch.tensor(P * 258.0).bfloat16().item()], x
    CHECKS["bfloat16 duplicates"] += 1


def check_timeout() -> None:
    """Groups made with a 2 s timeout: a collective rank 0 never joins (dense, then sparse on
    a group of its own) fails on the others as both torch's DistBackendError and cupycoll's
    CollectiveTimeout, naming rank 0; a DDP backward rank 0 never joins raises torch's
    RuntimeError naming the timeout and rank 0."""
    dense, sparse, trained = (dist.new_group(backend="cupycoll",
                                             timeout=datetime.timedelta(seconds=2))
                              for _ in range(3))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2),
                                                      process_group=trained)
    if RANK == 0 or P == 1:
        return
    try:  # DDP's reducer reads the failed Future in C++: the error, not a value (before: a
        model(torch.ones(3, 4)).sum().backward()  # PicklingError of the exception as tensors)
    except RuntimeError as exc:
        assert "CollectiveTimeout" in str(exc) and "rank 0 never arrived" in str(exc), repr(exc)
        CHECKS["timeout"] += 1
    else:
        raise AssertionError(f"rank {RANK}: DDP's backward did not time out")
    for group, x in ((dense, torch.ones(3)),
                     (sparse, torch.sparse_coo_tensor([[1]], torch.ones(1, 2), (4, 2)))):
        work = dist.all_reduce(x, group=group, async_op=True)
        try:
            work.wait()
        except dist.DistBackendError as exc:
            assert isinstance(exc, CollectiveTimeout) and exc.missing_ranks == [0], repr(exc)
            assert work.is_completed() and work.exception() is exc
            CHECKS["timeout"] += 1
        else:
            raise AssertionError(f"rank {RANK}: no timeout")


check_allreduce()
check_reduce()
check_broadcast()
check_allgather()
check_reduce_scatter()
check_all_to_all()
check_gather_scatter()
check_coalesced_and_barrier()
check_nested_wait()
check_hook_then_wait()
check_sparse()
check_sparse_async_differs()
check_errors()
check_sparse_errors()
check_one_rank_refuses()
check_bfloat16_duplicates()
CHECKS["ddp"] = check_ddp(SEED, GLOO)
WORLD.Barrier()
check_timeout()
napping_barrier()  # rank 0 skipped the timeouts the others wait for
timeouts = WORLD.reduce(CHECKS.pop("timeout", 0), root=0)
if RANK == 0:
    print(json.dumps({"checks": dict(sorted(CHECKS.items())), "timeouts": timeouts}), flush=True)
if THEN:
    dist.destroy_process_group()  # the hooks' workers make a gloo default group of their own
    if THEN[0] == "sparse":
        torch_sparse.main()
    else:
        torch_ddp.main(int(THEN[1]), report=True)
