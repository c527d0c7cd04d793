"""Randomized sparse_allreduce cases against an independent dense numpy reference.

Usage: sparse_random.py SEED NCASES [ALGORITHM ...]   (CC_TEST_NUMBA_THREADS=1: see below)

Every rank rebuilds every rank's input from the shared seed, densifies and reduces it with numpy
in float64/int64 (absent entries count as +0), and checks its own result: indices exactly (and
their dtype), integer values and float max/min bit for bit (NaN as NaN; a +0/-0 tie gives +0 for
max, -0 for min), float sums/products/averages within a rounding bound of half an ulp per
rounding (the reduction rounds at most once per added term, plus the cast back and avg's
division), with NaN and +-inf positions exact, the sign of a product exact and the sign of a sum
of zeros exact. Float cases mix in NaN, +-inf and +-0; the "full" pattern puts every index on
every rank (so products are not all absent zeros). Results must be bitwise identical on every
rank (checked once at the end over all cases) and the inputs must be left untouched.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from _common import digest, rng_for, unique
from mpi4py import MPI

from cupycoll.comm.mpi import MPICommunicator
from cupycoll.sparse import SparseResult, sparse_allreduce

ALGORITHMS = ["allgather", "mask", "dense", "recursive_doubling", "split", "hierarchical", "auto"]
OPS = ["sum", "prod", "max", "min", "avg"]
DTYPES = ["float16", "float32", "float64", "int32", "int64"]
PATTERNS = ["disjoint", "identical", "random", "hot", "full"]
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0]
UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum,
          "min": np.minimum}
#: -0.0 for sums: an index whose terms are all -0 sums to -0, as in IEEE arithmetic.
IDENTITY = {"sum": -0.0, "avg": -0.0, "prod": 1, "max": -np.inf, "min": np.inf}


def case_params(seed: int, case: int, size: int, algorithms: list[str]) -> dict:
    """Parameters shared by all ranks of one case."""
    rng = np.random.default_rng([seed, case, 7919])
    dtype = DTYPES[rng.integers(len(DTYPES))]
    op = OPS[rng.integers(len(OPS))]
    big = rng.random() < 0.04
    n = int(rng.integers(2**31, 2**33)) if big else int(rng.choice([1, 2, 5, 17, 64, 200, 1500]))
    algorithm = algorithms[case % len(algorithms)]
    if big and algorithm == "dense":
        algorithm = "split"
    acc = None
    if dtype == "float16" and rng.random() < 0.5:
        acc = "float32"
    elif dtype in ("float32", "int32") and rng.random() < 0.2:
        acc = {"float32": "float64", "int32": "int64"}[dtype]
    empty = rng.random() < 0.05
    special = np.dtype(dtype).kind == "f" and rng.random() < 0.3
    pattern = PATTERNS[rng.integers(len(PATTERNS))]
    if pattern == "full" and n > 200:
        pattern = "random"
    output = "dense" if not big and rng.random() < 0.3 else "sparse"
    return dict(special=special, dtype=dtype, op=op, n=n, algorithm=algorithm, acc=acc,
                output=output, into=output == "dense" and rng.random() < 0.5,
                width=int(rng.choice([0, 0, 0, 1, 3, 8])),
                index_dtype="int64" if big or rng.random() < 0.5 else "int32",
                pattern=pattern,
                dups=rng.random() < 0.4, all_empty=empty,
                cap=int(rng.choice([4, 16, 60])), shared=int(rng.integers(2**31)))


def rank_input(seed: int, case: int, rank: int, size: int, prm: dict):
    """The (indices, values) of ``rank`` in this case (any rank can rebuild it)."""
    rng = rng_for(seed, rank, case)
    n = prm["n"]
    if prm["all_empty"] or rng.random() < 0.12:
        k = 0
    else:
        k = int(rng.integers(1, prm["cap"] + 1))
    pattern = prm["pattern"]
    if pattern == "full":  # every index on every rank
        idx = np.arange(n) if k else np.empty(0, int)
        k = idx.size
    elif pattern == "identical":
        shared = np.random.default_rng(prm["shared"])
        idx = shared.integers(0, n, size=k if k else 0)
        k = idx.size
    elif pattern == "disjoint":
        stripe = max((n - rank + size - 1) // size, 0)
        idx = rank + size * rng.integers(0, max(stripe, 1), size=k) if stripe else np.empty(0, int)
        k = idx.size
    elif pattern == "hot":
        hot = rng.random(k) < 0.7
        idx = np.where(hot, rng.integers(0, min(n, 3), size=k), rng.integers(0, n, size=k))
    else:
        idx = rng.integers(0, n, size=k)
    if not prm["dups"]:
        idx = unique(idx)
        rng.shuffle(idx)
    elif prm["op"] == "prod":  # at most 2 entries per index keep products in range
        uniq = unique(idx)
        idx = np.concatenate([uniq, uniq[: uniq.size // 2]])
        rng.shuffle(idx)
    idx = idx.astype(prm["index_dtype"])
    shape = (idx.size,) + ((prm["width"],) if prm["width"] else ())
    dtype, op = np.dtype(prm["dtype"]), prm["op"]
    if dtype.kind == "f":
        if op == "prod":
            val = rng.uniform(0.7, 1.4, shape) * rng.choice([-1, 1], shape)
        else:
            val = rng.standard_normal(shape) * 4
    else:
        val = rng.choice([-2, -1, 1, 2], shape) if op == "prod" else rng.integers(-50, 51, shape)
    if prm["special"]:
        hit = rng.random(shape) < 0.15
        val = np.where(hit, rng.choice(SPECIAL, shape), val)
    return idx, val.astype(dtype)


def _identity(op: str, wide: type):
    if op in ("max", "min") and wide is np.int64:
        info = np.iinfo(np.int64)
        return info.min if op == "max" else info.max
    return IDENTITY[op]


def reference(inputs, prm: dict, size: int):
    """Dense numpy reference over the union of indices (absent entries count as +0).

    Returns (union indices, values in float64/int64, sum of |finite terms|, number of terms).
    A max (min) that comes out 0 is +0 (-0) when any contribution, absent ones included, is +0
    (-0): the documented tie rule, applied from flags rather than from any fold order.
    """
    op = prm["op"]
    universe = unique(np.concatenate([i.astype(np.int64) for i, _ in inputs]))
    m = universe.size  # densify over the union only: n can be 2**33
    wide = np.float64 if np.dtype(prm["dtype"]).kind == "f" else np.int64
    row = (prm["width"],) if prm["width"] else ()
    total, abs_sum, terms = None, np.zeros((m,) + row), np.zeros(m)
    winner = np.zeros((m,) + row, bool)  # some contribution is the tie's winning zero
    for idx, val in inputs:
        pos = np.searchsorted(universe, idx.astype(np.int64))
        dense = np.full((m,) + row, _identity(op, wide), dtype=wide)
        wval = val.astype(wide)
        UFUNCS[op].at(dense, pos, wval)
        present = np.zeros(m, bool)
        present[pos] = True
        dense[~present] = 0
        if op in ("max", "min") and wide is np.float64:
            winner[~present] |= op == "max"
            np.logical_or.at(winner, pos, (wval == 0) & (np.signbit(wval) == (op == "min")))
        np.add.at(abs_sum, pos, np.where(np.isfinite(wval), np.abs(wval), 0))
        np.add.at(terms, pos, 1)
        total = dense if total is None else UFUNCS[op](total, dense)
    if op in ("max", "min") and wide is np.float64:
        zero = total == 0
        total[zero & winner] = -0.0 if op == "min" else 0.0
        total[zero & ~winner] = 0.0 if op == "min" else -0.0
    if op == "avg":
        total = np.sign(total) * (np.abs(total) // size) if wide is np.int64 else total / size
    return universe, total, abs_sum, terms


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bit for bit, except that any NaN matches any NaN (its sign and payload are free)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if got.dtype.kind != "f":
        return np.array_equal(got, want)
    nan = np.isnan(want)
    bits = f"u{got.dtype.itemsize}"
    return bool(np.array_equal(np.isnan(got), nan)
                and np.array_equal(got[~nan].view(bits), want[~nan].view(bits)))


def _ulp(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The spacing of ``dtype`` numbers at magnitude ``x`` (float64 array, finite)."""
    info = np.finfo(dtype)
    exp = np.floor(np.log2(np.maximum(np.abs(x), float(info.smallest_normal))))
    return np.exp2(exp - info.nmant)


