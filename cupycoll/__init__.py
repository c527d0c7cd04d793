"""cupycoll: dense and sparse collective communication over MPI/numpy and NCCL/CuPy."""

from __future__ import annotations

import logging

from . import errors
from ._registry import algorithms
from ._types import ReduceOp
from .collectives import (all_gather, all_reduce, allgather, allreduce, broadcast, reduce,
                          reduce_scatter)
from ._result import SparseResult
from .comm import Communicator, Stats, Work, get_comm, init
from .sparse import sparse_allreduce
from .topk import TopkCompressor, TopkState, topk_allreduce

__all__ = ["init", "get_comm", "Communicator", "Stats", "Work", "ReduceOp", "errors",
           "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "all_reduce",
           "all_gather", "algorithms", "SparseResult", "sparse_allreduce", "topk_allreduce", "TopkCompressor",
           "TopkState"]

logging.getLogger("cupycoll").addHandler(logging.NullHandler())


def __getattr__(name: str) -> str:
    """``cupycoll.__version__``, read on first use from the installed distribution's metadata
    (the one version source: pyproject.toml), so that ``import cupycoll`` does not import
    ``importlib.metadata`` and the email and zip parsers it brings."""
    if name != "__version__":
        raise AttributeError(f"module 'cupycoll' has no attribute {name!r}")
    from importlib import metadata
    try:
        version = metadata.version("cupycoll")
    except metadata.PackageNotFoundError:  # a source checkout that was never installed
        version = "0+unknown"
    globals()["__version__"] = version
    return version
