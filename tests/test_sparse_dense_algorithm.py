"""``sparse/dense.py`` in process: its cost model from the formulas
of its module docstring (Python integers and the documented bus factors), the presence rules'
edges, and the -0-filled sum on one rank against numpy (every present row back, bit for bit)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI

import cupycoll as cc
from cupycoll._types import ReduceOp
from cupycoll.sparse import dense
from cupycoll.sparse._cost import Shape

SUMS = ("sum", "avg")


def _allreduce(p: int, nbytes: int) -> tuple[int, int]:
    """(bytes, messages) a rank receives in a native allreduce: floor(2(P-1)/P bytes), 2(P-1)."""
    return (math.floor(2 * (p - 1) / p * nbytes), 2 * (p - 1)) if p > 1 else (0, 0)


def _bitmap(p: int, n: int) -> tuple[int, int, int, int]:
    """The presence bitmap's exchange and allgather: c = ceil(ceil(n/8)/P) bytes per rank."""
    if p == 1:
        return (0, 0, 0, 0)
    c = -(-(-(-n // 8)) // p)
    return ((p - 1) * c, p - 1, math.floor((p - 1) / p * p * c), p - 1)


def _booked(cost) -> dict[str, tuple[int, int]]:
    return {op: (cost.received[op], cost.messages[op]) for op in cost.received}


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_dense_cost_follows_its_documented_formulas(p):
    """signed zeros (float sums): one allreduce of n*R + V; folded counts (other sums of rows
    of width >= 8): n*(R + V); otherwise n*R and the bitmap under ``dense.union``."""
    for n in (1000, 1001, 7):
        for width in (0, 1, 7, 8, 12):
            for vb in (2, 4, 8):
                for op in ("sum", "avg", "max", "min", "prod"):
                    for fv in (True, False):
                        shape = Shape(p, n, width, 4, vb, (3,) * p, op=op, float_values=fv)
                        r = vb * max(width, 1)
                        if fv and op in SUMS:
                            want = {"dense.allreduce": _allreduce(p, n * r + vb)}
                        elif op in SUMS and width >= 8:
                            want = {"dense.allreduce": _allreduce(p, n * (r + vb))}
                        else:
                            ex_b, ex_m, ag_b, ag_m = _bitmap(p, n)
                            want = {"dense.allreduce": _allreduce(p, n * r),
                                    "dense.union": (ex_b + ag_b, ex_m + ag_m)}
                        want = {k: v for k, v in want.items() if v != (0, 0)}
                        got = dense.cost(shape, p - 1)
                        assert _booked(got) == want, (n, width, vb, op, fv)


@pytest.mark.parametrize("p", [1, 2, 4])
def test_settle_cost_is_the_candidates_allgatherv_and_one_count_per_doubtful_row(p):
    """Settling -0 inputs: every rank's rows with a -0 element allgathered (a count per rank,
    then 8 bytes per row from every peer with some), and an int32 holder count per distinct
    row, allreduced."""
    for candidates in ([0] * p, [3] + [0] * (p - 1), list(range(1, p + 1))):
        for doubtful in (0, 1, 9):
            for rank in range(p):
                others = [c for r, c in enumerate(candidates) if r != rank]
                want = {}
                if p > 1:
                    want["dense.signed_zeros.counts"] = (
                        math.floor((p - 1) / p * 8 * p), p - 1)
                    if sum(others):
                        want["dense.signed_zeros"] = (8 * sum(others),
                                                      sum(1 for c in others if c))
                    if doubtful:
                        want["dense.signed_zeros.held"] = _allreduce(p, 4 * doubtful)
                got = _booked(dense.settle_cost(p, rank, candidates, doubtful))
                assert got == want, (candidates, doubtful, rank)


def test_presence_folds_only_while_the_count_is_exact():
    """A presence count rides in the values' allreduce for sums of rows of width >= 8 while
    P is below 2^(mantissa bits): 2^11 for 2-byte values, 2^24 for 4, 2^53 for 8."""
    for itemsize, bits in ((2, 11), (4, 24), (8, 53)):
        for op in ("sum", "avg", ReduceOp.SUM, ReduceOp.AVG):
            assert dense.folds_presence(2**bits - 1, itemsize, op, 8)
            assert not dense.folds_presence(2**bits, itemsize, op, 8)
            assert not dense.folds_presence(2, itemsize, op, 7)
            assert dense.folds_presence(1, itemsize, op, 9)
        for op in ("max", "min", "prod", ReduceOp.MAX):
            assert not dense.folds_presence(2, itemsize, op, 8)
    for op in ("sum", "avg", ReduceOp.AVG):
        assert dense.signed_zero_fill(op, True) and not dense.signed_zero_fill(op, False)
    for op in ("max", "min", "prod", ReduceOp.PROD):
        assert not dense.signed_zero_fill(op, True) and not dense.signed_zero_fill(op, False)


@pytest.fixture(scope="module")
def comm():
    return cc.init("mpi", mpi_comm=MPI.COMM_SELF)


def _bits(a: np.ndarray) -> list:
    return a.view(f"u{a.dtype.itemsize}").tolist()


ROWS = {  # one rank's coalesced rows: +0, -0, NaN, inf, mixed, exact values
    "plain": [[1.5], [-2.0], [0.25]],
    "zeros": [[0.0], [3.0], [-1.0]],
    "minus zero": [[-0.0], [2.0], [0.0]],
    "specials": [[np.nan], [-np.inf], [-0.0]],
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("width", [0, 1, 3, 8])
@pytest.mark.parametrize("rows", list(ROWS))
def test_signed_zero_sum_on_one_rank_returns_every_row_bit_for_bit(comm, dtype, width, rows):
    """A float sum on one rank: the union is exactly the rows held (a row of zeros, -0 or +0,
    included), each with its own bits, in the index dtype given."""
    n = 40
    base = np.array(ROWS[rows], dtype)
    for itype in (np.int32, np.int64):
        idx = np.array([3, 17, 39], itype)
        if width == 0:
            val = base[:, 0].copy()
        else:
            val = np.repeat(base, width, axis=1)
            val[0, -1] = -0.0  # the row of index 3 ends in -0 (all -0 when width is 1)
            val[2, 0] = dtype(0.0) if width > 1 else val[2, 0]
        for op in (ReduceOp.SUM, ReduceOp.AVG):
            for _ in range(2):  # the second call reuses the kept buffer
                union, got = dense.dense(comm, idx, val, n, op)
                assert union.dtype == itype and union.tolist() == [3, 17, 39]
                assert got.dtype == val.dtype and got.shape == val.shape
                assert _bits(got) == _bits(val), (rows, width)
        all_minus = np.full_like(val, -0.0)  # rows of -0 only: still held
        union, got = dense.dense(comm, idx, all_minus, n, ReduceOp.SUM)
        assert union.tolist() == [3, 17, 39] and _bits(got) == _bits(all_minus)


def _plain_rows(p: int, width: int, dtype):
    """Per rank: rows without any -0: signs mixed, +0 inputs, sums cancelling to +0."""
    n, rows = 24, max(width, 1)
    per_rank = []
    for r in range(p):
        entries = {3: [0.0] * rows, 5 + r: [-1.25 * (r + 1)] + [0.0] * (rows - 1),
                   20: [(-1.0) ** r * 2.0] * rows, 23 - r: [7.0] * rows}
        idx = np.array(sorted(entries), np.int64)
        val = np.array([entries[i] for i in sorted(entries)], dtype)
        per_rank.append((idx, val if width else val[:, 0].copy()))
    return n, per_rank


def _rank_rows(p: int, width: int, dtype):
    """Per rank: indices and rows over n = 24 with -0 held by some ranks only, -0 held by every
    rank, sums that cancel to +0, +0 inputs, rows of several elements partly -0."""
    n, rows = 24, max(width, 1)
    per_rank = []
    for r in range(p):
        entries = {
            1: [-0.0] * rows,                              # every rank: stays -0
            2 + r: [1.5 * (r + 1)] * rows,                  # one rank each
            20: [(-1.0) ** r * 2.0] * rows,                 # cancels to +0 at even P
            23: [0.0 if r else -0.0] + [-0.0] * (rows - 1),  # -0 and +0 mixed
        }
        if r == 0:
            entries[10] = [-0.0] * rows                     # -0 on rank 0 only: becomes +0
            entries[11] = [-0.0] + [3.0] * (rows - 1)      # a row partly -0, one rank
        if r == p - 1:
            entries[15] = [float("inf")] + [-0.0] * (rows - 1)
        idx = np.array(sorted(entries), np.int64)
        val = np.array([entries[i] for i in sorted(entries)], dtype)
        per_rank.append((idx, val if width else val[:, 0].copy()))
    return n, per_rank


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("width", [0, 1, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [_rank_rows, _plain_rows], ids=["minus_zeros", "plain"])
def test_signed_zero_sum_over_ranks_matches_numpy(p, width, dtype, rows):
    """Ranks simulated by threads: the union of the indices, and at each the sum over ranks with
    +0 for an absent entry (numpy, rank order, exact inputs), bit for bit: a -0 survives only
    where every rank holds it. Booked: the allreduce, then (some rank holds a -0) the
    candidate rows' allgatherv and their holder counts."""
    from tests._threaded import on_communicators

    n, per_rank = rows(p, width, dtype)
    union = sorted(set().union(*(set(i.tolist()) for i, _ in per_rank)))
    total = None
    for idx, val in per_rank:
        full = np.zeros((n,) + val.shape[1:], dtype)  # +0 where absent
        full[idx] = val
        total = full if total is None else total + full
    want = total[union]
    # settled: the distinct rows some rank holds with a -0 element
    candidates = len({int(i) for idx, val in per_rank
                      for i, v in zip(idx, val.reshape(len(idx), -1))
                      if ((v == 0) & np.signbit(v)).any()})
    for itype in (np.int32, np.int64):
        def fn(comm):
            idx, val = per_rank[comm.rank]
            return dense.dense(comm, idx.astype(itype), val, n, ReduceOp.SUM)

        for (got_i, got_v), log in on_communicators(p, fn):
            assert got_i.dtype == itype and got_i.tolist() == union
            assert got_v.dtype == dtype and _bits(got_v) == _bits(want), (width, itype)
            log = [entry for entry in log if entry[0] != "verb"]
            names = [name for j, (name, _) in enumerate(log) if j == 0 or log[j - 1][0] != name]
            settles = any(np.signbit(v[v == 0]).any() for _, v in per_rank)
            assert names == ["dense.allreduce"] + settles * (
                ["dense.signed_zeros.counts"] + (p > 1) * ["dense.signed_zeros"]
                + bool(candidates) * ["dense.signed_zeros.held"])
            assert log[0][1] == (n * max(width, 1) + 1) * np.dtype(dtype).itemsize
            if settles:
                assert log[-1][1] == 4 * candidates


@pytest.mark.parametrize("numba", ["on", "off"])
@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("width", [0, 4])
def test_large_sums_read_the_union_back_and_leave_the_kept_buffer_minus_zero(monkeypatch, numba,
                                                                             p, width):
    """n above the numba loops' threshold, ranks simulated by threads, 1-D and rows: a small
    union (the numba block scan; rows: the row marks) and a large one (the branch-free numba
    copy; without numba compare + flatnonzero + take, and the next call fills), each twice in
    a row on the same kept buffer; against numpy's sums with +0 for absent entries, bit for
    bit (rows of +0 elements are present), and the kept buffer all -0 (and known to be) after
    each call the numba pass read (or each small union)."""
    from cupycoll.primitives import _accel
    from tests._threaded import on_ranks

    monkeypatch.setenv("CUPYCOLL_NUMBA", numba)
    n, row = 1 << 15, (width,) if width else ()
    for share in (64, 3):  # this rank's nnz = n / share: P x nnz below and above n/8
        inputs = []
        for r in range(p):
            rng = np.random.default_rng([share, r, p])
            idx = np.sort(rng.choice(n, n // share, replace=False))
            val = rng.integers(-8, 9, (idx.size,) + row).astype(np.float32) / 4
            val[::5] = 0.0  # whole rows of +0: present all the same
            inputs.append((idx, val))
        total = np.zeros((n,) + row, np.float32)
        for idx, val in inputs:
            total[idx] += val
        union = np.unique(np.concatenate([i for i, _ in inputs]))

        def fn(comm):
            idx, val = inputs[comm.rank]
            out = []
            for _ in range(2):
                out.append(dense.dense(comm, idx, val, n, ReduceOp.SUM))
                kept = _accel.kept_buffer(n * max(width, 1) + 1, np.float32)
                restored = numba == "on" or union.size <= dense.RESTORE_SHARE * n
                if restored:
                    assert np.signbit(kept).all() and (kept == 0).all()
                assert (_accel._KEPT.filled is not None) == restored
            return out

        for results, _ in on_ranks(p, fn):
            for got_i, got_v in results:
                assert got_i.tolist() == union.tolist()
                assert _bits(got_v) == _bits(total[union]), (share, p)


@pytest.mark.parametrize("width", [0, 3])
def test_local_pass_is_the_union_of_one_rank_and_restores_small_unions(monkeypatch, width):
    """``local_pass`` (the host work ``tune`` times): the union of one rank's indices, for a
    small input and a large one, 1-D and rows: a numba pass either way, after which the kept
    buffer is all -0 and marked (no fill on the next call)."""
    from cupycoll.primitives import _accel

    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    n = 1 << 15
    for share in (64, 2):
        rng = np.random.default_rng([share, width])
        idx = np.sort(rng.choice(n, n // share, replace=False)).astype(np.int32)
        val = rng.standard_normal((idx.size, width) if width else idx.size).astype(np.float32)
        for _ in range(2):
            union = dense.local_pass(idx, val, n)
            assert union.dtype == idx.dtype and union.tolist() == idx.tolist()
            assert _accel._KEPT.filled is not None
            kept = _accel.kept_buffer(n * max(width, 1) + 1, np.float32)
            assert np.signbit(kept).all() and (kept == 0).all()


@pytest.mark.parametrize("p", [1, 2, 5])
def test_dense_output_cost_is_the_values_allreduce_alone(p):
    """``output="dense"`` needs no presence: one allreduce of n*R bytes for every op and dtype."""
    for n, width, vb in ((1000, 0, 4), (7, 3, 8), (1001, 8, 2)):
        for op in ("sum", "avg", "max", "min", "prod"):
            for fv in (True, False):
                shape = Shape(p, n, width, 4, vb, (3,) * p, op=op, float_values=fv,
                              output="dense")
                want = {"dense.allreduce": _allreduce(p, n * vb * max(width, 1))}
                got = _booked(dense.cost(shape, 0))
                assert got == {k: v for k, v in want.items() if v != (0, 0)}


OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("width", [0, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("n", [300, 4000])
def test_dense_result_reduces_zero_filled_inputs(p, width, dtype, n):
    """``dense_result`` on simulated ranks, five calls in a row (new indices each time, ops
    alternating, into the same garbage-filled ``out`` or a new array): numpy's reduction of the
    zero-filled inputs in rank order, bit for bit; one allreduce of n*R bytes."""
    from tests._threaded import on_ranks

    row = (width,) if width else ()
    calls = []
    for call, op in enumerate(["sum", "max", "sum", "prod", "min"]):
        inputs = []
        for r in range(p):
            rng = np.random.default_rng([call, r, p, width])
            idx = np.sort(rng.choice(n, 40 + 30 * r, replace=False)).astype(np.int32)
            inputs.append((idx, rng.integers(-6, 7, (idx.size,) + row).astype(dtype)))
        want = None
        for idx, val in inputs:
            full = np.zeros((n,) + row, dtype)
            full[idx] = val
            want = full if want is None else OPS[op](want, full)
        calls.append((op, inputs, want))

    def fn(comm):
        got, out = [], np.full((n,) + row, 9, dtype)
        for k, (op, inputs, _) in enumerate(calls):
            result = dense.dense_result(comm, *inputs[comm.rank], n, ReduceOp(op),
                                        out if k % 2 else None)
            assert result is out if k % 2 else result is not out
            got.append(result.copy())
        return got

    for got, log in on_ranks(p, fn):
        for result, (op, _, want) in zip(got, calls):
            assert result.dtype == dtype and _bits(result.reshape(-1)) == _bits(
                want.reshape(-1)), op
        assert log == [("dense.allreduce", n * max(width, 1) * np.dtype(dtype).itemsize)] * 5
