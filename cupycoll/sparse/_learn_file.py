"""learn's records on disk: read or written by rank 0, the outcome broadcast to every rank;
shape class keys as JSON and back."""

from __future__ import annotations

import os
from typing import Any, Callable

from ..errors import InvalidArgument
from ..wire._pack import Wire

__all__ = ["from_rank_zero", "jsonable", "hashable"]


def from_rank_zero(comm: Any, verb: str, work: Callable[[], Any], path: Any, failed: str
                   ) -> Any:
    """``work()`` run on rank 0 and its result broadcast (:meth:`host_bcast`); an
    error there (rank 0's ``path`` not a file path: no int taken for a descriptor) raised on
    every rank as InvalidArgument naming ``path``."""
    outcome: Any = None
    if comm.rank == 0:
        try:
            if not isinstance(path, (str, os.PathLike)):
                raise TypeError("not a file path (str or os.PathLike)")
            outcome = (work(), None)
        except Exception as exc:  # any failure must reach the other ranks
            outcome = (None, f"{type(exc).__name__}: {exc}")
    result, error = comm.host_bcast(outcome, verb) if comm.size > 1 else outcome  # timed
    if error is not None:
        raise InvalidArgument("path", path, f"{failed} (on rank 0: {error})", rank=comm.rank)
    return result


def jsonable(value: Any) -> Any:
    """A shape class key as JSON: tuples as lists, a Wire as {"wire": [compact, values]}."""
    if isinstance(value, Wire):
        return {"wire": [value.compact, value.values]}
    return [jsonable(v) for v in value] if isinstance(value, (tuple, list)) else value


def hashable(value: Any, top: bool = True) -> Any:
    """The inverse of :func:`jsonable` (a key is a list at the top)."""
    if top and type(value) is not list:
        raise ValueError(f"a shape class that is not a list: {value!r}")
    if isinstance(value, dict):
        return Wire(*value["wire"])
    return tuple(hashable(v, False) for v in value) if isinstance(value, list) else value
