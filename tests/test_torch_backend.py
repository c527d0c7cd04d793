"""The ``cupycoll`` backend for torch.distributed (cupycoll/_torch_backend.py and siblings).

Launches: every verb against gloo and numpy, then DDP with a sparse embedding, at P = 1-4
(tests/workers/torch_backend.py, one mpiexec job each, which then runs cupycoll.torch's hooks'
checks: tests/workers/torch_sparse.py at P = 1 and 3, tests/workers/torch_ddp.py at 2 and 4);
torchrun with each process under ``mpiexec -n 1`` (joined through MPI ports) and with bare
singletons (a clear error on every rank, no hang). In process: registration, the timeout rule, the
error mapping, the op table, TorchWork's completion, and the tensor conversions.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist

from cupycoll import _torch_backend as backend
from cupycoll._torch_tensors import (byte_tensor, copied_back, reduce_op, reduction_tensor,
                                     sparse_parts, sparse_tensor)
from cupycoll._torch_work import TorchWork, dist_error, network_error
from cupycoll._torch_world import rendezvous, timeout_seconds
from cupycoll._types import ReduceOp
from cupycoll.comm import Work
from cupycoll.errors import (BackendError, BackendUnavailable, CollectiveTimeout,
                             InvalidArgument, InvalidType)
from tests._mpi import ROOT, WORKERS, mpiexec, run_mpi

VERBS = ("allreduce", "sparse allreduce", "broadcast", "reduce", "allgather",
         "all_gather_single", "reduce_scatter", "reduce_scatter_single", "all_to_all_single",
         "alltoall", "gather", "scatter", "barrier", "allreduce_coalesced",
         "allgather_coalesced", "all_gather_single_coalesced",
         "reduce_scatter_single_coalesced", "errors", "sparse errors", "one rank refuses",
         "bfloat16 duplicates", "nested wait", "ddp")


def hooks(nprocs: int) -> tuple:
    """What the job runs after the backend's checks, in the same processes (each rank imports
    torch once): tests/workers/torch_ddp.py at P = 2 and 4, 600 // P steps (every P sees the
    same number of samples, 32 per rank per step; its sparse checks are torch_sparse.py's), and
    tests/workers/torch_sparse.py at P = 1 and 3."""
    return ("ddp", 600 // nprocs) if nprocs % 2 == 0 else ("sparse",)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_every_verb_and_ddp_against_gloo_then_the_hooks(nprocs):
    then = hooks(nprocs)
    out = run_mpi(nprocs, "torch_backend.py", 11, *then, timeout=900)
    report = json.loads(next(line for line in out.splitlines() if line.startswith('{"checks"')))
    assert {v for v, n in report["checks"].items() if n} >= set(VERBS), report
    assert report["timeouts"] == 3 * (nprocs - 1)  # dense, sparse and DDP: every rank but
    # the late one named it
    if then[0] == "sparse":
        assert f"torch_sparse: P = {nprocs} ok" in out
    else:
        assert out.count('"hook"') == 5 and f"P = {nprocs}: float32 values differing" in out
    print(out)  # the accuracy, bytes and step-time rows (docs/pytorch.md)


def torchrun(nprocs: int, under_mpiexec: bool, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the torchrun worker on ``nprocs`` processes, each under ``mpiexec -n 1`` or bare."""
    python = [sys.executable, str(WORKERS / "torch_backend_torchrun.py"), "7"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nprocs}", "--no-python",
           *([mpiexec(), "-n", "1"] if under_mpiexec else []), *python]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=ROOT, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"timeout after {timeout}s: {' '.join(cmd)}\n{(exc.stdout or b'')[-3000:]!r}")


