"""The CUDA devices the selftest sees: how many, what they are, their peak memory bandwidth."""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["probe", "peak_bandwidth", "no_device_error"]

#: cudaError_t values of a machine without a CUDA device (the second: no driver installed)
CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INSUFFICIENT_DRIVER = 100, 35

#: cudaDeviceAttr numbers (stable across CUDA versions): memory clock in kHz, bus width in bits
_MEMORY_CLOCK_KHZ, _BUS_WIDTH_BITS = 36, 37


def peak_bandwidth(cupy: Any, device: int = 0) -> float | None:
    """Peak memory bandwidth in bytes/s: memory clock x bus width x 2 (double data rate), from
    the device attributes; None where the runtime does not report them (the emulation tier)."""
    try:
        rt = cupy.cuda.runtime
        clock_khz = rt.deviceGetAttribute(_MEMORY_CLOCK_KHZ, device)
        bus_bits = rt.deviceGetAttribute(_BUS_WIDTH_BITS, device)
    except Exception:  # noqa: BLE001 - an emulated or partial runtime: no figure, not an error
        return None
    if not clock_khz or not bus_bits:
        return None
    return float(clock_khz) * 1e3 * 2 * bus_bits / 8


def _driver_installed() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def no_device_error(exc: BaseException) -> bool:
    """Whether ``getDeviceCount()``'s error says this machine has no CUDA device
    (cudaErrorNoDevice, or cudaErrorInsufficientDriver while no driver library is installed at
    all), not that an installed CUDA is broken (a driver too old or mismatched, anything else)."""
    status = getattr(exc, "status", None)
    return status == CUDA_ERROR_NO_DEVICE or (
        status == CUDA_ERROR_INSUFFICIENT_DRIVER and not _driver_installed())


def probe() -> dict[str, Any]:
    """``{"count": N, ...}``: the visible CUDA devices with device 0's name, compute
    capability, memory and peak bandwidth, and the versions; ``count`` 0 with ``why`` when
    CuPy does not import or sees no device, and with ``broken`` too when CUDA is installed but
    answers with another error (:func:`no_device_error`)."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - not installed or broken: the no-GPU selftest
        return {"count": 0, "why": f"cupy does not import ({type(exc).__name__}: {exc})"}
    rt, stage = cupy.cuda.runtime, "getDeviceCount()"
    try:
        count = rt.getDeviceCount()
        if count:
            stage = "the device query"  # an error past the count: CUDA is there, and broken
            props = rt.getDeviceProperties(0)
            versions = rt.runtimeGetVersion(), rt.driverGetVersion()
    except Exception as exc:  # noqa: BLE001 - no driver or no device, or a broken CUDA
        why = f"{stage} raised {type(exc).__name__}: {exc}"
        found = {"count": 0, "why": why, "cupy": cupy.__version__}
        return found if stage == "getDeviceCount()" and no_device_error(exc) else {
            **found, "broken": why}
    if count == 0:
        return {"count": 0, "why": "no CUDA device visible", "cupy": cupy.__version__}
    peak = peak_bandwidth(cupy)
    return {"count": count, "name": props["name"].decode(errors="replace"),
            "compute_capability": f"{props['major']}.{props['minor']}",
            "memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
            "peak_bandwidth_gbs": None if peak is None else round(peak / 1e9, 1),
            "cupy": cupy.__version__, "cuda_runtime": versions[0], "cuda_driver": versions[1]}
