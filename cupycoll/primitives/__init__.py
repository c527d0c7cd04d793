"""Compute primitives of the sparse and top-k algorithms: numpy implementations that define them.

Every public function takes numpy or cupy arrays. numpy inputs run the numpy twin
(``_numpy_select``, ``_numpy_reduce``), which defines the semantics and hands large inputs' core
loops to the numba loops of ``_numba`` (``_accel`` decides); cupy inputs are routed by
:func:`_dispatch` to the function of the same name in ``_cupy`` (imported lazily, so numpy users
never import cupy). Imports flow one way: ``_checks``, ``_common`` <- ``_accel``, ``_numba``,
``_numpy_*``, ``_cupy`` <- this module; none of them imports this one.

Magnitudes: ``|x|`` of a float is its absolute value; of an integer it is exact (``|INT_MIN|`` is
``2**(bits-1)``), which is why :func:`kth_abs` returns integer magnitudes as unsigned scalars.
NaN: never ``>= t`` (:func:`count_abs_ge`, :func:`select_abs_ge`), and ranked below every number,
including 0, by :func:`kth_abs` and :func:`topk_abs`.

Reductions (:func:`coo_reduce`, :func:`merge_sorted`, :func:`scatter_reduce`) are left folds in
input order: the values ``v0, v1, v2`` of one index reduce to ``(v0 op v1) op v2``. The result is
therefore defined bit for bit, and ``merge_sorted(parts)`` equals ``coo_reduce`` of the
concatenated parts. Float max/min are numpy's ``maximum``/``minimum`` (NaN propagates) except on
a tie of +0 and -0, which gives +0 for max and -0 for min whatever the order (:func:`combine`):
numpy would return the later operand, so the bits would depend on the order of the operands.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import numpy as np

from .._types import array_namespace
from . import _numpy_reduce, _numpy_select
from ._accel import free_scratch
from ._checks import INDEX_DTYPES, VALUE_DTYPES
from ._numpy_reduce import combine

__all__ = ["count_abs_ge", "select_abs_ge", "kth_abs", "topk_abs", "coo_reduce", "merge_sorted",
           "scatter_reduce", "gather", "densify", "combine", "VALUE_DTYPES", "INDEX_DTYPES",
           "free_scratch"]


def _dispatch(fn: Callable) -> Callable:
    """Route a call to ``_cupy.<name>`` when its first argument holds cupy arrays."""
    name = fn.__name__
    first = next(iter(inspect.signature(fn).parameters))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        probe = args[0] if args else kwargs.get(first)
        for _ in range(2):  # merge_sorted: parts -> first part -> its indices
            if isinstance(probe, (list, tuple)) and probe:
                probe = probe[0]
        xp = np if probe is None else array_namespace(probe)
        if xp is not np:  # a device namespace may bring its own (e.g. kernels run on the CPU)
            impl = getattr(xp, "cupycoll_primitives", None)
            if impl is None:
                from . import _cupy as impl
            return getattr(impl, name)(*args, **kwargs)
        return fn(*args, **kwargs)

    wrapper.__module__ = __name__  # the public name (pickle finds the dispatcher, not the twin)
    return wrapper


count_abs_ge = _dispatch(_numpy_select.count_abs_ge)
select_abs_ge = _dispatch(_numpy_select.select_abs_ge)
kth_abs = _dispatch(_numpy_select.kth_abs)
topk_abs = _dispatch(_numpy_select.topk_abs)
coo_reduce = _dispatch(_numpy_reduce.coo_reduce)
merge_sorted = _dispatch(_numpy_reduce.merge_sorted)
scatter_reduce = _dispatch(_numpy_reduce.scatter_reduce)
gather = _dispatch(_numpy_reduce.gather)
densify = _dispatch(_numpy_reduce.densify)
