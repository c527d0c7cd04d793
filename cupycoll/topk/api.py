"""``topk_allreduce``: the front door of the top-k allreduce family (Ok-Topk and its baselines).

A wrapper over the one call pipeline (:func:`cupycoll._pipeline.call`): validate (below), plan
(:func:`plan`), run, deliver in ``x``'s array library. Arguments are validated collectively before
any data moves: each rank checks its own arguments, then one small allreduce (MAX over int64: an
error code keyed by rank, and +/- the length, k, dtype and algorithm so min and max can be
compared) tells every rank whether any rank failed or whether the ranks disagree. So bad input on
one rank raises a typed error on every rank instead of leaving the others waiting: the failing rank
raises its own precise error, the others the same type naming that rank; disagreement raises
:class:`~cupycoll.errors.MismatchError` everywhere.
"""

from __future__ import annotations

import functools
import numbers
import zlib
from typing import Any

import numpy as np

from .. import _agreement as agreement
from .._agreement import ranks_text
from .._config import check_run_settings, setting
from .._pipeline import Delivery, Plan, call
from .._registry import algorithms, record
from .._result import SparseResult
from .._types import as_array, check_device, check_dtype, check_flag
from ..comm import Communicator, comm_or_default
from ..errors import ELSEWHERE, CupycollError, InvalidArgument, InvalidType
from ..wire._choice import check_wire, check_wire_values, decode_code, wire_code
from ..wire._pack import COO
from ._common import TopkOutcome, TopkState, to_namespace
from ._oktopk_small import SmallRefresh
from ._wire import choose_wire
from .selectors import Selector, reference_threshold

__all__ = ["topk_allreduce", "validate", "plan", "run", "state_crc", "FLOAT_DTYPES"]

#: value dtypes the top-k algorithms accept.
FLOAT_DTYPES = tuple(np.dtype(t) for t in ("float16", "float32", "float64"))

#: dtype -> its code in the validation allreduce.
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(FLOAT_DTYPES, 1)}

def _peer_error(failure: agreement.Failure, draft: agreement.Draft) -> CupycollError:
    """The error a rank with good arguments raises for a peer's bad ones."""
    name, rank = failure.argument or "argument", failure.rank
    reason = f"rank {rank} passed an invalid {name!r} (see that rank's error); every rank raises"
    if failure.kind is InvalidType:
        return InvalidType(name, ELSEWHERE, f"valid on every rank: {reason}", rank=rank)
    if failure.kind is InvalidArgument:
        return InvalidArgument(name, ELSEWHERE, reason, rank=rank)
    return CupycollError(reason)


def _mismatch(differs: list[agreement.Differ], draft: agreement.Draft) -> str:
    """The message of the first field (in declaration order) the ranks disagree on."""
    d = differs[0]
    algorithm, settings = draft.context
    if d.field == "settings":
        return (f"ranks disagree on the settings that decide the call's collectives ("
                f"{_settings_differ(draft.comm, settings) or f'rank {draft.rank} has {settings}'}"
                "): a state's step, Ok-Topk's tau, tau_prime, "
                "padded allgather, boundaries, global threshold and last k (their crc32), the "
                "selector's threshold policy, a compressor's warm-up, measure_xi, step count "
                "and async_op, and "
                "CUPYCOLL_RANKS_PER_NODE must be the same on every rank (ranks restored from "
                "different checkpoints?)")
    return _disagreement(d, draft.rank, algorithm, draft.terms.verb)


def _settings_differ(comm: Communicator, settings: dict[str, Any]) -> str:
    """Each setting the ranks disagree on, with every value and the ranks that passed it, from
    one allgather of the settings over the host communicator (every rank of a mismatch is on
    this path); "" where there is none (ranks simulated in one process)."""
    mpi_comm = getattr(comm, "mpi_comm", None)
    if mpi_comm is None:
        return ""
    every = mpi_comm.allgather(settings)
    named = []
    for key in dict.fromkeys(k for s in every for k in s):
        ranks: dict[str, list[int]] = {}
        for rank, theirs in enumerate(every):
            ranks.setdefault(repr(theirs.get(key)), []).append(rank)
        if len(ranks) > 1:
            named.append(f"{key}: " + "; ".join(f"{value} on {ranks_text(rs)}"
                                                  for value, rs in ranks.items()))
    return ", ".join(named)


#: the arguments a TopkCompressor's fields come from, named by its disagreements
_COMPRESSOR_FIELDS = {"length of x": "length of grad", "k": "k (density x n)",
                      "dtype": "dtype of grad"}


def _terms(verb: str) -> agreement.Terms:
    """What ``verb`` (topk_allreduce or TopkCompressor.step) agrees on."""
    return agreement.Terms(verb, ("length of x", "k", "dtype", "algorithm", "wire",
                                  "settings"), _peer_error, _mismatch, columns=("count",))


