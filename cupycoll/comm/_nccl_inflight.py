"""The NCCL backend's operations in flight: posted on the communicator's stream and not yet
observed complete, each keeping what its device work reads or writes.

The calling thread posts and releases them, the completer thread (a future's wait) and the
watchdog release them too: one lock orders every read and change of the list, so a release
never drops the entry of an operation still running (its buffers would go back to the pool
while NCCL uses them).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

__all__ = ["Entry", "Inflight"]


class Entry:
    """One operation: the event recorded behind it, what it keeps, its deadline, its name, its
    collective number, its number among the communicator's posts and the peers it receives
    from (an exchange's: a timeout names them)."""

    __slots__ = ("event", "keep", "deadline", "op_name", "sequence", "number", "peers")

    def __init__(self, event: Any, keep: Any, deadline: float | None, op_name: str,
                 sequence: int, number: int, peers: tuple[int, ...] = ()) -> None:
        self.event, self.keep, self.deadline = event, keep, deadline
        self.op_name, self.sequence, self.number, self.peers = op_name, sequence, number, peers


class Inflight:
    """The entries in posting order, behind one lock."""

    __slots__ = ("_entries", "_lock")

    def __init__(self) -> None:
        self._entries: collections.deque[Entry] = collections.deque()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._entries)

    def add(self, entry: Entry, queried: int) -> None:
        """Append ``entry``; past ``queried`` entries, release the oldest that are done (a
        loop that never waits on the host), the newest always kept."""
        with self._lock:
            entries = self._entries
            entries.append(entry)
            if len(entries) > queried:
                while len(entries) > 1 and entries[0].event.done:
                    entries.popleft()

    def number_last(self, sequence: int) -> None:
        """The newest entry is collective ``sequence`` (booked after its post)."""
        with self._lock:
            if self._entries:
                self._entries[-1].sequence = sequence

    def newest(self) -> Entry | None:
        with self._lock:
            return self._entries[-1] if self._entries else None

    def oldest(self) -> Entry | None:
        with self._lock:
            return self._entries[0] if self._entries else None

    def oldest_running(self) -> Entry | None:
        """The oldest entry whose event has not completed (None: all have)."""
        with self._lock:
            return next((e for e in self._entries if not e.event.done), None)

    def of(self, event: Any) -> Entry | None:
        """The entry of ``event`` (None: released, or not an operation's)."""
        with self._lock:
            return next((e for e in self._entries if e.event is event), None)

    def observed(self, event: Any) -> None:
        """``event`` completed: so did every operation posted before it on the stream."""
        with self._lock:
            number = next((e.number for e in self._entries if e.event is event), None)
            if number is not None:
                self._release_upto(number)

    def release_upto(self, number: int) -> None:
        """Operations 1..``number`` are complete: release what they kept."""
        with self._lock:
            self._release_upto(number)

    def _release_upto(self, number: int) -> None:
        entries = self._entries
        while entries and entries[0].number <= number:
            entries.popleft()

    def running(self) -> list[Entry]:
        """The entries whose event may not have completed (a query that fails counts as not
        completed): what a dropped or dead communicator's stream may still touch."""
        with self._lock:
            return [e for e in self._entries if not _done(e.event)]


def _done(event: Any) -> bool:
    try:
        return bool(event.done)
    except Exception:  # a device already torn down (interpreter exit): keep it
        return False
