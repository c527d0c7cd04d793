"""Worker: host-sync budget on the GPU code path, and that path's results.

Every call of ``bench/bench_syncs.py`` runs over the sync-counting device namespace (the GPU
primitives with the kernels compiled for the CPU, NCCL's booking of waits). Checks:

1. each budgeted call is within budget and counts the same on every rank;
2. each sparse_allreduce algorithm's result equals the dense numpy reference built from every
   rank's (rebuilt) input: indices exactly, max exactly, sums to float32 tolerance; and equals,
   bit for bit, the same call on the plain numpy MPI path;
3. top-k allreduce (every algorithm, three steps of one state): bit for bit the numpy path.

Prints ``ok syncs on P ranks`` and the counts of the budgeted calls.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_syncs as bench  # noqa: E402

import cupycoll as cc  # noqa: E402
from cupycoll.testing.sync_counting import SyncCountingCommunicator  # noqa: E402
from cupycoll.comm.mpi import MPICommunicator  # noqa: E402
from cupycoll.topk import TopkState, topk_allreduce  # noqa: E402

N, NNZ, K = 1 << 11, 200, 48


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _dense_reference(p: int, op: str) -> tuple[np.ndarray, np.ndarray]:
    ufunc = {"sum": np.add, "max": np.maximum}[op]
    dense, present = np.zeros(N, np.float64), np.zeros(N, bool)
    for r in range(p):
        idx, val = bench._sparse_input(r, N, NNZ)
        full = np.zeros(N, np.float64)
        full[idx] = val
        dense = full if r == 0 else ufunc(dense, full)
        present[idx] = True
    where = np.flatnonzero(present)
    return where, dense[where]


def check_sparse(gpu, cpu, rank: int, p: int) -> None:
    idx, val = bench._sparse_input(rank, N, NNZ)
    for name in cc.algorithms("sparse"):
        for op in ("sum", "max"):
            got = cc.sparse_allreduce(gpu.xp.asarray(idx), gpu.xp.asarray(val), N, op=op,
                                      algorithm=name, comm=gpu)
            twin = cc.sparse_allreduce(idx, val, N, op=op, algorithm=name, comm=cpu)
            gi, gv = _host(got.indices), _host(got.values)
            assert gi.dtype == twin.indices.dtype and gv.dtype == twin.values.dtype, name
            assert gi.tobytes() == twin.indices.tobytes(), f"{name} {op}: indices differ"
            assert gv.tobytes() == twin.values.tobytes(), f"{name} {op}: values differ"
            want_i, want_v = _dense_reference(p, op)
            assert np.array_equal(gi, want_i), f"{name} {op}: indices vs dense reference"
            if op == "max":
                assert np.array_equal(gv, want_v.astype(np.float32)), f"{name} max"
            else:
                np.testing.assert_allclose(gv, want_v, rtol=1e-5, atol=1e-5, err_msg=name)


def check_topk(gpu, cpu, rank: int) -> None:
    for name in cc.algorithms("topk"):
        states = TopkState(tau_prime=2), TopkState(tau_prime=2)
        for t in range(3):
            x = bench._topk_input(rank, N, t)
            got = topk_allreduce(gpu.xp.asarray(x), K, algorithm=name, comm=gpu,
                                 state=states[0])
            twin = topk_allreduce(x, K, algorithm=name, comm=cpu, state=states[1])
            assert _host(got.indices).tobytes() == twin.indices.tobytes(), f"{name} step {t}"
            assert _host(got.values).tobytes() == twin.values.tobytes(), f"{name} step {t}"


def main() -> None:
    mpi = MPI.COMM_WORLD
    gpu, cpu = SyncCountingCommunicator(), MPICommunicator()
    check_sparse(gpu, cpu, mpi.rank, mpi.size)
    check_topk(gpu, cpu, mpi.rank)
    rows = bench.measure(gpu, 1 << 12, 256, 64)
    budgeted = {r["call"]: r for r in rows if r["budget"] is not None}
    assert set(budgeted) == set(bench.BUDGET), sorted(budgeted)
    for call, row in budgeted.items():
        assert row["status"] == "ok", f"{call}: {row}"
    if mpi.rank == 0:
        counts = " ".join(f"{c}={r['host_syncs']}" for c, r in sorted(budgeted.items()))
        print(f"ok syncs on {mpi.size} ranks: {counts}")


if __name__ == "__main__":
    main()
