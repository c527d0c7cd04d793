"""Every dense collective x op x dtype x size x root, in-place and out-of-place, vs numpy."""

from __future__ import annotations

import functools
import sys

import numpy as np
from _common import assert_identical_across_ranks, rng_for

import cupycoll as cc

OPS = ["sum", "prod", "max", "min", "avg"]
DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "int64", "uint32", "uint64"]
SIZES = [0, 1, 7, 1000, 65537]


#: from this many elements a rank's input is a rotation of one random array per case (every
#: rank rebuilds every rank's input: one draw per case instead of P keeps P = 8 affordable).
ROTATED_FROM = 4096
#: rank r's rotated input is the case's draw rolled by ``SHIFT * r``
SHIFT = 7919


def make(seed: int, rank: int, dtype: str, count: int, op: str) -> np.ndarray:
    """``rank``'s input of a case: its own draw, or above :data:`ROTATED_FROM` elements the
    case's draw rotated by a rank-dependent offset (each position still sees P values)."""
    if count < ROTATED_FROM:
        return _draw(seed, rank, dtype, count, op)
    return np.roll(_draw(seed, 0, dtype, count, op), SHIFT * rank)


@functools.lru_cache(maxsize=4)
def _draw(seed: int, rank: int, dtype: str, count: int, op: str) -> np.ndarray:
    rng = rng_for(seed, rank, DTYPES.index(dtype), count, OPS.index(op))
    dt = np.dtype(dtype)
    if dt.kind == "f":
        lo, hi = (0.5, 1.5) if op == "prod" else (-4.0, 4.0)
        out = rng.uniform(lo, hi, count).astype(dt)
    else:
        lo, hi = (0, 3) if dt.kind == "u" else (-3, 4)
        if op == "prod":
            lo, hi = (max(lo, -2), 3)
        out = rng.integers(lo, hi, count).astype(dt)
    out.flags.writeable = False  # cached: callers copy before writing
    return out


def reference(inputs: list[np.ndarray], op: str) -> np.ndarray:
    """Independent reduction: wide accumulation (float64, int64) folded rank by rank, then
    NCCL's rounding/wrapping/truncation."""
    dt, p = inputs[0].dtype, len(inputs)
    total = inputs[0].astype({"f": np.float64, "u": np.uint64}.get(dt.kind, np.int64))
    fold = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum,
            "min": np.minimum}[op]
    for a in inputs[1:]:
        fold(total, a, out=total)
    if op == "avg":
        total = total / p if dt.kind == "f" else np.trunc(total / p).astype(np.int64)
    if dt.kind != "f":
        total = total.astype(dt)  # wraps like C integer arithmetic
    return total.astype(dt)


def block(seed: int, rank: int, dtype: str, count: int, op: str, part: slice) -> np.ndarray:
    """``make(seed, rank, dtype, count, op)[part]`` without building another rank's whole input
    (a reduce_scatter's reference needs one block of each rank's input)."""
    if count < ROTATED_FROM:
        return _draw(seed, rank, dtype, count, op)[part]
    positions = (np.arange(part.start, part.stop) - SHIFT * rank) % count  # np.roll's inverse
    return _draw(seed, 0, dtype, count, op)[positions]