def check(res, prm: dict, inputs, size: int, case: int) -> None:
    ref_idx, ref_val, abs_sum, terms = reference(inputs, prm, size)
    where = f"case {case} {prm}"
    assert res.indices.dtype == np.dtype(prm["index_dtype"]), where
    assert res.values.dtype == np.dtype(prm["dtype"]), where
    assert np.array_equal(res.indices.astype(np.int64), ref_idx), f"indices differ: {where}"
    want_shape = (ref_idx.size,) + ((prm["width"],) if prm["width"] else ())
    assert res.values.shape == want_shape, where
    dtype = np.dtype(prm["dtype"])
    if dtype.kind != "f" or prm["op"] in ("max", "min"):
        want = ref_val.astype(dtype)
        assert same_bits(res.values, want), f"values differ: {where}\n{res.values}\n{want}"
        return
    got = res.values.astype(np.float64)
    finite = np.isfinite(ref_val)
    assert same_bits(got[~finite], ref_val[~finite]), f"NaN/inf differ: {where}"
    if prm["op"] == "prod":
        assert np.array_equal(np.signbit(got[finite]), np.signbit(ref_val[finite])), \
            f"sign of a product differs: {where}"
    zeros = finite & (abs_sum == 0)
    assert same_bits(got[zeros], ref_val[zeros]), f"sum of zeros differs: {where}"
    acc = np.dtype(prm["acc"] or prm["dtype"])
    t = terms.reshape((-1,) + (1,) * (ref_val.ndim - 1))
    # roundings: one per term folded in (t - 1), avg's division, the cast back to dtype
    rounds = np.maximum(t - 1, 0) + (prm["op"] == "avg")
    if prm["op"] == "prod":  # relative: each rounding scales by at most (1 + eps/2)
        tol = (rounds * np.finfo(acc).eps / 2 * 1.01 + np.finfo(dtype).eps / 2) * np.abs(ref_val)
    else:  # every partial sum is at most abs_sum: half an ulp of acc there per rounding, and
        # as much again per term of the float64 reference's own sum
        tol = (rounds * _ulp(abs_sum, acc) / 2 + _ulp(ref_val, dtype) / 2
               + np.maximum(t - 1, 0) * _ulp(abs_sum, np.dtype(np.float64)) / 2)
    err = np.abs(got - ref_val)
    bad = finite & ~(err <= tol)
    assert not bad.any(), f"values off: {where}\nmax err {err[bad].max()} tol {tol[bad].min()}"


