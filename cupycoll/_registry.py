"""Algorithm registries: ``@register("sparse", "allgather")`` fills one dict per family."""

from __future__ import annotations

import functools
from typing import Callable, Sequence, TypeVar

from .errors import InvalidArgument

__all__ = ["register", "lookup", "algorithms"]

_REGISTRY: dict[str, dict[str, Callable]] = {}
#: (family, name) of the algorithms that take ``counts=`` (every rank's nnz, when known)
_TAKES_COUNTS: set[tuple[str, str]] = set()
F = TypeVar("F", bound=Callable)


def register(family: str, name: str, counts: bool = False) -> Callable[[F], F]:
    """Decorator: make ``fn`` the algorithm ``name`` of ``family`` ("sparse", "topk");
    ``counts``: it takes ``counts=`` (every rank's entry count, which saves it a size round)."""
    def decorate(fn: F) -> F:
        _REGISTRY.setdefault(family, {})[name] = fn
        if counts:
            _TAKES_COUNTS.add((family, name))
        return fn
    return decorate


#: families whose modules are imported (their algorithms registered)
_LOADED: set[str] = set()


def _load(family: str) -> None:
    if family in _LOADED:
        return
    if family == "sparse":
        from . import sparse  # noqa: F401  (importing registers the algorithms)
    elif family == "topk":
        from . import topk  # noqa: F401
    _LOADED.add(family)


def algorithms(family: str = "sparse") -> list[str]:
    """Return the sorted names of the registered algorithms of ``family``."""
    if family not in ("sparse", "topk"):
        raise InvalidArgument("family", family, "valid: ['sparse', 'topk']")
    _load(family)
    return sorted(_REGISTRY.get(family, {}))


def lookup(family: str, name: str, *, rank: int | None = None,
           counts: Sequence[int] | None = None) -> Callable:
    """Return the algorithm ``name`` of ``family`` or raise InvalidArgument listing valid names.

    ``counts``: every rank's entry count, when the caller knows them; bound as ``counts=`` to
    the algorithms registered to take it (see :func:`register`), ignored by the others."""
    table = _REGISTRY.get(family, {})
    if name not in table:
        raise InvalidArgument("algorithm", name, f"unknown {family} algorithm; valid: "
                              f"{sorted(table)}", rank=rank)
    if counts is not None and (family, name) in _TAKES_COUNTS:
        return functools.partial(table[name], counts=counts)
    return table[name]