def roots(p: int, case: int) -> tuple[int, ...]:
    """The roots a rooted case runs with: every rank up to P = 4; beyond, two roots per case,
    turning over the ranks from case to case (every root is still taken, every case run; the
    full case x root product at P = 8 is most of the launch's time on two cores)."""
    if p <= 4:
        return tuple(range(p))
    first = 2 * case % p
    return first, (first + 1) % p


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape)
    if want.dtype.kind == "f":
        tol = {"float16": 4e-3, "float32": 1e-5, "float64": 1e-12}[want.dtype.name]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def nan_and_signed_zero(rank: int, p: int) -> int:
    """Float max/min: NaN on one rank propagates, a +0/-0 tie has one answer, on every rank.

    (MPI's built-in MAX/MIN depend on the operand order, which differs between ranks.)
    """
    def row(r: int, dtype: str) -> np.ndarray:
        return np.array([np.nan if r == 0 else 1.0, np.nan if r == p - 1 else 2.0 + r,
                         -0.0 if r % 2 else 0.0, 0.0 if r == p - 1 else -0.0, 3.0], dtype)

    cases = 0
    for dtype in ("float16", "float32", "float64"):
        for op, fn in (("max", np.max), ("min", np.min)):
            stack = np.stack([row(r, dtype) for r in range(p)])
            want = fn(stack, axis=0)  # a zero tie: -0 for min if any -0, +0 for max if any +0
            negative = np.signbit(stack).any(0) if op == "min" else np.signbit(stack).all(0)
            want[want == 0] = np.where(negative, -0.0, 0.0)[want == 0]
            got = cc.allreduce(row(rank, dtype), op=op)
            assert got.tobytes() == want.tobytes(), (dtype, op, got, want)
            got = cc.reduce(row(rank, dtype), root=p - 1, op=op)
            assert rank != p - 1 or got.tobytes() == want.tobytes(), (dtype, op, got, want)
            got = cc.reduce_scatter(np.tile(row(rank, dtype), p), op=op)
            assert got.tobytes() == want.tobytes(), (dtype, op, got, want)
            # past the fold's blocks (2**18 elements): the rows again, across a block's edge
            long = np.tile(row(rank, dtype), 120_001)[3:]
            got = cc.allreduce(long, op=op)
            assert got.tobytes() == np.tile(want, 120_001)[3:].tobytes(), (dtype, op)
            cases += 4
    # a NaN made by the sum (inf - inf, or inf + NaN, in each rank's own order): numpy's NaN
    # bits on every rank where the result passes through a rounding or a division
    values = [np.inf, -np.inf, 1.0, np.nan, 1.0]
    for dtype, op in (("float16", "sum"), ("float16", "avg"), ("float32", "avg"),
                      ("float64", "avg")):
        got = cc.allreduce(np.array([values[rank % 5], 1.0], dtype), op=op)
        nan = np.array(np.nan, dtype)
        assert p == 1 or got[:1].tobytes() == nan.tobytes(), (dtype, op, got.tobytes())
        cases += 1
    # NaNs of other bits on some ranks (x86's inf - inf has the sign set): max and min, and avg
    # through the pairwise reduce and reduce-scatter (>= 256 KiB), give numpy's NaN everywhere
    with np.errstate(invalid="ignore"):
        signed = np.float64(np.inf) - np.float64(np.inf)
    for dtype in ("float16", "float32", "float64"):
        nan = np.array(np.nan, dtype)
        for op in ("max", "min"):
            got = cc.allreduce(np.array([signed if rank % 2 else np.nan, 1.0], dtype), op=op)
            assert got[:1].tobytes() == nan.tobytes(), (dtype, op, got.tobytes())
            cases += 1
    big = np.ones(300_000, np.float32)
    big[0] = np.inf if rank % 2 else -np.inf  # inf - inf in each rank's order of operands
    big[1] = signed if rank == 0 else 1.0
    nan = np.array(np.nan, np.float32).tobytes() * 2
    got = cc.reduce(big, root=p - 1, op="avg")
    assert rank != p - 1 or p == 1 or got[:2].tobytes() == nan, got[:2].tobytes()
    got = cc.reduce_scatter(np.tile(big[:2], p * 70_000), op="avg")
    assert p == 1 or got[:2].tobytes() == nan, got[:2].tobytes()
    return cases + 2


def aliased_out(rank: int, p: int) -> int:
    """``out`` that is another view of x is in place (pointers equal, as NCCL decides); ``out``
    overlapping x partially still reads all of x first (MPI forbids aliased buffers)."""
    inputs = [np.arange(8, dtype=np.float32) * (r + 1) for r in range(p)]
    want = np.sum(inputs, axis=0)
    b = inputs[rank].copy()
    cc.allreduce(b[:4], out=b[:4][...])
    assert np.array_equal(b[:4], want[:4]) and np.array_equal(b[4:], inputs[rank][4:])
    b = inputs[rank].copy()
    got = cc.reduce(b, root=p - 1, out=b.view() if rank == p - 1 else None)
    assert rank != p - 1 or np.array_equal(b, want) and np.shares_memory(got, b), got
    b = inputs[rank].copy()
    cc.allreduce(b[0:4], out=b[2:6], op="max")
    assert np.array_equal(b[2:6], np.max(inputs, axis=0)[0:4]), b
    b = inputs[rank].copy()
    if rank == 0:
        cc.reduce(b[1:5], root=0, out=b[0:4])
        assert np.array_equal(b[0:4], want[1:5]), b
    else:
        cc.reduce(b[1:5], root=0)
    return 4


