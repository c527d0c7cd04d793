"""Top-k edge cases: NaN never selected, non-finite thresholds, bad or mixed states.

In-process checks of the selectors, and one launch per P = 1..4 of tests/workers/topk_edges.py
(every algorithm and the compressor against plain numpy references), one more on the GPU path.
"""

import numpy as np
import pytest

import cupycoll as cc
from cupycoll.errors import InvalidArgument, InvalidType
from cupycoll.topk import Exact, Gaussian, Threshold
from tests._mpi import Batch, run_mpi

LAUNCHES = Batch({"topk_edges.py": {p: () for p in (1, 2, 3, 4)}}, timeout=300)


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("topk_edges.py"))
def test_topk_edge_cases(nprocs):
    out = LAUNCHES.output("topk_edges.py", nprocs)
    assert "OK" in out


def test_nan_never_selected_on_the_gpu_path():
    """The NaN checks over emulated NCCL and cupy (the top-k kernels compiled for the CPU)."""
    assert "OK emulated" in run_mpi(2, "topk_edges.py", 0, "emulated", timeout=240)


@pytest.mark.parametrize("selector,want", [(Exact(), [0, 2, 3, 5, 6]),
                                           (Threshold(policy="reference"), [0, 2, 3, 5])])
def test_exact_selections_leave_nan_out(selector, want):
    """Fewer than k numbers: every number (the reference policy: every nonzero), no NaN."""
    x = np.array([3, np.nan, -1, 0.5, np.nan, 2, 0], np.float32)
    sel = selector.select(x, 6)
    np.testing.assert_array_equal(sel.indices, want)
    np.testing.assert_array_equal(sel.values, x[want])
    assert selector.select(np.full(5, np.nan, np.float32), 2).count == 0


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_histogram_threshold_from_a_threshold_at_the_top(dtype):
    """The last threshold inf or the dtype's largest value (a state saved after an inf k-th
    magnitude): the window stays finite and numpy counts 0.9k..1.1k at the new threshold."""
    from mpi4py import MPI

    from cupycoll.topk._global_threshold import histogram_threshold

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    mags = np.abs(np.random.default_rng(3).standard_normal(20000)).astype(dtype)
    for center in (np.inf, float(np.finfo(dtype).max)):
        t, count = histogram_threshold(comm, mags, 500, 20000, center, dtype)
        assert count == np.count_nonzero(mags.astype(np.float64) >= t), (center, t)
        assert 450 <= count <= 550, (center, t, count)


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_gaussian_reference_fit_made_non_finite_selects_about_k(poison):
    """One NaN or infinity in x makes the whole-vector fit non-finite: the reference policy
    takes the k-th magnitude of x's numbers instead (it selected every nonzero), NaN never."""
    x = np.random.default_rng(5).standard_normal(10000).astype(np.float32)
    x[17] = poison
    sel = Gaussian(policy="reference").select(x, 100)
    assert 75 <= sel.count <= 125 and not np.isnan(sel.values).any(), sel.count
    assert (17 in sel.indices.tolist()) == bool(np.isinf(poison))
    numbers = np.abs(x[~np.isnan(x)])
    assert np.all(np.abs(sel.values) >= np.sort(numbers)[-sel.count])


@pytest.mark.parametrize("make,setting,value,kind", [
    (Gaussian, "low", "0.75", InvalidType), (Gaussian, "high", 0.5, InvalidArgument),
    (Gaussian, "max_corrections", None, InvalidType), (Gaussian, "scale", np.inf, InvalidArgument),
    (Threshold, "scale", 0, InvalidArgument), (Threshold, "cap_tries", 1.5, InvalidType),
    (Threshold, "cap", -1.0, InvalidArgument), (Threshold, "policy", "nope", InvalidArgument),
    (Gaussian, "low", True, InvalidType)])
def test_bad_selector_settings_raise_naming_the_selector(make, setting, value, kind):
    """At construction and when set afterwards (check(), which every call runs)."""
    with pytest.raises(kind) as info:
        make(**{setting: value})
    assert info.value.argument == "selector" and setting in str(info.value)
    sel = make(policy="reference")
    setattr(sel, setting, value)
    with pytest.raises(kind) as info:
        sel.check(rank=2)
    assert (info.value.argument, info.value.rank) == ("selector", 2)
