"""Configuration: keyword argument first, ``CUPYCOLL_*`` environment variable second.

The table below is the single source of the configuration table in docs/configuration.md; an unknown
``CUPYCOLL_*`` variable raises, so a typo is not silently ignored.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from .errors import InvalidArgument

__all__ = ["SETTINGS", "setting", "check_environment", "parse_timeout", "debug"]


def _timeout(text: Any) -> float | None:
    if isinstance(text, bool):
        raise ValueError("expected a number of seconds, not a bool")
    try:
        value = float(text)
    except OverflowError:  # an int past float's range: as long as inf (none)
        value = float("inf") if text > 0 else float("-inf")
    if value != value:
        raise ValueError("expected a number of seconds, not NaN")
    return None if value <= 0 or value == float("inf") else value


def parse_timeout(value: Any) -> float | None:
    """Seconds of a timeout (keyword or ``CUPYCOLL_TIMEOUT`` text): <= 0 or None mean none."""
    if value is None:
        return None
    try:
        return _timeout(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument("timeout", value, f"not a number of seconds ({exc})") from None


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError("expected a finite number of seconds >= 0")
    return value


def _numba_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode in ("0", "off", "false", "no"):
        return "off"
    if mode == "auto":
        return "auto"
    if mode in ("1", "on", "true", "yes"):
        return "on"
    raise ValueError("expected auto, on (1) or off (0)")


def _auto_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode in ("estimate", "measure", "learn"):
        return mode
    raise ValueError("expected estimate, measure or learn")


def _threads(text: str) -> int | str:
    if text.strip().lower() == "auto":
        return "auto"
    count = int(text)
    if count < 1:
        raise ValueError("expected auto or a positive integer")
    return count


def _bytes_or_off(text: str) -> int | None:
    if text.strip().lower() in ("off", "none", "never"):
        return None
    count = int(text)
    if count < 0:
        raise ValueError("expected a number of bytes >= 0 or off")
    return count


def _ranks_per_node(text: str) -> int:
    """A positive count of ranks, at most 2**20 (the agreement packs it into an int64)."""
    count = int(text)
    if not 1 <= count <= 1 << 20:
        raise ValueError("expected a positive integer up to 1048576")
    return count


_OFF = ("", "0", "false", "no", "off")  # the CUPYCOLL_DEBUG values that mean off (any case)

#: name -> (parser, default, description)
SETTINGS: dict[str, tuple[Callable[[str], Any], Any, str]] = {
    "CUPYCOLL_BACKEND": (str, "auto", "default backend of init(): auto, mpi or nccl"),
    "CUPYCOLL_TIMEOUT": (_timeout, None,
                         "seconds a blocking wait may take before CollectiveTimeout (<= 0: none)"),
    "CUPYCOLL_CONNECT_TIMEOUT": (_timeout, 300.0,
                                 "seconds an NCCL call on a non-blocking communicator may "
                                 "spend connecting to its peers (NCCL connects lazily, inside "
                                 "the first calls that need a peer or an algorithm; NVLS and "
                                 "InfiniBand setup can take seconds) before CollectiveTimeout "
                                 "(<= 0: none)"),
    "CUPYCOLL_SPIN": (_seconds, 0.05,
                      "seconds a wait of the MPI backend tests back to back (yielding the core "
                      "every 8 tests) before it sleeps between tests: low latency with a core "
                      "for every rank; 0 on cores shared with other jobs (docs/failures.md)"),
    "CUPYCOLL_ALGORITHM": (str, "auto", "default sparse_allreduce algorithm"),
    "CUPYCOLL_AUTO": (_auto_mode, "learn",
                      "how sparse_allreduce's auto picks: estimate (the least time the model "
                      "predicts), measure (its candidates timed on the first calls of each "
                      "shape, then the fastest kept) or learn (a recurring shape's candidates "
                      "tried in turn, every trial and one in 4 of the choice's calls timed, "
                      "the fastest kept and rechecked; "
                      "docs/tuning.md); the same on every rank"),
    "CUPYCOLL_TOPK_ALGORITHM": (str, "oktopk", "default topk_allreduce algorithm"),
    "CUPYCOLL_WIRE": (str, "auto", "default wire format of sparse entries in sparse_allreduce, "
                      "topk_allreduce and TopkCompressor: coo, compact or auto"),
    "CUPYCOLL_DEBUG": (lambda t: t.strip().lower() not in _OFF, False,
                       "before every dense collective, check that all ranks called the same one with the same op, "
                       "root, dtype and count (one extra small allreduce; MismatchError otherwise)"),
    "CUPYCOLL_NUMBA": (_numba_mode, "auto",
                       "numba loops for the hot numpy primitives: auto (numba imported in the "
                       "background at the first large input; numpy's loops until it is ready), "
                       "on (imported there, the call waiting for it) or off"),
    "CUPYCOLL_THREADS": (_threads, "auto",
                         "threads of one numba loop: auto (the CPUs this process may use "
                         "divided by the MPI ranks on this node, as MPI_LOCALNRANKS or "
                         "OMPI_COMM_WORLD_LOCAL_SIZE tell) or a positive integer"),
    "CUPYCOLL_RANKS_PER_NODE": (_ranks_per_node, None,
                                "ranks per node for the node-aware algorithms: rank // value "
                                "(emulates several nodes on one machine); default: detected "
                                "by MPI's shared-memory split"),
    "CUPYCOLL_REDUCE_AS_ALLREDUCE": (_bytes_or_off, 1 << 18,
                                     "bytes from which the MPI backend runs reduce as an "
                                     "allreduce (the result kept at the root only; off the root "
                                     "into a reused scratch buffer), or off: from there "
                                     "MPICH's nonblocking reduce is slower than its allreduce "
                                     "(docs/dense.md); the same on every rank"),
    "CUPYCOLL_REDUCE_PAIRWISE": (_bytes_or_off, 1 << 18,
                                 "bytes of input from which the MPI backend runs reduce, for "
                                 "dtypes MPI reduces natively, as a pairwise reduce-scatter "
                                 "and a gather of the folded blocks at the root, or off: "
                                 "faster than as an allreduce from there on one node "
                                 "(docs/dense.md); the same on every rank"),
    "CUPYCOLL_REDUCE_SCATTER_PAIRWISE": (_bytes_or_off, 1 << 16,
                                         "bytes of a block (the output) from which the MPI "
                                         "backend runs reduce_scatter as a pairwise exchange of "
                                         "the blocks folded locally, or off: from there "
                                         "MPICH's reduce-scatter is slower on one node "
                                         "(docs/dense.md); the same on every rank"),
    "CUPYCOLL_ALLREDUCE_PAIRWISE": (_bytes_or_off, 1 << 21,
                                    "bytes of input from which the MPI backend runs allreduce, "
                                    "on a number of ranks that is not a power of two and for "
                                    "dtypes MPI reduces natively, as a pairwise reduce-scatter "
                                    "and an allgather of the folded blocks, or off: from there "
                                    "MPICH's allreduce, which folds the ranks beyond a power "
                                    "of two in and out whole, is the slower one on one node "
                                    "(docs/dense.md); the same on every rank"),
    "CUPYCOLL_LOG_LEVEL": (str, "WARNING", "level of the 'cupycoll' logger"),
    "CUPYCOLL_EMULATION_CACHE": (str, None, "folder of the CPU builds of the CUDA kernels (the "
                                 "GPU emulation tier's and the kernel tests'; default: "
                                 "cupycoll-emulation-UID in the temporary directory); see "
                                 "docs/gpu.md"),
    "CUPYCOLL_PROFILE": (str, None, "machine profile (JSON) that auto's time model reads and "
                         "'cupycoll tune' writes; default $XDG_CACHE_HOME/cupycoll/profile.json "
                         "(else ~/.cache/cupycoll/profile.json), "
                         "else the profile shipped with the package"),
}


def check_environment() -> None:
    """Raise InvalidArgument for a CUPYCOLL_* environment variable that is not in SETTINGS."""
    unknown = sorted(k for k in os.environ if k.startswith("CUPYCOLL_") and k not in SETTINGS)
    if unknown:
        raise InvalidArgument(unknown[0], os.environ[unknown[0]],
                              f"unknown setting; known: {sorted(SETTINGS)}")


def setting(name: str, value: Any = None) -> Any:
    """Return ``value`` if given, else the value :data:`PINNED` in this thread, else the parsed
    environment variable, else the default. The variable is read at every call (a change of
    ``os.environ`` is seen at once), decoded and parsed only when the environment holds another
    object for it than at the last parse (a parse costs several microseconds)."""
    if value is not None:
        return value
    pins = PINNED.__dict__
    if pins and name in pins:
        return pins[name]
    env = os.environ
    if env is not _ENVIRON:  # a replaced os.environ or another Python
        text = env.get(name)
        return SETTINGS[name][1] if text is None else _parsed(name, text)
    raw = env._data.get(_KEYS[name])  # type: ignore[attr-defined]
    if raw is None:
        return SETTINGS[name][1]
    kept = _PARSED.get(name)
    if kept is not None and kept[0] is raw:
        return kept[1]
    value = _parsed(name, env.decodevalue(raw))  # type: ignore[attr-defined]
    _PARSED[name] = (raw, value)  # raw kept alive: no other object can take its identity
    return value


def chosen(name: str, value: Any, argument: str, valid: Any, what: str,
           rank: int | None = None) -> Any:
    """``value`` if given, else the setting ``name``; InvalidArgument naming the keyword
    ``argument`` or the variable, whichever it came from, unless it is one of ``valid``."""
    where = argument if value is not None else name
    value = setting(name, value)
    if not isinstance(value, str) or value not in valid:
        raise InvalidArgument(where, value, f"{what}valid: {list(valid)}", rank=rank)
    return value


def _parsed(name: str, text: str) -> Any:
    try:
        return SETTINGS[name][0](text)
    except ValueError as exc:
        raise InvalidArgument(name, text, f"cannot parse environment variable: {exc}") from None


_ENVIRON = os.environ
try:  # CPython's os._Environ keeps the encoded variables in the dict ``_data``
    #: setting name -> its key in os.environ's own storage
    _KEYS = {name: _ENVIRON.encodekey(name) for name in SETTINGS}  # type: ignore[attr-defined]
    _DEBUG_OFF = frozenset([None] + [_ENVIRON.encodevalue(v)  # type: ignore[attr-defined]
                                     for v in _OFF])
    _ENVIRON._data.get(_KEYS["CUPYCOLL_DEBUG"])  # type: ignore[attr-defined]
except (AttributeError, TypeError):
    _ENVIRON = None  # type: ignore[assignment]

#: setting name -> (the environment's stored value object, its parsed value): see setting()
_PARSED: dict[str, tuple[Any, Any]] = {}


#: settings the algorithms read while they run (the numba loops, the node topology):
#: :func:`check_run_settings` parses them in the validation round instead.
RUN_SETTINGS = ("CUPYCOLL_NUMBA", "CUPYCOLL_THREADS", "CUPYCOLL_RANKS_PER_NODE")
#: per thread, settings read as given instead of from the environment (an asynchronous call's
#: run reads its RUN_SETTINGS as its validation did: ``_pipeline.with_run_settings``)
PINNED = threading.local()


#: the reductions' thresholds an MPI communicator reads as it is made
_THRESHOLDS = tuple(f"CUPYCOLL_{name}" for name in
                    ("REDUCE_AS_ALLREDUCE", "REDUCE_PAIRWISE", "REDUCE_SCATTER_PAIRWISE",
                     "ALLREDUCE_PAIRWISE"))


def made_settings() -> tuple[float, tuple]:
    """The settings an MPI communicator reads as it is made: CUPYCOLL_SPIN and the reductions'
    thresholds (:data:`_THRESHOLDS`)."""
    return setting("CUPYCOLL_SPIN"), tuple(setting(name) for name in _THRESHOLDS)


def shared_thresholds(made: tuple[float, tuple]) -> dict[str, Any]:
    """The thresholds of :func:`made_settings`' ``made`` by name: every rank must hold them
    alike (they choose how a collective runs); the spin is each rank's own."""
    return dict(zip(_THRESHOLDS, made[1]))