def staged_blocks_reused(rank: int, p: int) -> int:
    """In-place reduce_scatter on MPI receives the block apart (aliased buffers) into staging
    buffers the communicator reuses from 64 KiB: two asynchronous calls in flight at once get
    two buffers (waited in reverse order), later calls of other dtypes and sizes reuse them;
    every result against numpy, nothing outside the block written."""
    count = 40_000  # float32: 160 KB blocks
    xs = [np.arange(count * p, dtype=np.float32) * (rank + 1 + k) for k in range(2)]
    keep = [x.copy() for x in xs]
    outs = [x[rank * count:(rank + 1) * count] for x in xs]
    works = [cc.reduce_scatter(x, out=o, async_op=True) for x, o in zip(xs, outs)]
    for k in (1, 0):
        works[k].wait()
        base = np.arange(count * p, dtype=np.float32)[rank * count:(rank + 1) * count]
        assert np.array_equal(outs[k], base * sum(r + 1 + k for r in range(p))), k
        rest = np.ones(count * p, bool)
        rest[rank * count:(rank + 1) * count] = False
        assert np.array_equal(xs[k][rest], keep[k][rest])
    for dtype, n in (("float64", 30_000), ("int32", 70_000), ("float32", 20_000)):
        x = np.full(n * p, rank + 1, dtype)
        out = x[rank * n:(rank + 1) * n]
        cc.reduce_scatter(x, out=out, op="max")
        assert (out == p).all() and (np.delete(x, np.s_[rank * n:(rank + 1) * n]) == rank + 1).all()
    return 5


def polled_completion(rank: int, p: int) -> int:
    """An async call polled with ``is_completed()`` alone has its whole result in ``out`` once
    that says True: float16's rounding, avg's division and the copy back included."""
    import time

    cases = 0
    for dtype, op, n in (("float16", "sum", 5), ("float32", "avg", 5), ("int32", "avg", 70_000),
                         ("uint64", "max", 3)):
        inputs = [np.full(n, 2 * (r + 1), dtype) for r in range(p)]
        out = np.zeros(n, dtype)
        work = cc.allreduce(inputs[rank], op, out=out, async_op=True)
        while not work.is_completed():
            time.sleep(1e-4)
        check(out.copy(), reference(inputs, op), f"polled {dtype} {op}")
        assert work.wait() is out
        cases += 1
    return cases


def bad_numba_setting(rank: int, p: int) -> int:
    """A bad CUPYCOLL_NUMBA on every rank: a float max/min/avg (whose MPI op or division reads
    it) raises InvalidArgument naming it and the rank before anything is posted, never a fatal
    error inside MPI's callback; the communicator works on once it is fixed."""
    import os

    from cupycoll.errors import InvalidArgument

    x = np.arange(20_000, dtype=np.float64) * (rank + 1)
    # reduce and reduce_scatter past the thresholds: pairwise (float64, blocks of numba's size
    # on some ranks only) and as an allreduce (float16, where only the root divides an avg)
    big = np.arange(40_000 * p, dtype=np.float64) % 1000 * (rank + 1)
    half = (np.arange(160_000) % 7).astype(np.float16)
    calls = [(f"allreduce {op}", lambda op=op: cc.allreduce(x, op)) for op in ("max", "min", "avg")]
    calls += [(f"reduce {op} root {root} {a.dtype}", lambda op=op, root=root, a=a: cc.reduce(
        a, root, op)) for op in ("max", "avg") for root in {0, p - 1} for a in (big, half)]
    calls += [(f"reduce_scatter {op}", lambda op=op: cc.reduce_scatter(big, op))
              for op in ("max", "avg")]
    # allreduce past CUPYCOLL_ALLREDUCE_PAIRWISE (2 MiB): pairwise where P is not a power of two
    large = np.arange(300_000, dtype=np.float64) * (rank + 1)
    calls += [(f"allreduce {op} 2.4 MB", lambda op=op: cc.allreduce(large, op))
              for op in ("max", "avg")]
    os.environ["CUPYCOLL_NUMBA"] = "maybe"
    try:
        for label, call in calls:
            try:
                call()
            except InvalidArgument as exc:
                assert exc.argument == "CUPYCOLL_NUMBA" and exc.rank == rank, (label, exc)
            else:
                raise AssertionError(f"{label}: no InvalidArgument")
    finally:
        del os.environ["CUPYCOLL_NUMBA"]
    check(cc.allreduce(x, "max"), x / (rank + 1) * p, "max after the setting is fixed")
    got = cc.reduce(big, 0, "max")  # nothing of the refused calls was left posted
    if rank == 0:
        check(got, big * p, "reduce max after the setting is fixed")
    return len(calls)


