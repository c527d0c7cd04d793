"""The emulated ``cupy.cuda.nccl`` module (:func:`build`): the real binding's constants and
errors, the emulated group calls and communicator of :mod:`.nccl` (CuPy 13's has no
``commSplit``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .nccl import NcclCommunicator, groupEnd, groupStart
from .nccl_core import STATE, get_unique_id

__all__ = ["build"]


class _Cupy13Communicator(NcclCommunicator):
    """CuPy 13's binding: no ``commSplit``, no ``NcclConfig`` (blocking communicators only)."""

    def __init__(self, ndev: int, commId: Any, rank: int, *, _mpi: Any = None,
                 _uid: bytes | None = None) -> None:
        super().__init__(ndev, commId, rank, _mpi=_mpi, _uid=_uid)

    def __getattribute__(self, name: str) -> Any:
        if name == "commSplit":
            raise AttributeError("'cupy.cuda.nccl.NcclCommunicator' object has no attribute "
                                 "'commSplit' (CuPy 13)")
        return super().__getattribute__(name)


def build(real: Any, version: int, node: int) -> Any:
    """The emulated ``cupy.cuda.nccl`` module over the real binding ``real``."""
    import types

    mod = types.ModuleType("cupy.cuda.nccl")
    for name in dir(real):
        if name.startswith("NCCL_"):
            setattr(mod, name, getattr(real, name))
    STATE.update(real=real, version=version, node=node, boot=MPI.COMM_WORLD.Dup(),
                 dtypes={int(getattr(real, "NCCL_" + n.upper())): np.dtype(n) for n in
                         ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
                          "float32", "float64")})
    mod.NcclError = real.NcclError
    mod.available = True
    mod.get_version = real.get_version
    mod.get_unique_id = get_unique_id
    real.groupStart()  # the real ones exist and pair up (the calls inside are not real:
    real.groupEnd()  # NCCL would report their null-communicator errors at groupEnd)
    mod.groupStart, mod.groupEnd = groupStart, groupEnd
    mod.NcclCommunicator = NcclCommunicator if version >= 14 else _Cupy13Communicator
    if version >= 14:  # the real class: cupycoll sets ``blocking`` in its real ncclConfig_t
        mod.NcclConfig = real.NcclConfig
    return mod
