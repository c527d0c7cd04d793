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

import dataclasses
import json
import logging
import os
import weakref
from importlib import resources
from pathlib import Path
from typing import Any

from .._config import setting

__all__ = ["Profile", "default_profile", "profile_path", "load_profile", "save_profile",
           "profile_for", "WORK_KINDS"]

#: units of local work priced by ``gamma`` (seconds per unit), see predict.work.
WORK_KINDS = ("merge", "row", "dense", "scan", "code", "fill", "fold")
#: the prices a link kind may override (Profile.links).
_LINK_PRICES = ("alpha_p2p", "beta_p2p", "alpha_msg")


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

    def price(self, unit: str) -> float:
        """Seconds per unit of local work ``unit`` (0 if unmeasured; a profile measured before
        ``fill`` existed prices it as a ``dense`` unit)."""
        if unit == "fill" and unit not in self.gamma:
            unit = "dense"
        return self.gamma.get(unit, 0.0)

    def link(self, kind: str) -> "Profile":
        """This profile with the point-to-point prices of link ``kind`` (if it has them)."""
        prices = {k: float(v) for k, v in self.links.get(kind, {}).items() if k in _LINK_PRICES}
        return dataclasses.replace(self, **prices) if prices else self

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Profile":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


def profile_path() -> Path:
    """Where ``tune`` writes and ``auto`` reads the profile (``CUPYCOLL_PROFILE`` or cache dir)."""
    path = setting("CUPYCOLL_PROFILE")
    if path:
        return Path(path).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "cupycoll" / "profile.json"


def default_profile() -> Profile:
    """The profile measured on the development machine (shipped with the package)."""
    text = resources.files(__package__).joinpath("default_profile.json").read_text()
    return Profile.from_dict(json.loads(text))


def load_profile(path: Path | str | None = None) -> Profile:
    """The profile at ``path`` (default :func:`profile_path`), or the shipped default."""
    path = Path(path) if path is not None else profile_path()
    if not path.is_file():
        return default_profile()
    try:
        return Profile.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:  # never hang the other ranks on a bad file
        _log.warning("cupycoll: ignoring unreadable profile %s (%s); using the default", path, exc)
        return default_profile()


def save_profile(profile: Profile, path: Path | str | None = None) -> Path:
    path = Path(path) if path is not None else profile_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.as_dict(), indent=1, sort_keys=True) + "\n")
    return path


_log = logging.getLogger("cupycoll")
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
            profile = load_profile()
        else:
            data = load_profile().as_dict() if comm.rank == 0 else None
            profile = Profile.from_dict(mpi_comm.bcast(data, root=0))
        _PROFILES[comm] = profile
    return profile
