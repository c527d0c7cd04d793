"""What ``sparse_allreduce`` agrees on (:data:`TERMS`, laid out by :mod:`cupycoll._agreement`):
the codes its fields travel as, and the errors a rank raises when a peer's arguments are bad or
the ranks disagree, in the words a user wrote them (:func:`_decode`)."""

from __future__ import annotations

import numpy as np

from .. import _agreement as agreement
from .._registry import algorithms
from .._types import ReduceOp
from ..errors import ELSEWHERE, CupycollError, InvalidArgument, InvalidType
from ..primitives import VALUE_DTYPES
from ..wire._choice import decode_code
from ._cost import VALIDATION_FIELDS

__all__ = ["TERMS", "OUTPUTS", "AUTO_MODES"]

_INDEX_NAMES = ("int32", "int64")
_VALUE_NAMES = tuple(d.name for d in VALUE_DTYPES)
#: dtype -> its code in the validation vector, looked up by the dtype itself (one dict hit).
_INDEX_CODES = {np.dtype(name): code for code, name in enumerate(_INDEX_NAMES)}
_VALUE_CODES = {np.dtype(name): code for code, name in enumerate(_VALUE_NAMES)}
_OPS = tuple(ReduceOp)
_OP_CODES = {op: code for code, op in enumerate(_OPS)}
#: what ``sparse_allreduce`` returns: a SparseResult, or the reduced n-vector itself.
OUTPUTS = ("sparse", "dense")
#: how ``auto`` picks (CUPYCOLL_AUTO), part of the agreed algorithm field.
AUTO_MODES = ("estimate", "measure", "learn")


def _peer_error(failure: agreement.Failure, draft: agreement.Draft) -> CupycollError:
    """The error a rank with good input raises for a peer's bad input."""
    rank, argument = failure.rank, failure.argument or "arguments"
    also = f"; ranks with bad input: {failure.ranks}" if len(failure.ranks) > 1 else ""
    if failure.detail is not None:  # an index out of range
        return InvalidArgument("indices", failure.detail, _out_of_range(
            failure.detail, draft.context.n, rank) + also, rank=rank)
    if failure.kind is InvalidType:
        return InvalidType(argument, ELSEWHERE,
                           f"valid on every rank (rank {rank} raised the precise error{also})",
                           rank=rank)
    passed = "invalid arguments (that rank's error names them)" if argument == "arguments" \
        else f"an invalid {argument}"
    return InvalidArgument(argument, ELSEWHERE, f"rank {rank} passed {passed}{also}",
                           rank=rank)


def _out_of_range(index: int, n: int, rank: int) -> str:
    """Why peer ``rank``'s ``index`` is out of range, naming this rank's ``n`` as the peer's
    only where it may be: an index inside [0, n) here fails only under a smaller n there."""
    if 0 <= index < n:
        return f"index out of range [0, n) on rank {rank}, whose n is at most {index} (n = {n} " \
            "here)"
    return f"index out of range [0, n={n}) on rank {rank}"


def _mismatch(differs: list[agreement.Differ], draft: agreement.Draft) -> str:
    """The message naming every field on which the ranks disagree."""
    named = ", ".join(f"{_label(d)} ({d.by_rank(lambda v, d=d: _decode(d.field, v, d))})"
                      for d in differs)
    return (f"ranks disagree on {named} (seen on rank {draft.rank} of {draft.size}); every "
            "rank must pass the same value")


def _label(differ: agreement.Differ) -> str:
    """The field's name; for an algorithm every rank names alike, the settings it carries."""
    if differ.field != "algorithm":
        return differ.field
    names = len(algorithms("sparse"))
    if len({code % names for code in differ.ranks or (differ.low, differ.high)}) > 1:
        return "algorithm"
    return "the algorithm's settings"


#: what sparse_allreduce agrees on (:mod:`cupycoll._agreement`).
TERMS = agreement.Terms("sparse_allreduce", VALIDATION_FIELDS, _peer_error, _mismatch,
                        maxima=("may_nan", "minus_zero", "learned"), columns=("nnz",))


def _decode(field: str, value: int, differ: agreement.Differ | None = None) -> str:
    """``value`` of ``field`` as a user wrote it; the algorithm's settings (CUPYCOLL_AUTO,
    CUPYCOLL_RANKS_PER_NODE) where they differ between ``differ``'s lowest and highest."""
    if field == "index_dtype":
        return _INDEX_NAMES[value]
    if field in ("value_dtype", "accumulate_dtype"):
        return _VALUE_NAMES[value]
    if field == "op":
        return _OPS[value].value
    if field == "algorithm":  # past the names: CUPYCOLL_AUTO's mode, CUPYCOLL_RANKS_PER_NODE
        names = algorithms("sparse")

        def parts(code: int) -> tuple[str, str, str]:
            per_node, mode = divmod(code // len(names), len(AUTO_MODES))
            return (names[code % len(names)], f"CUPYCOLL_AUTO={AUTO_MODES[mode]}",
                    f"CUPYCOLL_RANKS_PER_NODE={per_node or 'unset'}")

        name, *settings = parts(value)
        low, high = (parts(differ.low), parts(differ.high)) if differ else ((), ())
        shown = [part for i, part in enumerate(settings, 1) if low and low[i] != high[i]
                 and (i == 2 or name == "auto")]  # a mode only where auto runs it
        return name + (f" ({', '.join(shown)})" if shown else "")
    if field == "wire":
        return decode_code(value)
    if field == "output":
        return OUTPUTS[value]
    return str(value)
