"""Host-sync counting (cupycoll.testing.syncs, cupycoll.testing.sync_counting) and the GPU path's
sync budget.

The unit tests pin what the counting namespace reports (each operation CuPy would block on, and
nothing else); the launches run ``tests/workers/sync_budget.py``: the budget of
``bench/bench_syncs.py`` held on every rank, and the GPU code path's results against a dense
reference and the numpy path.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from cupycoll.testing.sync_counting import DeviceArray, xp
from cupycoll.testing.syncs import count_host_syncs, host_sync, uncounted
from cupycoll._types import array_namespace, to_host

from tests._mpi import run_mpi


def _count(fn) -> dict:
    with count_host_syncs() as syncs:
        fn()
    return dict(syncs.by_kind)


def test_device_work_is_no_sync():
    a = xp.asarray(np.arange(10, dtype=np.float32))
    b = xp.arange(10)

    def work():
        c = a * 2 + 1
        s = c.sum()  # a 0-d device array, as in cupy
        assert isinstance(s, DeviceArray) and s.ndim == 0
        d = xp.searchsorted(b, xp.asarray([3, 7]))
        c[d] = s
        xp.cumsum(c)[a > 3.0 - 10]  # noqa: B018 -- a boolean mask IS a sync: counted below
    assert _count(work) == {"mask": 1}
    assert array_namespace(a) is xp and isinstance(a[1:], DeviceArray)


@pytest.mark.parametrize("op, kind", [
    (lambda a: int(a[0]), "read"), (lambda a: float(a.max()), "read"),
    (lambda a: bool(a.all()), "read"), (lambda a: a.tolist(), "read"),
    (lambda a: a[0].item(), "read"), (lambda a: to_host(a), "read"),
    (lambda a: range(10)[a[1]], "read"), (lambda a: xp.flatnonzero(a), "nonzero"),
    (lambda a: xp.unique(a), "nonzero"), (lambda a: np.nonzero(a), "nonzero"),
    (lambda a: a[a > 2], "mask"), (lambda a: a.__setitem__(a > 2, a[:7]), "mask"),
])
def test_each_blocking_operation_is_one_sync(op, kind):
    a = xp.asarray(np.arange(10))
    assert _count(lambda: op(a)) == {kind: 1}


def test_device_casts_neither_warn_nor_raise():
    """A device cast that overflows or meets NaN is silent, as CUDA's (before: numpy's
    FloatingPointError under np.errstate(all="raise"), on the counting tier only)."""
    from cupycoll import primitives

    idx = np.array([0, 0, 1])
    with np.errstate(all="raise"):
        _, summed = primitives.coo_reduce(xp.asarray(idx), xp.asarray(
            np.array([6e4, 6e4, 1], np.float16)), "sum", accumulate_dtype="float32")
        cast = xp.asarray(np.array([np.nan, 1e30], np.float32)).astype(np.float16)
    assert np.asarray(summed).tolist() == [np.inf, 1.0]
    assert np.isnan(np.asarray(cast)[0]) and np.isinf(np.asarray(cast)[1])


def test_counter_sees_every_thread_but_not_uncounted_work():
    with count_host_syncs() as outer:
        thread = threading.Thread(target=host_sync, args=("wait",))
        thread.start()
        thread.join()
        with uncounted():
            host_sync("read")
        with count_host_syncs(where=True) as inner:
            host_sync("read")
    assert outer.total == 2 and outer.by_kind == {"wait": 1, "read": 1}
    assert inner.total == 1 and "test_syncs.py" in inner.sites[0][1]


def test_primitives_on_the_namespace_run_the_kernels():
    from cupycoll import primitives

    idx = xp.asarray(np.array([5, 1, 5, 3], np.int32))
    val = xp.asarray(np.array([1.0, 2.0, 3.0, 4.0], np.float32))
    with count_host_syncs() as syncs:
        out_i, out_v = primitives.coo_reduce(idx, val)
    assert isinstance(out_i, DeviceArray)
    assert out_i.get().tolist() == [1, 3, 5] and out_v.get().tolist() == [2.0, 4.0, 4.0]
    assert syncs.by_kind == {"read": 1, "nonzero": 1}  # range and order; run starts


def _budget_counts(nprocs: int) -> str:
    out = run_mpi(nprocs, "sync_budget.py", timeout=300)
    line = next(line for line in out.splitlines() if line.startswith("ok syncs on"))
    assert line.startswith(f"ok syncs on {nprocs} ranks: ")
    return line.split(": ", 1)[1]


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_sync_budget_and_results_on_the_gpu_path(nprocs):
    _budget_counts(nprocs)


def test_sync_budget_is_the_same_at_p4_and_p8():
    four, eight = _budget_counts(4), _budget_counts(8)
    assert four == eight, f"syncs depend on P: P=4 {four}; P=8 {eight}"


def _emulated_budget(nprocs: int, tmp_path) -> dict:
    """bench_syncs.py on the real NCCL backend over the strict emulation tier."""
    path = tmp_path / f"syncs{nprocs}.json"
    run_mpi(nprocs, "../../bench/bench_syncs.py", "--backend", "emulated", "--json", path,
            timeout=400)  # exits 1 (and fails here) when a call is over budget or unequal
    rows = json.loads(path.read_text())["rows"]
    return {row["call"]: row["host_syncs"] for row in rows if row.get("budget") not in (None, "")}


def test_sync_budget_on_emulated_nccl_is_met_and_independent_of_p(tmp_path):
    four, eight = _emulated_budget(4, tmp_path), _emulated_budget(8, tmp_path)
    assert set(four) >= {"allreduce", "sparse_allreduce.split", "sparse_allreduce.allgather",
                         "topk_allreduce.oktopk.nonrefresh"}
    assert four == eight, f"syncs depend on P: P=4 {four}; P=8 {eight}"