def check_dense(dense, out, prm: dict, inputs, size: int, case: int) -> SparseResult:
    """A dense output: ``out`` itself when given, +0 (all bits clear) at every index no rank
    holds, and at the union what :func:`check` wants of a sparse result; returned as one."""
    where = f"case {case} {prm}"
    ref_idx = reference(inputs, prm, size)[0]
    row = (prm["width"],) if prm["width"] else ()
    assert out is None or dense is out, f"not written into out: {where}"
    assert dense.shape == (prm["n"],) + row and dense.dtype == np.dtype(prm["dtype"]), where
    absent = np.ones(prm["n"], bool)
    absent[ref_idx] = False
    assert not dense[absent].view(np.uint8).any(), f"absent entries not +0: {where}"
    res = SparseResult(ref_idx.astype(prm["index_dtype"]), dense[ref_idx], prm["n"])
    check(res, prm, inputs, size, case)
    return res


def every_loop_in_numba_threads() -> None:
    """CC_TEST_NUMBA_THREADS=1: every primitive call of any size takes the numba loops, with
    merges cut into blocks of 8 entries and loops into CUPYCOLL_THREADS pieces (normally only
    inputs of >= 2**14 entries do, in pieces of >= 2**17 and blocks of 2**15)."""
    from cupycoll.primitives import _accel, _common, _numba

    _accel._FAST_FROM = 0
    _common._MERGE_BLOCK = 8
    _numba._PIECE = 1
    assert _accel.loops() is _numba, "CUPYCOLL_NUMBA=on is needed: the numba loops do not run"


