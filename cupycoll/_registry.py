"""Algorithm registries: ``@register("sparse", "allgather")`` fills one dict per family."""

from __future__ import annotations

from typing import Callable, TypeVar

from .errors import InvalidArgument

__all__ = ["register", "lookup", "algorithms"]

_REGISTRY: dict[str, dict[str, Callable]] = {}
F = TypeVar("F", bound=Callable)


def register(family: str, name: str) -> Callable[[F], F]:
    """Decorator: make ``fn`` the algorithm ``name`` of ``family`` ("sparse", "topk")."""
    def decorate(fn: F) -> F:
        _REGISTRY.setdefault(family, {})[name] = fn
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


def lookup(family: str, name: str, *, rank: int | None = None) -> Callable:
    """Return the algorithm ``name`` of ``family`` or raise InvalidArgument listing valid names."""
    table = _REGISTRY.get(family, {})
    if name not in table:
        raise InvalidArgument("algorithm", name, f"unknown {family} algorithm; valid: "
                              f"{sorted(table)}", rank=rank)
    return table[name]
