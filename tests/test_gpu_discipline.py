"""The NCCL backend's stream, completion and lifetime discipline on emulated GPUs (issue 37):
no device work on the legacy NULL stream, futures completed on the communicator's device, and
every way of letting go of a communicator with a pending operation aborts it. Each mode failed
before its fix (tests/workers/gpu_discipline.py says how)."""

from __future__ import annotations

import pytest

from tests._mpi import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [2, 3])
def test_stream_completion_and_lifetime_discipline(nprocs):
    modes = ("null_stream,completer_device,waits_per_stream,stream_switch,future_streams,"
             "device_thread,inflight_threads,alloc_synced,result_after_abort,late_step,connecting,"
             "dup_board,close_paths,null_stream_copies,future_wait,connect_waits")
    out = run_mpi(nprocs, "gpu_discipline.py", modes, timeout=300)
    assert f"gpu_discipline {modes}: ok on {nprocs} ranks" in out