def state_settings(state: TopkState | None) -> dict[str, Any]:
    """What of ``state`` decides the collectives a call makes (so every rank must hold the
    same): its step, Ok-Topk's repartition and refresh periods, the padded allgather, and
    :func:`state_crc` (none for no state, or a bad one, which the validation names)."""
    if not isinstance(state, TopkState):
        return {}
    return {"step": state.step, "tau": state.tau, "tau_prime": state.tau_prime,
            "padded_allgather": state.padded_allgather, "state crc32": state_crc(state)}


def state_crc(state: TopkState) -> int:
    """crc32 of what a state carries from call to call that is identical on every rank:
    Ok-Topk's boundaries, global threshold and last k (computed from allreduced, gathered or
    agreed data). Ranks restored from different checkpoints differ here. Never raises."""
    b = state.boundaries
    ok = isinstance(b, np.ndarray) and b.dtype.kind in "iu"
    data = b.astype(np.int64).tobytes() if ok else repr(b).encode()
    th = state.global_th
    th = float(th).hex() if isinstance(th, numbers.Real) else repr(th)
    return zlib.crc32(f"{th} {state.k!r}".encode(), zlib.crc32(data))


#: the agreements of the verbs that validate here.
TERMS = {verb: _terms(verb) for verb in ("topk_allreduce", "TopkCompressor.step")}


def _local_checks(comm: Communicator, x: Any, k: Any, algorithm: Any, selector: Any, state: Any,
                  argument: str, n: int | None, wire: Any, wire_values: Any,
                  async_op: Any = False, algorithm_from: str = "algorithm"
                  ) -> tuple[Any, int, int]:
    rank = comm.rank
    check_run_settings(rank)
    check_flag(async_op, "async_op", rank)
    code = wire_code(check_wire(wire, rank), check_wire_values(wire_values, rank))
    if not isinstance(algorithm, str) or algorithm not in algorithms("topk"):
        raise InvalidArgument(algorithm_from, algorithm,
                              f"unknown topk algorithm; valid: {algorithms('topk')}", rank=rank)
    if selector is not None and not isinstance(selector, Selector):
        raise InvalidType("selector", type(selector).__name__,
                          "None or a selector (Exact, Threshold, Gaussian)", rank=rank)
    if state is not None and not isinstance(state, TopkState):
        raise InvalidType("state", type(state).__name__, "None or a TopkState", rank=rank)
    chosen = selector if selector is not None else getattr(state, "selector", None)
    if isinstance(chosen, Selector):
        chosen.check(rank)
    arr = as_array(x, argument, rank=rank)
    check_device(arr, comm, argument)
    if arr.dtype not in _DTYPE_CODES:
        check_dtype(arr, argument, rank=rank, allowed=FLOAT_DTYPES)
    if arr.ndim != 1:
        raise InvalidArgument(argument, tuple(arr.shape), "must be a 1-D array", rank=rank)
    if n is not None and arr.shape[0] != n:
        raise InvalidArgument(argument, arr.shape[0], f"length must be n = {n}", rank=rank)
    if type(k) is not int and (isinstance(k, (bool, np.bool_))
                               or not isinstance(k, (numbers.Integral, np.integer))):
        raise InvalidType("k", type(k).__name__, "an int", rank=rank)
    if not 0 < k <= arr.shape[0]:
        raise InvalidArgument("k", k, f"must satisfy 0 < k <= len({argument}) = {arr.shape[0]}",
                              rank=rank)
    if state is not None:
        _check_state(state, int(arr.shape[0]), comm.size, rank)
    return arr, int(k), code


def _check_state(state: TopkState, n: int, p: int, rank: int) -> None:
    """:meth:`TopkState.check` at call time (its fields may have been set since), its errors
    naming ``state``, which every rank's error then names."""
    try:
        state.check(n, p)
    except InvalidType as exc:
        raise InvalidType("state", exc.got, f"a TopkState whose {exc.argument} is "
                          f"{exc.expected}", rank=rank) from exc
    except InvalidArgument as exc:
        raise InvalidArgument("state", exc.value, f"its {exc.argument} {exc.reason}",
                              rank=rank) from exc


