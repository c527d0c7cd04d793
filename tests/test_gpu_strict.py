"""The emulation tier as strict as the hardware where it used to be kinder (issue 37, item 7):
CuPy's stream-ordered pool with immediate reuse, NCCL's NaN-dropping max/min and ring-ordered
sums, a blocking ncclCommDestroy, remote errors across nodes only. One launch per P; each check
failed before the change it covers (see tests/workers/gpu_strict.py)."""

from __future__ import annotations

import pytest

from tests._mpi import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [3, 4])
def test_strict_points_on_emulated_gpus(nprocs):
    """The pool's immediate, poisoned, stream-ordered reuse; Ok-Topk with a bucket per step (its side-stream unpack keeps the receive slots until the
    join: before, the pool handed a dropped slot to the next bucket's receive, StreamOrderError);
    NCCL's max/min/sum/avg arithmetic; stable argsort and the MPI backend's in-place broadcast
    of device arrays (fidelity: both failed before their fixes); the MPI backend's asynchronous
    calls on device arrays delivering on the caller's device (mpi_devices). At P = 4 (2 devices
    per node: nodes {0, 1}, {2, 3}) also a peer's abort reported across nodes only, and
    destroy() blocking on a dead peer."""
    modes = ["fidelity", "counts", "pool", "oktopk", "nccl_math", "mpi_devices"] + (
        ["peer_dead", "destroy"] if nprocs == 4 else [])
    out = run_mpi(nprocs, "gpu_strict.py", ",".join(modes), timeout=240,
                  env={"CC_EMU_DEVICES": "2"})
    assert f"gpu_strict {','.join(modes)}: ok on {nprocs} ranks" in out, out
    assert f"oktopk with a bucket per step: {nprocs} buckets" in out, out
