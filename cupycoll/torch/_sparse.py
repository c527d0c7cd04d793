"""``cupycoll.torch.sparse_allreduce``: torch sparse COO tensors (an ``nn.Embedding(sparse=True)``
gradient) through cupycoll's exact sparse allreduce, at once or on cupycoll's background worker.

Each rank's rows go to :func:`cupycoll.sparse_allreduce` as zero-copy views, duplicates and
all: cupycoll adds each row's duplicates in input order (:mod:`._coalesce`: the rows read once,
where torch's ``coalesce()`` gathers them in sorted order); trailing dense dimensions are
flattened into the row width. Arrays cross as numpy (CPU) or CuPy (CUDA) views: no copy, and none of
DLPack's per-call cost on CPU.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any

import numpy as np
import torch

from .._background import run_async, run_in_order, runner
from ..comm import Communicator, Work, comm_or_default
from ..errors import InvalidArgument, InvalidType
from .._torch_tensors import Refused, check_device, holding, sparse_tensor
from .._types import check_flag
from ..sparse import sparse_allreduce as _sparse_allreduce
from ._coalesce import entries
from ._tensors import as_array, future_of, settled_later

__all__ = ["sparse_allreduce", "start", "future", "reduce"]


def sparse_allreduce(tensor: torch.Tensor, *, op: Any = "sum", comm: Communicator | None = None,
                     output: str = "sparse", out: torch.Tensor | None = None,
                     async_op: bool = False, **kwargs: Any) -> Any:
    """Allreduce a ``torch.sparse_coo_tensor`` with one sparse dimension (rows) over all ranks.

    Every rank gets the identical result: the rows of the union of all ranks' rows, each the
    **sum** of the ranks' rows (``op="avg"`` divides by P; "max", "min", "prod" as in
    :func:`cupycoll.sparse_allreduce`, a rank without a row counting as zeros there).
    Duplicate rows within a rank are summed first, in input order (as torch's ``coalesce()``
    sums them where its sort keeps that order); trailing dense dimensions are part of the row.

    Args:
        tensor: sparse COO tensor of shape ``(n, *row)`` (n >= 1, a row of >= 1 elements),
            any nnz (0 included), coalesced or not; float16, bfloat16 (reduced in float32,
            rounded back once), float32, float64, int32 or int64 values; CPU (MPI) or CUDA
            (NCCL). The same shape and dtype on every rank (what the ranks agree on is n, the
            row's element count and the dtype reduced: rows of (1, 3) and of (3,), or bfloat16
            and float32, are not told apart).
        op: "sum" (default), "avg", "max", "min", "prod" (or a ReduceOp).
        comm: communicator (default ``cupycoll.get_comm()``).
        output: "sparse": a coalesced sparse tensor (indices sorted, unique), as
            ``torch.distributed.all_reduce`` leaves it on gloo after ``coalesce()``. "dense":
            the strided tensor of ``tensor``'s shape, zeros where no rank has a row (for an
            optimizer that applies it densely anyway).
        out: with output="dense", a contiguous tensor of ``tensor``'s shape and dtype, written
            in place and returned (the same object).
        async_op: return a cupycoll :class:`Work` whose ``wait()`` returns the result. On MPI
            the whole call (coalescing, validation, reduction) runs on cupycoll's background
            worker over a duplicate communicator, in call order, so this thread does not wait
            for the other ranks; on NCCL as ``cupycoll.sparse_allreduce(async_op=True)``. A
            synchronous call runs over the same duplicate, after the asynchronous calls
            before it (in this thread when none is left), so ranks may differ in
            ``async_op``.
        kwargs: ``algorithm``, ``accumulate_dtype``, ``wire``, ``wire_values``, ``alloc_fn``,
            ``completion_fn``, ``fn_ctx`` of :func:`cupycoll.sparse_allreduce` (callbacks see
            numpy (CPU) or CuPy (CUDA) arrays: int64 indices, rows flattened to
            ``(nnz, width)``; ``alloc_fn`` may return tensors).
    Returns:
        The sparse or dense tensor on ``tensor``'s device, or a Work of it.
    Raises:
        InvalidType, InvalidArgument: ``tensor`` is not sparse COO with one sparse dimension,
            or any other bad argument, on every rank (the rank that passed it raises the precise
            error), as :func:`cupycoll.sparse_allreduce` raises it.
    Example::

        # rank 0: rows {1: [1., 1.]}            rank 1: rows {1: [2., 2.], 4: [5., 5.]}
        cct.sparse_allreduce(emb.weight.grad)   # both: rows {1: [3., 3.], 4: [5., 5.]}
    """
    comm = comm_or_default(comm)
    call = dict(kwargs, op=op, output=output, out=out)
    try:
        async_op = check_flag(async_op, "async_op", comm.rank)
        _check(tensor, comm.rank)
        _check_keywords(kwargs, comm.rank)
    except (InvalidArgument, InvalidType) as exc:
        call = {key: value for key, value in call.items() if key not in kwargs or key in
                _KEYWORDS}
        refused = functools.partial(_refused, error=exc, call=call)
        if async_op is True:
            return run_async(comm, refused, op_name="torch.sparse_allreduce")
        return run_in_order(comm, refused, "torch.sparse_allreduce")  # where the others' run
    if async_op:
        return start(comm, tensor, call)
    return run_in_order(comm, lambda on: reduce(tensor, on, **call), "torch.sparse_allreduce")


#: the keywords of cupycoll.sparse_allreduce that pass through ``kwargs``: all but those this
#: function takes itself or makes from ``tensor``
_KEYWORDS = frozenset(inspect.signature(_sparse_allreduce).parameters) - {
    "indices", "values", "n", "op", "comm", "output", "out", "async_op"}


def _check_keywords(kwargs: dict[str, Any], rank: int) -> None:
    """An unknown keyword is this rank's bad argument (raised on every rank), not a TypeError
    on this rank alone."""
    for key in kwargs:
        if key not in _KEYWORDS:
            raise InvalidArgument(key, kwargs[key], "is not a keyword of cupycoll.torch."
                                  f"sparse_allreduce; valid: {sorted(_KEYWORDS)}", rank=rank)


def _refused(comm: Communicator, error: Exception, call: dict[str, Any]) -> Any:
    """Take part in the validation round of the others' calls with ``error`` (a tensor this
    rank cannot reduce): it raises there (:class:`Refused`), so every rank raises; raising
    before the call would leave the others waiting in that round."""
    return _sparse_allreduce(np.empty(0, np.int64), Refused(error), 1, comm=comm,
                             **dict(call, out=None))


def start(comm: Communicator, tensor: torch.Tensor, call: dict[str, Any],
          op_name: str = "torch.sparse_allreduce") -> Work:
    """Start :func:`reduce` of ``tensor`` with keywords ``call`` through
    ``cupycoll._background.run_async``: on MPI on ``comm``'s worker over its duplicate (this
    thread goes on at once; calls run in call order on every rank), on NCCL here on
    ``comm``'s stream. The Work's result is the reduced tensor."""
    return run_async(comm, lambda on: reduce(tensor, on, **call), op_name=op_name)


def future(comm: Communicator, tensor: torch.Tensor, call: dict[str, Any],
           op_name: str, last: bool = False) -> torch.futures.Future:
    """A torch Future of :func:`start`'s result. On MPI the call runs on cupycoll's worker,
    and a settler thread completes the Future once it returns there (no hop through the
    completer thread; the Future's callbacks never hold the worker: one may start another
    operation and wait for it); ``last`` (nothing is left for the caller to overlap it with,
    e.g. DDP's last bucket) and the worker idle: the call runs here, on the worker's
    communicator, and completes the Future here, saving the thread switches. On NCCL the
    completer finishes it, after a host synchronize (the Future names the tensor's device),
    and a settler thread completes it (:func:`._tensors.future_of`)."""
    if getattr(comm, "stream_work", None) is not None:
        return future_of(start(comm, tensor, call, op_name), lambda result: result, tensor)
    worker = runner(comm)
    result: torch.futures.Future = torch.futures.Future()
    if last and worker.idle():
        try:
            result.set_result(reduce(tensor, worker.comm, **call))
        except Exception as exc:  # the Future carries it, as from the worker
            result.set_exception(exc)
        return result
    submitted = worker.submit(reduce, tensor, worker.comm, **call)
    settle = settled_later(result)  # (its callbacks must not hold the worker)
    submitted.add_done_callback(lambda done: settle(done.result))
    return result


def reduce(tensor: torch.Tensor, comm: Communicator, *, output: str = "sparse",
           out: Any = None, in_place: bool = False, **kwargs: Any) -> torch.Tensor:
    """The call itself, on ``comm``: coalesce, reduce, and return the torch result;
    ``in_place`` (a sparse output): ``tensor`` itself, holding the result (no copy)."""
    indices, values = _rows(tensor, kwargs.get("op", "sum"))
    target = _target(out, tensor, values.dtype, comm.rank)
    result = _sparse_allreduce(as_array(indices), as_array(values), tensor.shape[0],
                               comm=comm, output=output, out=_viewed(target, tensor, comm.rank),
                               **kwargs)
    if output == "dense":
        return _dense(result, tensor, out, target)
    reduced = sparse_tensor(result, tensor)
    return holding(tensor, reduced) if in_place else reduced


def _check(tensor: Any, rank: int) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        raise InvalidType("tensor", type(tensor).__name__ if not isinstance(
            tensor, torch.Tensor) else f"a {tensor.layout} tensor",
            "a torch.sparse_coo_tensor", rank=rank)
    check_device(tensor, "tensor", rank)
    if tensor.sparse_dim() != 1:
        raise InvalidArgument("tensor", f"sparse_dim={tensor.sparse_dim()}",
                              "one sparse dimension (rows), like an embedding gradient",
                              rank=rank)


def _rows(tensor: torch.Tensor, op: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows (:func:`._coalesce.entries` for ``op``): 1-D int64 indices and values
    ``(nnz,)`` or ``(nnz, width)``, bfloat16 as float32."""
    if tensor.dtype == torch.bfloat16:  # duplicates summed in float32 too
        tensor = tensor.float()
    indices, values = entries(tensor, op)
    if values.dim() > 2:  # explicit width: reshape(0, -1) of no rows is ambiguous
        values = values.reshape(values.shape[0], math.prod(values.shape[1:]))
    return indices, values.contiguous()


def _target(out: Any, tensor: torch.Tensor, dtype: torch.dtype, rank: int) -> Any:
    """What cupycoll writes a dense result into: ``out`` as ``(n, width)`` rows (a view), a
    float32 buffer for a bfloat16 ``out`` (copied over afterwards), or, where ``out`` is not
    a tensor of ``tensor``'s shape and dtype (contiguous beyond 2-D), what cupycoll's
    validation raises on every rank (the error of the tensor as given, not of its rows)."""
    if not isinstance(out, torch.Tensor):
        return out
    if out.dtype != tensor.dtype:
        return Refused(InvalidType("out", str(out.dtype), f"a tensor of dtype {tensor.dtype} "
                                   "(the input's)", rank=rank))
    if out.shape != tensor.shape:
        return Refused(InvalidArgument("out", tuple(out.shape), "must have the tensor's shape "
                                       f"{tuple(tensor.shape)}", rank=rank))
    if tensor.dim() > 2 and not out.is_contiguous():
        return Refused(InvalidArgument("out", "a non-contiguous tensor", "must be contiguous "
                                       "(written as rows of the tensor's shape)", rank=rank))
    if out.dtype == torch.bfloat16:
        return torch.empty(_flat_shape(tensor), dtype=dtype, device=out.device)
    if tensor.dim() > 2:
        return out.view(_flat_shape(tensor))
    return out


def _viewed(target: Any, tensor: torch.Tensor, rank: int) -> Any:
    """A tensor as the array cupycoll writes (numpy or CuPy, zero-copy), else as given; one
    that cannot be viewed so (e.g. it requires grad) as :class:`Refused`, which cupycoll's
    validation raises on every rank."""
    if not isinstance(target, torch.Tensor):
        return target
    try:
        return as_array(target)
    except (TypeError, RuntimeError) as exc:
        return Refused(InvalidArgument("out", f"a {target.dtype} tensor", "cannot be written "
                                       f"in place ({exc})", rank=rank))


def _flat_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    n = tensor.shape[0]
    return (n,) if tensor.dim() == 1 else (n, math.prod(tensor.shape[1:]))


def _dense(result: Any, tensor: torch.Tensor, out: Any, target: Any) -> torch.Tensor:
    """The dense result in ``tensor``'s shape and dtype: ``out`` itself when given."""
    if out is None:
        return torch.as_tensor(result, device=tensor.device).reshape(tensor.shape).to(
            tensor.dtype)
    if target is not out and target.dtype != out.dtype:  # the float32 buffer of a bfloat16
        out.copy_(target.view(out.shape))
    return out