@pytest.mark.ranks(3)
def test_torchrun_joins_processes_started_apart():
    proc = torchrun(3, under_mpiexec=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # three processes share torchrun's stdout: their lines may interleave, so match each
    assert sorted(re.findall(r"rank (\d+) of 3: ok", proc.stdout)) == ["0", "1", "2"], \
        proc.stdout[-4000:]


def test_torchrun_bare_singletons_fail_clearly_on_every_rank():
    """MPICH 5.0 cannot connect bare singletons (pmodels/mpich#7805): every rank says so and
    what to launch instead; none hangs."""
    proc = torchrun(2, under_mpiexec=False)
    assert proc.returncode != 0
    for rank in range(2):
        assert f"rank {rank}: MPI could not connect the separately started processes" in \
            proc.stderr and "mpiexec -n 1" in proc.stderr, proc.stderr[-4000:]
    assert "DistNetworkBackendUnavailable" in proc.stderr


def test_a_subgroup_of_another_default_needs_mpiexec(monkeypatch):
    """A cupycoll subgroup of a gloo default group over processes started apart (MPI worlds
    of one) cannot be joined: it says what to do instead of failing inside MPI."""
    from cupycoll import _torch_world

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    with pytest.raises(BackendUnavailable, match="make cupycoll the default group's backend"):
        _torch_world._mpiexec_world(dist.HashStore(), 1, [0, 1])


def test_a_subgroup_whose_torch_ranks_are_not_mpis_raises_on_every_member(monkeypatch):
    """A cupycoll subgroup of another default group whose torch ranks differ from MPI's:
    every member raises, also one whose own two ranks agree (before: that member went on into
    MPI's group creation and waited there for ever for the members that had raised)."""
    from cupycoll import _torch_world

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    store = dist.HashStore()
    store.set("cupycoll.mpi_rank.1", "5")  # the other member: torch rank 1, MPI rank 5
    with pytest.raises(InvalidArgument, match="torch's rank 1 differs from MPI's \\(5\\)"):
        _torch_world._mpiexec_world(store, 0, [0, 1])  # this member: torch 0 = MPI 0


def test_open_mpi_refuses_to_join_processes_started_apart(monkeypatch):
    """Under Open MPI (its Accept/Connect across separate mpiexec runs never return, and take
    no timeout) a group over processes started apart is refused at once, nothing posted."""
    from cupycoll import _torch_world

    monkeypatch.setattr(_torch_world.MPI, "Get_library_version", lambda: "Open MPI v5.0.11")
    monkeypatch.setattr(_torch_world, "_connect_ports", lambda *a: pytest.fail("connected"))
    with pytest.raises(dist.DistNetworkError, match="rank 1: Open MPI cannot connect") as info:
        _torch_world._form_world(object(), 1, 2, 5.0)
    assert isinstance(info.value, BackendUnavailable) and "mpiexec -n 2" in str(info.value)


def test_a_destroyed_default_groups_world_is_forgotten(monkeypatch):
    """Subgroups are cut from the live default group's world: once that group is shut down, a
    subgroup of a later default group (here of another backend) is not made from the old one
    (whose rank order may differ), it goes to mpiexec's world and its checks."""
    from cupycoll import _torch_world

    old = object()
    monkeypatch.setattr(_torch_world, "_world", old)
    _torch_world.forget_world(object())  # another group's communicator: kept
    assert _torch_world._world is old
    _torch_world.forget_world(old)
    assert _torch_world._world is None
    monkeypatch.setattr(_torch_world, "_world", old)  # an aborted group's too (torch's abort
    group = types.SimpleNamespace(_device=None, _host=None, _mpi_comm=old)  # calls abort,
    backend.ProcessGroupCupycoll.abort(group)  # never shutdown)
    assert _torch_world._world is None


@pytest.mark.ranks(4)
def test_processes_with_a_gloo_subgroup_exit_cleanly():
    """Rank 0 holds the TCPStore a gloo subgroup's store is built on: a rank still tearing
    its groups down when rank 0 had exited aborted ("terminate called without an active
    exception", in about half the runs at P = 4). Three runs, every rank exits 0."""
    for _ in range(3):
        run_mpi(4, "torch_exit.py", timeout=120)


def test_exit_ends_a_background_call_its_peers_never_join():
    """Rank 0 exits with an asynchronous sparse allreduce on the background worker that no
    peer joins: the exit waits its few seconds, then ends the call; every rank exits 0."""
    start = time.monotonic()
    out = run_mpi(2, "torch_exit.py", "unmatched", timeout=90)
    assert out.count(": leaves") == 2 and time.monotonic() - start < 60, out
    out = run_mpi(2, "torch_exit.py", "thread", timeout=90)  # but a call a thread of the
    assert out.count("waited [[2.0, 0.0], [0.0, 2.0]]") == 2, out  # program waits for runs on


@pytest.mark.parametrize("nprocs", [1, 3])
def test_exit_lets_callbacks_and_their_collectives_finish(nprocs):
    """The exit waits for started operations' Future callbacks, one of them waiting for a
    collective it starts, and every rank exits 0 (tests/workers/torch_exit.py)."""
    out = run_mpi(nprocs, "torch_exit.py", "callbacks", timeout=120)
    for rank in range(nprocs):
        assert f"rank {rank}: nested {[float(nprocs)] * 3}" in out, out
        assert f"rank {rank}: sleepy {[2.0 * nprocs] * 2}" in out, out


def test_registering_is_idempotent():
    backend.register()
    backend.register()
    assert dist.Backend.backend_list.count("cupycoll") == 1
    assert dist.Backend("cupycoll") == "cupycoll"
    assert dist.Backend.backend_capability["cupycoll"] == ["cpu", "cuda"]
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"  # defaults left alone


@pytest.mark.parametrize("env, group, expected", [
    (None, datetime.timedelta(minutes=30), 1800.0), ("5", datetime.timedelta(minutes=30), 5.0),
    ("5", datetime.timedelta(seconds=2), 2.0), ("0", datetime.timedelta(seconds=9), 9.0),
    (None, None, None), ("0", None, None)])
def test_timeout_is_the_shorter_of_the_group_and_cupycoll_timeout(monkeypatch, env, group,
                                                                   expected):
    if env is None:
        monkeypatch.delenv("CUPYCOLL_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("CUPYCOLL_TIMEOUT", env)
    assert timeout_seconds(group) == expected


def test_cupycoll_errors_reach_torch_as_dist_errors():
    late = CollectiveTimeout("allreduce timed out", missing_ranks=[2], op_name="allreduce")
    raised = dist_error(late)
    assert isinstance(raised, dist.DistBackendError) and isinstance(raised, CollectiveTimeout)
    assert isinstance(raised, TimeoutError) and type(raised).__name__ == \
        "DistBackendCollectiveTimeout"
    assert raised.missing_ranks == [2] and raised.op_name == "allreduce"
    assert str(raised) == str(late) and raised.__cause__ is late
    failed = dist_error(BackendError("MPI failed"))
    assert isinstance(failed, dist.DistBackendError) and isinstance(failed, BackendError)
    bad = InvalidArgument("op", "BAND", "no", rank=0)
    assert dist_error(bad) is bad  # bad arguments stay ValueError / TypeError
    unreachable = network_error(BackendUnavailable("no port"))
    assert isinstance(unreachable, dist.DistNetworkError)
    assert network_error(unreachable) is unreachable


@pytest.mark.parametrize("op, expected", [
    (dist.ReduceOp.SUM, ReduceOp.SUM), (dist.ReduceOp.PRODUCT, ReduceOp.PROD),
    (dist.ReduceOp.MIN, ReduceOp.MIN), (dist.ReduceOp.MAX, ReduceOp.MAX),
    (dist.ReduceOp.AVG, ReduceOp.AVG), (dist.ReduceOp.BAND, None), (dist.ReduceOp.BXOR, None),
    (dist.ReduceOp.PREMUL_SUM, None)])
def test_torch_ops_map_and_the_others_raise(op, expected):
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp(op) if op != dist.ReduceOp.PREMUL_SUM else \
        dist._make_nccl_premul_sum(2.0)
    if expected is None:
        with pytest.raises(InvalidArgument, match="'allreduce: op' on rank 3"):
            reduce_op(options.reduceOp, "allreduce", 3)
    else:
        assert reduce_op(options.reduceOp, "allreduce", 0) is expected


def test_torch_work_completes_from_cupycoll_and_carries_errors():
    release = threading.Event()
    tensor = torch.ones(2)
    work = TorchWork(Work(wait_fn=lambda: release.wait(60)), lambda _: [tensor],
                     verb="allreduce")
    with pytest.raises(dist.DistBackendError, match="allreduce: Work.wait") as info:
        work.wait(datetime.timedelta(seconds=0.2))
    assert isinstance(info.value, CollectiveTimeout) and not work.is_completed()
    release.set()
    assert work.wait() is True and work.is_completed() and work.is_success()
    assert work.get_future().wait() == [tensor] and work.result() == [tensor]

    def fail():
        raise BackendError("MPI failed allreduce on rank 0")

    broken = TorchWork(Work(wait_fn=fail), lambda _: [tensor], verb="allreduce")
    with pytest.raises(dist.DistBackendError, match="MPI failed") as info:
        broken.wait()
    assert isinstance(info.value, BackendError) and broken.exception() is info.value
    with pytest.raises(RuntimeError, match="BackendError: MPI failed allreduce on rank 0"):
        broken.get_future().wait()  # torch's Future holds it as an error, not as its value


@pytest.fixture
def one_rank_group():
    dist.init_process_group("cupycoll", init_method="cupycoll://")
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_one_rank_group(one_rank_group):
    assert dist.get_backend() == "cupycoll" and one_rank_group.name() == "cupycoll"
    for _ in range(200):  # the Work's future is done once wait() returns (both futures)
        work = dist.all_reduce(torch.ones(2), async_op=True)
        assert work.wait() and work.get_future().done() and work.get_future().value()
    x = torch.arange(4.0)
    work = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
    assert work.wait() and work.get_future().wait() == [x] and x.tolist() == [0, 1, 2, 3]
    s = torch.sparse_coo_tensor(torch.tensor([[2, 0, 2]]), torch.ones(3, 2), (4, 2),
                                check_invariants=True)
    dist.all_reduce(s)
    assert s.is_coalesced() and s.indices().tolist() == [[0, 2]]
    assert s.values().tolist() == [[1, 1], [2, 2]]
    with pytest.raises(NotImplementedError, match=r"\(rank 0\) has no recv_anysource"):
        dist.recv(torch.empty(1))
    one_rank_group.abort()
    with pytest.raises(dist.DistBackendError, match="abort") as info:
        dist.all_reduce(x)
    assert isinstance(info.value, BackendError) and isinstance(info.value.__cause__,
                                                               BackendError)


def test_rendezvous_takes_rank_and_size_from_mpi():
    with pytest.raises(InvalidArgument, match="'rank'.*takes it from MPI"):
        dist.init_process_group("cupycoll", init_method="cupycoll://", rank=1, world_size=1)
    assert not dist.is_initialized()
    with pytest.raises(InvalidArgument, match="'world_size'.*takes it from MPI.*got 'one'"):
        next(iter(rendezvous("cupycoll://?rank=0&world_size=one")))  # not a number: InvalidArgument


@pytest.mark.parametrize("shape, row", [((9,), ()), ((9, 4), (4,)), ((3, 3, 2), (2,)),
                                        ((5, 4), ())])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX])
