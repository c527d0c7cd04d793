"""Host-synchronisation counting: the hook any emulated device namespace reports to.

On a GPU every point where the host waits for the device costs a round trip (tens of us, and the
launch queue drains). The algorithms are held to a budget of such points per call; this module
counts them. It knows nothing about arrays: an array namespace that models a device (the counting
namespace of :mod:`cupycoll.testing.sync_counting`, the emulation tier
:mod:`cupycoll.testing.emulation`, ...) calls :func:`host_sync` at each operation that would block
the host on real CuPy, and whoever wants the figure opens :func:`count_host_syncs` around the
calls it measures.

The hook interface (all a namespace needs):

* ``host_sync(kind)``: one blocking point of ``kind`` (a short label: ``"read"``, ``"mask"``,
  ``"nonzero"``, ``"wait"``, ``"fetch"``, ...). Counted into every open counter, from any thread
  (an async call's worker thread counts too), unless the calling thread is inside
  :func:`uncounted`.
* ``uncounted()``: a context in which this thread's reports are dropped, for work that stands in
  for something that is no sync on the modelled device (e.g. an MPI backend staging buffers
  through the host where NCCL would not).

Example::

    with count_host_syncs() as syncs:
        cc.sparse_allreduce(idx, val, n, comm=comm)
    syncs.total, syncs.by_kind          # e.g. 8, {"read": 1, "fetch": 4, "nonzero": 1, ...}
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import traceback
from typing import Iterator

__all__ = ["SyncCount", "host_sync", "count_host_syncs", "uncounted"]

_lock = threading.Lock()
_open: list["SyncCount"] = []
_local = threading.local()
#: the counting machinery's own files, skipped when finding a sync's call site
_MACHINERY = {os.path.join(os.path.dirname(os.path.abspath(__file__)), f)
              for f in ("syncs.py", "sync_counting.py")}


class SyncCount:
    """Host synchronisations seen while a :func:`count_host_syncs` context was open.

    Attributes: ``total``, ``by_kind`` (kind -> count) and, when ``where`` was asked for,
    ``sites`` (kind and the innermost cupycoll frame of each sync, for finding them).
    """

    def __init__(self, where: bool = False) -> None:
        self.total = 0
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.sites: list[tuple[str, str]] = []
        self._where = where

    def _add(self, kind: str, site: str | None) -> None:
        self.total += 1
        self.by_kind[kind] += 1
        if site is not None:
            self.sites.append((kind, site))

    def __repr__(self) -> str:
        return f"SyncCount(total={self.total}, by_kind={dict(self.by_kind)})"


def _site() -> str:
    """``file:line function`` of the innermost frame outside the counting machinery."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename.rsplit("/", 1)[-1]
        if name != "contextlib.py" and os.path.abspath(frame.filename) not in _MACHINERY:
            return f"{name}:{frame.lineno} {frame.name}"
    return "?"


def host_sync(kind: str) -> None:
    """Report one operation that blocks the host until the device catches up (the hook)."""
    if not _open or getattr(_local, "quiet", 0):
        return
    with _lock:
        counters = list(_open)
    site = _site() if any(c._where for c in counters) else None
    with _lock:
        for counter in counters:
            counter._add(kind, site)


@contextlib.contextmanager
def count_host_syncs(where: bool = False) -> Iterator[SyncCount]:
    """Count the host synchronisations of every thread while the context is open.

    ``where=True`` also records the call site of each one in ``sites``.
    """
    counter = SyncCount(where)
    with _lock:
        _open.append(counter)
    try:
        yield counter
    finally:
        with _lock:
            _open.remove(counter)


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Drop this thread's :func:`host_sync` reports inside the context (nests)."""
    _local.quiet = getattr(_local, "quiet", 0) + 1
    try:
        yield
    finally:
        _local.quiet -= 1
