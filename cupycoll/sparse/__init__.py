"""Exact sparse allreduce: the ``sparse_allreduce`` front door and its registered algorithms.

Importing this package registers the algorithms (``cupycoll.algorithms("sparse")`` lists them):
each module registers its own record (``cupycoll._registry.Algorithm``) as it is imported, in
the order below, which is the order ``auto`` breaks ties in (after ``Algorithm.tie``).
"""

from __future__ import annotations

from . import allgather, dense, mask, recursive_doubling, split  # noqa: F401 (register)
from . import hierarchical, auto  # noqa: F401, I001 (register after the algorithms they use)
from . import small  # noqa: F401 (the record of calls whose entries ride in the validation)
from .api import SparseResult, sparse_allreduce

__all__ = ["sparse_allreduce", "SparseResult"]
