"""What learn keeps between the calls of a loop: a communicator's table of records, which marks
each record it lets go, and a kind of call's class, record and wires (the front door's)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .auto import Recent

__all__ = ["Records", "Kind"]


class Records(Recent):
    """A communicator's records by shape class: a :class:`~.auto.Recent` table that marks each
    record it lets go (evicted, replaced, deleted, cleared) as dropped (``_dropped``)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        _drop(self.get(key), value)
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        _drop(self.get(key))
        super().__delitem__(key)

    def pop(self, key: Any, *default: Any) -> Any:
        _drop(self.get(key))
        return super().pop(key, *default)

    def popitem(self, last: bool = True) -> tuple[Any, Any]:
        key, record = super().popitem(last)
        _drop(record)
        return key, record

    def clear(self) -> None:
        for record in self.values():
            _drop(record)
        super().clear()


def _drop(record: Any, kept: Any = None) -> None:
    if record is not None and record is not kept:
        record._dropped = True


@dataclasses.dataclass(slots=True)
class Kind:
    """What the front door keeps for a kind of call while every rank's count stays within
    :data:`~.auto.REPRICE_BEYOND` of those of the call that made it (:func:`.auto.remembered`):
    that call's class key, its record once a call has looked it up (until its table lets it
    go) and, as the calls run them, each algorithm's wire. A loop's call finds all three in
    one lookup and keeps one class while its total nnz hovers at a power of two."""

    key: tuple
    wires: dict[str, Any] = dataclasses.field(default_factory=dict)
    record: Any = None
