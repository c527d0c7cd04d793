"""Traffic counters of a Communicator (:class:`Stats`, :class:`OpStats`) and the bus-bandwidth
model they book volumes with (:func:`bus_factor`)."""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any

__all__ = ["Stats", "OpStats", "bus_factor"]


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
    """

    def __init__(self) -> None:
        super().__init__()
        self.by_op: dict[str, OpStats] = {}
        self._lock = threading.Lock()

    def record(self, op: str, sent: int = 0, received: int = 0, msgs_sent: int = 0,
               msgs_received: int = 0) -> None:
        """Add traffic to the totals and to ``by_op[op]``."""
        self._add(op, int(sent), int(received), int(msgs_sent), int(msgs_received))

    def _add(self, op: str, sent: int, received: int, msgs_sent: int, msgs_received: int) -> None:
        """:meth:`record` of Python ints (the dense hot path books with it: no conversions)."""
        with self._lock:
            self.bytes_sent += sent
            self.bytes_received += received
            self.messages_sent += msgs_sent
            self.messages_received += msgs_received
            per = self.by_op.get(op)
            if per is None:
                per = self.by_op[op] = OpStats()
            per.bytes_sent += sent
            per.bytes_received += received
            per.messages_sent += msgs_sent
            per.messages_received += msgs_received

    def reset(self) -> None:
        """Zero every counter."""
        with self._lock:
            self.bytes_sent = self.bytes_received = 0
            self.messages_sent = self.messages_received = 0
            self.by_op = {}

    def snapshot(self) -> dict[str, Any]:
        """Return the counters as a plain dict (for JSON output)."""
        with self._lock:
            out = dataclasses.asdict(OpStats(self.bytes_sent, self.bytes_received,
                                             self.messages_sent, self.messages_received))
            out["by_op"] = {k: dataclasses.asdict(v) for k, v in self.by_op.items()}
            return out


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
