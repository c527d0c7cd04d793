"""``sparse_allreduce``: the front door of the exact sparse allreduce.

A wrapper over the one call pipeline (:func:`cupycoll._pipeline.call`): validate collectively
(one small allreduce, ``_validate.prepare``), coalesce, plan (:func:`plan`: the algorithm named
or ``auto``'s pick, the same on every rank, and its wire format; a small call's entries came
with the validation, see ``small.py``), run the plan or start it (``async_op``), then deliver
(:class:`cupycoll._pipeline.Delivery`: a :class:`SparseResult`, the caller's ``alloc_fn``
buffers, ``completion_fn``, a dense output into ``out``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable

import numpy as np

from .._config import setting
from .._pipeline import Delivery, Plan, call
from .._registry import Algorithm, bind_prices, record
from .._result import SparseResult
from .._types import ReduceOp, trunc_divide
from ..comm import Communicator, comm_or_default
from ..errors import InvalidArgument, OutOfMemory
from ..primitives._unfolded import Unfolded, folded
from . import auto as _auto
from . import dense as _dense
from . import learn as _learn
from . import measure as _measure
from . import small as _small
from ._common import canonical_nan, native_drops_nan, native_keeps_minus_zero
from ._cost import Shape
from ..wire._pack import COO, Wire
from ._validate import Prepared, prepare

__all__ = ["sparse_allreduce", "SparseResult", "Plan", "plan"]

_log = logging.getLogger("cupycoll")


def sparse_allreduce(indices: Any, values: Any, n: int, *, op: Any = "sum",
                     algorithm: str | None = None, comm: Communicator | None = None,
                     accumulate_dtype: Any = None,
                     alloc_fn: Callable[..., tuple[Any, Any]] | None = None,
                     completion_fn: Callable[[Any, Any, Any], Any] | None = None,
                     fn_ctx: Any = None, async_op: bool = False, wire: str | None = None,
                     wire_values: str | None = None, output: str = "sparse",
                     out: Any = None) -> Any:
    """Reduce sparse (indices, values) over all ranks; every rank gets the identical result.

    The result holds the ascending union of all ranks' indices (index dtype as given) and, at
    each of them, the dense allreduce of the densified inputs: an index absent on a rank counts
    as 0 there for every op (so ``max`` over {3 on rank 0, absent on rank 1} is 3, ``min`` is 0,
    ``prod`` is 0). Results are bitwise identical on all ranks. NaN propagates like in a dense
    reduction.

    Args:
        indices: 1-D int32/int64, any order, duplicates allowed (coalesced with ``op`` first;
            ``avg`` coalesces with sum). numpy, cupy or any ``__dlpack__`` object.
        values: 1-D, one per index, or 2-D ``(len(indices), width)`` embedding rows; float16,
            float32, float64, int32 or int64.
        n: dense length (number of rows), the same on every rank; indices must be in [0, n).
        op: "sum", "prod", "max", "min" or "avg" (sum / P; integers truncate toward zero).
        algorithm: one of ``cupycoll.algorithms("sparse")``; default ``CUPYCOLL_ALGORITHM`` or
            "auto" (the time model's pick; with ``CUPYCOLL_AUTO=measure`` the fastest of its
            candidates, timed on the first calls: docs/tuning.md). The same on every rank.
        comm: communicator (default ``cupycoll.get_comm()``).
        accumulate_dtype: dtype the reduction (and the wire) runs in, e.g. float32 for float16
            values; the result is cast back to the values' dtype once, at the end.
        alloc_fn: ``alloc_fn(nnz, index_dtype, values_shape, value_dtype, fn_ctx) ->
            (index_buf, value_buf)``; the result is copied into these buffers, which are
            returned in the SparseResult.
        completion_fn: ``completion_fn(indices, values, fn_ctx)``, called with the result
            (buffers valid during the call only: copy what you keep).
        fn_ctx: user object passed to the callbacks.
        wire: how sparse entries travel: "coo" (raw indices), "compact" (sorted index streams
            encoded losslessly: bitwise the same result, fewer bytes), "auto" (default, or
            ``CUPYCOLL_WIRE``: compact where the cost model says coding pays). See docs/wire.md.
        wire_values: None, "bfloat16" or "float16": float values travel rounded to nearest
            even and are summed in float32 (at least) at the receivers; the result is then
            approximate (still identical on every rank).
        output: "sparse" (default): a SparseResult. "dense": the reduced n-vector itself,
            ``(n,)`` or ``(n, width)`` in the values' dtype, +0 wherever no rank has an entry
            (the SparseResult's ``to_dense()``): for callers that apply the result densely
            anyway. ``auto`` then prices the ``dense`` algorithm as one dense allreduce
            and every other algorithm with the densified result; see docs/sparse.md.
        out: with output="dense", a writable C-contiguous buffer of that shape and dtype (the
            communicator's array type) to write the result into and return.
        async_op: return a :class:`Work` (``wait()``, ``is_completed()``, ``result()``);
            callbacks run in the thread that waits. On MPI the algorithm runs on a background
            thread over a duplicate of ``comm``, in call order. On NCCL its host part runs in
            the calling thread, on the caller's device and stream (NCCL needs one launch order
            on every rank, which a second host thread cannot keep), and the Work completes when
            the device work queued by the call has run.
    Returns:
        ``SparseResult(indices, values, n)`` in the caller's array type (output="dense": the
        n-vector, ``out`` itself if given), or a Work of it. ``completion_fn`` of a dense
        output is called as ``completion_fn(None, dense, fn_ctx)``.
    Raises:
        InvalidType, InvalidArgument: a bad argument on any rank (raised on every rank, naming
            the rank and argument). MismatchError: ranks disagree on n, dtypes, width, op,
            algorithm, accumulate_dtype, wire, wire_values, output or async_op.
    Example::

        # rank 0: indices [1, 5], values [1., 2.]    rank 1: indices [5, 7], values [10., 20.]
        res = cc.sparse_allreduce(idx, val, n=8)
        res.indices, res.values                      # both ranks: [1, 5, 7], [1., 12., 20.]
    """
    comm = comm_or_default(comm)
    return call(comm, "sparse_allreduce",
                lambda: prepare(comm, indices, values, n, op=op, algorithm=algorithm,
                                accumulate_dtype=accumulate_dtype, alloc_fn=alloc_fn,
                                completion_fn=completion_fn, async_op=async_op, wire=wire,
                                wire_values=wire_values, output=output, out=out),
                lambda prepared: plan(comm, prepared, async_op),
                lambda prepared: Delivery(values, indices, prepared.n, out, alloc_fn,
                                          completion_fn, fn_ctx, comm.rank), async_op)


def plan(comm: Communicator, prepared: Prepared, async_op: bool = False) -> Plan:
    """The plan of an agreed call (the same on every rank): ``small`` where every rank's
    entries came with the validation (sparse/small.py), else the algorithm named or auto's
    pick; its wire format, and its dense-output variant where the call asks for one and the
    algorithm has it."""
    if prepared.slots is not None:  # nothing left to decide: no message, no pricing
        wire = COO if prepared.wire_values is None else Wire(False, prepared.wire_values)
        name, timer = _small.ALGORITHM.name, None
    else:
        name, wire, timer = _decide(comm, prepared, async_op)
    _log.debug("sparse_allreduce: algorithm %s, wire %s, nnz %s, n %d", name, wire,
               prepared.nnz, prepared.n)
    comm.stats.count_call("sparse_allreduce", name, wire.label)
    found, run, variant = _bound(comm, name)
    if prepared.output == "dense" and variant is not None:
        return Plan(name, wire, lambda on: _dense_output(on, prepared, variant, wire), timer)
    if found.rides:
        run = functools.partial(run, slots=prepared.slots)
    # the validation told every rank's nnz: algorithms that take them skip a size round
    fn = functools.partial(run, counts=prepared.nnz) if found.counts else run
    values = prepared.values if found.unfolded else folded(prepared.values)
    return Plan(name, wire, lambda on: _run(on, prepared, name, fn, values, wire), timer)


def _bound(comm: Communicator, name: str) -> tuple[Algorithm, Callable, Callable | None]:
    """``name``'s record, its run function and its dense-output variant (None without one),
    with the prices they take bound (:func:`~.auto.prices`), kept per communicator while the
    registry holds the same record: a loop's calls bind them once. (The profile a
    communicator prices with is fixed at its first use: :func:`cupycoll.tuner.profile_for`.)"""
    found, table = record("sparse", name, rank=comm.rank), _auto.comm_table(comm, "_bound")
    kept = table.get(name)
    if kept is None or kept[0] is not found:
        prices = _auto.prices(comm, name)
        variant = found.dense_output and bind_prices(found, found.dense_output, **prices)
        kept = table[name] = (found, bind_prices(found, found.run, **prices), variant)
    return kept


def _decide(comm: Communicator, prepared: Prepared, async_op: bool
            ) -> tuple[str, Wire, Callable | None]:
    """(algorithm, wire, timer): the algorithm named, or auto's pick by its mode
    (``CUPYCOLL_AUTO``), its wire format, and the :attr:`Plan.timer` of a call measure or
    learn times (only synchronous calls are timed).
    What the models decide is :func:`~.auto.remembered` per kind of call: a loop's calls
    skip the pricing (measure and learn choose the algorithm per call, their wires are kept)."""
    kind = ("plan", prepared.algorithm, prepared.n, prepared.width, prepared.index_dtype,
            prepared.accumulate_dtype, prepared.value_dtype, prepared.op, prepared.wire,
            prepared.wire_values, prepared.output, native_drops_nan(comm),
            native_keeps_minus_zero(comm))
    learns = prepared.algorithm == "auto" and comm.size > 1 and prepared.auto_mode in (
        "measure", "learn")
    if not learns:
        kind += (prepared.auto_mode,) if prepared.algorithm == "auto" else ()
        return _auto.remembered(comm, kind, prepared.nnz, prepared.n,
                                lambda: _priced(comm, prepared, _shape(comm, prepared)))
    if prepared.auto_mode == "learn":
        return _learned(comm, kind, prepared, async_op)
    timer = None
    name, trials = _measure.plan(comm, _shape(comm, prepared), prepared.op, not async_op)
    if trials is not None:
        timer = lambda on: functools.partial(  # noqa: E731
            _measure.record, on, trials, name, _measure.settled(on))
    wire = _auto.remembered(comm, kind + (name,), prepared.nnz, prepared.n,
                            lambda: _wire(comm, prepared, name, _shape(comm, prepared)))
    return name, wire, timer


def _learned(comm: Communicator, kind: tuple, prepared: Prepared, async_op: bool
             ) -> tuple[str, Wire, Callable | None]:
    """learn's (algorithm, wire, timer) of a call of ``kind``. The call's class key, record and
    each algorithm's wire are :func:`~.auto.remembered` together (:class:`~.learn.Kind`): a
    loop's call finds them in one lookup while its counts stay near those of the call that
    set them, and keeps that call's class (a total nnz hovering at a power of two stays in
    one)."""
    kept = _auto.remembered(comm, kind + ("learn",), prepared.nnz, prepared.n,
                            lambda: _learn.Kind(_learn.with_total(
                                _learn_kind(comm, kind, prepared), sum(prepared.nnz))))
    name, learning = _learn.plan(comm, kept, lambda: _shape(comm, prepared), prepared.op,
                                 not async_op)
    timer = None
    if learning is not None:
        timer = lambda on: functools.partial(_learn.finish, on, learning)  # noqa: E731
    wire = kept.wires.get(name)
    if wire is None:
        wire = kept.wires[name] = _wire(comm, prepared, name, _shape(comm, prepared))
    return name, wire, timer


def _learn_kind(comm: Communicator, kind: tuple, prepared: Prepared) -> tuple:
    """learn's class key of a call of ``kind`` (:func:`~.learn.class_key`, the ranks' nodes
    in it), built once per kind and node setting: a new :class:`~.learn.Kind` of a loop (its
    counts moved, or a rank's count of 4 or fewer changed) takes another total nnz alone
    (:func:`~.learn.with_total`)."""
    keys = _auto.bounded_table(comm, "_learn_kinds")
    kind += (setting("CUPYCOLL_RANKS_PER_NODE"),)
    key = keys.get(kind)
    if key is None:
        shape, _ = _auto.resolved(_shape(comm, prepared), comm=comm)
        key = keys[kind] = _learn.class_key(shape, prepared.op)
    return key


def _shape(comm: Communicator, prepared: Prepared) -> Shape:
    """The call as auto prices it: with the wire asked for (raw when auto decides it after;
    the wire choice sets each wire itself, so one Shape serves both)."""
    return prepared.shape(comm, Wire(prepared.wire == "compact", prepared.wire_values)
                          if prepared.algorithm == "auto" else COO)


def _priced(comm: Communicator, prepared: Prepared, shape: Shape
            ) -> tuple[str, Wire, None]:
    """The algorithm named or the model's pick (``estimate``), and its wire format."""
    name = (prepared.algorithm if prepared.algorithm != "auto"
            else _auto.choose(shape, comm=comm, op=prepared.op))
    return name, _wire(comm, prepared, name, shape), None


def _wire(comm: Communicator, prepared: Prepared, name: str, shape: Shape) -> Wire:
    """The wire format of the call running ``name`` (:func:`~.auto.choose_wire`)."""
    return _auto.choose_wire(name, shape, prepared.wire, prepared.wire_values, comm=comm)


def _run(comm: Communicator, prepared: Prepared, name: str, fn: Callable, values: Any,
         wire: Wire) -> tuple[Any, Any]:
    """Run the algorithm on ``values`` (the prepared ones, folded unless it takes them
    unfolded), then :func:`_sparse_result` of its result (copied if it aliases the input)."""
    with _allocations(comm, prepared, name):
        idx, val = fn(comm, prepared.indices, values, prepared.n, prepared.reduce_op,
                      prepared.accumulate_dtype, wire)
        xp = comm.xp
        if not isinstance(values, Unfolded) and xp.may_share_memory(val, values):
            val = val.copy()
        if xp.may_share_memory(idx, prepared.indices):
            idx = idx.copy()
        return _sparse_result(comm, prepared, idx, val)


def _sparse_result(comm: Communicator, prepared: Prepared, idx: Any, val: Any) -> Any:
    """The reduced entries as the caller's (:func:`_callers_values`, NaN bits made canonical);
    for a dense output, written into zeros (the caller's ``out`` or a new array)."""
    idx = idx.astype(prepared.index_dtype, copy=False)
    val = _callers_values(comm, prepared, val, True)
    if prepared.output != "dense":
        return idx, val
    return _dense.densify_into(_dense_target(comm, prepared), idx, val)


def _callers_values(comm: Communicator, prepared: Prepared, val: Any, nan_bits: bool) -> Any:
    """Reduced values (entries' rows or a dense block) as the caller's: avg, the cast, and,
    where ``nan_bits``, numpy's NaN bits (a float average of the caller's dtype: the division
    and the NaN bits in one pass)."""
    if prepared.op is ReduceOp.AVG:
        if nan_bits and val.dtype.kind == "f" and val.dtype == prepared.value_dtype:
            return canonical_nan(val, comm.size)
        trunc_divide(val, comm.size)
    with np.errstate(all="ignore"):  # an accumulate dtype's sum past the caller's range (its
        val = val.astype(prepared.value_dtype, copy=False)  # inf) or below it (0): no raise
    return canonical_nan(val) if nan_bits else val


def _dense_target(comm: Communicator, prepared: Prepared) -> Any:
    """The array a dense output is written into: the caller's ``out``, or a new array of the
    caller's dtype."""
    if prepared.out is not None:
        return prepared.out
    row = tuple(prepared.values.shape[1:])
    return comm.xp.empty((prepared.n,) + row, dtype=prepared.value_dtype)


def _dense_output(comm: Communicator, prepared: Prepared, variant: Callable, wire: Wire) -> Any:
    """``output="dense"`` by the algorithm's own dense variant
    (:attr:`cupycoll._registry.Algorithm.dense_output`)."""
    with _allocations(comm, prepared, "dense output"):
        return variant(comm, prepared.indices, prepared.values, prepared.n, prepared.reduce_op,
                       _dense_target(comm, prepared),
                       lambda val: _callers_values(comm, prepared, val, prepared.may_nan),
                       prepared.minus_zero, wire)


@contextlib.contextmanager
def _allocations(comm: Communicator, prepared: Prepared, name: str) -> Any:
    """A buffer of the call past what this rank can hold (numpy's or CuPy's MemoryError, an
    array past numpy's size limit) as InvalidArgument naming n where the call holds n rows
    (the dense algorithm, a dense output), else as OutOfMemory naming ``name``; either names
    the rank. Ranks of one agreed call allocate alike, so with alike memory each raises it; a
    rank alone short of memory raises alone and its peers wait for it."""
    try:
        yield
    except (MemoryError, ValueError) as exc:
        if isinstance(exc, ValueError) and not any(
                text in str(exc) for text in ("too big", "Maximum allowed dimension")):
            raise
        if name == "dense" or prepared.output == "dense":
            raise InvalidArgument("n", prepared.n, f"a buffer of this call cannot be allocated "
                                  f"on this rank ({exc}); a dense output and the dense "
                                  "algorithm hold n rows", rank=comm.rank) from exc
        raise OutOfMemory(f"sparse_allreduce ({name}) on rank {comm.rank}: a buffer of this "
                          f"call cannot be allocated ({exc})") from exc
