"""The GPU path (NCCL backend, cupy primitives and kernels) on emulated GPUs: cupycoll._emulation.

Few, large mpiexec launches: every suite at P = 1..4 with 2 emulated devices per node (so local
rank 1 runs on device 1), a quick subset at P = 8, and one launch per defect the emulator found.
"""

from __future__ import annotations

import pytest

from tests._mpi import run_mpi

pytestmark = pytest.mark.mpi


def _run(nprocs, mode, *args, timeout=300, **env):
    env = {"CC_EMU_" + k.upper(): str(v) for k, v in env.items()}
    out = run_mpi(nprocs, "gpu_emulated.py", mode, *args, timeout=timeout, env=env)
    assert f"gpu_emulated {mode}: ok on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_suites_on_emulated_gpus(nprocs):
    """Dense, sparse (every algorithm, sync and async), top-k (every algorithm, Ok-Topk refresh
    and non-refresh) on init("nccl") against numpy references; NCCL call logs agree."""
    _run(nprocs, "suites", 60 + nprocs, 24)


def test_suites_on_8_emulated_gpus():
    _run(8, "suites", 68, 8, "quick", timeout=400)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_async_sparse_runs_on_the_communicators_device(nprocs):
    _run(nprocs, "async_device")


def test_async_sparse_keeps_one_launch_order_on_every_rank():
    _run(2, "async_order", devices=1, timeout=120)


@pytest.mark.parametrize("cupy", [13, 14])
def test_dup_without_comm_split(cupy):
    _run(2, "dup", cupy=cupy, timeout=120)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_timeout_fires_when_a_peer_never_joins(nprocs):
    _run(nprocs, "missing_peer", timeout=90)


def test_wait_without_timeout_sees_a_peer_abort():
    _run(2, "peer_aborts", timeout=60)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_failed_init_on_one_rank_raises_everywhere(nprocs):
    _run(nprocs, "init_fails", timeout=90)


def test_init_keeps_the_current_device():
    _run(2, "device_choice", devices=3, timeout=90)


@pytest.mark.parametrize("nprocs", [1, 2])
def test_auto_backend_agreed_across_ranks(nprocs):
    _run(nprocs, "auto_agrees", timeout=90)


def test_the_emulator_catches_what_a_gpu_would_not_forgive():
    """Device mismatches, host arrays, NCCL units/overlap/memory, unordered stream reads, host
    syncs reported, cross-rank log differences, abort unblocking a blocked call."""
    _run(2, "rules", timeout=120)
