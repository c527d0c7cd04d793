"""Collective validation of a ``sparse_allreduce`` call: one small allreduce before any data moves.

Every rank checks its own arguments locally (types, dtypes, shapes, index range), coalesces its
input, and then all ranks run ONE int64 MAX-allreduce of

* ``max(x)`` and ``max(-x)`` of every agreement field (n, index dtype, value dtype, width, op,
  algorithm, accumulate dtype, wire, output, async_op): the two differ exactly when ranks
  disagree;
* with ``output="dense"``, whether any rank's values hold a NaN or an infinity, or a -0;
* every rank's coalesced nnz (used by ``auto``) and which rank had which problem, with an
  out-of-range index's value

(the layout is :mod:`cupycoll._agreement`'s, from :data:`TERMS`).

The vector ends with one entry slot per rank: with ``algorithm="auto"``, a call whose entries
fit there on every rank is complete after this one collective (:mod:`.small`).

Then every rank raises the same kind of error: the rank with bad input raises its precise
InvalidType/InvalidArgument, the others an error of the same type naming that rank and argument;
ranks that disagree raise MismatchError. Nobody is left waiting in a collective.
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
from typing import Any

import numpy as np

from .._agreement import unchecked
from .._config import check_run_settings, chosen, setting
from .._registry import algorithms
from .._types import (ReduceOp, array_namespace, as_array, check_device, check_flag, check_native,
                      parse_op, to_host)
from ..errors import CupycollError, InvalidArgument, InvalidType
from ..primitives import coo_reduce
from ..primitives._accel import _fast
from ..primitives._checks import _index_stats
from ..primitives._unfolded import unfold
from ..wire._choice import check_wire, check_wire_values, wire_code
from ..wire._pack import COO, Wire
from . import learn, small
from ._common import native_drops_nan, native_keeps_minus_zero
from ._cost import Shape
from .recursive_doubling import reads_in_place
from ._terms import (_INDEX_CODES, _INDEX_NAMES, _OP_CODES, _VALUE_CODES, _VALUE_NAMES,
                     AUTO_MODES, OUTPUTS, TERMS)

__all__ = ["Prepared", "prepare"]


@dataclasses.dataclass
class Prepared:
    """A validated call: coalesced sorted local input (values in the accumulate dtype, or
    their :class:`cupycoll.primitives._unfolded.Unfolded` rows) and the arguments every rank
    agreed on."""

    indices: Any
    values: Any
    n: int
    op: ReduceOp
    algorithm: str
    index_dtype: np.dtype
    value_dtype: np.dtype
    accumulate_dtype: np.dtype
    width: int
    nnz: tuple[int, ...] = ()
    wire: str = "coo"
    wire_values: str | None = None
    slots: Any = None  # every rank's entries, when they rode in the validation (small.py)
    output: str = "sparse"
    out: Any = None  # output="dense": the caller's buffer, as an array of the communicator's
    may_nan: bool = False  # output="dense": the reduction may hold a NaN (_value_flags)
    minus_zero: bool = False  # output="dense": some rank's float values hold a -0
    auto_mode: str = "estimate"  # algorithm "auto": CUPYCOLL_AUTO (measure.py, learn.py)
    ranks_per_node: int = 0  # CUPYCOLL_RANKS_PER_NODE (0: unset), agreed with the algorithm

    @property
    def reduce_op(self) -> ReduceOp:
        """The op the algorithms run (avg is a sum divided by P afterwards)."""
        return ReduceOp.SUM if self.op is ReduceOp.AVG else self.op

    def shape(self, comm: Any, wire: Wire = COO) -> Shape:
        """The call as the cost models see it, on ``comm`` (its size, native reductions, array
        namespace, and whether its blocks are read in place)."""
        row_bytes = self.value_dtype.itemsize * max(self.width, 1)
        return Shape(comm.size, self.n, self.width, self.index_dtype.itemsize,
                     self.accumulate_dtype.itemsize, self.nnz, wire=wire,
                     float_values=self.accumulate_dtype.kind == "f"
                     and self.accumulate_dtype.itemsize >= 4, output=self.output,
                     result_bytes=self.value_dtype.itemsize
                     if self.value_dtype != self.accumulate_dtype else 0,
                     native_minmax_drops_nan=native_drops_nan(comm),
                     native_sum_keeps_minus_zero=native_keeps_minus_zero(comm),
                     host=comm.xp is np, in_place=reads_in_place(
                         comm, self.nnz, self.n, self.index_dtype.itemsize, row_bytes))

    def fields(self, names: list[str]) -> tuple[int, ...]:
        """The agreement fields (VALIDATION_FIELDS but async_op; ``names``: the sparse
        algorithms); the algorithm's also carries CUPYCOLL_AUTO and CUPYCOLL_RANKS_PER_NODE."""
        how = AUTO_MODES.index(self.auto_mode) + len(AUTO_MODES) * self.ranks_per_node
        return (self.n, _INDEX_CODES[self.index_dtype], _VALUE_CODES[self.value_dtype],
                self.width, _OP_CODES[self.op], names.index(self.algorithm) + len(names) * how,
                _VALUE_CODES[self.accumulate_dtype], wire_code(self.wire, self.wire_values),
                OUTPUTS.index(self.output))