def communicator_with(name: str, value: str, **more: str):
    """An MPI communicator created while the setting ``name`` is ``value`` (and every setting
    in ``more``; it reads them then)."""
    import os

    from cupycoll.comm.mpi import MPICommunicator

    settings = {name: value, **more}
    os.environ.update(settings)
    try:
        return MPICommunicator()
    finally:
        for key in settings:
            del os.environ[key]


def matrix(seed: int, p: int):
    """Every (dtype, op, count) of the matrix with every rank's input and numpy's reduction."""
    for dtype in DTYPES:
        for op in OPS:
            for count in SIZES:
                inputs = [make(seed, r, dtype, count, op) for r in range(p)]
                yield dtype, op, count, inputs, reference(inputs, op)


def reduce_as_allreduce(seed: int, rank: int, p: int) -> int:
    """``reduce`` run as an allreduce (CUPYCOLL_REDUCE_AS_ALLREDUCE=0: every size): every dtype,
    op, size and root against numpy, in place and async; off the root neither the input nor a
    given ``out`` is written, and the result went through the pooled scratch buffer there."""
    comm = communicator_with("CUPYCOLL_REDUCE_AS_ALLREDUCE", "0", CUPYCOLL_REDUCE_PAIRWISE="off")
    cases = 0
    for turn, (dtype, op, count, inputs, want) in enumerate(matrix(seed + 3, p)):
        for root in roots(p, turn):
            x = inputs[rank].copy()
            got = cc.reduce(x, root=root, op=op, comm=comm)
            assert np.array_equal(x, inputs[rank]), "reduce wrote its input"
            if rank == root:
                check(got, want, f"reduce as allreduce {dtype} {op} {count} r{root}")
            else:
                assert got is None
            mine = x.copy()
            work = cc.reduce(mine, root=root, op=op, comm=comm, out=mine, async_op=True)
            work.wait()
            if rank == root:
                check(mine, want, f"reduce as allreduce in place {dtype} {op} {count}")
            else:  # off the root ``out`` is not the result's: left as it was
                assert np.array_equal(mine, inputs[rank]), "reduce wrote out off root"
            cases += 2
    if p > 1 and rank != 0:  # a 64 KiB+ result off the root went to a pooled scratch buffer
        assert comm._spare, "reduce did not run as an allreduce off the root"
    return cases


def nan_and_zero_cases(p: int):
    """(dtype, op, every rank's row, the reduction's bits) of max and min over rows holding a
    NaN (it wins) and +0/-0 ties (one answer: -0 for min where any rank has it, +0 for max
    unless every rank has -0), float32 and float64."""
    for dtype in ("float32", "float64"):
        for op, fn in (("max", np.max), ("min", np.min)):
            rows = [np.array([np.nan if r == 0 else 1.0, -0.0 if r % 2 else 0.0,
                              0.0 if r == p - 1 else -0.0, 2.0 + r] * p, dtype)
                    for r in range(p)]
            stack = np.stack(rows)
            want = fn(stack, axis=0)
            negative = np.signbit(stack).any(0) if op == "min" else np.signbit(stack).all(0)
            want[want == 0] = np.where(negative, -0.0, 0.0)[want == 0]
            yield dtype, op, rows, want


