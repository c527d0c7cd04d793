"""The CUDA devices the selftest sees: how many, what they are, their peak memory bandwidth."""

from __future__ import annotations

from typing import Any

__all__ = ["probe", "peak_bandwidth"]

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


def probe() -> dict[str, Any]:
    """``{"count": N, ...}``: the visible CUDA devices with device 0's name, compute
    capability, memory and peak bandwidth, and the versions; ``count`` 0 with ``why`` when
    CuPy does not import or sees no device."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - not installed or broken: the no-GPU selftest
        return {"count": 0, "why": f"cupy does not import ({type(exc).__name__}: {exc})"}
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver or no device
        return {"count": 0, "why": f"getDeviceCount() raised {type(exc).__name__}: {exc}",
                "cupy": cupy.__version__}
    if count == 0:
        return {"count": 0, "why": "no CUDA device visible", "cupy": cupy.__version__}
    props = cupy.cuda.runtime.getDeviceProperties(0)
    peak = peak_bandwidth(cupy)
    return {"count": count, "name": props["name"].decode(errors="replace"),
            "compute_capability": f"{props['major']}.{props['minor']}",
            "memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
            "peak_bandwidth_gbs": None if peak is None else round(peak / 1e9, 1),
            "cupy": cupy.__version__,
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "cuda_driver": cupy.cuda.runtime.driverGetVersion()}
