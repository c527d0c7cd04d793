"""The one reason a GPU test may skip: no CUDA device. Every other problem fails the test.

``no_device_reason()`` returns a reason starting with ``NO_DEVICE`` when this machine has no
CUDA device: ``getDeviceCount()`` reports cudaErrorNoDevice, or cudaErrorInsufficientDriver
while no driver library (libcuda.so.1) is installed at all, or a count below what the test
needs. A missing or broken cupy, a driver that is installed but too old, or any other error is
raised as a test failure: on a GPU machine those are bugs to see, not tests to skip.
tests/conftest.py fails the session when any test skips for a reason not starting with
``NO_DEVICE``.
"""

from __future__ import annotations

import pytest

from cupycoll.testing.selftest._device import no_device_error

NO_DEVICE = "no CUDA device"


def no_device_reason(devices: int = 1) -> str | None:
    """Why GPU tests needing ``devices`` devices cannot run here, None when they can.

    Fails the calling test (pytest.fail) on any error other than "no device".
    """
    try:
        import cupy
    except Exception as exc:  # the gpu extra is part of the test environment
        pytest.fail(f"cupy does not import (install the gpu-cu12 extra): {exc!r}")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        if no_device_error(exc):
            return f"{NO_DEVICE}: getDeviceCount() raised {exc} (no CUDA driver or device here)"
        pytest.fail(f"CUDA is installed but broken: getDeviceCount() raised {exc!r}")
    if count < devices:
        return f"{NO_DEVICE}: {count} visible, {devices} needed (one per rank)"
    return None