def pairwise_reduce(seed: int, rank: int, p: int) -> int:
    """``reduce`` as a pairwise reduce-scatter and a gather (CUPYCOLL_REDUCE_PAIRWISE=0: every
    size, P near-equal blocks): every dtype, op and size (the root rotating over the ranks)
    against numpy, in place, async, and into an ``out`` overlapping the input (staged); off
    the root neither the input nor a given ``out`` is written; float sums equal a fold in rank
    order bit for bit; NaN and +-0 as the native path; the scratch went back to the pool."""

    comm = communicator_with("CUPYCOLL_REDUCE_PAIRWISE", "0")
    cases = 0
    for dtype, op, count, inputs, want in matrix(seed + 7, p):
        root = cases // 3 % p  # every root in turn over the cases
        at_root = rank == root
        x = inputs[rank].copy()
        got = cc.reduce(x, root=root, op=op, comm=comm)
        assert np.array_equal(x, inputs[rank]), "reduce wrote its input"
        if at_root:
            check(got, want, f"pairwise reduce {dtype} {op} {count} r{root}")
            if op == "sum" and dtype in ("float32", "float64"):
                in_order = functools.reduce(np.add, inputs)
                assert got.tobytes() == in_order.tobytes(), "not a rank-order fold"
        else:
            assert got is None
        mine = x.copy()
        cc.reduce(mine, root=root, op=op, comm=comm, out=mine, async_op=True).wait()
        if at_root:
            check(mine, want, f"pairwise reduce in place {dtype} {op} {count}")
        else:  # off the root ``out`` is not the result's: left as it was
            assert np.array_equal(mine, inputs[rank]), "reduce wrote out off root"
        both = np.concatenate([inputs[rank], np.full(1, 7, dtype)])
        cc.reduce(both[:count], root=root, op=op, comm=comm, out=both[1:])
        if at_root:  # an ``out`` overlapping the input: staged
            check(both[1:], want, f"pairwise reduce overlapping {dtype} {op} {count}")
        else:
            assert np.array_equal(both[:count], inputs[rank]) and both[-1] == 7
        cases += 3
    for dtype, op, rows, want in nan_and_zero_cases(p):
        got = cc.reduce(rows[rank], root=p - 1, op=op, comm=comm)
        if rank == p - 1:
            assert got.tobytes() == want.tobytes(), (dtype, op, got, want)
        cases += 1
    if p > 1:  # the largest case's scratch went back to the pool
        assert comm._spare, "reduce did not run as a pairwise exchange"
    return cases


def pairwise_allreduce(seed: int, rank: int, p: int) -> int:
    """``allreduce`` as a pairwise reduce-scatter and an allgather (CUPYCOLL_ALLREDUCE_PAIRWISE=0:
    every size, where P is not a power of two; elsewhere MPI's own): every dtype, op and size
    against numpy, the same bits on every rank, in place, async, into an ``out`` overlapping
    the input (staged) and from a strided input; float sums equal a fold in rank order bit for
    bit; NaN and +-0 as the native path; the scratch went back to the pool."""

    comm = communicator_with("CUPYCOLL_ALLREDUCE_PAIRWISE", "0")
    pairwise = p & (p - 1) != 0
    cases = 0
    for dtype, op, count, inputs, want in matrix(seed + 9, p):
        x = inputs[rank].copy()
        got = cc.allreduce(x, op=op, comm=comm)
        assert np.array_equal(x, inputs[rank], equal_nan=True), "allreduce wrote its input"
        check(got, want, f"pairwise allreduce {dtype} {op} {count}")
        assert_identical_across_ranks(got)
        if pairwise and op == "sum" and dtype in ("float32", "float64"):
            in_order = functools.reduce(np.add, inputs)
            assert got.tobytes() == in_order.tobytes(), "not a rank-order fold"
        cc.allreduce(x, op=op, comm=comm, out=x, async_op=True).wait()
        check(x, want, f"pairwise allreduce in place {dtype} {op} {count}")
        both = np.concatenate([inputs[rank], np.full(1, 7, dtype)])
        cc.allreduce(both[:count], op=op, comm=comm, out=both[1:])
        check(both[1:], want, f"pairwise allreduce overlapping {dtype} {op} {count}")
        strided = np.repeat(inputs[rank], 2)[::2]
        check(cc.allreduce(strided, op=op, comm=comm), want,
              f"pairwise allreduce strided {dtype} {op} {count}")
        cases += 4
    for dtype, op, rows, want in nan_and_zero_cases(p):
        got = cc.allreduce(rows[rank], op=op, comm=comm)
        assert got.tobytes() == want.tobytes(), (dtype, op, got, want)
        cases += 1
    if pairwise:  # the largest case's scratch went back to the pool
        assert comm._spare, "allreduce did not run as a pairwise exchange"
    return cases


