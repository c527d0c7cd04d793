"""``allgather``: allgatherv of every rank's coalesced entries, then one merge in rank order.

What Gloo, Horovod and DeepSpeed do, done right: inputs are coalesced first, the result is
sorted and unique, and every rank merges the same parts in the same (rank) order, so every value
is computed by the same left fold everywhere and the result is bitwise identical on all ranks.

Cost per rank (E = index + row bytes): in one exchange round, indices and rows of every other
rank with entries (sum of others' nnz) * E, one packed message per such peer. The sizes come
from the validation (``sparse_allreduce`` passes every rank's nnz as ``counts``); without them
a counts allgather of (P-1)*8 bytes comes first, and the compact wire always exchanges its
(count, bytes) pairs first. Local work: one P-way merge of all P * nnz entries. Best for small
totals, where its one round (after validation) wins.
"""

from __future__ import annotations

from typing import Any, Sequence

from .._registry import register
from .._types import ReduceOp
from ..wire._exchange import gather_entries
from ..wire._pack import COO, Wire
from ._common import reduce_parts
from ._cost import Cost, Shape

__all__ = ["allgather", "cost", "cost_over", "work", "ALGORITHM"]


def allgather(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
              accumulate_dtype: Any = None, wire: Wire = COO,
              counts: Sequence[int] | None = None) -> tuple[Any, Any]:
    """Allgatherv indices and values, merge the P parts in rank order (absent counts as 0).

    ``counts``: every rank's nnz when the caller knows them (then no size round on coo)."""
    parts, _ = gather_entries(comm, indices, values, "allgather", wire, 0, n, counts)
    return reduce_parts(parts, op, accumulate_dtype)


def cost(shape: Shape, rank: int, profile: Any = None) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce), the counts
    known (as ``sparse_allreduce`` calls it)."""
    return cost_over(shape, rank, 0, shape.n)


def cost_over(shape: Shape, rank: int, lo: int, hi: int) -> Cost:
    """:func:`cost` of blocks coded over ``[lo, hi)`` (a hierarchical rail's region): coo
    reuses the known counts (no size round), compact exchanges its (count, bytes) pairs first."""
    inputs = shape.inputs or [None] * shape.size
    blocks = [shape.block_bytes(c, a, lo, hi) for c, a in zip(shape.nnz, inputs)]
    if shape.wire.compact:
        return Cost().allgatherv_entries("allgather", shape.size, rank, blocks,
                                         shape.size_words)
    others = [b for k, b in enumerate(blocks) if k != rank and b]
    return Cost().book("allgather", sum(others), len(others))


def work(shape: Shape, rank: int, profile: Any = None) -> dict[str, float]:
    """Every rank packs its own entries and merges all N (the received blocks merge where
    they arrive; every element past a row's first folded)."""
    w = max(shape.width, 1)
    return {"merge": shape.total_nnz, "row": shape.nnz[rank] * w,
            "fold": shape.total_nnz * (w - 1)}


ALGORITHM = register("sparse", "allgather", allgather, cost=cost, work=work, counts=True)