def check_run_settings(rank: int | None = None) -> int:
    """Parse :data:`RUN_SETTINGS` now: a bad value raises here (naming ``rank``), inside a
    front door's validation (so on every rank), not on one rank in the middle of a
    collective. Returns ``CUPYCOLL_RANKS_PER_NODE`` (0: unset), which every rank must hold
    alike at every call (the node-aware algorithms' collectives follow it): the front doors
    agree on it."""
    for name in RUN_SETTINGS:
        try:
            setting(name)
        except InvalidArgument as exc:
            raise InvalidArgument(exc.argument, exc.value, exc.reason, rank=rank) from None
    return setting("CUPYCOLL_RANKS_PER_NODE") or 0


def debug() -> bool:
    """``setting("CUPYCOLL_DEBUG")`` for the dense fast path, which reads it on every call:
    one dict lookup in the environment's own storage (``os.environ.get`` is slower: a KeyError
    when unset; docs/dense.md), so a change of ``os.environ`` is seen at the next call; a
    replaced ``os.environ`` or another Python falls back to :func:`setting`."""
    env = os.environ
    if env is _ENVIRON:
        raw = env._data.get(_KEYS["CUPYCOLL_DEBUG"])  # type: ignore[attr-defined]
        if raw in _DEBUG_OFF:  # the common case: unset, or one of the usual offs
            return False
    return bool(setting("CUPYCOLL_DEBUG"))  # any other text, as the setting parses it
