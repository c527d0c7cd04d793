"""Exception types of cupycoll.

Every error names what was wrong, the argument and the rank, so a message from one rank of a
large job is enough to find the cause. Cross-rank problems (a bad argument on one rank, ranks that
disagree) are detected collectively and raised on every rank, never left to hang: always in the
sparse and top-k calls, in the dense verbs with ``CUPYCOLL_DEBUG`` (without it, as in NCCL, the
other ranks wait until ``CUPYCOLL_TIMEOUT``, and a disagreement may go unseen).
"""

from __future__ import annotations

import enum

__all__ = [
    "CupycollError",
    "InvalidArgument",
    "InvalidType",
    "MismatchError",
    "CollectiveTimeout",
    "BackendUnavailable",
    "BackendError",
    "OutOfMemory",
    "CupycollWarning",
    "ELSEWHERE",
]


class _Elsewhere(enum.Enum):
    ELSEWHERE = "passed on another rank"

    def __repr__(self) -> str:
        return "<passed on another rank>"


#: the ``value`` (``got``) of an :class:`InvalidArgument` (:class:`InvalidType`) a rank raises for
#: another rank's bad argument, which it never saw (the message then shows no value)
ELSEWHERE = _Elsewhere.ELSEWHERE


class CupycollError(Exception):
    """Base class of every error raised by cupycoll."""


class InvalidArgument(CupycollError, ValueError):
    """An argument has a bad value (names the argument, the rank and the value)."""

    def __init__(self, argument: str, value: object, reason: str, *, rank: int | None = None):
        self.argument, self.value, self.reason, self.rank = argument, value, reason, rank
        where = f" on rank {rank}" if rank is not None else ""
        got = "" if value is ELSEWHERE else f" (got {_short(value)})"
        super().__init__(f"invalid argument {argument!r}{where}: {reason}{got}")

    def __reduce__(self) -> tuple:
        return _remade, (type(self), self.argument, self.value, self.reason, self.rank), \
            self.__dict__


class InvalidType(CupycollError, TypeError):
    """An argument has the wrong type or dtype (names the parameter and what it got)."""

    def __init__(self, argument: str, got: object, expected: str, *, rank: int | None = None):
        self.argument, self.got, self.expected, self.rank = argument, got, expected, rank
        where = f" on rank {rank}" if rank is not None else ""
        shown = "" if got is ELSEWHERE else f", got {_short(got)}"
        super().__init__(f"argument {argument!r}{where} must be {expected}{shown}")

    def __reduce__(self) -> tuple:
        return _remade, (type(self), self.argument, self.got, self.expected, self.rank), \
            self.__dict__


class MismatchError(CupycollError, ValueError):
    """Ranks disagree on something that must be identical (n, dtype, width, op, algorithm...)."""


class CollectiveTimeout(CupycollError, TimeoutError):
    """A collective did not complete in time: some peer never arrived.

    ``missing_ranks``: sorted ranks that had not reached this operation when the wait gave up,
    or, every rank having reached it, those that gave the communicator up (``[]`` only when
    that cannot be known); ``op_name``: the operation that timed out.
    """

    def __init__(self, message: str, *, missing_ranks: list[int] | None = None,
                 op_name: str | None = None) -> None:
        super().__init__(message)
        self.missing_ranks = sorted(missing_ranks or [])
        self.op_name = op_name


class BackendUnavailable(CupycollError, RuntimeError):
    """The requested backend (NCCL, CuPy, a GPU, MPI) cannot be used here."""


class BackendError(CupycollError, RuntimeError):
    """The backend failed an operation (names the operation and the rank; the backend's own
    exception is the ``__cause__``). With MPI, the usual cause is ranks that disagree on a dense
    collective's count or dtype, which only ``CUPYCOLL_DEBUG=1`` checks beforehand."""


class OutOfMemory(CupycollError, MemoryError):
    """A buffer of a call cannot be allocated on a rank (names the call, the algorithm and the
    rank; the allocator's own error is the ``__cause__``). Raised mid-call on that rank, which
    aborts the communicator (its peers may wait in the call: ``CUPYCOLL_TIMEOUT`` names it)."""


class CupycollWarning(UserWarning):
    """Something the caller set is not used as given, and the call goes on without it (e.g. an
    unreadable profile file: the shipped one prices the calls); shown once by Python's
    ``warnings``."""


def _remade(cls: type, argument: str, value: object, detail: str, rank: int | None) -> Exception:
    """An InvalidArgument or InvalidType unpickled (their constructors take the fields, not
    the message: pickle's default passes the message alone)."""
    return cls(argument, value, detail, rank=rank)


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
