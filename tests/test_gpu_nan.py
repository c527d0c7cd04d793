"""The sparse NaN and signed-zero contract on NCCL, on emulated GPUs (issue 37, item 5).

One launch per P (2 and 3) runs ``tests/workers/gpu_nan.py``: NCCL's float max/min drop a NaN
and its in-switch sum need not keep -0, so the worker makes the emulated NCCL reduce that way
and checks every sparse algorithm against the numpy reference. Before ``mask``, ``dense`` and
``dense_result`` reduced float max/min through order keys, ``mask`` lost the NaN of one rank
(float16 max, the first case); before ``dense`` stopped filling absent entries with -0 on
NCCL, a flushed -0 made every absent index part of its union.
"""

from __future__ import annotations

import pytest

from tests._mpi import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [2, 3])
def test_nan_and_signed_zeros_on_emulated_nccl(nprocs):
    """Float max/min with NaN on one rank only, +-inf and +-0 ties, absent entries, 1-D and
    rows, float16/32/64: every algorithm (and the dense outputs) gives the reference's bits;
    float sums on a network that loses -0 keep the exact union in every algorithm."""
    out = run_mpi(nprocs, "gpu_nan.py", "nan,flush", 37, timeout=240)
    assert f"gpu_nan nan,flush: ok on {nprocs} ranks" in out, out
