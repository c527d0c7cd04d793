"""SparseResult: what sparse_allreduce and topk_allreduce return on every rank."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["SparseResult"]


class SparseResult(NamedTuple):
    """Sorted unique ``indices`` (1-D), their ``values`` (1-D or (nnz, width)), dense length ``n``."""

    indices: Any
    values: Any
    n: int

    @property
    def nnz(self) -> int:
        """Number of stored entries (rows)."""
        return int(self.indices.shape[0])

    def to_dense(self) -> Any:
        """Return the dense array of length ``n`` (absent entries are 0), in the values' array
        library (a torch tensor for torch results)."""
        from ._types import as_array, callers
        from .primitives import densify

        dense = densify(as_array(self.indices, "indices"), as_array(self.values, "values"),
                        self.n)
        return callers(dense, self.values)
