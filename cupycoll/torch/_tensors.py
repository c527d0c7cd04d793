"""Tensor plumbing the hooks and the sparse helper share: array views of tensors, the dtypes
gradients are reduced in, and torch Futures completed from cupycoll Works."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .._torch_tensors import as_array
from ..comm import Work
from ..errors import InvalidType

__all__ = ["as_array", "working_dtype", "working_copy", "written_back", "future_of"]


#: gradient dtype -> the dtype the hooks reduce it in: bfloat16 in float32 (numpy, the MPI
#: backend and the top-k tables have no bfloat16), written back with torch's rounding.
_WORKING_DTYPES = {torch.float16: torch.float16, torch.float32: torch.float32,
                   torch.float64: torch.float64, torch.bfloat16: torch.float32}


def working_dtype(buffer: torch.Tensor, rank: int) -> torch.dtype:
    """The dtype a hook reduces a gradient bucket (dense or sparse) of ``buffer``'s dtype in.

    Raises:
        InvalidType: a bucket dtype the hooks do not reduce (named, with this rank).
    """
    dtype = _WORKING_DTYPES.get(buffer.dtype)
    if dtype is None:
        raise InvalidType("bucket", str(buffer.dtype), "a float16, bfloat16, float32 or "
                          "float64 gradient bucket", rank=rank)
    return dtype


def working_copy(buffer: torch.Tensor, rank: int) -> torch.Tensor:
    """The tensor a hook reduces: the dense bucket itself, or a float32 copy of a bfloat16 one.

    Raises:
        InvalidType: as :func:`working_dtype`.
    """
    dtype = working_dtype(buffer, rank)
    return buffer if dtype == buffer.dtype else buffer.to(dtype)


def written_back(buffer: torch.Tensor, reduced: torch.Tensor) -> torch.Tensor:
    """The bucket holding ``reduced`` (rounded by torch where it is a float32 copy)."""
    return buffer if reduced is buffer else buffer.copy_(reduced)


def future_of(work: Work, finish: Callable[[Any], Any],
              buffer: torch.Tensor) -> torch.futures.Future:
    """A torch Future completed with ``finish(work.wait())`` (or its exception).

    For a CUDA bucket the Future names its device, so torch records an event on the current
    stream when the value is set and DDP's wait makes its own stream wait for that event.
    """
    future: torch.futures.Future = torch.futures.Future(
        devices=[buffer.device] if buffer.is_cuda else None)

    def done(_: Work) -> None:
        try:
            future.set_result(finish(work.wait()))
        except BaseException as exc:  # DDP re-raises it from the backward pass
            future.set_exception(exc)

    work.add_done_callback(done)
    return future
