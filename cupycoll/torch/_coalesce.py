"""Coalescing a CPU sparse gradient with cupycoll's own ``coo_reduce``: rows sorted and unique,
each row's duplicates summed in the order they appear in the tensor (the first copied, the
others added in turn).

That is the order torch's CPU ``coalesce()`` sums them wherever its sort keeps equal rows in
input order (from 32,768 entries in torch 2.x, where it sorts by radix); below that its sort
leaves equal rows in an order of its own, so a row present three times or more may differ from
torch's (and gloo's) sum in the last bit. ``coo_reduce`` reads the rows once, in input order,
through a table of the row span (docs/primitives.md), where torch gathers them in sorted order.
CUDA tensors, already coalesced ones and dtypes cupycoll does not reduce take torch's own
``coalesce()``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..primitives import VALUE_DTYPES, coo_reduce

__all__ = ["coalesce"]

_REDUCED = frozenset(torch.from_numpy(np.empty(0, d)).dtype for d in VALUE_DTYPES)


def coalesce(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (1-D int64, ascending, unique) and values of ``tensor`` coalesced.

    ``tensor``: sparse COO with one sparse dimension."""
    if tensor.is_cuda or tensor.is_coalesced() or tensor.dtype not in _REDUCED:
        done = tensor.coalesce()
        return done.indices()[0], done.values()
    values = tensor._values().contiguous()
    rows = values.reshape(values.shape[0], math.prod(values.shape[1:]))
    indices, summed = coo_reduce(tensor._indices()[0].numpy(), rows.numpy())
    return (torch.from_numpy(indices),
            torch.from_numpy(summed).reshape((indices.shape[0], *values.shape[1:])))
