"""Tensors as the arrays cupycoll's verbs take, for the ``cupycoll`` process group.

CPU tensors become numpy views (no copy), CUDA tensors CuPy arrays through DLPack. Verbs that
only move bytes (broadcast, allgather, all-to-all) see every tensor as its bytes, so they take
any dtype. Reductions take the dtypes cupycoll reduces (float16/32/64, int8, uint8, int32,
int64), complex tensors for SUM and AVG (as their real and imaginary parts), and bfloat16 as a
float32 copy rounded back once. A tensor that is not contiguous is copied into a contiguous one
and the result copied back.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ._result import SparseResult
from ._types import ReduceOp
from .errors import InvalidArgument, InvalidType

__all__ = ["reduce_op", "as_array", "byte_tensor", "reduction_tensor", "sparse_parts", "holding",
           "sparse_tensor", "copied_back", "Refused", "dtype_code", "check_device", "dense_length"]


def as_array(tensor: torch.Tensor) -> Any:
    """A zero-copy numpy (CPU) or CuPy (CUDA) view of a contiguous tensor (``cupycoll.torch``
    uses it too: it lives here, below the package, so that either imports first)."""
    if tensor.is_cuda:
        import cupy

        return cupy.from_dlpack(tensor)
    return tensor.detach().numpy()


def check_device(tensor: torch.Tensor, name: str, rank: int) -> None:
    """Raise InvalidType unless ``tensor`` lives on the CPU or a CUDA device (a ``meta`` or
    another backend's tensor has no memory cupycoll can read)."""
    if tensor.device.type not in ("cpu", "cuda"):
        raise InvalidType(name, f"a tensor on device {tensor.device.type!r}",
                          "a tensor on the CPU or a CUDA device", rank=rank)


class Refused:
    """Stands for an argument this rank found bad before calling a cupycoll front door that
    validates collectively: reading it there (as an array, through DLPack) raises ``error``
    inside the validation round, so every rank raises, where raising before the call would
    leave the other ranks waiting in that round."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __dlpack_device__(self) -> Any:
        raise self.error

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


_TORCH_OPS = {dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.PRODUCT: ReduceOp.PROD,
              dist.ReduceOp.MIN: ReduceOp.MIN, dist.ReduceOp.MAX: ReduceOp.MAX,
              dist.ReduceOp.AVG: ReduceOp.AVG}
#: dtypes cupycoll's dense reductions take as they are.
_REDUCIBLE = frozenset({torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8,
                        torch.int32, torch.int64})
#: dtypes cupycoll's sparse allreduce takes as they are (values).
_SPARSE_VALUES = frozenset({torch.float16, torch.float32, torch.float64, torch.int32,
                            torch.int64})
_COMPLEX_OPS = frozenset({ReduceOp.SUM, ReduceOp.AVG})


def reduce_op(op: Any, verb: str, rank: int, dtype: torch.dtype | None = None) -> ReduceOp:
    """cupycoll's op for torch's ``op`` (a ``dist.ReduceOp`` or its ``RedOpType``) on a tensor
    of ``dtype``: a bool tensor (reduced as its uint8 bytes) sums as MAX and multiplies as MIN
    (logical or, and: gloo's and NCCL's results).

    Raises:
        InvalidArgument: BAND, BOR, BXOR, PREMUL_SUM; AVG of a bool tensor (named, with the
            verb and rank).
    """
    kind = getattr(op, "op", op)  # opts.reduceOp is a ReduceOp; its .op the RedOpType
    found = _TORCH_OPS.get(kind)
    if found is None:
        raise InvalidArgument(f"{verb}: op", kind, "cupycoll's process group reduces with "
                              "SUM, PRODUCT, MIN, MAX or AVG", rank=rank)
    if dtype == torch.bool and found not in (ReduceOp.MIN, ReduceOp.MAX):
        if found is ReduceOp.AVG:
            raise InvalidArgument(f"{verb}: op", kind, "a bool tensor reduces with SUM, "
                                  "PRODUCT, MIN or MAX (an average is no bool)", rank=rank)
        return ReduceOp.MAX if found is ReduceOp.SUM else ReduceOp.MIN
    return found


def dtype_code(dtype: torch.dtype) -> int:
    """``dtype``'s code in a CUPYCOLL_DEBUG agreement: its numpy twin's ``num``; one past
    numpy's codes (from its name) for a dtype numpy lacks (bfloat16)."""
    try:
        return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype.str).num
    except TypeError:
        return 1024 + zlib.crc32(str(dtype).encode()) % 2**20


