"""NCCL backend: type tables and device choice in-process; under mpiexec the bootstrap, the
backend's logic over a host stand-in for NCCL, and (on GPUs) the real thing."""

from __future__ import annotations

import types

import numpy as np
import pytest
from cupy.cuda import nccl
from mpi4py import MPI

from cupycoll import ReduceOp
from cupycoll.comm import nccl as backend
from cupycoll.errors import BackendUnavailable, InvalidArgument, InvalidType
from tests._gpu import no_device_reason
from tests._mpi import run_mpi

#: ncclDataType_t and ncclRedOp_t as nccl.h numbers them (independent of both tables).
HEADER_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
                 "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
HEADER_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
CUPY_DTYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
               "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
               "float16": "NCCL_HALF", "float32": "NCCL_FLOAT", "float64": "NCCL_DOUBLE",
               "bfloat16": "NCCL_BFLOAT16"}


def _no_device_reason(nprocs: int = 1) -> str | None:
    """Why the GPU tests cannot run here (None when they can); fails on a broken CUDA."""
    return no_device_reason(nprocs)


@pytest.mark.parametrize("name", sorted(HEADER_DTYPES))
def test_every_dtype_maps_to_its_nccl_type(name):
    want = getattr(nccl, CUPY_DTYPES[name])
    assert want == HEADER_DTYPES[name]
    assert backend.nccl_types(name) == (want, None)
    if name != "bfloat16":  # numpy has no bfloat16 without ml_dtypes
        assert backend.nccl_types(np.dtype(name), nccl=nccl) == (want, None)
        assert backend.nccl_types(np.zeros(1, name).dtype, "sum")[0] == want


@pytest.mark.parametrize("op", list(ReduceOp))
def test_every_op_maps_to_its_nccl_op(op):
    want = getattr(nccl, "NCCL_" + op.value.upper())
    assert want == HEADER_OPS[op.value]
    for spelling in (op, op.value, op.value.upper()):
        assert backend.nccl_types(np.float32, spelling) == (nccl.NCCL_FLOAT32, want)


def test_mpi_ops_map_like_their_names():
    for mpi_op, name in ((MPI.SUM, "SUM"), (MPI.PROD, "PROD"), (MPI.MAX, "MAX"), (MPI.MIN, "MIN")):
        assert backend.nccl_types("int32", mpi_op)[1] == getattr(nccl, "NCCL_" + name)


@pytest.mark.parametrize("dtype", ["int16", "uint16", "bool", "complex64", "object", "float8"])
def test_unsupported_dtype_raises_invalid_type(dtype):
    with pytest.raises(InvalidType, match="dtype") as info:
        backend.nccl_types(dtype, "sum", rank=3)
    assert "rank 3" in str(info.value) and "float32" in str(info.value)


def test_unknown_op_raises():
    with pytest.raises(InvalidArgument, match="op"):
        backend.nccl_types(np.float32, "bitand")
    with pytest.raises(InvalidType, match="op"):
        backend.nccl_types(np.float32, 3.5)


def test_bfloat16_only_where_nccl_defines_it():
    without = types.SimpleNamespace(**{k: getattr(nccl, k) for k in dir(nccl)
                                       if k.startswith("NCCL_") and k != "NCCL_BFLOAT16"})
    with pytest.raises(InvalidType, match="bfloat16"):
        backend.nccl_types("bfloat16", nccl=without)
    assert backend.nccl_types("float16", "avg", nccl=without) == (6, 4)


def test_tables_cover_the_dense_dtypes_and_every_op():
    from cupycoll._types import DENSE_DTYPES

    assert {d.name for d in DENSE_DTYPES} | {"bfloat16"} <= set(backend.NCCL_DTYPES)
    assert set(backend.NCCL_OPS) == set(ReduceOp)


@pytest.mark.parametrize("local_rank, count, device", [(0, 1, 0), (3, 1, 0), (0, 8, 0), (5, 8, 5),
                                                       (9, 8, 1), (7, 4, 3), (4, 3, 1)])
def test_device_is_node_local_rank_modulo_device_count(local_rank, count, device):
    assert backend.device_for(local_rank, count) == device


def test_device_choice_errors():
    with pytest.raises(BackendUnavailable, match="needs a CUDA device"):
        backend.device_for(0, 0)
    with pytest.raises(InvalidArgument, match="local_rank"):
        backend.device_for(-1, 2)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_bootstrap_over_mpi(nprocs):
    """Unique id made on rank 0 reaches every rank; without a device every rank raises."""
    assert "ok on" in run_mpi(nprocs, "nccl_worker.py", "bootstrap", timeout=60)


def test_without_cupy_every_rank_raises_backend_unavailable():
    assert "ok on" in run_mpi(2, "nccl_worker.py", "nocupy", timeout=60)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_backend_logic_over_host_nccl(nprocs):
    """The backend's own code on a host stand-in for NCCL: results, groups, stats, waits with
    stuck events (tests/test_gpu_emulated.py runs the same checks at P = 1-4 and 8 on strictly
    emulated GPUs)."""
    assert "ok on" in run_mpi(nprocs, "nccl_worker.py", "emulated", 40 + nprocs, timeout=120)


@pytest.mark.gpu
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_collectives_on_gpus(nprocs):
    reason = _no_device_reason(nprocs)
    if reason is not None:
        pytest.skip(reason)
    assert "ok on" in run_mpi(nprocs, "nccl_worker.py", "gpu", 60 + nprocs, timeout=600)
