"""Communicators: the protocol (``Communicator``), the MPI and NCCL backends, and the default."""

from __future__ import annotations

import logging
import os
from typing import Any

from .._config import check_environment, chosen, parse_timeout, setting
from ..errors import BackendUnavailable, InvalidArgument, InvalidType
from ._base import Communicator
from ._stats import OpStats, Stats, bus_factor
from ._work import Work

__all__ = ["Communicator", "Stats", "OpStats", "Work", "bus_factor", "init", "get_comm",
           "nccl_usable", "load_mpi", "made_comm", "comm_or_default"]

_log = logging.getLogger("cupycoll")
_default: Communicator | None = None
#: the processes a default communicator spans when ``init()`` is given none: MPI's COMM_WORLD
#: (None), or those a torch.distributed default group of the cupycoll backend joined when they
#: were started apart (torchrun: each an MPI world of one)
_world: Any = None
_BACKENDS = ("auto", "mpi", "nccl")


def nccl_usable() -> bool:
    """Return True when CuPy, its NCCL binding and at least one CUDA device are usable."""
    try:
        import cupy
        from cupy.cuda import nccl  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0 and nccl.available
    except Exception:  # any import or driver failure means "not usable"
        return False


def load_mpi() -> None:
    """Import mpi4py's MPI (mpi4py loads the MPI library then); raise
    :class:`BackendUnavailable`, naming what to install, when no MPI library can be loaded."""
    try:
        from mpi4py import MPI  # noqa: F401
    except (ImportError, RuntimeError) as exc:
        why = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise BackendUnavailable(
            f"no MPI library (mpi4py: {why}); install one with pip install "
            "'cupycoll[mpi]' (the mpich wheel) or point mpi4py at the system's MPI") from exc


def init(backend: str | None = None, *, mpi_comm: Any = None,
         timeout: float | None = None) -> Communicator:
    """Create a Communicator over ``mpi_comm`` (default COMM_WORLD, or the processes a
    ``cupycoll`` torch.distributed group joined: :func:`use_world`) and make it the default.

    Args:
        backend: "auto" (NCCL when CuPy, NCCL and a device are usable on every rank, else MPI;
            collective), "mpi" or "nccl";
            default ``CUPYCOLL_BACKEND`` or "auto".
        mpi_comm: the mpi4py communicator whose ranks form the group (it also bootstraps NCCL).
        timeout: seconds before a blocking wait raises CollectiveTimeout (``CUPYCOLL_TIMEOUT``);
            0 or less means no timeout, as for the variable.
    Raises:
        InvalidArgument: unknown backend. MismatchError: ranks asked for different backends
            (every rank raises). BackendUnavailable: "nccl" asked for but not usable,
            or no MPI library (every backend starts over MPI).
    """
    global _default
    load_mpi()
    from mpi4py import MPI

    from ._checks import agreed_settings
    from ._mpi_types import usable

    if mpi_comm is None:
        mpi_comm = _world
    group = MPI.COMM_WORLD if mpi_comm is None else usable(mpi_comm)
    backend, timeout = agreed_settings(group, lambda: _init_settings(backend, timeout),
                                       same=lambda settings: {"backend": settings[0]})
    _apply_log_level()
    if backend == "auto":
        backend = _agreed_auto(group)
    if backend == "nccl":  # readiness is agreed inside: every rank raises or none does
        from .nccl import NCCLCommunicator

        try:
            comm: Communicator = NCCLCommunicator(mpi_comm, timeout=timeout)
        except BackendUnavailable as exc:
            raise BackendUnavailable(f"backend 'nccl': {exc}") from exc
    else:
        from .mpi import MPICommunicator

        comm = MPICommunicator(mpi_comm, timeout=timeout)
    if comm.board is None:  # backends that do not set up the arrival board themselves
        comm._watch(comm.mpi_comm)
    _log.debug("cupycoll: rank %d/%d on backend %s", comm.rank, comm.size, comm.backend)
    _default = comm
    return comm


def _init_settings(backend: str | None, timeout: float | None) -> tuple[str, float | None]:
    """What :func:`init` reads before it makes a communicator: no unknown ``CUPYCOLL_*``
    variable, the backend, the timeouts and the log level, each checked."""
    check_environment()
    backend = chosen("CUPYCOLL_BACKEND", backend, "backend", _BACKENDS, "")
    setting("CUPYCOLL_CONNECT_TIMEOUT")
    log_level()
    return backend, parse_timeout(setting("CUPYCOLL_TIMEOUT", timeout))  # (a keyword too)


def _agreed_auto(group: Any) -> str:
    """"nccl" if every rank of the mpi4py ``group`` can use NCCL, else "mpi" (collective, one
    allreduce)."""
    from mpi4py import MPI

    return "nccl" if group.allreduce(nccl_usable(), op=MPI.LAND) else "mpi"


def log_level() -> str | None:
    """CUPYCOLL_LOG_LEVEL's level name, checked (None: unset)."""
    if not os.environ.get("CUPYCOLL_LOG_LEVEL"):
        return None
    level = setting("CUPYCOLL_LOG_LEVEL").upper()
    if not isinstance(logging.getLevelName(level), int):
        raise InvalidArgument("CUPYCOLL_LOG_LEVEL", level, "not a logging level name")
    return level


def _apply_log_level() -> None:
    """Set the 'cupycoll' logger's level from CUPYCOLL_LOG_LEVEL, only when that is set."""
    level = log_level()
    if level is not None:
        _log.setLevel(level)


def use_world(mpi_comm: Any) -> None:
    """Make ``mpi_comm`` the processes of the default communicator (None: MPI's COMM_WORLD
    again); a default made over others is let go, so the next :func:`get_comm` makes it over
    these (the torch backend's joined world: hooks and calls without ``comm`` then reduce over
    torch's whole world, not one process)."""
    global _default, _world
    if mpi_comm is not _world:
        _world, _default = mpi_comm, None


def get_comm() -> Communicator:
    """Return the default Communicator, initialising it (``init()``) on first use."""
    return _default if _default is not None else init()


def comm_or_default(comm: Any) -> Communicator:
    """``comm`` if it is a Communicator, the default one (:func:`get_comm`) for None; else
    InvalidType naming ``comm`` (an mpi4py communicator is not one: ``cupycoll.init(mpi_comm=...)``
    makes one of it)."""
    if comm is None:
        return get_comm()
    if not isinstance(comm, Communicator):
        raise InvalidType("comm", type(comm).__name__, "a cupycoll Communicator (cupycoll.init"
                          "(), or init(mpi_comm=) over an mpi4py communicator) or None",
                          rank=None if _default is None else _default.rank)
    return comm


def made_comm() -> Communicator | None:
    """The default Communicator if one was made, else None (nothing collective)."""
    return _default
