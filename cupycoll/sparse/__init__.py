"""Exact sparse allreduce: the ``sparse_allreduce`` front door and its registered algorithms.

Importing this package registers the algorithms (``cupycoll.algorithms("sparse")`` lists them):
allgather, mask, dense, recursive_doubling, split, hierarchical and auto.
"""

from __future__ import annotations

from . import (allgather, auto, dense, hierarchical, mask,  # noqa: F401 (registers)
               recursive_doubling, split)
from .api import SparseResult, sparse_allreduce

__all__ = ["sparse_allreduce", "SparseResult"]
