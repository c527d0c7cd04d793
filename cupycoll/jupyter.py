"""Jupyter on P ranks: an ipyparallel cluster of MPI engines that finds this Python's mpiexec.

    import cupycoll.jupyter
    cluster = cupycoll.jupyter.mpi_cluster(4)     # 4 engines = 4 MPI ranks
    rc = cluster.start_and_connect_sync()         # then %%px cells run on every engine
    ...
    cluster.stop_cluster_sync()                   # or: with cupycoll.jupyter.mpi_cluster(4) as rc:

The kernel itself is not a rank: it only drives the engines. Importing this module does not
import ipyparallel (install it with the ``notebook`` extra).
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from .errors import BackendUnavailable, InvalidArgument, InvalidType

__all__ = ["find_mpiexec", "mpi_cluster", "OVERSUBSCRIBE"]


#: environment that lets Open MPI's mpiexec start more ranks than cores, as MPICH's does by
#: itself (which ignores these variables): Open MPI 5 (PRRTE) and 4
OVERSUBSCRIBE = {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
                 "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def find_mpiexec() -> str:
    """Return the mpiexec next to this Python (the mpich wheel's, venv active or not), else PATH's.

    Raises:
        BackendUnavailable: no mpiexec anywhere (install the ``mpi`` extra: ``pip install mpich``).
    """
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        raise BackendUnavailable("no mpiexec next to this Python nor on PATH: "
                                 "pip install 'cupycoll[mpi]' (the mpich wheel) or install MPI")
    return found


def _mpi_args(mpi_args: Any) -> list[str]:
    """``mpi_args`` as mpiexec's argument list (a string split as a shell would)."""
    if isinstance(mpi_args, str):
        try:
            return shlex.split(mpi_args)
        except ValueError as exc:  # an unclosed quote, a trailing escape
            raise InvalidArgument("mpi_args", mpi_args, f"a shell would not split it: {exc}") \
                from None
    if mpi_args is None:
        return []
    if not isinstance(mpi_args, (list, tuple)) or not all(isinstance(a, str) for a in mpi_args):
        raise InvalidType("mpi_args", type(mpi_args).__name__,
                          "a list of strings, one string, or None")
    return list(mpi_args)


def mpi_cluster(n: int = 4, *, mpi_args: list[str] | str | None = None, **kwargs: Any):
    """Return an (unstarted) ``ipyparallel.Cluster`` of ``n`` engines launched by one mpiexec.

    Args:
        n: number of engines, i.e. MPI ranks (``COMM_WORLD`` of the engines).
        mpi_args: extra mpiexec arguments: a list of strings (``["-bind-to", "none"]``) or
            one string split as a shell would (``"-bind-to none"``).
        **kwargs: passed to ``ipyparallel.Cluster`` (``cluster_id``, ``log_level``,
            ``config``: a traitlets Config merged under the launcher's settings, ...).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InvalidArgument("n", n, "the number of engines must be a positive int")
    args = _mpi_args(mpi_args)
    try:
        import ipyparallel
        from traitlets.config import Config
    except ImportError as exc:
        raise BackendUnavailable("cupycoll.jupyter needs ipyparallel: "
                                 "pip install 'cupycoll[notebook]'") from exc
    if "engines" in kwargs:
        raise InvalidArgument("engines", kwargs["engines"], "mpi_cluster sets it (mpi)")
    mine = kwargs.pop("config", None)
    if mine is not None and not isinstance(mine, dict):  # a Config is a dict
        raise InvalidType("config", type(mine).__name__, "a traitlets Config, a dict or None")
    config = Config()
    config.merge(Config(mine or {}))  # the caller's settings, then ours
    config.MPILauncher.mpi_cmd = [find_mpiexec()]
    config.MPILauncher.mpi_args = args
    return ipyparallel.Cluster(engines="mpi", n=n, config=config, **kwargs)
