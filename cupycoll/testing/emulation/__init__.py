"""Strict GPU emulation: run the NCCL backend and the cupy code paths on CPU under GPU rules.

:func:`install` puts an emulated ``cupy`` (with ``cupy.cuda``, ``cupy.cuda.runtime`` and
``cupy.cuda.nccl``) in ``sys.modules`` of an MPI process, so cupycoll's GPU path runs unchanged:
``init("nccl")`` bootstraps emulated NCCL communicators, algorithms get ``comm.xp`` = the emulated
cupy, primitives launch the real CUDA kernels compiled for the CPU. What it enforces:

* devices: ``devices_per_node`` emulated devices per node (node = world rank // devices_per_node),
  a current device per host thread, arrays that know their device; every array operation, kernel
  launch and NCCL call needs its arrays, stream and communicator on the current device;
* streams: NCCL work runs later, in stream order, on the stream's own thread; events and stream
  waits order streams; touching a buffer before the work writing it is ordered before raises
  :class:`StreamOrderError`, and receive buffers hold poison (all bits set) until written;
* memory: CuPy's stream-ordered pool (:mod:`.pool`): a freed device block goes at once, poisoned,
  to the next allocation of its size on the stream that allocated it, with the other streams'
  unordered work on it, so touching it unordered raises :class:`StreamOrderError`;
* NCCL: lazy connection handshakes (first collective per communicator, first send/recv per peer)
  block the caller like NCCL >= 2.22, or, on a non-blocking communicator (CuPy's ``NcclConfig``
  with ``blocking = 0``), return ncclInProgress (CuPy raises ``KeyError(7)``) and go on in the
  background; in-place and overlap rules; NCCL's arithmetic (float max/min drop NaN, sums in
  ring order); ``abort()`` unblocks a blocked call, and an abort while another thread is inside
  a call of a blocking communicator is recorded; a peer's abort is a remote error across nodes
  only; ``destroy()`` blocks while an operation waits for a peer; :func:`check_logs` compares
  every rank's calls; each call is also issued through the real ``cupy.cuda.nccl`` on a null
  communicator and must reach NCCL's own argument error;
* host synchronizations (device-to-host copies, scalar reads, data-dependent sizes, event and
  stream synchronize) are reported to :func:`cupycoll.testing.syncs.host_sync` (counted by
  :func:`cupycoll.testing.syncs.count_host_syncs`).

Run a script under it: ``mpiexec -n 4 python -m cupycoll.testing.emulation script.py [args]``.
"""

from __future__ import annotations

import sys
import types

from .device import DeviceMismatch, EmulationError, StreamOrderError, host_sync
from .logs import check_logs
from .nccl_core import release_blocked

__all__ = ["install", "check_logs", "release_blocked", "EmulationError",
           "StreamOrderError", "DeviceMismatch", "host_sync", "installed", "real_cupy_version"]

_INSTALLED: dict[str, types.ModuleType] = {}


def installed() -> bool:
    return bool(_INSTALLED)


def install(devices_per_node: int = 2, cupy_version: int = 14) -> types.ModuleType:
    """Replace ``cupy`` in ``sys.modules`` by the emulation (call before cupycoll imports cupy).

    Collective over ``MPI.COMM_WORLD`` (it duplicates it for the emulated NCCL bootstrap).
    ``cupy_version`` 13 emulates CuPy 13's NCCL binding (no ``commSplit``, tuple unique ids).
    Returns the emulated ``cupy`` module.
    """
    if _INSTALLED:
        return _INSTALLED["cupy"]
    import cupy as real_cupy
    from cupy.cuda import nccl as real_nccl  # the real binding, checked call by call
    from cupy.cuda import nvrtc as real_nvrtc
    from mpi4py import MPI

    real_nvrtc.getVersion()  # loads libnvrtc now: its lazy loader looks up cupy._environment

    from . import array, device, kernels, namespace, nccl_module, runtime

    device.configure(devices_per_node)
    node = MPI.COMM_WORLD.Get_rank() // devices_per_node
    emulated_nccl = nccl_module.build(real_nccl, cupy_version, node)
    cuda = runtime.cuda_module(emulated_nccl)
    cuda.nvrtc = real_nvrtc
    cupy = types.ModuleType("cupy")
    cupy.__getattr__ = namespace.namespace  # numpy's names, device-side
    cupy.__version__ = f"{cupy_version}.0.0+emulated"
    cupy.cuda = cuda
    cupy.RawModule = kernels.RawModule
    cupy._environment = real_cupy._environment  # what the real NVRTC binding's loader reads
    cupy.ndarray = array.ndarray
    for name, module in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.nccl", emulated_nccl),
                         ("cupy.cuda.runtime", cuda.runtime), ("cupyx", runtime.cupyx_module())):
        sys.modules[name] = module
    _INSTALLED.update(cupy=cupy, real=real_cupy.__version__)
    return cupy


def real_cupy_version() -> str:
    """Version of the real CuPy whose NCCL binding checks every call."""
    return _INSTALLED["real"]
