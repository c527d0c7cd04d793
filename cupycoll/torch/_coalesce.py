"""A CPU sparse gradient's rows as cupycoll takes them: duplicates and all where its sparse
allreduce sums them itself, each row's duplicates added in the order they appear in the tensor
(the first copied, the others added in turn), by ``coo_reduce`` or, for an algorithm that
takes them so, straight into the rows the reduction sends (no coalesced copy in between).

That is the order torch's CPU ``coalesce()`` sums them wherever its sort keeps equal rows in
input order (from 32,768 entries in torch 2.x, where it sorts by radix); below that its sort
leaves equal rows in an order of its own, so a row present three times or more may differ from
torch's (and gloo's) sum in the last bit. A reduction other than a sum gets the tensor's rows
summed first (``coo_reduce``: a COO tensor's duplicates mean their sum whatever the reduction);
CUDA tensors and dtypes cupycoll does not reduce take torch's own ``coalesce()``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .._types import ReduceOp, parse_op
from ..errors import CupycollError
from ..primitives import VALUE_DTYPES, coo_reduce

__all__ = ["entries"]

_REDUCED = frozenset(torch.from_numpy(np.empty(0, d)).dtype for d in VALUE_DTYPES)


def entries(tensor: torch.Tensor, op: Any = "sum") -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices (1-D int64) and values of ``tensor`` (sparse COO, one sparse dimension)
    for a cupycoll sparse allreduce with ``op``: as they are for a sum or an average of a CPU
    tensor of a dtype cupycoll reduces, else coalesced (ascending, unique)."""
    if tensor.is_cuda or tensor.is_coalesced() or tensor.dtype not in _REDUCED:
        done = tensor.coalesce()
        return done.indices()[0], done.values()
    if _sums(op):
        return tensor._indices()[0], tensor._values()
    values = tensor._values().contiguous()
    rows = values.reshape(values.shape[0], math.prod(values.shape[1:]))
    indices, summed = coo_reduce(tensor._indices()[0].numpy(), rows.numpy())
    return (torch.from_numpy(indices),
            torch.from_numpy(summed).reshape((indices.shape[0], *values.shape[1:])))


def _sums(op: Any) -> bool:
    """Whether ``op`` is a sum or an average (a bad op: no; cupycoll then names it on every
    rank)."""
    try:
        return parse_op(op) in (ReduceOp.SUM, ReduceOp.AVG)
    except CupycollError:
        return False
