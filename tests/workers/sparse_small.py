"""Small sparse_allreduce calls that finish in the validation allreduce (cupycoll/sparse/small.py).

Usage: sparse_small.py SEED [emulated]   (emulated: init("nccl") on cupycoll.testing.emulation)

Every rank rebuilds every rank's input from the seed and checks its result against a dense numpy
reference (absent entries count as +0; small integer values, so sums and products are exact in
every dtype; a +0/-0 tie gives +0 for max and -0 for min; NaN where any term is NaN), bitwise
against algorithm="allgather" (the same merge), and bitwise across ranks. A fused call must run
ONE collective (the validation, booked as its cost model says); a call whose entries overflow
the slot on one rank only takes the normal path. Bad input on one rank raises on every rank,
mismatched n / dtype / op raise MismatchError everywhere, and the communicator stays usable.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from _common import assert_identical_across_ranks, emulation, expect_raises, host, rng_for, unique
from mpi4py import MPI

SEED = int(sys.argv[1])
emu = emulation(sys.argv)
EMULATED = emu is not None

import cupycoll as cc  # noqa: E402
from cupycoll import _agreement  # noqa: E402
from cupycoll.errors import InvalidArgument, InvalidType, MismatchError  # noqa: E402
from cupycoll.sparse._common import native_drops_nan, native_keeps_minus_zero  # noqa: E402
from cupycoll.sparse._cost import Shape  # noqa: E402
from cupycoll.sparse.auto import call_cost  # noqa: E402
from cupycoll.sparse.small import fits  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
SPECIAL = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf])


def inputs_of(case: int, n: int, nnz, dtype: str, width: int, itype: str, special: bool):
    """Every rank's (indices, values): unsorted with duplicates, small integers (+ specials)."""
    out = []
    for r in range(P):
        rng = rng_for(SEED, r, case)
        k = nnz(r)
        idx = rng.integers(0, n, k).astype(itype)
        shape = (k, width) if width else (k,)
        val = rng.integers(-3, 4, shape).astype(np.float64)
        if special and k:
            flat = val.reshape(-1)
            hit = rng.random(flat.size) < 0.3
            flat[hit] = rng.choice(SPECIAL, int(hit.sum()))
        out.append((idx, val.astype(dtype)))
    return out


def _tie(total, dense, op):
    """max/min of float arrays with numpy, then the documented +0/-0 tie rule."""
    ufunc = np.maximum if op == "max" else np.minimum
    both_zero = (total == 0) & (dense == 0)
    out = ufunc(total, dense)
    if op == "max":  # +0 unless both are -0
        out[both_zero] = np.where(np.signbit(total) & np.signbit(dense), -0.0, 0.0)[both_zero]
    else:  # -0 if either is -0
        out[both_zero] = np.where(np.signbit(total) | np.signbit(dense), -0.0, 0.0)[both_zero]
    return out


def reference(inputs, n: int, op: str, dtype: str, acc: str | None):
    """(union indices, reduced rows in dtype) with numpy, absent = +0, left fold in rank order."""
    width = inputs[0][1].shape[1:] if inputs[0][1].ndim == 2 else ()
    union = unique(np.concatenate([i for i, _ in inputs]).astype(np.int64))
    acc_dt = np.dtype(acc or dtype)
    work = np.float64 if acc_dt.kind == "f" else np.int64
    total = None
    for idx, val in inputs:
        dense = np.zeros((n,) + width, work)
        seen = np.zeros(n, bool)
        for i, v in zip(idx.tolist(), val.astype(work)):
            if not seen[i]:
                dense[i], seen[i] = v, True
            elif op in ("sum", "avg"):
                dense[i] = dense[i] + v
            elif op == "prod":
                dense[i] = dense[i] * v
            else:
                dense[i] = _tie(np.atleast_1d(dense[i]), np.atleast_1d(v), op).reshape(dense[i].shape)
        if total is None:
            total = dense
        elif op in ("sum", "avg"):
            total = total + dense
        elif op == "prod":
            total = total * dense
        else:
            total = _tie(total, dense, op) if work == np.float64 else \
                (np.maximum if op == "max" else np.minimum)(total, dense)
    rows = total[union].astype(acc_dt)
    if op == "avg":
        rows = rows / acc_dt.type(P) if acc_dt.kind == "f" else \
            np.trunc(rows / P).astype(acc_dt)
    return union, rows.astype(dtype)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        if not np.array_equal(nan, np.isnan(b)):
            return False
        return a[~nan].tobytes() == b[~nan].tobytes()
    return a.tobytes() == b.tobytes()