def _length(n: Any, rank: int) -> int:
    if type(n) is int and 0 < n < 2**62:  # the usual case, without the ABC check below
        return n
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (numbers.Integral, np.integer)):
        raise InvalidType("n", type(n).__name__, "an int (the dense length)", rank=rank)
    value = operator.index(n)
    if not 0 < value < 2**62:
        raise InvalidArgument("n", value, "must be a positive int below 2**62 (the dense "
                              "length)", rank=rank)
    return value


def _on(xp: Any, a: Any) -> Any:
    """``a`` as a C-contiguous array of the communicator's library (host copy or upload)."""
    if type(a) is not xp.ndarray and array_namespace(a) is not xp:
        a = to_host(a) if xp is np else xp.asarray(a)
    return a if a.flags.c_contiguous else xp.ascontiguousarray(a)


def _arrays(comm: Any, indices: Any, values: Any, rank: int) -> tuple[Any, Any, int]:
    idx = as_array(indices, "indices", rank=rank)
    val = as_array(values, "values", rank=rank)
    check_device(idx, comm, "indices")
    check_device(val, comm, "values")
    check_native(idx.dtype, "indices", rank)
    check_native(val.dtype, "values", rank)
    if idx.dtype not in _INDEX_CODES and np.dtype(idx.dtype).name not in _INDEX_NAMES:
        raise InvalidType("indices", idx.dtype, "an array of int32 or int64", rank=rank)
    if idx.ndim != 1:
        raise InvalidArgument("indices", tuple(idx.shape), "must be 1-D", rank=rank)
    if val.dtype not in _VALUE_CODES and np.dtype(val.dtype).name not in _VALUE_NAMES:
        raise InvalidType("values", val.dtype, f"an array of one of {list(_VALUE_NAMES)}",
                          rank=rank)
    if val.ndim not in (1, 2):
        raise InvalidArgument("values", tuple(val.shape), "must be 1-D, or 2-D rows "
                              "(len(indices), width)", rank=rank)
    if val.shape[0] != idx.shape[0]:
        raise InvalidArgument("values", tuple(val.shape), f"needs one value (row) per index; "
                              f"there are {idx.shape[0]} indices", rank=rank)
    if val.ndim == 2 and val.shape[1] < 1:
        raise InvalidArgument("values", tuple(val.shape), "rows must have width >= 1", rank=rank)
    width = int(val.shape[1]) if val.ndim == 2 else 0
    return _on(comm.xp, idx), _on(comm.xp, val), width


def _output(output: Any, rank: int) -> str:
    if not isinstance(output, str) or output not in OUTPUTS:
        raise InvalidArgument("output", output, f"must be one of {list(OUTPUTS)}", rank=rank)
    return output


def _out(comm: Any, out: Any, output: str, alloc_fn: Any, n: int, width: int,
         value_dtype: np.dtype, rank: int) -> Any:
    """The caller's buffer for ``output="dense"`` as a writable C-contiguous array of the
    communicator's library ((n,) or (n, width), the values' dtype), or None."""
    if output == "dense" and alloc_fn is not None:
        raise InvalidArgument("alloc_fn", "a callable", "is for sparse results; with "
                              "output='dense' pass out= (or nothing)", rank=rank)
    if out is None:
        return None
    if output != "dense":
        raise InvalidArgument("out", type(out).__name__, "is only for output='dense'",
                              rank=rank)
    arr = as_array(out, "out", rank=rank)
    check_device(arr, comm, "out")
    want = (n, width) if width else (n,)
    if tuple(arr.shape) != want or np.dtype(arr.dtype) != value_dtype:
        raise InvalidArgument("out", f"{tuple(arr.shape)} {arr.dtype}", f"must have shape "
                              f"{want} and dtype {value_dtype} (the dense result)", rank=rank)
    if type(arr) is not comm.xp.ndarray and array_namespace(arr) is not comm.xp:
        raise InvalidType("out", type(out).__name__, f"an array the communicator writes "
                          f"({comm.xp.__name__})", rank=rank)
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise InvalidArgument("out", f"{tuple(arr.shape)} {arr.dtype}", "must be writable and "
                              "C-contiguous", rank=rank)
    return arr


