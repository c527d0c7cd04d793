"""Tensor plumbing the hooks and the sparse helper share: array views of tensors, the dtypes
gradients are reduced in, and torch Futures completed from cupycoll Works."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from .._torch_tensors import as_array
from .._torch_work import torch_settlers
from ..comm import Work
from ..errors import InvalidType

__all__ = ["as_array", "working_dtype", "working_copy", "written_back", "future_of",
           "settled_later"]


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
    """A torch Future completed with ``finish(work.wait())`` (or its exception), in a settler
    thread (:func:`settled_later`: a ``then`` callback on it may wait for another operation).

    For a CUDA bucket the Future names its device, so torch records an event on the current
    stream when the value is set and DDP's wait makes its own stream wait for that event.
    """
    future: torch.futures.Future = torch.futures.Future(
        devices=[buffer.device] if buffer.is_cuda else None)
    settle = settled_later(future)
    work.add_done_callback(lambda _: settle(lambda: finish(work.wait())))
    return future


def settled_later(future: torch.futures.Future) -> Callable[[Callable[[], Any]], None]:
    """What completes ``future`` with a function's value (or its exception, which DDP raises
    from the backward pass): the function runs where the operation ended, the Future is then
    completed by cupycoll's torch settler threads, in completion order, so its callbacks never
    hold the thread that completes another operation (torch's PowerSGD hook waits for a second
    allreduce in one)."""
    settlers = torch_settlers()
    settlers.expect()

    def settle(value: Callable[[], Any]) -> None:
        try:
            done = functools.partial(future.set_result, value())
        except BaseException as exc:
            done = functools.partial(future.set_exception, exc)
        settlers.submit(done)

    return settle
