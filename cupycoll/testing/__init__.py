"""Verification tooling for cupycoll (as ``numpy.testing``): not needed to use cupycoll.

What the test suite, the benchmarks and ``cupycoll selftest`` use to check the GPU path without a
GPU; nothing in cupycoll's normal path imports it, and importing this package imports none of
its submodules (no emulator, nothing compiled):

* :mod:`cupycoll.testing.emulation`: the strict emulation tier, emulated CuPy, CUDA and NCCL on
  the CPU under GPU rules (``mpiexec -n P python -m cupycoll.testing.emulation script.py``);
* :mod:`cupycoll.testing.kernel_shim`: the CUDA kernels compiled for the CPU by g++ (cached by
  source hash) and ``ShimLauncher``, which runs them on host arrays;
* :mod:`cupycoll.testing.syncs`: host-synchronisation counting, the ``host_sync`` hook a device
  namespace reports to and ``count_host_syncs``;
* :mod:`cupycoll.testing.sync_counting`: a numpy-backed CuPy stand-in that reports every host
  sync real CuPy would make, and ``SyncCountingCommunicator``, the MPI backend over it booked as
  NCCL would be;
* :mod:`cupycoll.testing.selftest`: ``python -m cupycoll selftest``, the one-command acceptance
  run on a GPU machine (its emulated equivalent without one).
"""