def _accumulate(accumulate_dtype: Any, value_dtype: np.dtype, op: ReduceOp,
                rank: int) -> np.dtype:
    """The dtype the reduction runs in: ``accumulate_dtype``, else the values' own, but float32
    for a float16 average (as the dense verbs run it: its float16 sum may overflow)."""
    if accumulate_dtype is None:
        if op is ReduceOp.AVG and value_dtype == np.float16:
            return np.dtype(np.float32)
        return value_dtype
    try:  # the arithmetic's dtype: its byte order is this machine's, whatever was named
        acc = np.dtype(accumulate_dtype).newbyteorder("=")
    except TypeError:
        raise InvalidType("accumulate_dtype", accumulate_dtype, "a dtype", rank=rank) from None
    if acc.name not in _VALUE_NAMES:
        raise InvalidType("accumulate_dtype", acc, f"one of {list(_VALUE_NAMES)}", rank=rank)
    return acc


#: the reason of an index outside [0, n): its value travels to the other ranks
_OUT_OF_RANGE = "index out of range [0, n="


def _check_range(idx: Any, n: int, rank: int) -> bool:
    """Raise unless every index is in [0, n); return whether ``idx`` is strictly increasing
    (range and order come from one device read)."""
    if idx.shape[0] == 0:
        return True
    lo, hi, increasing = _index_stats(idx)
    if lo < 0 or hi >= n:
        bad = lo if lo < 0 else hi
        raise InvalidArgument("indices", bad, f"{_OUT_OF_RANGE}{n})", rank=rank)
    return increasing


def _coalesce(idx: Any, val: Any, op: ReduceOp, acc: np.dtype, increasing: bool,
              output: str) -> tuple[Any, Any]:
    """Sorted unique local input with values in ``acc`` (duplicates reduced with the op); a
    host sum's values for a sparse output as :class:`Unfolded` rows where numba's table takes
    them (summed where they land, by an algorithm that takes them so: ``Algorithm.unfolded``)."""
    if not increasing and output == "sparse" and op in (ReduceOp.SUM, ReduceOp.AVG) \
            and type(val) is np.ndarray:
        rows = unfold(idx, val, acc)
        if rows is not None:
            return rows.keys, rows
    if val.dtype != acc:
        with np.errstate(all="ignore"):  # a narrower accumulate dtype: inf, 0 or a subnormal
            val = val.astype(acc)
    if not increasing:
        idx, val = coo_reduce(idx, val, (ReduceOp.SUM if op is ReduceOp.AVG else op).value)
    return idx, val


def _local(comm: Any, indices: Any, values: Any, n: Any, op: Any, algorithm: Any,
           accumulate_dtype: Any, alloc_fn: Any, completion_fn: Any, names: list[str],
           wire: Any = None, wire_values: Any = None, output: Any = "sparse", out: Any = None,
           async_op: Any = False) -> tuple[Prepared | None, CupycollError | None]:
    """Check this rank's arguments and coalesce its input; return (prepared, error)."""
    rank = comm.rank
    try:
        per_node = check_run_settings(rank)
        red = parse_op(op, rank=rank)
        name = chosen("CUPYCOLL_ALGORITHM", algorithm, "algorithm", names,
                      "unknown sparse algorithm; ", rank)
        wire = check_wire(wire, rank)
        wire_values = check_wire_values(wire_values, rank)
        output = _output(output, rank)
        check_flag(async_op, "async_op", rank)
        length = _length(n, rank)
        idx, val, width = _arrays(comm, indices, values, rank)
        acc = _accumulate(accumulate_dtype, np.dtype(val.dtype), red, rank)
        if not Wire(values=wire_values).rounds(val.dtype):  # float16 and integer values
            wire_values = None  # travel as they are, a float accumulate dtype or not
        for arg, fn in (("alloc_fn", alloc_fn), ("completion_fn", completion_fn)):
            if fn is not None and not callable(fn):
                raise InvalidType(arg, type(fn).__name__, "a callable or None", rank=rank)
        value_dtype = np.dtype(val.dtype)
        buffer = _out(comm, out, output, alloc_fn, length, width, value_dtype, rank)
        increasing = _check_range(idx, length, rank)
        idx, val = _coalesce(idx, val, red, acc, increasing, output)
        if buffer is not None:  # out= over the input (out=values): read before it is written
            idx, val = (a.copy() if comm.xp.may_share_memory(buffer, a) else a
                        for a in (idx, val))
        mode = setting("CUPYCOLL_AUTO") if name == "auto" else "estimate"
    except Exception as exc:  # reaches the other ranks as a flag, naming this rank
        return None, unchecked(exc, rank)
    return Prepared(idx, val, length, red, name, np.dtype(idx.dtype), value_dtype, acc,
                    width, wire=wire, wire_values=wire_values, output=output, out=buffer,
                    auto_mode=mode, ranks_per_node=per_node), None