def validate(comm: Communicator, x: Any, k: Any, algorithm: Any, *, selector: Any = None,
             state: Any = None, argument: str = "x", n: int | None = None,
             verb: str = "topk_allreduce", wire: Any = None,
             wire_values: Any = None, small: SmallRefresh | None = None,
             settings: dict[str, Any] | None = None, async_op: Any = False,
             algorithm_from: str = "algorithm") -> tuple[Any, int]:
    """Check the arguments on every rank with one small allreduce; return (array, k).

    The allreduce carries ``verb``'s tag (see :mod:`cupycoll._agreement`), so a rank in another
    validating verb makes every rank raise MismatchError.

    Raises (on every rank): InvalidType / InvalidArgument when any rank's arguments are bad
    (non-float dtype, not 1-D, k <= 0 or k > n, unknown algorithm, bad selector or state),
    MismatchError when the ranks disagree on the length, k, dtype, algorithm, wire keywords,
    ``async_op`` (an asynchronous step runs over the background duplicate) or ``settings``
    (those that decide the collectives: :func:`state_settings` of ``state`` by default).
    ``algorithm_from``: the argument an unknown algorithm came from (``algorithm`` or
    ``CUPYCOLL_TOPK_ALGORITHM``).
    ``small``: the selection travels in the entry slots and, when every rank's fitted, the
    agreed slots are kept for the ``oktopk_small`` record (``small.slots``;
    :mod:`._oktopk_small`).
    """
    draft = TERMS[verb].draft(comm)
    settings = state_settings(state) if settings is None else settings
    draft.context = algorithm, settings
    try:
        arr, kk, wcode = _local_checks(comm, x, k, algorithm, selector, state, argument, n,
                                       wire, wire_values, async_op, algorithm_from)
        settings = {**settings, "CUPYCOLL_RANKS_PER_NODE": setting("CUPYCOLL_RANKS_PER_NODE"),
                    "async_op": bool(async_op)}
        if algorithm == "oktopk":  # its collectives follow the selector's policy
            chosen = selector if selector is not None else getattr(state, "selector", None)
            settings["reference threshold"] = reference_threshold(chosen)
        draft.context = algorithm, settings  # the nodes' setting parsed by the checks
    except Exception as exc:  # any: it reaches the other ranks as a flag
        draft.fail(exc)
    else:
        draft.agree((int(arr.shape[0]), kk, _DTYPE_CODES[np.dtype(arr.dtype)],
                     _algorithm_code(algorithm), wcode, _settings_code(settings)))
        if small is not None:
            small.pack(draft, to_namespace(arr, comm.xp), kk)
    agreed = draft.settle("topk.validate")
    if small is not None:
        small.finish(agreed)
    return arr, kk


def _settings_code(settings: dict[str, Any]) -> int:
    """A positive int32 hash of ``settings`` (ranks compare these)."""
    return zlib.crc32(repr(sorted(settings.items())).encode()) & 0x7FFFFFFF


@functools.lru_cache(maxsize=64)
def _algorithm_code(algorithm: str) -> int:
    """A positive int32 hash of the algorithm's name (ranks compare these, not the names)."""
    return zlib.crc32(algorithm.encode()) & 0x7FFFFFFF


def _disagreement(d: agreement.Differ, rank: int, algorithm: str,
                  verb: str = "topk_allreduce") -> str:
    """The message of a MismatchError: each value and the ranks that passed it, dtypes by
    name, algorithms by name (the validation allreduce carries a hash of each: one that no
    registered algorithm has is "another one"), a compressor's fields by the arguments they
    come from."""
    name = d.field if verb == "topk_allreduce" else _COMPRESSOR_FIELDS.get(d.field, d.field)
    if name == "algorithm":
        known = {_algorithm_code(a): a for a in algorithms("topk")}
        if all(code in known for code in d.ranks):
            return (f"ranks disagree on the algorithm of {verb} "
                    f"({d.by_rank(lambda code: repr(known[code]))}; seen on rank {rank})")
        mine = [r for r, code in enumerate(d.ranks) if code == d.mine]
        others = [r for r in range(len(d.ranks)) if r not in mine]
        return (f"ranks disagree on the algorithm of {verb} ({ranks_text(mine)} asked for "
                f"{algorithm!r}, {ranks_text(others)} for another one; seen on rank {rank})")
    if name == "wire":
        return (f"ranks disagree on wire / wire_values in {verb} ({d.by_rank(decode_code)}; "
                f"seen on rank {rank})")
    if name.startswith("dtype"):
        of = "x" if verb == "topk_allreduce" else "grad"
        return (f"ranks disagree on the dtype of {of} in {verb} "
                f"({d.by_rank(lambda code: FLOAT_DTYPES[code - 1].name)}; seen on rank {rank})")
    return f"ranks disagree on the {name} of {verb} ({d.by_rank()}; seen on rank {rank})"