def pairwise_reduce_scatter(seed: int, rank: int, p: int) -> int:
    """``reduce_scatter`` as a pairwise exchange (CUPYCOLL_REDUCE_SCATTER_PAIRWISE=0: every
    size): every dtype, op and size against numpy, into ``out``, in place (nothing outside the
    block written), async, and with buffers that differ between ranks (the first block as
    ``out``: in place on rank 0 only; a strided input), which the exchange stages; float sums equal a fold in rank order bit for bit; NaN and +-0
    as the native path; a 64 KiB+ block's scratch went back to the pool."""

    comm = communicator_with("CUPYCOLL_REDUCE_SCATTER_PAIRWISE", "0")
    cases = 0
    for dtype in DTYPES:
        for op in OPS:
            for count in SIZES:
                mine = slice(rank * count, (rank + 1) * count)
                blocks = [block(seed + 5, r, dtype, count * p, op, mine) for r in range(p)]
                want = reference(blocks, op)
                own = make(seed + 5, rank, dtype, count * p, op)
                x = own.copy()
                got = cc.reduce_scatter(x, op=op, comm=comm)
                check(got, want, f"pairwise reduce_scatter {dtype} {op} {count}")
                assert np.array_equal(x, own), "reduce_scatter wrote its input"
                if op == "sum" and dtype in ("float32", "float64"):
                    in_order = functools.reduce(np.add, blocks)
                    assert got.tobytes() == in_order.tobytes(), "not folded in rank order"
                out = np.full(count, 7, dtype)
                cc.reduce_scatter(x, op=op, comm=comm, out=out, async_op=True).wait()
                check(out, want, f"pairwise reduce_scatter async out {dtype} {op} {count}")
                cc.reduce_scatter(x, op=op, comm=comm, out=x[mine])
                check(x[mine], want, f"pairwise reduce_scatter in place {dtype} {op} {count}")
                rest = np.ones(x.shape[0], bool)
                rest[mine] = False
                assert np.array_equal(x[rest], own[rest]), "wrote outside the block"
                # the first block as out: in place on rank 0, a partial overlap elsewhere,
                # and a strided input: each rank's buffers alike or not, one exchange (staged)
                x = own.copy()
                cc.reduce_scatter(x, op=op, comm=comm, out=x[:count])
                check(x[:count], want, f"pairwise reduce_scatter first block {dtype} {op}")
                strided = np.repeat(own, 2)[::2]  # own, not contiguous
                got = cc.reduce_scatter(strided, op=op, comm=comm)
                check(got, want, f"pairwise reduce_scatter strided input {dtype} {op}")
                cases += 5
    for dtype in ("float32", "float64"):  # NaN wins, a +0/-0 tie has one answer
        for op, fn in (("max", np.max), ("min", np.min)):
            rows = [np.array([np.nan if r == 0 else 1.0, -0.0 if r % 2 else 0.0,
                              0.0 if r == p - 1 else -0.0, 2.0 + r], dtype) for r in range(p)]
            stack = np.stack(rows)
            want = fn(stack, axis=0)
            negative = np.signbit(stack).any(0) if op == "min" else np.signbit(stack).all(0)
            want[want == 0] = np.where(negative, -0.0, 0.0)[want == 0]
            got = cc.reduce_scatter(np.tile(rows[rank], p), op=op, comm=comm)
            assert got.tobytes() == want.tobytes(), (dtype, op, got, want)
            cases += 1
    if p > 1:  # the largest case's scratch (a 64 KiB+ block) went back to the pool
        assert comm._spare, "reduce_scatter did not run as a pairwise exchange"
    return cases


