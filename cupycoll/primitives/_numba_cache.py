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
shared one. A signature the cache lacks is compiled under an exclusive ``flock`` of a lock
file of its own (the loop's index file and a digest of the signature): ranks that need the
same signature wait for the first one's compile, then load it from the cache, instead of each
compiling it (8 ranks on 2 cores paid 8 compiles), while processes that need other signatures
compile them at the same time; loads that hit take no compile lock. A loop's compile also
compiles the loops it calls, taking their locks while it holds its own: locks are taken down
the call graph only, so no two processes wait for each other. Without ``fcntl`` (Windows) or
numba's internals as expected, nothing changes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
from typing import Any, Callable, Iterator

try:
    import fcntl

    from numba.core.caching import IndexDataCacheFile
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.dispatcher import Dispatcher
except ImportError:  # no flock (Windows) or another numba layout: numba's own behaviour
    fcntl = IndexDataCacheFile = global_compiler_lock = Dispatcher = None  # type: ignore

__all__ = ["make_process_safe"]

#: the compile lock files this process holds, with their open handles (None: not lockable)
_HELD: dict[str, Any] = {}


@contextlib.contextmanager
def _locked(lock_path: str, exclusive: bool) -> Iterator[None]:
    """Hold a flock of ``lock_path`` (unlocked if it cannot be opened: a read-only cache is
    only read)."""
    try:
        handle = open(lock_path, "a+b")
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
            with _locked(self._index_path + ".lock", True):
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
            with _locked(self._index_path + ".lock", False):
                return super().load(key)


def _compiled_once(compile: Callable[[Any], Any], lock_of: Callable[[Any], str]
                   ) -> Callable[[Any], Any]:
    """``compile`` (a dispatcher's: it loads a signature from the cache, else compiles and
    saves it) under numba's compiler lock, releasing the compile lock that a cache miss in it
    took (:func:`_loaded_or_locked`) once the signature is saved. ``lock_of(sig)``: the
    signature's lock file."""

    @functools.wraps(compile)
    def compile_once(sig: Any) -> Any:
        lock_path = lock_of(sig)
        with global_compiler_lock:  # threads of one process queue here, not in flock
            outermost = lock_path not in _HELD  # a compile that calls itself back
            try:
                return compile(sig)
            finally:
                if outermost and lock_path in _HELD:
                    handle = _HELD.pop(lock_path)
                    if handle is not None:
                        handle.close()  # releases the flock
    return compile_once


def _loaded_or_locked(load: Callable[..., Any], lock_of: Callable[[Any], str]
                      ) -> Callable[..., Any]:
    """A cache's ``load_overload(sig, target)`` that, on a miss, takes an exclusive flock of
    ``lock_of(sig)`` and loads again: a rank that waited for another's compile loads its
    result; the first compiles holding the lock. Hits take no compile lock."""

    @functools.wraps(load)
    def load_or_lock(*args: Any) -> Any:
        found = load(*args)
        if found is not None:
            return found
        lock_path = lock_of(args[0])
        if lock_path in _HELD:
            return found
        try:
            handle = open(lock_path, "a+b")
        except OSError:  # a read-only cache: compile unlocked
            _HELD[lock_path] = None
            return found
        fcntl.flock(handle, fcntl.LOCK_EX)
        _HELD[lock_path] = handle
        return load(*args)
    return load_or_lock


def make_process_safe(namespace: dict[str, Any]) -> None:
    """Give every cached numba function in ``namespace`` (a module's globals) the locked cache
    file and the compile run once across ranks; functions already given them, or not cached,
    are left alone."""
    if IndexDataCacheFile is None:
        return
    for value in list(namespace.values()):
        cache = getattr(value, "_cache", None)
        current = getattr(cache, "_cache_file", None)
        if type(current) is IndexDataCacheFile:
            locked = _LockedCacheFile.__new__(_LockedCacheFile)
            locked.__dict__.update(current.__dict__)
            cache._cache_file = locked
            if not isinstance(value, Dispatcher):  # an njit loop's compile(sig) only
                continue
            lock_of = functools.partial(_lock_path, locked._index_path)
            cache.load_overload = _loaded_or_locked(cache.load_overload, lock_of)
            value.compile = _compiled_once(value.compile, lock_of)


def _lock_path(index_path: str, sig: Any) -> str:
    """The compile lock file of signature ``sig`` of the loop whose index is ``index_path``."""
    digest = hashlib.sha1(str(sig).encode()).hexdigest()[:16]
    return f"{index_path}.{digest}.lock"