def run(comm: Communicator, x: Any, k: int, algorithm: str, selector: Selector | None,
        state: TopkState | None, wire: str = "coo", wire_values: str | None = None
        ) -> TopkOutcome:
    """Run a validated call: pick the selector and the wire format, run the algorithm, advance
    the state's step (the remainders of rounded values are kept in ``state.last``)."""
    found = record("topk", algorithm, rank=comm.rank)
    state = state if state is not None else TopkState()
    profile = None
    if wire == "auto" and comm.size > 1:
        from ..tuner.profile import profile_for

        profile = profile_for(comm)
    state.wire = choose_wire(wire, wire_values, comm.size, k, int(x.shape[0]), profile)
    if selector is not None:
        state.selector = selector
    elif state.selector is None:
        state.selector = found.selector()
    outcome = found.run(comm, x, k, state)
    state.last["wire"] = state.wire.name
    state.last["remainders"] = outcome.remainders
    state.step += 1
    return outcome


def topk_allreduce(x: Any, k: int, *, algorithm: str | None = None,
                   comm: Communicator | None = None, selector: Selector | None = None,
                   state: TopkState | None = None, wire: str | None = None,
                   wire_values: str | None = None) -> SparseResult:
    """Return (approximately) the top-k by magnitude of the sum over ranks of ``x``.

    Every rank gets the identical :class:`SparseResult`: ascending unique int32 indices (int64
    when n >= 2**31) and their values, which are **sums** over the ranks whose contributions made
    it into the result (divide by P for an average). What each algorithm selects where, and what
    it guarantees, is documented in its module: ``dense`` is exact; ``oktopk`` about k entries
    (exactly ``min(k, nonzeros)`` on refresh steps); ``topka`` and ``gaussiank`` up to P*k;
    ``gtopk`` at most k.

    Args:
        x: this rank's dense 1-D float vector (numpy, cupy or ``__dlpack__``); same length and
            dtype on every rank.
        k: number of entries asked for, ``0 < k <= len(x)``, the same on every rank.
        algorithm: "oktopk" (default, or ``CUPYCOLL_TOPK_ALGORITHM``), "topka", "gtopk",
            "gaussiank", "dense" (``cupycoll.algorithms("topk")``).
        comm: communicator (default ``cupycoll.get_comm()``).
        selector: local selector (default: the algorithm's; see :mod:`cupycoll.topk.selectors`).
        state: a :class:`TopkState` carried across calls (thresholds, boundaries, step); without
            one every call is a refresh step.
        wire: "coo", "compact" (index streams encoded losslessly: the same result, fewer
            bytes) or "auto" (default, or ``CUPYCOLL_WIRE``); see docs/wire.md.
        wire_values: None, "bfloat16" or "float16": float32/float64 values travel rounded
            (nearest even), so the result is approximate (identical on every rank); the
            rounding errors of this rank's values that reached the result are left in
            ``state.last["remainders"]`` ((indices, values) pairs) for the caller's error
            feedback (:class:`TopkCompressor` adds them to its residual).
    Returns:
        SparseResult in ``x``'s array library (numpy or cupy).
    Raises:
        InvalidType, InvalidArgument, MismatchError: on every rank (see :func:`validate`).
    Example::

        res = cc.topk_allreduce(grad, k=grad.size // 100, state=st)   # every rank: same res
    """
    comm = comm_or_default(comm)
    algorithm_from = "algorithm" if algorithm is not None else "CUPYCOLL_TOPK_ALGORITHM"
    algorithm = setting("CUPYCOLL_TOPK_ALGORITHM", algorithm)
    small = None  # a stateless Ok-Topk call may be finished by its validation allreduce
    if (algorithm == "oktopk" and state is None and selector is None and wire_values is None
            and agreement.slot_words(comm.size)):
        small = SmallRefresh(comm)
    return call(comm, "topk_allreduce",
                lambda: validate(comm, x, k, algorithm, selector=selector, state=state,
                                 wire=wire, wire_values=wire_values, small=small,
                                 algorithm_from=algorithm_from),
                lambda agreed: plan(comm, *agreed, algorithm, selector, state, wire,
                                    wire_values, small),
                lambda agreed: Delivery(agreed[0], agreed[0], int(agreed[0].shape[0])))


def plan(comm: Communicator, arr: Any, k: int, algorithm: str, selector: Selector | None,
         state: TopkState | None, wire: Any, wire_values: str | None,
         small: SmallRefresh | None = None) -> Plan:
    """The plan of an agreed call (the same on every rank): ``oktopk_small`` where every
    rank's selection came with the validation, else the algorithm by :func:`run`; its run
    returns the outcome's result."""
    x = to_namespace(arr, comm.xp)
    if small is not None and small.slots is not None:
        found = record("topk", "oktopk_small")
        return Plan(found.name, COO, lambda on: found.run(
            on, x, k, slots=small.slots, counts=small.counts, threshold=small.threshold).result)
    return Plan(algorithm, None, lambda on: run(
        on, x, k, algorithm, selector, state, check_wire(wire), wire_values).result)
