"""Every top-k algorithm on tiny inputs, one short launch per rank count (tests/workers/topk_quick.py).

The mutation run's multi-rank selection for ``cupycoll/topk/`` (tests/mutation/run.py): the
regular workers' checks and references on smaller inputs, plus Ok-Topk's reference-policy
feedback with T < 2k/3 and the compact/rounded wires. Part of the regular suite too (~10 s).
"""

import pytest

from tests._mpi import run_mpi


@pytest.mark.parametrize("nprocs", [2, 3])
def test_topk_quick_every_algorithm(nprocs):
    out = run_mpi(nprocs, "topk_quick.py", timeout=180)
    assert "OK" in out