def run_case(comm, xp, case: int, n: int, nnz, op: str, dtype: str, width: int, itype: str,
             acc=None, special=False, expect_fused=None, **kw):
    inputs = inputs_of(case, n, nnz, dtype, width, itype, special)
    idx, val = (xp.asarray(a) for a in inputs[RANK])
    comm.stats.reset()
    with np.errstate(all="ignore"):
        res = cc.sparse_allreduce(idx, val, n, op=op, comm=comm, accumulate_dtype=acc, **kw)
    got_i, got_v = host(res.indices), host(res.values)
    stats = {o: (s.bytes_received, s.messages_received) for o, s in comm.stats.by_op.items()
             if s.bytes_received or s.messages_received}
    coalesced = [unique(i) for i, _ in inputs]
    shape = dataclasses.replace(  # with the backend's native traits, as the call saw them
        Shape.from_inputs(coalesced, n, width, np.dtype(itype).itemsize,
                          np.dtype(acc or dtype).itemsize),
        native_minmax_drops_nan=native_drops_nan(comm),
        native_sum_keeps_minus_zero=native_keeps_minus_zero(comm))
    fused = fits(shape)
    assert expect_fused is None or fused == expect_fused, (case, fused, expect_fused)
    model = call_cost("auto", shape, RANK)
    assert stats == {o: (model.received[o], model.messages[o]) for o in model.received}, \
        (case, stats, model)
    if fused:
        assert set(stats) <= {"sparse.validate"}, (case, stats)
    (ran,) = comm.stats.calls  # the call is counted once, by the algorithm auto resolved to
    assert ran[0] == "sparse_allreduce" and comm.stats.calls[ran] == 1, comm.stats.calls
    assert (ran[1] == "small") == fused and ran[1] in {"small", *cc.algorithms("sparse")}, ran
    assert ran[2].split("+")[0] in ("coo", "compact"), ran
    assert len(set(MPI.COMM_WORLD.allgather(ran))) == 1, ran  # agreed: the same on every rank
    with np.errstate(all="ignore"):
        ref_i, ref_v = reference(inputs, n, op, dtype, acc)
    assert got_i.dtype == np.dtype(itype) and np.array_equal(got_i, ref_i), (case, got_i, ref_i)
    assert same_bits(got_v, ref_v), (case, op, dtype, got_v, ref_v)
    with np.errstate(all="ignore"):
        other = cc.sparse_allreduce(idx, val, n, op=op, comm=comm, accumulate_dtype=acc,
                                    algorithm="allgather", **kw)
    assert same_bits(host(other.values), got_v) and np.array_equal(host(other.indices), got_i)
    assert sum(c for (_, name, _), c in comm.stats.calls.items() if name == "allgather") == \
        1 + (ran[1] == "allgather"), comm.stats.calls
    assert_identical_across_ranks(got_i, got_v)
    return fused


def semantics(comm, xp) -> int:
    checks, fused_runs = 0, 0
    case = 0
    for dtype, acc in (("float32", None), ("float64", None), ("float16", "float32"),
                       ("int32", None), ("int64", None)):
        for op in ("sum", "prod", "max", "min", "avg"):
            for width, itype in ((0, "int32"), (3, "int64")):
                case += 1
                special = dtype.startswith("float") and op != "avg"
                fused_runs += run_case(comm, xp, case, 50, lambda r: 3 + (r * 5) % 9, op, dtype,
                                       width, itype, acc, special=special,
                                       expect_fused=width == 0 or P <= 4)
                checks += 1
    # empty ranks, all empty, and one rank overflowing its slot while the others are tiny
    run_case(comm, xp, 900, 40, lambda r: 0 if r % 2 else 4, "sum", "float32", 0, "int64",
             expect_fused=True)
    run_case(comm, xp, 901, 40, lambda r: 0, "max", "float32", 0, "int32", expect_fused=True)
    big = 8 * _agreement.slot_words(P) + 1 if _agreement.slot_words(P) else 5
    run_case(comm, xp, 902, 10**6, lambda r: big if r == P - 1 else 3, "sum", "float32", 0,
             "int64", expect_fused=False)
    run_case(comm, xp, 903, 10**6, lambda r: big if r == 0 else 3, "min", "int64", 0, "int32",
             expect_fused=False)
    # one int32 index and a float32 row of 2(w - 1) elements fill a slot of w words exactly
    # (the index padded to one word); one element more pads to a word over
    words = _agreement.slot_words(P)
    for width, fused in ((2 * (words - 1), True), (2 * words - 1, False)):
        run_case(comm, xp, 905, 100, lambda r: 1, "sum", "float32", width, "int32",
                 expect_fused=fused)
    # wire keywords: the same bits as allgather with the same keywords (rounded values too)
    for kw in ({"wire": "compact"}, {"wire_values": "bfloat16"}, {"wire_values": "float16"}):
        run_wire(comm, xp, 904, kw)
    return checks + 4 + 2 + 3, fused_runs


