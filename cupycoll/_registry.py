"""Algorithm registries: one :class:`Algorithm` record per algorithm, made by
``register(family, name, run, ...)`` at the end of the algorithm's own module.

The record holds everything the library knows of the algorithm: its run function, its traffic
model, its local-work model, and the flags the front door and the tuner read. The tuner
(``auto``, ``predict``, ``simulate``, ``tune``) iterates the priced records of a family
(:func:`priced`). The registry imports no algorithm: a family's package registers its own
as it is imported (``import cupycoll`` imports both families).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

from .errors import InvalidArgument

__all__ = ["Algorithm", "register", "unregister", "lookup", "record", "priced", "algorithms"]


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One algorithm of a family ("sparse", "topk").

    Attributes:
        run: the algorithm itself (the family's call signature).
        cost: traffic model. Sparse: ``cost(shape, rank, profile=None) -> Cost``, the exact
            bytes and messages ``rank`` receives (``profile`` where the algorithm's messages
            depend on the machine's prices); top-k: ``cost(p, k, n) -> WordCost``. None: not
            priced (``auto`` never picks it).
        work: local-work model (sparse): ``work(shape, rank, profile=None) -> {unit: count}``
            in the units ``Profile.gamma`` prices (:mod:`cupycoll.tuner.predict`).
        time: a time model of its own, replacing the sum of fixed cost, traffic and work:
            ``time(shape, rank, profile, pricing) -> seconds``, ``pricing`` being
            :mod:`cupycoll.tuner.predict` (for algorithms built of other algorithms' phases).
        counts: the run function takes ``counts=`` (every rank's entry count, which the
            validation already agreed: it saves the algorithm a size round).
        prices: the keywords among ``profile`` and ``pricing`` its run function and dense
            variant take: the communicator's prices (a :class:`cupycoll.tuner.profile.Profile`)
            and the time model (:mod:`cupycoll.tuner.predict`), for an algorithm whose messages
            depend on predicted times. The plan binds them: no algorithm reads a profile.
        dense_output: a variant writing ``output="dense"`` itself, ``dense_output(comm,
            indices, values, n, op, out, finish, minus_zero, wire) -> out`` (``out``: the
            caller's dtype; ``finish``: avg, the cast and NaN bits of reduced values); its
            work model prices that output. None: a dense output is the sparse result written
            into zeros.
        unfolded: its run function also takes this rank's values as
            :class:`cupycoll.primitives._unfolded.Unfolded` rows (a host input with
            duplicate indices, summed where the rows land: :func:`cupycoll.sparse.dense.
            scatter_into`); the plan hands every other algorithm the coalesced values.
        coded: its traffic carries sparse entries, so a compact wire applies (False: it
            moves dense values only, and every call of it runs on coo).
        tie: on equal predicted times the lower wins (then the earlier registered).
        selector: top-k: the selector class used when the call names none.
        rides: its entries ride in the agreement's payload: it runs exactly where every
            rank's entries fitted there (the plan takes it then, before any pricing), taking
            ``slots=`` (the agreed payload) with ``counts=``; a caller cannot name it, so
            :func:`algorithms` does not list it and :func:`priced` leaves it out.
    """

    family: str
    name: str
    run: Callable
    cost: Callable | None = None
    work: Callable | None = None
    time: Callable | None = None
    counts: bool = False
    prices: tuple[str, ...] = ()
    dense_output: Callable | None = None
    unfolded: bool = False
    coded: bool = True
    tie: int = 0
    selector: Any = None
    rides: bool = False


_REGISTRY: dict[str, dict[str, Algorithm]] = {}
FAMILIES = ("sparse", "topk")


def register(family: str, name: str, run: Callable, **fields: Any) -> Algorithm:
    """Record ``run`` as the algorithm ``name`` of ``family`` (``fields``: the other attributes
    of :class:`Algorithm`) and return the record; a name registered again is replaced."""
    found = Algorithm(family, name, run, **fields)
    _REGISTRY.setdefault(family, {})[name] = found
    return found


def unregister(family: str, name: str) -> None:
    """Remove an algorithm (one a test or a plug-in registered at run time)."""
    _REGISTRY.get(family, {}).pop(name, None)


def algorithms(family: str = "sparse") -> list[str]:
    """Return the sorted names of the algorithms of ``family`` a caller may name (every
    registered one but those that ride in the agreement, :attr:`Algorithm.rides`)."""
    if family not in FAMILIES:
        raise InvalidArgument("family", family, f"valid: {list(FAMILIES)}")
    return sorted(name for name, found in _REGISTRY.get(family, {}).items() if not found.rides)


def record(family: str, name: str, *, rank: int | None = None) -> Algorithm:
    """Return the record of ``name`` or raise InvalidArgument listing the valid names."""
    table = _REGISTRY.get(family, {})
    if name not in table:
        raise InvalidArgument("algorithm", name, f"unknown {family} algorithm; valid: "
                              f"{sorted(table)}", rank=rank)
    return table[name]


def lookup(family: str, name: str, *, rank: int | None = None,
           counts: Sequence[int] | None = None, **prices: Any) -> Callable:
    """Return the run function of ``name`` (see :func:`record`).

    ``counts``: every rank's entry count, when the caller knows them; bound as ``counts=`` to
    the algorithms that take it, ignored by the others. ``prices``: ``profile=`` and
    ``pricing=`` (:attr:`Algorithm.prices`), bound to the algorithms that take them."""
    found = record(family, name, rank=rank)
    run = bind_prices(found, found.run, **prices)
    if counts is not None and found.counts:
        return functools.partial(run, counts=counts)
    return run


def bind_prices(found: Algorithm, fn: Callable, **prices: Any) -> Callable:
    """``fn`` (``found``'s run function or dense variant) with the prices it takes bound."""
    wanted = {key: prices[key] for key in found.prices if key in prices}
    return functools.partial(fn, **wanted) if wanted else fn


def priced(family: str = "sparse") -> dict[str, Algorithm]:
    """The algorithms of ``family`` that have a traffic model and that ``auto`` may pick by
    price (not those that ride in the agreement), in the order ``auto`` breaks ties in
    (:attr:`Algorithm.tie`, then registration)."""
    table = _REGISTRY.get(family, {})
    order = {name: i for i, name in enumerate(table)}
    ranked = sorted((a for a in table.values() if a.cost is not None and not a.rides),
                    key=lambda a: (a.tie, order[a.name]))
    return {a.name: a for a in ranked}