def test_sparse_tensors_round_trip(shape, row, op):
    """What the sparse allreduce makes of the parts, turned back into a tensor, is the
    coalesced input (several sparse dimensions linearised row-major; one rank: no
    communication; a sum's parts go uncoalesced, a max's summed first)."""
    import cupycoll as cc

    comm = cc.init("mpi")
    sparse_dims = len(shape) - len(row)
    gen = torch.Generator().manual_seed(len(shape))
    for nnz in (0, 6):
        index = torch.stack([torch.randint(0, s, (nnz,), generator=gen)
                             for s in shape[:sparse_dims]])
        x = torch.sparse_coo_tensor(index, torch.randn((nnz,) + row, generator=gen), shape,
                                    check_invariants=True)
        flat, values, n = sparse_parts(x, op, rank=0)
        assert n == int(np.prod(shape[:sparse_dims])) and flat.ndim == 1
        back = sparse_tensor(cc.sparse_allreduce(flat, values, n, op=op, comm=comm), x)
        want = x.coalesce()
        assert back.is_coalesced() and back.shape == x.shape
        assert torch.equal(back.indices(), want.indices())
        assert torch.equal(back.values(), want.values())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int64])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX])
def test_duplicates_are_summed(dtype, op):
    """An uncoalesced tensor (rows repeated, as an embedding gradient): each row's values
    summed, by the sparse allreduce or before it (small integers: exact in any order),
    against float64 sums; one rank."""
    import cupycoll as cc

    comm = cc.init("mpi")
    gen = torch.Generator().manual_seed(5)
    index = torch.randint(0, 20, (1, 500), generator=gen)
    values = (torch.randn(500, 3, generator=gen) * 8).round().to(dtype)
    x = torch.sparse_coo_tensor(index, values, (20, 3), check_invariants=True)
    flat, summed = cc.sparse_allreduce(*sparse_parts(x, op, rank=0), op=op, comm=comm)[:2]
    want = torch.zeros(20, 3, dtype=torch.float64).index_add_(0, index[0], values.double())
    assert flat.tolist() == sorted(set(index[0].tolist()))
    assert torch.equal(torch.from_numpy(np.asarray(summed)).double(),
                       want[flat].to(dtype if dtype != torch.bfloat16 else torch.float32).double())