def main(seed: int) -> None:
    comm = cc.init("mpi")
    rank, p = comm.rank, comm.size
    cases = turn = 0
    for dtype in DTYPES:
        for op in OPS:
            for count in SIZES:
                turn += 1
                inputs = [make(seed, r, dtype, count, op) for r in range(p)]
                want = reference(inputs, op)
                x = inputs[rank].copy()
                keep = x.copy()
                got = cc.allreduce(x, op=op)
                check(got, want, f"allreduce {dtype} {op} {count}")
                assert np.array_equal(x, keep, equal_nan=True), "input modified out-of-place"
                assert_identical_across_ranks(got)
                cc.allreduce(x, op=op, out=x)
                check(x, want, f"allreduce in-place {dtype} {op} {count}")
                for root in roots(p, turn):
                    x = inputs[rank].copy()
                    got = cc.reduce(x, root=root, op=op)
                    if rank == root:
                        check(got, want, f"reduce {dtype} {op} {count} root {root}")
                        cc.reduce(x, root=root, op=op, out=x)
                        check(x, want, f"reduce in-place {dtype} {op} {count} root {root}")
                    else:
                        assert got is None
                        cc.reduce(x, root=root, op=op, out=x)
                    assert np.array_equal(inputs[rank], make(seed, rank, dtype, count, op))
                # reduce_scatter: every rank's input has p blocks of `count` elements
                mine = slice(rank * count, (rank + 1) * count)
                want_rs = reference([block(seed + 1, r, dtype, count * p, op, mine)
                                     for r in range(p)], op)
                own = make(seed + 1, rank, dtype, count * p, op)
                x = own.copy()
                check(cc.reduce_scatter(x, op=op), want_rs, f"reduce_scatter {dtype} {op} {count}")
                assert np.array_equal(x, own)
                cc.reduce_scatter(x, op=op, out=x[mine])
                check(x[mine], want_rs, f"reduce_scatter in-place {dtype} {op} {count}")
                rest = np.ones(x.shape[0], bool)
                rest[mine] = False
                assert np.array_equal(x[rest], own[rest]), "in-place reduce_scatter " \
                    "wrote outside this rank's block"  # NCCL writes recvbuff only
                cases += 4 + 2 * len(roots(p, turn))
            # data movement does not depend on op: once per dtype and size
        for count in SIZES:
            inputs = [make(seed + 2, r, dtype, count, "sum") for r in range(p)]
            x = inputs[rank].copy()
            got = cc.allgather(x)
            check(got, np.concatenate(inputs), f"allgather {dtype} {count}")
            out = np.zeros(count * p, dtype)
            out[rank * count:(rank + 1) * count] = x
            cc.allgather(out[rank * count:(rank + 1) * count], out=out)
            check(out, np.concatenate(inputs), f"allgather in-place {dtype} {count}")
            rows = np.stack([inputs[rank], inputs[rank]], axis=1) if count else np.zeros((0, 2), dtype)
            got2 = cc.allgather(rows)
            assert got2.shape == (count * p, 2)
            turn += 1
            for root in roots(p, turn):
                x = inputs[rank].copy()
                check(cc.broadcast(x, root=root), inputs[root], f"broadcast {dtype} {count} r{root}")
                assert np.array_equal(x, inputs[rank])
                cc.broadcast(x, root=root, out=x)
                check(x, inputs[root], f"broadcast in-place {dtype} {count} root {root}")
            cases += 3 + 2 * len(roots(p, turn))
    # async handles and mpi4py-style ops
    from mpi4py import MPI

    x = np.arange(10, dtype=np.float32) + rank
    work = cc.allreduce(x, op=MPI.MAX, async_op=True)
    res = work.wait()
    assert work.is_completed() and res is work.result()
    check(res, np.arange(10, dtype=np.float32) + (p - 1), "async max")
    check(cc.all_reduce(x, op=cc.ReduceOp.MIN), np.arange(10, dtype=np.float32), "alias")
    cases += polled_completion(rank, p)
    cases += bad_numba_setting(rank, p)
    cases += nan_and_signed_zero(rank, p)
    cases += aliased_out(rank, p)
    cases += staged_blocks_reused(rank, p)
    cases += reduce_as_allreduce(seed, rank, p)
    cases += pairwise_reduce(seed, rank, p)
    cases += pairwise_reduce_scatter(seed, rank, p)
    cases += pairwise_allreduce(seed, rank, p)
    print(f"rank {rank}: {cases} dense cases ok")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1234)