def prepare(comm: Any, indices: Any, values: Any, n: Any, *, op: Any, algorithm: Any,
            accumulate_dtype: Any, alloc_fn: Any, completion_fn: Any,
            async_op: bool, wire: Any = None, wire_values: Any = None, output: Any = "sparse",
            out: Any = None) -> Prepared:
    """Validate collectively and coalesce; raise the same kind of error on every rank.

    Raises:
        InvalidType, InvalidArgument: some rank's arguments are bad (that rank and argument are
            named; the rank itself raises its precise error).
        MismatchError: ranks disagree on n, dtypes, width, op, algorithm, accumulate_dtype,
            wire, wire_values, output or async_op.

    With ``output="dense"`` the ranks also agree on :func:`_value_flags`: whether some rank's
    float values hold a NaN or an infinity (only then does the dense result need its NaN bits
    made canonical, a pass over n) or a -0.
    """
    names = algorithms("sparse")
    prepared, error = _local(comm, indices, values, n, op, algorithm, accumulate_dtype,
                             alloc_fn, completion_fn, names, wire, wire_values, output, out,
                             async_op)
    draft = TERMS.draft(comm)
    draft.context = prepared
    few = False  # whether this rank's entries may fit its slot (auto's small call)
    if prepared is not None:
        draft.agree(prepared.fields(names) + (int(bool(async_op)),))
        draft.column("nnz", prepared.indices.shape[0])
        may_nan, minus_zero = _value_flags(prepared, comm.size)
        draft.maximum("may_nan", may_nan)
        draft.maximum("minus_zero", minus_zero)
        draft.maximum("learned", learn.pending_us(comm))  # the last learning call's time
        few = prepared.algorithm == "auto" and prepared.indices.shape[0] <= small.MOST_ENTRIES
        if few:
            draft.vec = small.pack(comm, draft.vec, draft.slot(), prepared.indices,
                                   prepared.values, prepared.wire_values)
    else:
        out_of_range = isinstance(error, InvalidArgument) and error.argument == "indices" \
            and error.reason.startswith(_OUT_OF_RANGE)
        draft.fail(error, error.value if out_of_range else None)
    agreed = draft.settle("sparse.validate")
    prepared.nnz = tuple(agreed.columns["nnz"])
    prepared.may_nan = agreed.maxima["may_nan"] > 0
    prepared.minus_zero = agreed.maxima["minus_zero"] > 0
    learn.absorb(comm, agreed.maxima["learned"])
    # every rank decides alike: a rank with too many entries for a slot (not few) makes every
    # rank's fits_all false
    if few and small.fits_all(
            comm.size, prepared.nnz, prepared.index_dtype.itemsize,
            prepared.accumulate_dtype.itemsize * max(prepared.width, 1)):
        prepared.slots = agreed.slots
    return prepared


def _value_flags(prepared: Prepared, p: int) -> tuple[int, int]:
    """A dense output's value facts (only then computed: one pass over this rank's values):
    whether the reduction may hold a NaN, so its NaN bits need settling (a NaN or an infinity
    in the values, or a magnitude at which P of them can overflow, whose infinities then meet:
    ``inf - inf``, ``inf * 0``; on a float16 wire, at float16's range), and whether they
    hold a -0 (so +0 + x is not x for every input)."""
    values = prepared.values
    if prepared.output != "dense" or values.dtype.kind != "f" or values.size == 0:
        return 0, 0
    limit = _overflowing(values.dtype, prepared.op, p)
    if prepared.wire_values == "float16":  # beyond float16's range values travel as +-inf
        limit = min(limit, _overflowing(np.dtype(np.float16), prepared.op, p))
    fast = _fast(values.size) if isinstance(values, np.ndarray) else None
    if fast is not None:
        may_nan, minus_zero = fast.special_values(values, limit)
    else:
        xp = array_namespace(values)
        may_nan = not bool((xp.abs(values) < limit).all())  # NaN compares False
        minus_zero = bool(((values == 0) & xp.signbit(values)).any())
    return int(may_nan), int(minus_zero)


def _overflowing(dtype: np.dtype, op: ReduceOp, p: int) -> float:
    """The least power of two whose magnitude, reduced by ``op`` over ``p`` ranks, may
    overflow (a rounding's margin included); inf for max and min, which cannot."""
    if op in (ReduceOp.MAX, ReduceOp.MIN):
        return np.inf
    top = np.finfo(dtype).maxexp - 1  # the largest finite value is below 2 ** (top + 1)
    ranks = max(p - 1, 1).bit_length()  # ceil(log2(p)), at least 1: a rounding's margin
    below = top // p if op is ReduceOp.PROD else top - ranks
    return float(2.0 ** below)
