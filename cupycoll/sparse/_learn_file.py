"""learn's records on disk: read or written by rank 0, the outcome broadcast to every rank;
shape class keys as JSON and back."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable

from .._registry import priced
from ..errors import InvalidArgument
from ..wire._pack import Wire

__all__ = ["write_records", "read_records", "from_rank_zero", "jsonable", "hashable"]


def saved_fields(record_type: type) -> tuple[str, ...]:
    """The fields of a record that :func:`write_records` writes and :func:`read_records`
    takes (those not starting with ``_``)."""
    return tuple(f.name for f in dataclasses.fields(record_type) if not f.name.startswith("_"))


def write_records(comm: Any, table: dict, path: Any, record_type: type) -> None:
    """Write ``table`` (``record_type`` records by shape class) to ``path`` as JSON: rank 0
    writes, the others wait for it (:func:`from_rank_zero`)."""
    def written() -> None:
        fields = saved_fields(record_type)
        data = [{"kind": jsonable(key), **{k: getattr(record, k) for k in fields}}
                for key, record in table.items()]
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"learned": data}, f, indent=1)

    from_rank_zero(comm, "learn.save", written, path, "could not be written")


def read_records(comm: Any, path: Any, record_type: type) -> dict:
    """The records by shape class that :func:`write_records` wrote to ``path``, read on rank 0
    (each a ``record_type``, checked: :func:`_record`) and broadcast."""
    def read() -> dict:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)["learned"]
        fields, pickable = saved_fields(record_type), priced("sparse")
        return {hashable(entry.pop("kind")): _record(entry, record_type, fields, pickable)
                for entry in entries}

    return from_rank_zero(comm, "learn.load", read, path, "is not a table learn.save wrote")


def _record(entry: dict, record_type: type, fields: tuple[str, ...], pickable: Any) -> Any:
    """A record of a saved entry, its fields checked (only the saved ``fields``; its
    candidates among ``pickable``, the algorithms ``auto`` may pick by price here); warmed
    nothing (in this process, its first call is a warm-up)."""
    if not isinstance(entry, dict) or not set(entry) <= set(fields):  # what save wrote only
        raise ValueError(f"a record with other fields than {list(fields)}: {entry}")
    record = record_type(**{**entry, "warmed": []}, _confirmed=True)
    seconds = record.seconds
    # each clause below reads only what the ones before it checked
    if not (type(seconds) is dict and record.candidates
            and all(type(field) is list for field in (record.candidates, record.abandoned,
                                                      *seconds.values()))
            and all(type(name) is str and name in pickable
                    for name in (*record.candidates, *record.abandoned, *seconds))
            and all(type(t) in (int, float) and 0 <= t < math.inf
                    for window in seconds.values() for t in window)
            and type(record.calls) is int and record.calls >= 0):
        raise ValueError(f"a record with bad fields: {entry}")
    return record


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
