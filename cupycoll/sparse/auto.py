"""``auto``: the exact algorithm with the least predicted time for the call's global shape.

Every rank knows the same numbers after the validation allreduce (P, every rank's coalesced nnz,
n, row width, element sizes, op) and the same machine profile (rank 0's, broadcast once: see
:mod:`cupycoll.tuner.profile`), so every rank predicts the same times and picks the same
algorithm. The prediction (:func:`cupycoll.tuner.predict.predict`) prices each algorithm's exact
per-op traffic (its ``cost`` below) by alpha per message and beta per byte, point-to-point and
native collectives apart, plus gamma per unit of local work and a fixed per-call cost. The
``dense`` algorithm is one dense allreduce with presence folded in (for sum), so when no sparse
algorithm is predicted to win, auto costs about what a plain dense allreduce costs.
P == 1 moves nothing: ``allgather`` (a copy) is taken. Before any of this, ``sparse_allreduce``
finishes a call whose entries all fit in the validation allreduce's slots (:mod:`.small`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable

import numpy as np

from .._config import setting
from .._registry import lookup, priced, record, register
from .._types import ReduceOp
from . import small
from ..wire._choice import could_pay, prefer_compact
from ..wire._pack import COO, Wire
from ._common import native_drops_nan, native_keeps_minus_zero
from ._cost import Cost, Shape, validation_cost
from .recursive_doubling import reads_in_place

__all__ = ["choose", "remembered", "shape_class", "class_counts", "choose_wire", "auto", "prices",
           "call_cost", "predicted_times", "resolved", "comm_table", "Recent", "bounded_table",
           "candidates", "ALGORITHM"]

#: recent decisions: (id(profile), shape class) -> (profile, name). A training loop repeats
#: nearly the same shape every step (each rank's nnz drifting a little), and pricing every
#: model costs about a thousand Python calls (more at large P): a call is priced as its shape
#: class (:func:`shape_class`), once per class, so the decision is a function of the agreed
#: class alone (the same on every rank, whatever calls came before).
_DECISIONS: dict[tuple[int, Shape], tuple[Any, str]] = {}
#: entries a table of decisions keeps before it starts again (a bound on its memory)
_DECISIONS_MAX = 512
#: steps of a class's nnz per doubling: counts within about 2^(1/8) of each other share it.
CLASS_STEPS = 4
#: a communicator's auto call reuses the pick of its last priced call of the same kind while
#: every rank's nnz stays within this factor of that call's class (a loop's drift), else the
#: call is priced again and becomes the reference.
REPRICE_BEYOND = 2 ** 0.5


def comm_table(comm: Any, attribute: str, kind: type = dict) -> dict:
    """The dict a communicator keeps under ``attribute`` (a ``kind()`` made on first use):
    auto's decisions, measure's trials and learn's records live on the communicator they agree
    on."""
    table = getattr(comm, attribute, None)
    if table is None:
        table = kind()
        setattr(comm, attribute, table)
    return table


class Recent(collections.OrderedDict):
    """A table of at most :data:`_DECISIONS_MAX` entries that forgets the one used least
    recently first (:meth:`use` and setting use an entry; reading it, ``get`` included, does
    not): measure's trials and learn's records, whose classes a job may keep making. Every rank
    uses it in the order of its collective calls, so every rank forgets the same entries, what
    one rank alone reads (a log line) aside."""

    def use(self, key: Any) -> Any:
        """The entry of ``key`` (None without one), now the one used most recently."""
        try:
            self.move_to_end(key)
        except KeyError:
            return None
        return self[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > _DECISIONS_MAX:
            self.popitem(last=False)


def bounded_table(comm: Any, attribute: str) -> dict:
    """:func:`comm_table`, with room for one more decision (:func:`_with_room`)."""
    return _with_room(comm_table(comm, attribute))


def _with_room(table: dict) -> dict:
    """``table``, emptied once it holds :data:`_DECISIONS_MAX` entries (a bound on the memory
    of a table of decisions)."""
    if len(table) >= _DECISIONS_MAX:
        table.clear()
    return table


def candidates(times: dict[str, float], within: float, count: int) -> list[str]:
    """The algorithms predicted within ``within`` x the least of ``times``, fastest first (ties:
    ``times``' order), at most ``count``: what measure and learn try. The least is always
    one (a time that is not finite is none while another is)."""
    finite = {name: t for name, t in times.items() if math.isfinite(t)} or times
    least = min(finite, key=finite.__getitem__)
    best = finite[least]
    ranked = sorted((t, order, name) for order, (name, t) in enumerate(finite.items())
                    if t - best <= (within - 1) * abs(best) or name == least)
    return [name for _, _, name in ranked[:count]]


def predicted_times(shape: Shape, profile: Any = None) -> dict[str, float]:
    """Predicted seconds of every exact algorithm for ``shape`` (default profile if None)."""
    from ..tuner.predict import predict
    from ..tuner.profile import load_profile

    profile = profile or load_profile(size=shape.size)
    return {name: predict(name, shape, profile) for name in priced("sparse")}


def resolved(shape: Shape, profile: Any = None, *, comm: Any = None, op: Any = None
             ) -> tuple[Shape, Any]:
    """``shape`` with ``op`` (a ReduceOp or name) and, when ``shape.nodes`` is None, the node
    of every rank of ``comm`` filled in, and the profile to price it by (``comm``'s broadcast
    one: :func:`cupycoll.tuner.profile_for`; without ``comm`` the default one)."""
    if op is not None:
        shape = dataclasses.replace(shape, op=str(getattr(op, "value", op)))
    if comm is not None and shape.nodes is None:
        from ..comm._topology import node_ids

        shape = dataclasses.replace(shape, nodes=node_ids(comm))
    if profile is None:
        from ..tuner.profile import load_profile, profile_for

        profile = profile_for(comm) if comm is not None else load_profile(size=shape.size)
    return shape, profile


def class_counts(shape: Shape) -> tuple[int, ...]:
    """Every rank's nnz rounded to the nearest of :data:`CLASS_STEPS` steps per doubling
    (2^(j/CLASS_STEPS), at most n; 0 stays 0; counts up to 4 keep their value)."""
    return _classed(shape.nnz, shape.n)


def _classed(nnz: tuple[int, ...], n: int) -> tuple[int, ...]:
    def step(count: int) -> int:
        if count <= 4:
            return count
        rounded = round(CLASS_STEPS * math.log2(count)) / CLASS_STEPS
        return min(round(2.0 ** rounded), n)

    return tuple(step(c) for c in nnz)


def shape_class(shape: Shape) -> Shape:
    """``shape`` with :func:`class_counts`: the representative that ``choose`` prices for
    every call of the class."""
    return dataclasses.replace(shape, nnz=class_counts(shape))


def choose(shape: Shape, profile: Any = None, *, comm: Any = None, op: Any = None) -> str:
    """Return the algorithm with the least predicted time for ``shape``'s class
    (:func:`shape_class`; ties: :func:`cupycoll._registry.priced`'s order).

    ``comm`` supplies the broadcast profile (:func:`cupycoll.tuner.profile_for`) and, when
    ``shape.nodes`` is None, the node of every rank; ``op`` (a ReduceOp or name) refines
    ``shape.op``. A communicator's picks (no profile given) are :func:`remembered` on it by the
    call's fields other than the counts.
    """
    if shape.size == 1:
        return "allgather"
    if comm is None or profile is not None or shape.inputs is not None:
        return _priced_choice(shape, profile, comm, op)
    key = (tuple(v for k, v in shape.__dict__.items() if k != "nnz"),
           str(getattr(op, "value", op)))
    return remembered(comm, key, shape.nnz, shape.n,
                      lambda: _priced_choice(shape, None, comm, op))


def remembered(comm: Any, key: tuple, nnz: tuple[int, ...], n: int, decide: Callable[[], Any]
               ) -> Any:
    """``decide()`` for a call of kind ``key`` (its agreed fields other than the counts) on
    ``comm``, or what it returned for the last call of that kind that was decided, while
    every count of ``nnz`` stays within :data:`REPRICE_BEYOND` of that call's class: a
    training loop's drifting counts would otherwise cross a class every few steps. A call
    beyond it is decided and becomes the reference. Every rank sees the same agreed calls,
    so every rank keeps the same references and decisions."""
    memo = bounded_table(comm, "_auto_choices")
    key = key + (setting("CUPYCOLL_RANKS_PER_NODE"),)  # the nodes the models saw
    kept = memo.get(key)
    if kept is not None and _near(nnz, kept[0]):
        return kept[1]
    decided = decide()
    memo[key] = (_classed(nnz, n), decided)
    return decided


def _near(counts: tuple[int, ...], reference: tuple[int, ...]) -> bool:
    """Whether every count is within :data:`REPRICE_BEYOND` of ``reference``'s (counts up to 4
    and 0 only equal to it)."""
    for c, r in zip(counts, reference):
        if c != r and (c <= 4 or r <= 4 or max(c, r) > REPRICE_BEYOND * min(c, r)):
            return False
    return True


def _priced_choice(shape: Shape, profile: Any, comm: Any, op: Any) -> str:
    """:func:`choose` without the communicator's memo: memoised by (profile, shape class)."""
    shape, profile = resolved(shape, profile, comm=comm, op=op)
    if shape.inputs is not None:  # every rank's indices: priced exactly, not remembered
        return _cheapest(shape, profile)
    key = (id(profile), shape_class(shape))
    hit = _DECISIONS.get(key)
    if hit is not None and hit[0] is profile:
        return hit[1]
    name = _cheapest(key[1], profile)
    _with_room(_DECISIONS)[key] = (profile, name)
    return name


def _cheapest(shape: Shape, profile: Any) -> str:
    times = predicted_times(shape, profile)
    return min(times, key=times.__getitem__)


def choose_wire(name: str, shape: Shape, request: str, values: str | None = None,
                profile: Any = None, *, comm: Any = None) -> Wire:
    """The wire format of a call running algorithm ``name`` (``request``: coo, compact, auto).

    ``auto`` takes compact when the bytes it saves on the slowest rank, priced at beta, beat
    the coding work of about two codings (encode, decode) per entry received, priced at
    ``gamma["code"]``; an algorithm that moves no sparse entries (``dense``) keeps coo. Agreed
    inputs only.
    """
    model = record("sparse", name)
    if request == "coo" or not model.coded or shape.size == 1:
        return Wire(False, values)
    if request == "compact":
        return Wire(True, values)
    if profile is None:
        from ..tuner.profile import load_profile, profile_for

        profile = profile_for(comm) if comm is not None else load_profile(size=shape.size)
    if not could_pay(profile, shape.index_bytes):
        return Wire(False, values)
    ranks = sorted({min(range(shape.size), key=shape.nnz.__getitem__),
                    max(range(shape.size), key=shape.nnz.__getitem__)})

    def cost_of(wire: Wire) -> tuple[int, int]:
        costs = [model.cost(dataclasses.replace(shape, wire=wire, inputs=None), r, profile)
                 for r in ranks]
        worst = max(c.copied_bytes for c in costs)
        return worst, 2 * worst // max(shape.entry_bytes, 1)

    return Wire(prefer_compact(cost_of, values, profile), values)


def auto(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
         accumulate_dtype: Any = None, wire: Wire = COO) -> tuple[Any, Any]:
    """Run the algorithm :func:`choose` picks (nnz of every rank gathered first).

    ``sparse_allreduce`` does not call this: it already knows every rank's nnz from its
    validation allreduce and calls :func:`choose` directly.
    """
    counts = comm.allgather_counts(int(indices.shape[0]), "auto.counts")
    width = int(values.shape[1]) if values.ndim == 2 else 0
    nnz = tuple(int(c) for c in counts)
    shape = Shape(comm.size, n, width, indices.dtype.itemsize, values.dtype.itemsize, nnz,
                  native_minmax_drops_nan=native_drops_nan(comm),
                  native_sum_keeps_minus_zero=native_keeps_minus_zero(comm),
                  host=comm.xp is np, in_place=reads_in_place(
                      comm, nnz, n, indices.dtype.itemsize,
                      values.dtype.itemsize * max(width, 1)))
    name = choose(shape, comm=comm, op=op)
    return lookup("sparse", name, counts=shape.nnz, **prices(comm, name))(
        comm, indices, values, n, op, accumulate_dtype, wire)


def prices(comm: Any, name: str) -> dict[str, Any]:
    """The prices algorithm ``name``'s run function takes
    (:attr:`cupycoll._registry.Algorithm.prices`), as keywords for ``lookup``: the
    communicator's profile (broadcast from rank 0 on first use) and the time model."""
    if not record("sparse", name).prices:
        return {}
    from ..tuner import predict
    from ..tuner.profile import profile_for

    return {"profile": profile_for(comm), "pricing": predict}


def call_cost(algorithm: str, shape: Shape, rank: int, profile: Any = None) -> Cost:
    """Traffic ``rank`` receives in one ``sparse_allreduce`` call: validation + the algorithm.

    ``algorithm`` may be "auto": ``small`` (nothing beyond the validation) when every rank's
    entries fit in its validation slot, else resolved with :func:`choose` from the nnz alone,
    as ``sparse_allreduce`` does (``shape.inputs`` only sharpens the chosen algorithm's model).
    """
    if algorithm == "auto" and small.fits(shape):  # the entries ride in the validation
        return validation_cost(shape.size).add(small.cost(shape, rank))
    name = (choose(dataclasses.replace(shape, inputs=None), profile) if algorithm == "auto"
            else algorithm)
    return validation_cost(shape.size).add(record("sparse", name).cost(shape, rank, profile))


ALGORITHM = register("sparse", "auto", auto)
