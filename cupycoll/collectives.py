"""Dense collectives with NCCL's semantics: allreduce, broadcast, reduce, allgather, reduce_scatter.

Out-of-place by default (a new output array; the input is never modified), in-place with
``out=x``. Inputs are numpy or cupy arrays or anything with ``__dlpack__`` (PyTorch tensors,
zero-copy); results come back as the caller's array type. Bad arguments raise before anything is
sent, on the rank that got them.

Example::

    x = np.full(4, comm.rank + 1.0, np.float32)
    cc.allreduce(x)              # rank 0 and rank 1 (P=2): [3., 3., 3., 3.]
    cc.reduce(x, root=1)         # rank 0: None          rank 1: [3., 3., 3., 3.]
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np

from . import _agreement as agreement
from ._config import debug
from ._pipeline import Delivery, Plan, call
from ._types import (DENSE_DTYPES, ReduceOp, array_namespace, as_array, check_device,
                     check_dtype, check_flag, device_of, parse_op, writable)
from .comm import Communicator, Work, _checks, comm_or_default
from .errors import CupycollError, InvalidArgument, InvalidType, MismatchError

__all__ = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "all_reduce",
           "all_gather", "reduce_scatter_tensor"]


#: The common case, whose checks all pass, takes a fast path (:func:`_plain_output`): an array
#: of the communicator's own library, C-contiguous, of one of these dtypes, an op given by name or
#: as a ReduceOp, a preallocated ``out`` that fits (or none), an int root, CUPYCOLL_DEBUG off.
#: Anything else takes the general path below, which runs every check and raises its errors.
#: The fast path is one check function and the backend's ``run``: on a call whose caches are cold
#: (as after a collective that moved data) every Python frame is a cache miss (docs/dense.md).
_PLAIN_DTYPES = frozenset(DENSE_DTYPES)
_PLAIN_OPS = {op.value: op for op in ReduceOp}


def _plain_op(op: Any) -> ReduceOp | None:
    return _PLAIN_OPS.get(op) if type(op) is str or type(op) is ReduceOp else None


def _plain_output(x: Any, out: Any, comm: Communicator, grow: int = 0, shrink: int = 1) -> Any:
    """The output of a fast-path call (``out``, or a new array when ``out`` is None), or None
    when the call must take the general path: ``x`` is not a C-contiguous array of ``comm``'s
    library in a dense dtype, CUPYCOLL_DEBUG is on, ``out`` does not pass every check of
    :func:`_output`, or, with ``grow`` (allgather: P; reduce_scatter: 1), ``x`` has no axis 0
    or one that ``shrink`` (reduce_scatter: P) does not divide. The output's axis 0 is ``x``'s
    times ``grow / shrink``; without ``grow``, the output has ``x``'s shape."""
    if (type(x) is not comm.xp.ndarray or x.dtype not in _PLAIN_DTYPES
            or not x.flags.c_contiguous or debug()):
        return None
    shape = x.shape
    if grow:
        if not shape or shape[0] % shrink:
            return None
        shape = (shape[0] * grow // shrink,) + shape[1:]
    device = getattr(comm, "device_id", None)
    if device is not None and device_of(x, device) != device:
        return None
    if out is None:
        return comm.xp.empty(shape, dtype=x.dtype)
    if (type(out) is type(x) and out.shape == shape and out.dtype == x.dtype
            and out.flags.c_contiguous and writable(out)
            and (device is None or device_of(out, device) == device)):
        return out
    return None


def _plain_root(root: Any, comm: Communicator) -> bool:
    return type(root) is int and 0 <= root < comm.size


def _started(comm: Communicator, verb: str, args: tuple) -> Work:
    """``comm.<verb>(*args)`` started: its Work, whose result is the output ``args[1]``."""
    return Work.then(getattr(comm, verb)(*args), lambda: args[1])


def _ran(comm: Communicator, verb: str, args: tuple) -> Any:
    """``comm.<verb>(*args)`` run to completion (the backend's cheapest blocking way); the
    output ``args[1]``."""
    comm.run(verb, *args)
    return args[1]


def _fast(comm: Communicator, verb: str, args: tuple, async_op: bool) -> Any:
    """A call whose arguments need no agreement: started or run at once. Left by an exception
    not cupycoll's (Ctrl-C in its own work): the communicator's rule for a call its peers may
    be in (``Communicator._interrupted``), as a general path's ``calling`` applies it."""
    try:
        return (_started if async_op else _ran)(comm, verb, args)
    except BaseException as exc:
        if comm._fate.error is None:
            comm._interrupted(verb, type(exc))
        raise


def _general(comm: Communicator, verb: str, x: Any, out: Any, async_op: bool,
             validate: Callable[[], tuple[tuple, dict[str, Any]]]) -> Any:
    """A verb's general path, over the call pipeline (:func:`cupycoll._pipeline.call`):
    ``validate()`` checks the arguments on this rank and returns the verb's arguments (input,
    output, ...) and the agreement's fields (op, root); with CUPYCOLL_DEBUG every rank agrees
    on the call first (:func:`_agreed`). The Communicator runs the verb (its own Work for
    ``async_op``), on the caller's stream order; the caller gets its ``out`` itself (a torch
    tensor stays that tensor) or the output as its array type."""

    def plan(args: tuple) -> Plan:
        return Plan(verb, None, lambda on: _ran(on, verb, args),
                    start=lambda on: _started(on, verb, args))

    return call(comm, verb, lambda: _agreed(comm, verb, validate), plan,
                lambda args: Delivery(x, out=out), async_op, stream=False)


def _input(x: Any, comm: Communicator, name: str = "x") -> Any:
    arr = as_array(x, name, rank=comm.rank)
    check_dtype(arr, name, rank=comm.rank)
    check_device(arr, comm, name)
    if arr.flags.c_contiguous:
        return arr
    with comm.in_stream(join=False):  # NCCL: the copy on its stream, not on the caller's
        return array_namespace(arr).ascontiguousarray(arr)


def _output(out: Any, x: Any, shape: tuple, comm: Communicator) -> Any:
    if out is None:
        return array_namespace(x).empty(shape, dtype=x.dtype)
    out = as_array(out, "out", rank=comm.rank)
    if tuple(out.shape) != tuple(shape):
        raise InvalidArgument("out", tuple(out.shape), f"shape must be {tuple(shape)}",
                              rank=comm.rank)
    if out.dtype != x.dtype:
        raise InvalidType("out", out.dtype, f"an array of dtype {x.dtype} (the input's)",
                          rank=comm.rank)
    if not out.flags.c_contiguous:
        raise InvalidArgument("out", "non-contiguous array", "must be C-contiguous", rank=comm.rank)
    if not writable(out):
        raise InvalidArgument("out", "read-only array", "must be writable", rank=comm.rank)
    check_device(out, comm, "out")
    return out


def _root(root: Any, comm: Communicator) -> int:
    try:
        if isinstance(root, (bool, np.bool_)):  # operator.index(True) is 1: not a rank
            raise TypeError
        value = operator.index(root)
    except Exception:  # noqa: BLE001 -- a TypeError, or whatever its own __index__ raises
        raise InvalidType("root", root, "an int rank", rank=comm.rank) from None
    if not 0 <= value < comm.size:
        raise InvalidArgument("root", root, f"must be a rank in [0, {comm.size})", rank=comm.rank)
    return value


def _rows(x: Any, comm: Communicator) -> int:
    if x.ndim == 0:
        raise InvalidArgument("x", "0-d array", "needs at least one dimension (axis 0 is split "
                              "or concatenated)", rank=comm.rank)
    return int(x.shape[0])


_VERBS = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter")
#: verbs of the torch backend the dense verbs' agreement does not name: those built on
#: ``Communicator.exchange`` (no op, dtype or count shared) and barrier
_EXCHANGES = ("all_to_all_single", "alltoall", "gather", "scatter", "barrier")
_OPS = tuple(ReduceOp)
_FIELDS = ("collective", "op", "root", "dtype", "count")


def _peer_error(failure: agreement.Failure, draft: agreement.Draft) -> CupycollError:
    return MismatchError(f"rank {failure.rank} passed bad arguments to {draft.terms.verb}; "
                         f"rank {draft.rank} stops too (CUPYCOLL_DEBUG check)")


#: how a mismatch shows the agreed codes of the fields that are not numbers
_SHOWN = {"collective": lambda code: (_VERBS + _EXCHANGES)[code],
          "op": lambda code: _OPS[code].value if code >= 0 else "none",
          "dtype": lambda num: next((np.dtype(c).name for c in np.typecodes["All"]
                                     if _dtype_code(np.dtype(c)) == num), str(num))}


def _dtype_code(dtype: Any) -> int:
    """One code per dtype numpy calls equal (``longlong`` and ``int64`` on Linux: one code)."""
    return np.dtype(np.dtype(dtype).str).num


def _mismatch(differs: list[agreement.Differ], draft: agreement.Draft) -> str:
    named = "; ".join(f"{d.field}: {d.by_rank(_SHOWN.get(d.field, str))}" for d in differs)
    mine = ", ".join(f"{name} {_SHOWN.get(name, str)(code)}" for name, code
                     in draft.context.items() if name != "collective" and code != -1)
    return (f"rank {draft.rank} called {draft.terms.verb} with {mine}, but ranks "
            f"differ in {[d.field for d in differs]} ({named}; CUPYCOLL_DEBUG check)")


#: what each dense verb agrees on under CUPYCOLL_DEBUG (:mod:`cupycoll._agreement`).
_TERMS = {verb: agreement.Terms(verb, _FIELDS, _peer_error, _mismatch)
          for verb in _VERBS + _EXCHANGES}


def _agree(comm: Communicator, verb: str, fields: dict[str, int] | None,
           error: Exception | None = None) -> None:
    """With CUPYCOLL_DEBUG, check that every rank called the same collective the same way.

    One small MAX-allreduce (:mod:`cupycoll._agreement`) runs before the collective itself. So
    a rank that called another collective, or the same one with another op, root, dtype or
    count, or that raised ``error`` on bad arguments (``fields`` None), makes every other rank
    raise too instead of hanging or reducing garbage; that rank raises ``error``.
    """
    draft = _TERMS[verb].draft(comm)
    draft.context = fields
    if error is not None:
        draft.fail(error)
    else:
        draft.agree(fields.values())
    with comm.calling(verb):  # a timeout here names the verb, not its check
        draft.settle("debug.check")


def agree_exchange(comm: Communicator, verb: str, root: int = -1, dtype: int = -1,
                   count: int = -1) -> None:
    """With CUPYCOLL_DEBUG, every rank's agreement that it calls ``verb`` (one of the torch
    backend's exchanges or barrier, or a verb it runs on a tensor's bytes, whose own check sees
    bytes) with ``root``, the tensor's ``dtype`` (a code) and ``count`` (its elements): a rank
    that refused its arguments (:func:`refuse`) or called another verb makes every rank
    raise."""
    if debug():
        _agree(comm, verb, {"collective": (_VERBS + _EXCHANGES).index(verb), "op": -1,
                            "root": root, "dtype": dtype, "count": count})


_checks.BARRIER_CHECKS.append(lambda comm: agree_exchange(comm, "barrier"))


def refuse(comm: Communicator, verb: str, error: CupycollError) -> None:
    """``error``, a bad argument of ``verb`` found before calling it (a wrapper's own checks,
    with CUPYCOLL_DEBUG on), as the verb's general path treats one: it takes part in the
    verb's agreement, so every rank raises (this one ``error``)."""
    _agree(comm, verb, None, error)


def _async_flag(comm: Communicator, verb: str, async_op: Any) -> bool:
    """``async_op`` checked (True or False); with CUPYCOLL_DEBUG a bad one takes part in the
    verb's agreement, so every rank raises (:func:`refuse`)."""
    try:
        return check_flag(async_op, "async_op", comm.rank)
    except CupycollError as exc:
        if debug():
            refuse(comm, verb, exc)
        raise


def _agreed(comm: Communicator, verb: str,
            validate: Callable[[], tuple[tuple, dict[str, Any]]]) -> tuple:
    """The verb's arguments, validated on this rank by ``validate()`` (the arguments, input
    first, and the op and root to agree on); with CUPYCOLL_DEBUG every rank agrees on the call:
    a CupycollError raised by ``validate`` takes part in the agreement as a bad-argument flag
    (every rank raises), a call that differs raises MismatchError everywhere (:func:`_agree`)."""
    debugging = debug()
    try:
        args, fields = validate()
    except Exception as exc:
        if debugging:
            _agree(comm, verb, None, exc)  # raises it after the agreement (as cupycoll's)
        raise
    if debugging:
        op = fields.get("op")
        _agree(comm, verb, {"collective": _VERBS.index(verb),
                            "op": _OPS.index(op) if op is not None else -1,
                            "root": fields.get("root", -1),
                            "dtype": _dtype_code(args[0].dtype), "count": int(args[0].size)})
    return args


def allreduce(x: Any, op: Any = "sum", *, comm: Communicator | None = None, out: Any = None,
              async_op: bool = False) -> Any:
    """Reduce ``x`` over all ranks with ``op``; every rank gets the identical result.

    Args:
        x: array (numpy, cupy, or ``__dlpack__``); same shape and dtype on every rank.
        op: "sum", "prod", "max", "min", "avg", a ReduceOp or an mpi4py op.
        comm: communicator (default ``cupycoll.get_comm()``).
        out: output array (``out=x`` for in-place); default a new array.
        async_op: return a Work whose ``result()`` is the output.
    Example::

        cc.allreduce(np.array([rank + 1]))    # rank 0: [3]  rank 1: [3]
    """
    comm = comm_or_default(comm)
    async_op = _async_flag(comm, "allreduce", async_op)
    red = _plain_op(op)
    dst = _plain_output(x, out, comm) if red is not None else None
    if dst is not None:
        return _fast(comm, "allreduce", (x, dst, red), async_op)

    def validate() -> tuple[tuple, dict[str, Any]]:
        arr = _input(x, comm)
        red = parse_op(op, rank=comm.rank)
        return (arr, _output(out, arr, arr.shape, comm), red), {"op": red}

    return _general(comm, "allreduce", x, out, async_op, validate)


def broadcast(x: Any, root: int = 0, *, comm: Communicator | None = None, out: Any = None,
              async_op: bool = False) -> Any:
    """Copy root's ``x`` to every rank (``x`` on other ranks only gives shape and dtype)."""
    comm = comm_or_default(comm)
    async_op = _async_flag(comm, "broadcast", async_op)
    dst = _plain_output(x, out, comm) if _plain_root(root, comm) else None
    if dst is not None:
        return _fast(comm, "broadcast", (x, dst, root), async_op)

    def validate() -> tuple[tuple, dict[str, Any]]:
        arr = _input(x, comm)
        src = _root(root, comm)
        return (arr, _output(out, arr, arr.shape, comm), src), {"root": src}

    return _general(comm, "broadcast", x, out, async_op, validate)


def reduce(x: Any, root: int = 0, op: Any = "sum", *, comm: Communicator | None = None,
           out: Any = None, async_op: bool = False) -> Any:
    """Reduce ``x`` over all ranks onto ``root``; return the result on root and None elsewhere."""
    comm = comm_or_default(comm)
    async_op = _async_flag(comm, "reduce", async_op)
    red = _plain_op(op)
    dst = None
    if red is not None and _plain_root(root, comm):
        # off the root only ``x`` is checked (no output): ``x`` stands in for ``out``
        dst = _plain_output(x, out if comm.rank == root else x, comm)
    if dst is not None:
        return _fast(comm, "reduce", (x, dst if comm.rank == root else None, red, root), async_op)

    def validate() -> tuple[tuple, dict[str, Any]]:
        arr = _input(x, comm)
        dst_root = _root(root, comm)
        red = parse_op(op, rank=comm.rank)
        dst = _output(out, arr, arr.shape, comm) if comm.rank == dst_root else None
        return (arr, dst, red, dst_root), {"op": red, "root": dst_root}

    return _general(comm, "reduce", x, out, async_op, validate)


def allgather(x: Any, *, comm: Communicator | None = None, out: Any = None,
              async_op: bool = False) -> Any:
    """Concatenate every rank's ``x`` along axis 0 in rank order; identical on every rank."""
    comm = comm_or_default(comm)
    async_op = _async_flag(comm, "allgather", async_op)
    dst = _plain_output(x, out, comm, grow=comm.size)
    if dst is not None:
        return _fast(comm, "allgather", (x, dst), async_op)

    def validate() -> tuple[tuple, dict[str, Any]]:
        arr = _input(x, comm)
        shape = (comm.size * _rows(arr, comm),) + tuple(arr.shape[1:])
        return (arr, _output(out, arr, shape, comm)), {}

    return _general(comm, "allgather", x, out, async_op, validate)


def reduce_scatter(x: Any, op: Any = "sum", *, comm: Communicator | None = None, out: Any = None,
                   async_op: bool = False) -> Any:
    """Reduce ``x`` over ranks and return this rank's block (axis 0 split into P equal blocks)."""
    comm = comm_or_default(comm)
    async_op = _async_flag(comm, "reduce_scatter", async_op)
    red = _plain_op(op)
    dst = _plain_output(x, out, comm, grow=1, shrink=comm.size) if red is not None else None
    if dst is not None:
        return _fast(comm, "reduce_scatter", (x, dst, red), async_op)

    def validate() -> tuple[tuple, dict[str, Any]]:
        arr = _input(x, comm)
        rows = _rows(arr, comm)
        red = parse_op(op, rank=comm.rank)
        if rows % comm.size:
            raise InvalidArgument("x", tuple(arr.shape), f"axis 0 ({rows}) must be divisible by "
                                  f"the number of ranks ({comm.size})", rank=comm.rank)
        return (arr, _output(out, arr, (rows // comm.size,) + tuple(arr.shape[1:]), comm),
                red), {"op": red}

    return _general(comm, "reduce_scatter", x, out, async_op, validate)


all_reduce = allreduce
all_gather = allgather
reduce_scatter_tensor = reduce_scatter