def run_wire(comm, xp, case, kw):
    inputs = inputs_of(case, 300, lambda r: 7 + r, "float32", 0, "int32", False)
    rng = rng_for(SEED, RANK, case, 1)
    idx = xp.asarray(inputs[RANK][0])
    val = xp.asarray((inputs[RANK][1] + rng.random(inputs[RANK][1].size)).astype(np.float32))
    comm.stats.reset()
    a = cc.sparse_allreduce(idx, val, 300, comm=comm, **kw)
    assert set(comm.stats.by_op) <= {"sparse.validate"}, comm.stats.by_op
    b = cc.sparse_allreduce(idx, val, 300, comm=comm, algorithm="allgather", **kw)
    assert same_bits(host(a.values), host(b.values)), (kw, host(a.values), host(b.values))
    assert np.array_equal(host(a.indices), host(b.indices))
    assert_identical_across_ranks(host(a.indices), host(a.values))


def delivery(comm, xp) -> None:
    """async_op, alloc_fn and completion_fn on a fused call: the same result, delivered."""
    idx = xp.asarray(np.array([RANK, 7, 3], np.int64))
    val = xp.asarray(np.array([1.0, 2.0, 3.0], np.float32))
    want = cc.sparse_allreduce(idx, val, 16, comm=comm)
    seen = []
    work = cc.sparse_allreduce(idx, val, 16, comm=comm, async_op=True,
                               completion_fn=lambda i, v, ctx: seen.append((host(i).copy(),
                                                                            host(v).copy(), ctx)),
                               fn_ctx="ctx")
    got = work.wait()
    assert work.is_completed() and len(seen) == 1 and seen[0][2] == "ctx"
    for res_i, res_v in ((got.indices, got.values), seen[0][:2]):
        assert np.array_equal(host(res_i), host(want.indices))
        assert same_bits(host(res_v), host(want.values))
    bufs = {}

    def alloc(nnz, itype, vshape, vtype, ctx):
        bufs["b"] = (xp.zeros(nnz, itype), xp.zeros(vshape, vtype))
        return bufs["b"]

    res = cc.sparse_allreduce(idx, val, 16, comm=comm, alloc_fn=alloc)
    assert res.indices is bufs["b"][0] and same_bits(host(res.values), host(want.values))


def errors(comm, xp) -> None:
    """Bad input on one rank: every rank raises; mismatches: MismatchError everywhere."""
    bad = P - 1
    idx = xp.asarray(np.array([1, 2], np.int64))
    val = xp.asarray(np.array([1.0, 2.0], np.float32))
    own = xp.asarray(np.array([1, 99], np.int64)) if RANK == bad else idx
    exc = expect_raises(InvalidArgument, cc.sparse_allreduce, own, val, 10, comm=comm)
    assert str(bad) in str(exc), exc
    odd = xp.asarray(np.array([1, 2], np.uint8)) if RANK == bad else idx
    expect_raises(InvalidType, cc.sparse_allreduce, odd, val, 10, comm=comm)
    if P > 1:
        expect_raises(MismatchError, cc.sparse_allreduce, idx, val, 10 + (RANK == bad),
                      comm=comm)
        other = val.astype(np.float64) if RANK == bad else val
        expect_raises(MismatchError, cc.sparse_allreduce, idx, other, 10, comm=comm)
        expect_raises(MismatchError, cc.sparse_allreduce, idx, val, 10,
                      op="max" if RANK == bad else "sum", comm=comm)
        expect_raises(MismatchError, cc.sparse_allreduce, idx, val, 10,
                      algorithm="allgather" if RANK == bad else None, comm=comm)
    res = cc.sparse_allreduce(idx, val, 10, comm=comm)  # still usable, in step
    assert np.array_equal(host(res.values), np.full(2, P, np.float32) * [1, 2])


def main() -> None:
    comm = cc.init("nccl" if EMULATED else "mpi")
    xp = comm.xp
    checks, fused = semantics(comm, xp)
    delivery(comm, xp)
    errors(comm, xp)
    if EMULATED:
        emu.check_logs()
    if RANK == 0:
        print(f"ok small calls: {checks} cases ({fused} fused) on {P} ranks"
              + (" (emulated nccl)" if EMULATED else ""))


if __name__ == "__main__":
    main()
