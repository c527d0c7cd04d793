"""The ``wire`` / ``wire_values`` keywords: checking them, and ``wire="auto"``'s choice.

``wire``: "coo" (raw indices), "compact" (every transferred sorted index stream encoded by the
codec), "auto" (the default, or ``CUPYCOLL_WIRE``): compact only when the cost model says the
bytes it saves, priced at the profile's beta, outweigh the coding work, priced at the profile's
``gamma["code"]`` per index encoded or decoded. ``wire_values``: None (values as they are),
"bfloat16" or "float16" (float values travel rounded to nearest even, approximate).

The choice is made from agreed quantities only (every rank's nnz after the validation, the
broadcast profile), so it is the same on every rank.
"""

from __future__ import annotations

from typing import Any, Callable

from .._config import chosen
from ..errors import InvalidArgument
from ._pack import Wire

__all__ = ["WIRES", "WIRE_VALUES", "check_wire", "check_wire_values", "wire_code", "decode_code",
           "prefer_compact", "could_pay", "DEFAULT_CODE_COST"]

WIRES = ("coo", "compact", "auto")
WIRE_VALUES = (None, "bfloat16", "float16")
#: seconds per index encoded or decoded when the profile has no ``gamma["code"]`` (the numba
#: codec on the development machine, both directions).
DEFAULT_CODE_COST = 6e-9


def check_wire(wire: Any, rank: int | None = None) -> str:
    """Return the wire format asked for (keyword, else ``CUPYCOLL_WIRE``); raise if unknown."""
    return chosen("CUPYCOLL_WIRE", wire, "wire", WIRES, "unknown wire format; ", rank)


def check_wire_values(values: Any, rank: int | None = None) -> str | None:
    """Return ``wire_values`` (None, "bfloat16" or "float16"); raise InvalidArgument otherwise."""
    if values is not None and (not isinstance(values, str) or values not in WIRE_VALUES):
        raise InvalidArgument("wire_values", values,
                              f"unknown value format; valid: {list(WIRE_VALUES)}", rank=rank)
    return values


def wire_code(wire: str, values: str | None) -> int:
    """One small int for the agreement vector (ranks must pass the same keywords)."""
    return WIRES.index(wire) * len(WIRE_VALUES) + WIRE_VALUES.index(values)


def decode_code(code: int) -> str:
    """The keywords behind :func:`wire_code` (for mismatch messages)."""
    wire, values = divmod(int(code), len(WIRE_VALUES))
    return f"{WIRES[wire]}/{WIRE_VALUES[values]}"


def _prices(profile: Any) -> tuple[float, float]:
    beta = getattr(profile, "beta_p2p", 0.0)
    gamma = dict(getattr(profile, "gamma", {}) or {}).get("code", DEFAULT_CODE_COST)
    return beta, gamma


def could_pay(profile: Any, index_bytes: int) -> bool:
    """False when even an index coded in no bytes at all would not pay its two codings (then
    no cost model need be evaluated: the common case on shared memory)."""
    beta, gamma = _prices(profile)
    return index_bytes * beta > 2 * gamma


def prefer_compact(cost_of: Callable[[Wire], tuple[int, int]], values: str | None,
                   profile: Any) -> bool:
    """True when compact index coding pays: bytes saved x beta > coded indices x gamma.

    ``cost_of(wire)`` returns (bytes received, indices coded) of the call's slowest rank under
    ``wire`` (from the cost models).
    """
    coo_bytes, _ = cost_of(Wire(False, values))
    compact_bytes, coded = cost_of(Wire(True, values))
    beta, gamma = _prices(profile)
    return (coo_bytes - compact_bytes) * beta > coded * gamma
