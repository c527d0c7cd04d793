"""cupycoll: dense and sparse collective communication over MPI/numpy and NCCL/CuPy."""

from __future__ import annotations

import logging
from importlib import metadata

from . import errors
from ._registry import algorithms
from ._types import ReduceOp
from .collectives import (all_gather, all_reduce, allgather, allreduce, broadcast, reduce,
                          reduce_scatter)
from ._result import SparseResult
from .comm import Communicator, Stats, Work, get_comm, init
from .sparse import sparse_allreduce
from .topk import TopkCompressor, TopkState, topk_allreduce

try:  # one version source: the installed distribution's metadata (pyproject.toml)
    __version__ = metadata.version("cupycoll")
except metadata.PackageNotFoundError:  # a source checkout that was never installed
    __version__ = "0+unknown"
__all__ = ["init", "get_comm", "Communicator", "Stats", "Work", "ReduceOp", "errors",
           "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "all_reduce",
           "all_gather", "algorithms", "SparseResult", "sparse_allreduce", "topk_allreduce", "TopkCompressor",
           "TopkState"]

logging.getLogger("cupycoll").addHandler(logging.NullHandler())
