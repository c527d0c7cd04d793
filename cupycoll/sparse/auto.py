"""``auto``: pick an exact algorithm from the call's global shape by a short, documented rule.

The rule only reads numbers every rank knows identically after the validation allreduce (P, every
rank's coalesced nnz, n, row width, element sizes), so every rank picks the same algorithm.
With N the total nnz over ranks, E = I + R the bytes of an entry (index + row), the first match
wins (the tuner of a later release replaces the constants by measurements):

1. P == 1                                            -> ``allgather`` (no traffic at all)
2. (N / P) * E >= DENSE_FRACTION * n * R             -> ``dense``  (inputs about half dense:
   the O(n) passes beat merging; float32 + int32: mean density >= 40%)
3. width >= WIDE_ROWS (embedding rows)               -> ``mask``   (one native allreduce of
   the union rows beats merging rows)
4. N * E <= SMALL_BYTES (latency bound)              -> ``allgather`` (fewest rounds)
5. otherwise                                         -> ``split``

The constants come from the CPU sweep in bench/bench_sparse.py (P=4, 2 cores): split beats
allgather from about 3K entries per rank; mask overtakes split between widths 8 and 16; dense
overtakes split between 25% and 50% density per rank. ``recursive_doubling`` is never chosen
here (its log P rounds do not pay off at P <= 8).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._registry import lookup, register
from .._types import ReduceOp
from . import allgather, dense, mask, recursive_doubling, split
from ._cost import Cost, Shape, validation_cost

__all__ = ["choose", "auto", "call_cost", "MODELS", "DENSE_FRACTION", "WIDE_ROWS",
           "SMALL_BYTES"]

#: mean per-rank entry bytes above this fraction of the dense bytes -> dense.
DENSE_FRACTION = 0.8
#: rows at least this wide -> mask (index bytes negligible, one native allreduce of the rows).
WIDE_ROWS = 12
#: all entries of all ranks together at most this many bytes -> allgather (fewest rounds).
SMALL_BYTES = 96 << 10


#: the cost model of every exact algorithm (bytes and messages received per rank).
MODELS = {"allgather": allgather.cost, "dense": dense.cost, "mask": mask.cost,
          "recursive_doubling": recursive_doubling.cost, "split": split.cost}


def choose(shape: Shape) -> str:
    """Return the algorithm name the rule above picks for ``shape``."""
    if shape.size == 1:
        return "allgather"
    mean_nnz = shape.total_nnz / shape.size
    if mean_nnz * shape.entry_bytes >= DENSE_FRACTION * shape.n * shape.row_bytes:
        return "dense"
    if shape.width >= WIDE_ROWS:
        return "mask"
    if shape.total_nnz * shape.entry_bytes <= SMALL_BYTES:
        return "allgather"
    return "split"


@register("sparse", "auto")
def auto(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
         accumulate_dtype: Any = None) -> tuple[Any, Any]:
    """Run the algorithm :func:`choose` picks (nnz of every rank gathered first).

    ``sparse_allreduce`` does not call this: it already knows every rank's nnz from its
    validation allreduce and calls :func:`choose` directly.
    """
    counts = comm.allgather_counts(int(indices.shape[0]), "auto.counts")
    width = int(values.shape[1]) if values.ndim == 2 else 0
    shape = Shape(comm.size, n, width, indices.dtype.itemsize, values.dtype.itemsize,
                  tuple(int(c) for c in counts))
    return lookup("sparse", choose(shape))(comm, indices, values, n, op, accumulate_dtype)


def call_cost(algorithm: str, shape: Shape, rank: int) -> Cost:
    """Traffic ``rank`` receives in one ``sparse_allreduce`` call: validation + the algorithm.

    ``algorithm`` may be "auto": resolved with :func:`choose` from the nnz alone, as
    ``sparse_allreduce`` does (``shape.inputs`` only sharpens the chosen algorithm's model).
    """
    name = choose(dataclasses.replace(shape, inputs=None)) if algorithm == "auto" else algorithm
    return validation_cost(shape.size).add(MODELS[name](shape, rank))
