"""Traffic counters of a Communicator (:class:`Stats`, :class:`OpStats`) and the bus-bandwidth
model they book volumes with (:func:`bus_factor`)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from typing import Any

__all__ = ["Stats", "OpStats", "bus_factor"]

_FOLD_AT = 1024  # queued bookings folded into a Stats' counters at the latest


@dataclasses.dataclass
class OpStats:
    """Traffic of one operation name (or of all of them): bytes and messages, sent and received."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0

    def add(self, sent: int, received: int, msgs_sent: int, msgs_received: int) -> None:
        self.bytes_sent += int(sent)
        self.bytes_received += int(received)
        self.messages_sent += int(msgs_sent)
        self.messages_received += int(msgs_received)


class Stats(OpStats):
    """Per-rank traffic counters, in total and ``by_op`` (operation name -> :class:`OpStats`).

    Point-to-point traffic (``exchange``, ``alltoallv``, ``allgatherv``) is counted exactly: the
    bytes of every message to or from another rank, one message per peer and buffer. Native dense
    collectives count what this rank must at least move under the bandwidth-optimal (ring)
    algorithm that nccl-tests' bus bandwidth assumes, for N = the bytes of the full buffer:
    allreduce 2(P-1)/P*N sent and received; allgather and reduce_scatter (P-1)/P*N; broadcast N
    received by every non-root rank and N sent by the root; reduce N sent by every non-root rank
    and N received by the root (floors of these, in bytes; 0 when P == 1).

    ``calls`` counts the sparse front doors' calls by (verb, algorithm, wire) — the algorithm
    that ran (``auto`` resolved; ``small`` for entries finished inside the validation) and the
    wire format of its entries (``coo`` or ``compact``, ``+bfloat16``/``+float16`` when values
    travel rounded): what ``auto`` picked, without logging. ``by_op`` and ``calls`` are copies
    taken under the lock (a background call may add to them while the caller iterates).

    Dense collectives are booked without a lock (:meth:`book_collective`: one append to a
    thread-safe queue, which matters on a path that costs microseconds); the queue is folded
    into the counters under the lock whenever they are read, and every ``_FOLD_AT`` bookings.
    """

    def __init__(self) -> None:  # the counters are properties: see _counters
        self._total = OpStats()
        self._by_op: dict[str, OpStats] = {}
        self._lock = threading.Lock()
        self._booked: collections.deque = collections.deque()
        self._calls: collections.Counter[tuple[str, str, str]] = collections.Counter()

    def record(self, op: str, sent: int = 0, received: int = 0, msgs_sent: int = 0,
               msgs_received: int = 0) -> None:
        """Add traffic to the totals and to ``by_op[op]``."""
        with self._lock:
            self._add(op, int(sent), int(received), int(msgs_sent), int(msgs_received))

    def count_call(self, verb: str, algorithm: str, wire: str) -> None:
        """Count one call of ``verb`` run by ``algorithm`` on ``wire`` (see ``calls``)."""
        with self._lock:
            self._calls[(verb, algorithm, wire)] += 1

    def book_collective(self, op: str, collective: str, nbytes: int, at_root: bool,
                        size: int) -> None:
        """Book one native dense collective of ``nbytes`` under ``op`` (lock-free; see above)."""
        booked = self._booked
        booked.append((op, collective, nbytes, at_root, size))
        if len(booked) >= _FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        """Move the queued bookings into the counters (appends may go on meanwhile)."""
        booked = self._booked
        with self._lock:  # only a fold pops, so the first len(booked) entries are there to take
            batch = collections.Counter([booked.popleft() for _ in range(len(booked))])
            for (op, collective, nbytes, at_root, size), calls in batch.items():
                traffic = collective_traffic(collective, int(nbytes), at_root, size)
                self._add(op, *(calls * amount for amount in traffic))

    def _add(self, op: str, sent: int, received: int, msgs_sent: int, msgs_received: int) -> None:
        """Add Python ints to the totals and ``by_op[op]`` (the caller holds the lock)."""
        total = self._total
        total.bytes_sent += sent
        total.bytes_received += received
        total.messages_sent += msgs_sent
        total.messages_received += msgs_received
        per = self._by_op.get(op)
        if per is None:
            per = self._by_op[op] = OpStats()
        per.bytes_sent += sent
        per.bytes_received += received
        per.messages_sent += msgs_sent
        per.messages_received += msgs_received

    def _counters(self) -> OpStats:
        self._fold()
        return self._total

    bytes_sent = property(lambda self: self._counters().bytes_sent)  # type: ignore[assignment]
    bytes_received = property(lambda self: self._counters().bytes_received)  # type: ignore
    messages_sent = property(lambda self: self._counters().messages_sent)  # type: ignore
    messages_received = property(lambda self: self._counters().messages_received)  # type: ignore

    @property
    def by_op(self) -> dict[str, OpStats]:
        """Operation name -> a copy of its :class:`OpStats`."""
        self._fold()
        with self._lock:
            return {op: dataclasses.replace(per) for op, per in self._by_op.items()}

    @property
    def calls(self) -> collections.Counter[tuple[str, str, str]]:
        """(verb, algorithm, wire) -> calls (a copy)."""
        with self._lock:
            return collections.Counter(self._calls)

    def reset(self) -> None:
        """Zero every counter (bookings queued before the call are dropped)."""
        with self._lock:
            self._booked.clear()
            self._total = OpStats()
            self._by_op = {}
            self._calls = collections.Counter()

    def snapshot(self) -> dict[str, Any]:
        """Return the counters as a plain dict (for JSON output)."""
        self._fold()
        with self._lock:
            out = dataclasses.asdict(self._total)
            out["by_op"] = {k: dataclasses.asdict(v) for k, v in self._by_op.items()}
            out["calls"] = {"/".join(key): count for key, count in self._calls.items()}
            return out

    def __repr__(self) -> str:
        return f"Stats({self._counters()!r}, by_op={self.by_op!r})"


def collective_traffic(collective: str, nbytes: int, at_root: bool,
                       size: int) -> tuple[int, int, int, int]:
    """(bytes sent, received, messages sent, received) one rank books for a native collective of
    an ``nbytes`` buffer on ``size`` ranks, by the rule in :class:`Stats` (``at_root``: this rank
    is the root of a broadcast or reduce)."""
    if size <= 1:
        return 0, 0, 0, 0
    if collective == "broadcast" or collective == "reduce":
        if at_root is (collective == "broadcast"):
            return nbytes, 0, 1, 0
        return 0, nbytes, 0, 1
    factor, steps = _ring_steps(collective, size)
    moved = int(factor * nbytes)  # the floor: nbytes >= 0
    return moved, moved, steps, steps


#: nccl-tests' bus-bandwidth factor per collective, also the per-rank volume model of ``Stats``.
def bus_factor(collective: str, size: int) -> float:
    """Return nccl-tests' busbw/algbw factor of ``collective`` on ``size`` ranks."""
    if size <= 1:
        return 0.0 if collective != "broadcast" and collective != "reduce" else 1.0
    return {
        "allreduce": 2.0 * (size - 1) / size,
        "allgather": (size - 1) / size,
        "reduce_scatter": (size - 1) / size,
        "broadcast": 1.0,
        "reduce": 1.0,
    }[collective]


@functools.lru_cache(maxsize=None)
def _ring_steps(collective: str, size: int) -> tuple[float, int]:
    """(bus factor, messages per rank) of allreduce, allgather or reduce_scatter on ``size``."""
    return bus_factor(collective, size), (2 if collective == "allreduce" else 1) * (size - 1)