def _contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def byte_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor`` (contiguous, or a contiguous copy) as a 1-D uint8 tensor."""
    if not tensor.numel():  # an empty tensor's strides may be 0: nothing to view
        return torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return _contiguous(tensor).reshape(-1).view(torch.uint8)


def reduction_tensor(tensor: torch.Tensor, op: ReduceOp, name: str, rank: int) -> torch.Tensor:
    """The tensor a reduction of ``tensor`` with ``op`` runs on: ``tensor`` itself, its real
    view (complex, SUM/AVG), its uint8 view (bool: :func:`reduce_op` says how), a float32 copy
    (bfloat16) or a contiguous copy. Where it is not
    ``tensor``'s own memory, :func:`copied_back` writes the result back.

    Raises:
        InvalidType: a dtype cupycoll does not reduce (named, with the rank).
    """
    if tensor.dtype in _REDUCIBLE:
        return _contiguous(tensor)
    if tensor.dtype == torch.bfloat16:
        return tensor.to(torch.float32, memory_format=torch.contiguous_format)
    if tensor.dtype == torch.bool:
        return _contiguous(tensor).view(torch.uint8)
    if tensor.is_complex() and op in _COMPLEX_OPS:
        return torch.view_as_real(_contiguous(tensor))
    raise InvalidType(name, str(tensor.dtype), "a float16, bfloat16, float32, float64, int8, "
                      "uint8, int32, int64 or bool tensor (complex for SUM and AVG)", rank=rank)


def copied_back(tensor: torch.Tensor, worked: torch.Tensor) -> torch.Tensor:
    """Write ``worked`` (what :func:`reduction_tensor` or :func:`byte_tensor` returned, now
    holding the result) into ``tensor`` unless it is ``tensor``'s own memory; return
    ``tensor``. Elements of ``tensor`` that share memory (an ``expand``-ed dimension) take the
    result of the first of them (what every verb gives them all when they hold one value on
    each rank: gloo's result)."""
    if worked.data_ptr() == tensor.data_ptr() and tensor.is_contiguous():
        return tensor
    if worked.dtype == torch.uint8 and tensor.dtype != torch.uint8:
        if worked.storage_offset() % tensor.element_size():  # no dtype view at that byte
            worked = worked.clone()
        worked = worked.view(tensor.dtype)
    elif tensor.is_complex() and not worked.is_complex():
        worked = torch.view_as_complex(worked)
    target, worked = tensor, worked.reshape(tensor.shape)
    for dim in range(tensor.dim()):
        if tensor.stride(dim) == 0 and tensor.shape[dim] > 1:  # one memory location
            target, worked = target.narrow(dim, 0, 1), worked.narrow(dim, 0, 1)
    with torch.no_grad():  # a parameter (a leaf that requires grad) or a view of one
        target.copy_(worked)
    return tensor


def dense_length(tensor: torch.Tensor) -> int:
    """The dense length (rows) a sparse tensor is reduced as: its sparse dimensions' product;
    for one without elements (no rows, or rows of width 0), reduced with no entries and rows of
    width 1 so its ranks agree on the call as on any other, 2**62 - 1 less a crc32 of its
    shape: a length that differs between shapes (a rank with another shape is a mismatch) and
    that no tensor with elements has."""
    if not tensor.numel():
        return 2**62 - 1 - zlib.crc32(repr(tuple(tensor.shape)).encode())
    return math.prod(tensor.shape[:tensor.sparse_dim()])


def sparse_parts(tensor: torch.Tensor, op: ReduceOp, rank: int) -> tuple[Any, Any, int]:
    """(row indices, values, n) of a sparse COO tensor for :func:`cupycoll.sparse_allreduce`
    with ``op`` (n: :func:`dense_length`).

    Its duplicates are summed as torch's COO means them whatever the reduction, each row's in
    input order (``cupycoll.torch``'s :func:`entries`: by cupycoll's sum where ``op`` sums).
    Several sparse dimensions are linearised row-major into one index in [0, n) first; dense
    trailing dimensions are flattened into the rows' width; bfloat16 values become a float32
    copy first (their duplicates are summed in float32, as ``cupycoll.torch`` sums them).

    Raises:
        InvalidType: values of a dtype cupycoll's sparse allreduce does not take, a tensor
            on neither the CPU nor a CUDA device.
    """
    from .torch._coalesce import entries  # here: cupycoll.torch imports this module

    check_device(tensor, "tensor", rank)
    if tensor.dtype != torch.bfloat16 and tensor.dtype not in _SPARSE_VALUES:
        raise InvalidType("tensor", str(tensor.dtype), "sparse values of dtype float16, "
                          "bfloat16, float32, float64, int32 or int64", rank=rank)
    n = dense_length(tensor)
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.to(torch.float32)
    if not tensor.numel():  # no rows or no width: an empty result, agreed as a stand-in call
        values = torch.empty((0, 1), dtype=tensor.dtype, device=tensor.device)
        return as_array(torch.empty(0, dtype=torch.int64, device=tensor.device)), \
            as_array(values), n
    index, values = entries(_one_sparse_dim(tensor, n), op)
    if values.dim() > 2:
        values = values.reshape(values.shape[0], math.prod(values.shape[1:]))
    return as_array(index.contiguous()), as_array(values.contiguous()), n


def _one_sparse_dim(tensor: torch.Tensor, n: int) -> torch.Tensor:
    """``tensor`` with its sparse dimensions linearised row-major into one of ``n`` rows (the
    order of its entries, so a coalesced tensor stays coalesced)."""
    sparse_dims = tensor.sparse_dim()
    if sparse_dims == 1:
        return tensor
    shape, indices = tuple(tensor.shape), tensor._indices()
    strides = torch.tensor([math.prod(shape[d + 1:sparse_dims]) for d in range(sparse_dims)],
                           dtype=torch.int64, device=indices.device)
    index = (indices * strides[:, None]).sum(0, keepdim=True)
    return torch.sparse_coo_tensor(index, tensor._values(), (n, *shape[sparse_dims:]),
                                   is_coalesced=tensor.is_coalesced(), check_invariants=False)


def sparse_tensor(result: SparseResult, like: torch.Tensor) -> torch.Tensor:
    """The coalesced sparse tensor of ``result`` with ``like``'s shape, dtype and device."""
    shape = tuple(like.shape)
    sparse_dims = like.sparse_dim()
    index = torch.as_tensor(result.indices, device=like.device).to(torch.int64)
    if sparse_dims == 1:
        indices = index.unsqueeze(0)
    else:
        rows = []
        for size in reversed(shape[:sparse_dims]):
            rows.append(index % size)
            index = index // size
        indices = torch.stack(rows[::-1]) if rows else index.new_empty((0, len(index)))
    values = torch.as_tensor(np.asarray(result.values) if not like.is_cuda else result.values,
                             device=like.device)
    values = values.reshape((len(index), *shape[sparse_dims:])).to(like.dtype)
    return torch.sparse_coo_tensor(indices, values, shape, is_coalesced=True,
                                   check_invariants=False)  # sorted and unique by construction


def holding(tensor: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """``tensor`` (sparse) made to hold ``result``'s indices and values as they are, and
    returned: its ``.data`` swapped, no copy (``copy_`` clones both). ``result`` is new and the
    caller's (cupycoll's result arrays are), so nothing else writes them. A real view of a
    complex sparse tensor (what torch's ``dist.all_reduce`` passes for one) makes that tensor
    hold the result too, as complex values."""
    base = tensor._base if tensor._is_view() else None
    with torch.no_grad():
        tensor.data = result
        if base is not None and base.layout == torch.sparse_coo and base.is_complex():
            values = torch.view_as_complex(result._values().contiguous())
            base.data = torch.sparse_coo_tensor(result._indices(), values, base.shape,
                                                is_coalesced=True, check_invariants=False)
    return tensor
