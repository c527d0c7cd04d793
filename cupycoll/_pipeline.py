"""The one call pipeline of the front doors: agree, plan, run (or start), deliver.

``sparse_allreduce``, ``topk_allreduce``, ``TopkCompressor.step`` and the dense verbs' general
path (the one with their checks and CUPYCOLL_DEBUG's agreement) are short wrappers over
:func:`call`; they differ only in what they agree on, how they plan and what their plan runs.
What the caller gets back is one :class:`Delivery` for every front door.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Iterator

import numpy as np

from ._background import run_async
from ._config import PINNED, RUN_SETTINGS, setting
from ._result import SparseResult
from ._types import array_namespace, as_array, callers, writable
from .comm import Communicator, Work
from .errors import InvalidArgument, InvalidType

__all__ = ["Plan", "Delivery", "call", "callers"]


@dataclasses.dataclass(slots=True)
class Plan:
    """What an agreed call runs: the algorithm, its wire format (None where the algorithm
    chooses it as it runs), the function that runs it on a communicator; for a timed call
    (auto's measure and learn modes), ``timer(comm)``, called before the run, which returns
    the function to call after it; and where the Communicator starts the run itself (a dense
    verb), ``start(comm)``, its Work, whose result is the run's (else an asynchronous call
    runs on the background worker)."""

    algorithm: str
    wire: Any
    run: Callable[[Communicator], Any]
    timer: Callable[[Communicator], Callable[[], None]] | None = None
    start: Callable[[Communicator], Work] | None = None


def call(comm: Communicator, verb: str, agree: Callable[[], Any],
         plan: Callable[[Any], Plan], deliver: Callable[[Any], "Delivery"],
         async_op: bool = False, stream: bool = True) -> Any:
    """One front-door call of ``verb`` on ``comm``, in the communicator's stream order.

    ``agree()`` validates locally and settles the agreement (raising on every rank);
    ``plan(agreed)`` is what runs, the same on every rank; it runs here (timed where the plan
    says), or starts (``async_op``: a :class:`~cupycoll.comm.Work`, the plan's own ``start``
    or :func:`~cupycoll._background.run_async`); ``deliver(agreed)`` hands the result over, on
    the caller's stream. Everything before the delivery counts as ``verb`` for failure
    reports, and a KeyboardInterrupt anywhere in it aborts ``comm`` (its peers may be waiting
    in the call). ``stream`` False: the body keeps the caller's stream (a Communicator verb
    orders itself after it).
    """
    values = run_settings_now()
    with comm.in_stream(join=not async_op) if stream else contextlib.nullcontext(), \
            comm.calling(verb), pinned(values):
        agreed = agree()
        planned = plan(agreed)
        if async_op:
            delivery = deliver(agreed)
            if planned.start is not None:
                work = planned.start(comm)
                return Work.then(work, lambda: delivery(work.wait()))
            return run_async(comm, with_run_settings(functools.partial(_named, verb,
                                                                       planned.run), values),
                             delivery, verb)
        stop = planned.timer(comm) if planned.timer is not None else None
        result = planned.run(comm)
        if stop is not None:
            stop()
    return deliver(agreed)(result)


def run_settings_now() -> dict[str, Any]:
    """The :data:`~cupycoll._config.RUN_SETTINGS` as this thread reads them now, those that
    parse (a bad one is left to the validation, which raises it on every rank)."""
    values = {}
    for name in RUN_SETTINGS:
        try:
            values[name] = setting(name)
        except InvalidArgument:
            pass
    return values


@contextlib.contextmanager
def pinned(values: dict[str, Any]) -> Iterator[None]:
    """This thread reads ``values`` for those settings inside the block: a call's validation,
    plan and run read one layout, whatever another thread sets in ``os.environ`` meanwhile
    (``CUPYCOLL_RANKS_PER_NODE`` changed mid-call ran another node layout on one rank)."""
    pins = PINNED.__dict__
    before = dict(pins)
    pins.update(values)
    try:
        yield
    finally:
        pins.clear()
        pins.update(before)


def with_run_settings(fn: Callable[..., Any], values: dict[str, Any]) -> Callable[..., Any]:
    """``fn`` reading ``values`` (:func:`run_settings_now` as the call's validation read them)
    in whatever thread it runs: an asynchronous call's algorithm runs on the background
    worker."""
    def run(*args: Any) -> Any:
        with pinned(values):
            return fn(*args)

    return run


def _named(verb: str, run: Callable[[Communicator], Any], on: Communicator) -> Any:
    """``run(on)`` counted as ``verb`` for failure reports."""
    with on.calling(verb):
        return run(on)


@dataclasses.dataclass(slots=True)
class Delivery:
    """How a front door hands its result to the caller.

    An array (a dense verb's result, a dense output): the caller's ``out`` itself where given
    (a torch tensor stays that tensor), else the array as the caller's type (``like``'s).
    Entries (a tuple that starts ``(indices, values)``, e.g. a SparseResult): copied into the
    buffers ``alloc_fn(nnz, index_dtype, values_shape, value_dtype, fn_ctx)`` returns, else as
    the caller's types (``like_indices``'s, ``like``'s), in a :class:`SparseResult` of length
    ``n``. ``completion_fn(indices, values, fn_ctx)`` is then called with what the caller gets
    (indices None for an array).
    """

    like: Any
    like_indices: Any = None
    n: int = 0
    out: Any = None
    alloc_fn: Callable[..., tuple[Any, Any]] | None = None
    completion_fn: Callable[[Any, Any, Any], Any] | None = None
    fn_ctx: Any = None
    #: the caller's rank, which an error of ``alloc_fn``'s buffers names (it is raised on this
    #: rank only: the collective has completed on every rank)
    rank: int | None = None

    def __call__(self, result: Any) -> Any:
        if not isinstance(result, tuple):
            got = self.out if self.out is not None and result is not None else \
                callers(result, self.like)
            if self.completion_fn is not None:
                self.completion_fn(None, got, self.fn_ctx)
            return got
        idx, val = result[0], result[1]
        if self.alloc_fn is not None:
            idx, val = _fill(self.alloc_fn(int(idx.shape[0]), idx.dtype, tuple(val.shape),
                                           val.dtype, self.fn_ctx), idx, val, self.rank)
        else:
            idx, val = callers(idx, self.like_indices), callers(val, self.like)
        if self.completion_fn is not None:
            self.completion_fn(idx, val, self.fn_ctx)
        return SparseResult(idx, val, self.n)


def _fill(buffers: Any, idx: Any, val: Any, rank: int | None = None) -> tuple[Any, Any]:
    """Copy the result into the buffers ``alloc_fn`` returned (shape and dtype must match)."""
    if not isinstance(buffers, (tuple, list)) or len(buffers) != 2:
        raise InvalidType("alloc_fn", type(buffers).__name__,
                          "a callable returning (index_buf, value_buf)", rank=rank)
    checked = []  # both checked before either is written
    for name, buf, src in (("index_buf", buffers[0], idx), ("value_buf", buffers[1], val)):
        arr = as_array(buf, f"alloc_fn {name}", rank=rank)
        got = f"{name} {tuple(arr.shape)} {arr.dtype}"
        if tuple(arr.shape) != tuple(src.shape) or np.dtype(arr.dtype) != np.dtype(src.dtype):
            raise InvalidArgument("alloc_fn", got, f"must return {name} of shape "
                                  f"{tuple(src.shape)} and dtype {src.dtype}", rank=rank)
        if not writable(arr):
            raise InvalidArgument("alloc_fn", got, "must return writable buffers", rank=rank)
        checked.append((arr, src, got))
    (first, _, _), (second, _, got) = checked
    if first.size and second.size and _overlap(first, second):
        raise InvalidArgument("alloc_fn", got, "must return two buffers that do not overlap",
                              rank=rank)
    for arr, src, got in checked:
        try:
            arr[...] = callers(src, arr)
        except ValueError as exc:  # e.g. a buffer on another device than the result's
            raise InvalidArgument("alloc_fn", got, f"could not be filled ({exc})",
                                  rank=rank) from exc
    return buffers[0], buffers[1]


def _overlap(a: Any, b: Any) -> bool:
    """Whether arrays ``a`` and ``b`` share an element (exactly, where the library can tell
    within a bounded search: the fields of one record array, interleaved columns do not;
    arrays of two libraries never do)."""
    xp = array_namespace(a)
    if array_namespace(b) is not xp or not xp.may_share_memory(a, b):  # bounds apart: cheap
        return False
    exact = getattr(xp, "shares_memory", None)
    if exact is None:
        return True
    try:
        return bool(exact(a, b, max_work=10_000))
    except NotImplementedError:  # CuPy: no bound on its search (a sort of the addresses)
        return bool(exact(a, b))
    except Exception:  # numpy's search too hard: take them as the caller laid them out
        return False