def count_packed_sums() -> list[int]:
    """Count recursive doubling's merges written straight into the block the next round sends
    (``_Rounds.packed_sum``; printed at the end: its test asserts some ran)."""
    from cupycoll.sparse import recursive_doubling

    made, packed_sum = [0], recursive_doubling._Rounds.packed_sum

    def counted(self, lower, higher):  # type: ignore[no-untyped-def]
        state = packed_sum(self, lower, higher)
        made[0] += state is not None
        return state

    recursive_doubling._Rounds.packed_sum = counted
    return made


def count_last_merges() -> list[int]:
    """Count recursive doubling's last sparse merges (not sent on) whose union prefers dense
    and those whose result came back dense (printed: their test asserts the first some and
    the second none: a result not sent on is not densified to be read back)."""
    from cupycoll.sparse import recursive_doubling as rd

    seen, merge = [0, 0], rd._Rounds.merge

    def counted(self, lower, higher, sends_next=False):  # type: ignore[no-untyped-def]
        state = merge(self, lower, higher, sends_next)
        if not (sends_next or lower.dense or higher.dense):
            seen[0] += state.dense or rd.prefer_dense(int(state.first.shape[0]), self.n,
                                                      self.index_dtype.itemsize, self.row_bytes)
            seen[1] += state.dense
        return state

    rd._Rounds.merge = counted
    return seen


def main() -> None:
    seed, ncases = int(sys.argv[1]), int(sys.argv[2])
    if os.environ.get("CC_TEST_NUMBA_THREADS"):
        every_loop_in_numba_threads()
    packed = count_packed_sums()
    last = count_last_merges()
    algorithms = sys.argv[3:] or ALGORITHMS
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=60)
    size, rank = comm.size, comm.rank
    digests = []
    for case in range(ncases):
        prm = case_params(seed, case, size, algorithms)
        inputs = [rank_input(seed, case, r, size, prm) for r in range(size)]
        idx, val = inputs[rank]
        keep = (idx.copy(), val.copy())
        out = None
        if prm["into"]:  # garbage the call must overwrite
            row = (prm["width"],) if prm["width"] else ()
            out = np.full((prm["n"],) + row, 7, prm["dtype"])
        res = sparse_allreduce(idx, val, prm["n"], op=prm["op"], algorithm=prm["algorithm"],
                               comm=comm, accumulate_dtype=prm["acc"], output=prm["output"],
                               out=out)
        assert same_bits(idx, keep[0]) and same_bits(val, keep[1]), "input modified"
        if prm["output"] == "dense":
            res = check_dense(res, out, prm, inputs, size, case)
        else:
            check(res, prm, inputs, size, case)
        digests.append(digest(res.indices, res.values))
    every = MPI.COMM_WORLD.allgather(digests)
    for case in range(ncases):
        assert len({d[case] for d in every}) == 1, \
            f"case {case} differs across ranks: {case_params(seed, case, size, algorithms)}"
    if rank == 0:
        print(f"ok {ncases} cases on {size} ranks, algorithms {algorithms}")
        print(f"merges written into the block sent next on rank 0: {packed[0]}")
        print(f"last merges preferring dense on rank 0: {last[0]}, made dense: {last[1]}")


if __name__ == "__main__":
    main()
