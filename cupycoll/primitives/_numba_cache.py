"""numba's on-disk cache made safe for ranks that compile at the same time.

``cache=True`` keeps one index file per function (signature -> data file number) and one data
file per compiled signature. A save reads the index, takes the first free number, writes the
index, then the data. Ranks started together after an install, an upgrade or an edit of a loop
each compile what their own arguments need: two of them saving different signatures take the
same number, and a rank then loads machine code compiled for other argument types (in a
merge: ``TypeError: can't unbox array from PyObject into native value``; numba issue 10128
reports segfaults from the same race). :func:`make_process_safe` gives cupycoll's
loops a cache file whose saves run under an exclusive ``flock`` of a lock file next to the
index (and write the data before the index entry that names it) and whose loads run under a
shared one. Without ``fcntl`` (Windows) or numba's internals as expected, nothing changes.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Iterator

try:
    import fcntl

    from numba.core.caching import IndexDataCacheFile
except ImportError:  # no flock (Windows) or another numba layout: numba's own behaviour
    fcntl = IndexDataCacheFile = None  # type: ignore[assignment]

__all__ = ["make_process_safe"]


@contextlib.contextmanager
def _locked(index_path: str, exclusive: bool) -> Iterator[None]:
    """Hold a flock of ``index_path + ".lock"`` (unlocked if it cannot be opened: a read-only
    cache is only read)."""
    try:
        handle = open(index_path + ".lock", "a+b")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield  # closing the file releases the lock


if IndexDataCacheFile is not None:
    class _LockedCacheFile(IndexDataCacheFile):  # type: ignore[misc, valid-type]
        """numba's index and data files, saved and loaded under a lock."""

        def save(self, key: Any, data: Any) -> None:
            with _locked(self._index_path, True):
                overloads = self._load_index()
                name = overloads.get(key)
                if name is None:
                    taken = set(overloads.values())
                    name = next(n for n in map(self._data_name, itertools.count(1))
                                if n not in taken)
                self._save_data(name, data)
                overloads[key] = name
                self._save_index(overloads)

        def load(self, key: Any) -> Any:
            with _locked(self._index_path, False):
                return super().load(key)


def make_process_safe(namespace: dict[str, Any]) -> None:
    """Give every cached numba function in ``namespace`` (a module's globals) the locked cache
    file; functions already given it, or not cached, are left alone."""
    if IndexDataCacheFile is None:
        return
    for value in list(namespace.values()):
        cache = getattr(value, "_cache", None)
        current = getattr(cache, "_cache_file", None)
        if type(current) is IndexDataCacheFile:
            locked = _LockedCacheFile.__new__(_LockedCacheFile)
            locked.__dict__.update(current.__dict__)
            cache._cache_file = locked
