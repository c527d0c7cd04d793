"""``sparse_allreduce(output="dense")`` in process: ranks simulated by threads (tests/_threaded),
every algorithm, and split's region variant in both of its gathers (dense regions, sparse
entries) and both owner reductions (accumulated sums, merges), against numpy's fold of the
zero-filled inputs in rank order (absent entries count +0, so a -0 survives a sum only where
every rank holds it), bit for bit on exactly representable values."""

from __future__ import annotations

import numpy as np
import pytest

import cupycoll as cc
from cupycoll.sparse import split
from tests._threaded import on_communicators

FOLD = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def _inputs(p: int, n: int, width: int, dtype, minus_zero: bool, seed: int):
    row = (width,) if width else ()
    out = []
    for r in range(p):
        rng = np.random.default_rng([seed, r, p, width])
        idx = np.flatnonzero(rng.random(n) < 0.3 + 0.1 * r).astype(np.int32)
        val = (rng.integers(-8, 9, (idx.size,) + row) / 2).astype(dtype)
        if minus_zero and idx.size:
            val[: max(idx.size // 4, 1)] = -0.0 if np.dtype(dtype).kind == "f" else 0
        rng.shuffle(idx)  # the call coalesces (sorts) them
        out.append((idx, val))
    return out


def _reference(inputs, n: int, op: str, dtype):
    """numpy, rank order, each rank's entries scattered into +0: the documented semantics (a
    max/min of zeros is +0/-0 when any contribution, absent ones included, is +0/-0)."""
    total, plus, minus = None, False, False
    for idx, val in inputs:
        full = np.zeros((n,) + val.shape[1:], dtype)
        full[idx] = val
        total = full if total is None else FOLD[op](total, full)
        plus = plus | ((full == 0) & ~np.signbit(full))
        minus = minus | ((full == 0) & np.signbit(full))
    if op in ("max", "min") and np.dtype(dtype).kind == "f":
        tie = plus if op == "max" else minus
        total[total == 0] = 0.0
        total[(total == 0) & (tie if op == "min" else ~tie)] = -0.0
    if op == "avg":
        total = total / len(inputs) if np.dtype(dtype).kind == "f" else (
            np.sign(total) * (np.abs(total) // len(inputs))).astype(dtype)
    return total.astype(dtype)


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("gather", ["regions", "entries"])
@pytest.mark.parametrize("minus_zero", [False, True], ids=["plain", "minus_zero"])
@pytest.mark.parametrize("n", [257, 3], ids=["regions", "empty_regions"])
def test_split_region_variant_equals_the_numpy_fold(monkeypatch, p, gather, minus_zero, n):
    """split with output="dense": dense regions or sparse entries (forced), sums accumulated in
    the owner's block (with -0 inputs: settled) or merged (max/prod), avg, into ``out`` and
    into a new array, 1-D and rows, float32 and int64; n = 3 leaves regions empty."""
    monkeypatch.setattr(split, "gathers_dense", lambda shape, profile=None: gather == "regions")
    cases = [(op, width, dtype) for op in ("sum", "max", "prod", "avg")
             for width, dtype in ((0, np.float32), (3, np.float32), (0, np.int64))]
    for op, width, dtype in cases:
        inputs = _inputs(p, n, width, dtype, minus_zero, seed=len(op))
        want = _reference(inputs, n, op, dtype)

        def call(comm, into):
            out = np.full(want.shape, 7, dtype) if into else None
            res = cc.sparse_allreduce(*inputs[comm.rank], n, op=op, algorithm="split",
                                      comm=comm, output="dense", out=out)
            assert out is None or res is out
            return res

        for into in (False, True):
            for res, log in on_communicators(p, lambda c: call(c, into)):
                assert res.dtype == dtype and res.shape == want.shape
                assert _bits(res) == _bits(want), (op, width, dtype, into)
                ops = {name for name, _ in log if name != "verb"}
                if p > 1 and n > 3:  # (with n = 3 no peer's region may hold a row)
                    assert ("split.regions" in ops) == (gather == "regions"), ops


@pytest.mark.parametrize("p", [1, 2, 3])
def test_every_algorithm_gives_the_numpy_fold(p):
    """The other algorithms (and auto, and the dense algorithm's in-place reduction) with a -0
    held by some ranks, NaN-free exact values, float32 rows and int64."""
    n = 100
    for algorithm in cc.algorithms("sparse"):
        for op in ("sum", "min"):
            for width, dtype in ((0, np.float32), (2, np.float32), (0, np.int64)):
                inputs = _inputs(p, n, width, dtype, True, seed=3)
                want = _reference(inputs, n, op, dtype)
                for res, _ in on_communicators(p, lambda c: cc.sparse_allreduce(
                        *inputs[c.rank], n, op=op, algorithm=algorithm, comm=c,
                        output="dense")):
                    assert _bits(res) == _bits(want), (algorithm, op, width, dtype)
