"""Top-k edge cases: NaN never selected, non-finite thresholds, bad or mixed states.

In-process checks of the selectors, and one launch per P = 1..4 of tests/workers/topk_edges.py
(every algorithm and the compressor against plain numpy references).
"""

import numpy as np
import pytest

from cupycoll.topk import Exact, Threshold
from tests._mpi import Batch

LAUNCHES = Batch({"topk_edges.py": {p: () for p in (1, 2, 3, 4)}}, timeout=300)


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("topk_edges.py"))
def test_topk_edge_cases(nprocs):
    out = LAUNCHES.output("topk_edges.py", nprocs)
    assert "OK" in out


@pytest.mark.parametrize("selector,want", [(Exact(), [0, 2, 3, 5, 6]),
                                           (Threshold(policy="reference"), [0, 2, 3, 5])])
def test_exact_selections_leave_nan_out(selector, want):
    """Fewer than k numbers: every number (the reference policy: every nonzero), no NaN."""
    x = np.array([3, np.nan, -1, 0.5, np.nan, 2, 0], np.float32)
    sel = selector.select(x, 6)
    np.testing.assert_array_equal(sel.indices, want)
    np.testing.assert_array_equal(sel.values, x[want])
    assert selector.select(np.full(5, np.nan, np.float32), 2).count == 0
