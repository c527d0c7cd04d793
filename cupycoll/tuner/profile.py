"""A machine profile: what one message, one byte and one element of local work cost.

``alpha`` is seconds per sequential communication round on a rank's critical path and
``beta`` seconds per byte received, each for point-to-point exchanges and for native
collectives (allreduce, allgather) separately; ``alpha_msg`` seconds per point-to-point message
received (the per-peer cost of a round with many peers); ``gamma`` is seconds per unit of local work (see :mod:`cupycoll.tuner.predict`);
``fixed`` is each algorithm's per-call cost beyond those (launch and Python overhead, the
validation allreduce's software path). ``python -m cupycoll tune`` measures a profile and writes
it to ``CUPYCOLL_PROFILE`` (default ``$XDG_CACHE_HOME/cupycoll/profile.json``, else
``~/.cache/cupycoll/profile.json``); without one the profile measured on the development machine
(shipped as ``default_profile.json``) is used. Rank 0's profile is broadcast, so every rank
predicts the same times and ``auto`` picks the same algorithm everywhere.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import fractions
import math
import os
import warnings
import weakref
from importlib import resources
from pathlib import Path
from typing import Any

from .._config import setting
from ..errors import CupycollWarning

__all__ = ["Profile", "default_profile", "profile_path", "load_profile", "save_profile",
           "profile_for", "WORK_KINDS"]

#: units of local work priced by ``gamma`` (seconds per unit), see predict.work.
WORK_KINDS = ("merge", "merge2", "row", "dense", "dense_row", "dense_rows", "dense_wide",
              "scan", "code", "fill", "fold", "fold2", "union")
#: the unit a profile measured before a unit existed prices it by.
_STAND_INS = {"fill": "dense", "union": "merge", "merge2": "merge", "dense_row": "row",
              "dense_rows": "dense", "dense_wide": "dense", "fold2": "fold"}
#: the prices a link kind may override (Profile.links).
_LINK_PRICES = ("alpha_p2p", "beta_p2p", "alpha_msg")


#: prices (seconds, seconds a byte or an element) at or above this are refused: a price
#: times any size stays far from float64's overflow (a prohibitive price, 1e9, is fine)
PRICE_MAX = 1e100


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclasses.dataclass(frozen=True)
class Profile:
    """Measured (or assumed) prices of communication and local work."""

    name: str
    alpha_p2p: float
    beta_p2p: float
    alpha_native: float
    beta_native: float
    gamma: dict[str, float]
    alpha_msg: float = 0.0
    fixed: dict[str, float] = dataclasses.field(default_factory=dict)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: point-to-point prices of one link kind ("intra" = inside a node, "inter" = between
    #: nodes), overriding alpha_p2p, beta_p2p, alpha_msg for the node-aware algorithms' phases;
    #: absent (one machine, a measured profile): every link costs the same.
    links: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    #: measured seconds of one native collective by the bytes it books, ``[[bytes, seconds],
    #: ...]`` ascending (``tune``: allreduces from 8 B to 4 MiB); empty: alpha_native +
    #: beta_native x bytes. A native allreduce here is not linear in its size (MPICH changes
    #: algorithm with it): the line through 8 B and 4 MiB misses the middle (docs/tuning.md).
    native_curve: list[list[float]] = dataclasses.field(default_factory=list)

    def native_time(self, nbytes: int) -> float:
        """Seconds of one native collective booking ``nbytes``: the curve's value, linear
        between its points and along its last segment beyond it; else alpha + beta x bytes."""
        curve = self.native_curve
        if len(curve) < 2:
            return self.alpha_native + self.beta_native * nbytes
        at = bisect.bisect_left([point[0] for point in curve], nbytes)
        (x0, y0), (x1, y1) = curve[min(max(at - 1, 0), len(curve) - 2):][:2]
        if nbytes <= x0:
            return y0
        return y0 + (y1 - y0) * (nbytes - x0) / max(x1 - x0, 1)

    def price(self, unit: str) -> float:
        """Seconds per unit of local work ``unit`` (0 if unmeasured; a profile measured before
        ``fill``, ``union``, ``merge2``, ``dense_row``, ``dense_rows``, ``dense_wide`` or
        ``fold2`` existed prices them as ``dense``, ``merge``, ``merge``, ``row``, ``dense``,
        ``dense``, ``fold``)."""
        if unit not in self.gamma:
            unit = _STAND_INS.get(unit, unit)
        return self.gamma.get(unit, 0.0)

    def link(self, kind: str) -> "Profile":
        """This profile with the point-to-point prices of link ``kind`` (if it has them)."""
        prices = {k: float(v) for k, v in self.links.get(kind, {}).items() if k in _LINK_PRICES}
        return dataclasses.replace(self, **prices) if prices else self

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Profile":
        """The profile of ``data`` (a file's), its prices checked.

        Raises:
            ValueError: a price that is not a number in [0, PRICE_MAX) (negative or huge
                prices make predictions negative, infinite or NaN, which no choice survives),
                a table of prices (gamma, fixed, links, native_curve) of another shape, or a
                native_curve whose sizes do not ascend or whose seconds fall (extrapolated,
                it predicts negative times)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        profile = cls(**{k: v for k, v in data.items() if k in fields})
        numbers = [profile.alpha_p2p, profile.beta_p2p, profile.alpha_native,
                   profile.beta_native, profile.alpha_msg]
        tables = (profile.gamma, profile.fixed, profile.links)
        if not all(isinstance(t, dict) for t in tables) or not all(
                isinstance(link, dict) for link in profile.links.values()):
            raise ValueError("gamma, fixed, links and each link must be tables")
        numbers += [*profile.gamma.values(), *profile.fixed.values()]
        numbers += [v for link in profile.links.values() for v in link.values()]
        if not all(isinstance(point, (list, tuple)) and len(point) == 2
                   for point in profile.native_curve):
            raise ValueError("native_curve must hold [bytes, seconds] pairs")
        numbers += [seconds for _, seconds in profile.native_curve]
        sizes = [nbytes for nbytes, _ in profile.native_curve]
        if not all(_number(v) and 0 <= v < PRICE_MAX for v in numbers):
            raise ValueError(f"every price must be a number in [0, {PRICE_MAX:g})")
        if not all(_number(v) and 0 <= v < 2**63 for v in sizes):
            raise ValueError("native_curve's sizes must be byte counts")
        seconds = [t for _, t in profile.native_curve]
        if any(a >= b for a, b in zip(sizes, sizes[1:])) or \
                any(a > b for a, b in zip(seconds, seconds[1:])):  # else a falling segment,
            raise ValueError("native_curve must ascend in bytes and never fall in seconds")
        return profile


def profile_path() -> Path:
    """Where ``tune`` writes and ``auto`` reads the profile (``CUPYCOLL_PROFILE`` or cache dir)."""
    path = setting("CUPYCOLL_PROFILE")
    if path:
        return Path(path).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "cupycoll" / "profile.json"


def _nearest(data: dict[str, Any], size: int | None) -> dict[str, Any]:
    """The profile in a file's ``data``: the profile itself, or from a set
    (``{"by_ranks": {"P": profile, ...}}``, one ``tune`` per rank count) the one measured at the
    rank count nearest ``size`` by ratio (ties: the larger; no ``size``: the largest)."""
    sets = data.get("by_ranks")
    if not isinstance(sets, dict):
        return data
    keyed = {_rank_count(p): profile for p, profile in sets.items()}  # "02", " 2": 2
    ranks = sorted(p for p in keyed if p is not None)  # a key that names no count: left out
    if not ranks:
        raise ValueError("by_ranks names no rank count")
    best = ranks[-1] if not size else min(  # the ratio as an exact fraction: ties are exact
        ranks, key=lambda p: (fractions.Fraction(max(p, size), min(p, size)), -p))
    return keyed[best]


def _rank_count(value: Any) -> int | None:
    """``value`` (a key of ``by_ranks``, a ``meta["ranks"]``) as a rank count, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    try:
        count = int(value)
    except ValueError:
        return None
    return count if count > 0 else None


def default_profile(size: int | None = None) -> Profile:
    """The profile measured on the development machine (shipped with the package) at the rank
    count nearest ``size``."""
    text = resources.files(__package__).joinpath("default_profile.json").read_text()
    return Profile.from_dict(_nearest(json.loads(text), size))


def load_profile(path: Path | str | None = None, size: int | None = None) -> Profile:
    """The profile at ``path`` (default :func:`profile_path`) measured nearest ``size`` ranks,
    or the shipped default."""
    name = path if path is not None else setting("CUPYCOLL_PROFILE")
    try:  # any unreadable file or name (too long, ~nosuchuser) warns: a raise on one rank
        path = Path(path).expanduser() if path is not None else profile_path()  # hangs others
        if not path.exists():  # none measured yet (a folder warns below)
            return default_profile(size)
        return Profile.from_dict(_nearest(json.loads(path.read_text()), size))
    except Exception as exc:
        path = name
        warnings.warn(f"cupycoll: ignoring unreadable profile {path} ({exc}); the shipped "
                      "profile prices the calls (run cupycoll tune)", CupycollWarning,
                      stacklevel=2)
        return default_profile(size)


def save_profile(profile: Profile, path: Path | str | None = None) -> Path:
    """Write ``profile`` (``~`` in ``path`` expanded, as ``tune --output`` checks it); one
    measured at P ranks (``meta["ranks"]``) joins the file's profiles of other rank counts (a
    set, see :func:`load_profile`), replacing one of the same P."""
    path = Path(path).expanduser() if path is not None else profile_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = profile.as_dict()
    ranks = _rank_count(profile.meta.get("ranks")) if isinstance(profile.meta, dict) else None
    if ranks is not None and isinstance(profile.meta["ranks"], int):
        data = {"by_ranks": {**_measured(path), str(ranks): data}}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def _measured(path: Path) -> dict[str, Any]:
    """The profiles of ``path`` by the rank count they were measured at (none if unreadable)."""
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if isinstance(data.get("by_ranks"), dict):  # keys that name no rank count are dropped
        return {str(_rank_count(p)): v for p, v in data["by_ranks"].items()
                if _rank_count(p) is not None}
    meta = data.get("meta")
    ranks = meta.get("ranks") if isinstance(meta, dict) else None
    return {str(ranks): data} if isinstance(ranks, int) and _rank_count(ranks) else {}


_PROFILES: "weakref.WeakKeyDictionary[Any, Profile]" = weakref.WeakKeyDictionary()


def profile_for(comm: Any) -> Profile:
    """The profile every rank of ``comm`` uses: rank 0's, broadcast once over the host MPI
    communicator (unbooked: it is not part of any collective's traffic), then cached.

    A communicator without a host MPI communicator (a wrapped NCCL one) reads its own file.
    """
    profile = _PROFILES.get(comm)
    if profile is None:
        mpi_comm = getattr(comm, "mpi_comm", None)
        if mpi_comm is None or comm.size == 1:
            profile = load_profile(size=comm.size)
        else:
            data = load_profile(size=comm.size).as_dict() if comm.rank == 0 else None
            profile = Profile.from_dict(comm.host_bcast(data, "the profile's broadcast"))
        _PROFILES[comm] = profile
    return profile