def test_sparse_values_of_other_dtypes_are_refused():
    x = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.ones(1, dtype=torch.int8), (3,),
                                check_invariants=True)
    with pytest.raises(InvalidType, match="'tensor' on rank 2.*torch.int8"):
        sparse_parts(x, ReduceOp.SUM, rank=2)


def test_working_tensors_write_results_back():
    base = torch.arange(12.0).reshape(3, 4)
    odd = base.t()  # not contiguous: worked on a copy
    worked = reduction_tensor(odd, ReduceOp.SUM, "tensor", 0)
    assert worked.is_contiguous() and worked.data_ptr() != base.data_ptr()
    worked.mul_(2)
    assert torch.equal(copied_back(odd, worked), torch.arange(12.0).reshape(3, 4).t() * 2)
    half = torch.tensor([1.5, 2.5], dtype=torch.bfloat16)
    assert reduction_tensor(half, ReduceOp.AVG, "tensor", 0).dtype == torch.float32
    complex_ = torch.tensor([1 + 2j], dtype=torch.complex64)
    assert reduction_tensor(complex_, ReduceOp.SUM, "tensor", 0).data_ptr() == \
        complex_.data_ptr()
    with pytest.raises(InvalidType, match="complex for SUM and AVG"):
        reduction_tensor(complex_, ReduceOp.MAX, "tensor", 0)
    for empty in (torch.empty((0, 3), dtype=torch.float16),
                  torch.from_numpy(np.zeros(0, np.int64)).to(torch.float16)):  # stride 0
        assert byte_tensor(empty).numel() == 0
        assert copied_back(empty, byte_tensor(empty)) is empty
    weight = torch.nn.Parameter(torch.ones(2, 3, dtype=torch.bfloat16))  # requires grad
    for target in (weight, weight.t()):
        worked = reduction_tensor(target, ReduceOp.SUM, "tensor", 0)
        worked.fill_(3)
        assert copied_back(target, worked) is target and (target == 3).all()
    flags = torch.tensor([[True, False], [False, True]]).t()
    data = byte_tensor(flags)
    data.fill_(1)
    assert copied_back(flags, data).all()
