"""In-process unit tests of the sparse package: rules, cost models, helpers, one-rank calls."""

import dataclasses
import math

import numpy as np
import pytest
from mpi4py import MPI

import cupycoll as cc
from cupycoll._registry import record
from cupycoll._types import ReduceOp
from cupycoll.comm.mpi import MPICommunicator
from cupycoll.errors import InvalidArgument, InvalidType
from cupycoll.sparse import SparseResult, sparse_allreduce
from cupycoll.sparse import auto, recursive_doubling, split
from cupycoll.sparse._common import bitmap_chunk, fill_absent, reduce_parts
from cupycoll.sparse._cost import Shape, estimate_union, validation_cost
from cupycoll.wire._pack import Wire

ALL = ["allgather", "auto", "dense", "hierarchical", "mask", "recursive_doubling", "split"]


@pytest.fixture
def comm():
    return MPICommunicator(MPI.COMM_SELF)


def test_algorithms_are_registered():
    assert cc.algorithms("sparse") == ALL


def test_estimate_union():
    assert estimate_union(100, [0, 0]) == 0
    assert estimate_union(100, [100, 5]) == 100
    assert estimate_union(1000, [10]) == 10
    u = estimate_union(10**6, [10**5] * 4)  # 1 - 0.9**4 = 0.3439
    assert abs(u - 343900) < 2
    assert estimate_union(10, [3, 3]) >= 3


def test_fill_absent_combines_missing_entries_with_zero():
    union = np.array([1, 2, 3])
    parts = [np.array([1, 2]), np.array([2, 3])]
    for op, want in ((ReduceOp.MAX, [0.0, -1.0, 4.0]), (ReduceOp.MIN, [-5.0, -1.0, 0.0]),
                     (ReduceOp.PROD, [-0.0, -1.0, 0.0]), (ReduceOp.SUM, [-5.0, -1.0, 4.0])):
        got = fill_absent(union, np.array([-5.0, -1.0, 4.0]), parts, op)
        assert got.tolist() == want, op


def test_fill_absent_sum_turns_a_missing_minus_zero_into_plus_zero():
    """An absent entry is +0: -0 + (+0) = +0 where a part misses the index, -0 stays where every
    part holds it; no negative number in sight, so only the -0 itself can trigger the fill."""
    union = np.array([1, 2, 3])
    got = fill_absent(union, np.array([-0.0, -0.0, 2.0]), [np.array([1, 2, 3]), np.array([2])],
                      ReduceOp.SUM)
    assert np.signbit(got).tolist() == [False, True, False] and got.tolist() == [0.0, 0.0, 2.0]


def _absent_combined(v: float, op: ReduceOp) -> float:
    """``op(v, +0)`` by the rules of a dense reduction, written out element by element."""
    if math.isnan(v):
        return v
    if op is ReduceOp.SUM:
        return 0.0 if v == 0 else v
    if op is ReduceOp.MAX:
        return v if v > 0 else 0.0
    if op is ReduceOp.MIN:
        return v if v < 0 or (v == 0 and math.copysign(1, v) < 0) else 0.0
    return math.nan if math.isinf(v) else v * 0.0


@pytest.mark.parametrize("row", [(), (3,)])
def test_fill_absent_matches_an_element_by_element_reference(row):
    """Random parts with -0, +0, NaN and inf among the values, every op: each element of an
    index some part lacks becomes op(v, +0) and every other keeps its bits (a sum looks up
    only its rows holding a -0)."""
    rng = np.random.default_rng(len(row))
    n = 2000
    parts = [np.sort(rng.choice(n, size, replace=False)) for size in (1500, 1200, 1800)]
    union = np.unique(np.concatenate(parts))
    held = np.zeros(n, int)
    for part in parts:
        held[part] += 1
    for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PROD):
        values = rng.standard_normal((union.size,) + row)
        flat = values.reshape(-1)
        for special, share in ((-0.0, 0.05), (0.0, 0.05), (np.nan, 0.01), (np.inf, 0.01)):
            flat[rng.random(flat.size) < share] = special
        want = values.copy().reshape(union.size, -1)
        for at, index in enumerate(union):
            if held[index] < len(parts):
                want[at] = [_absent_combined(float(v), op) for v in want[at]]
        got = fill_absent(union, values, parts, op).reshape(union.size, -1)
        same = (got.view(np.int64) == want.view(np.int64)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), op  # every bit, a NaN's payload aside (inf x 0's is the CPU's)


def test_reduce_parts_accumulates_in_the_accumulate_dtype():
    """float16 2048 + 1 + 1: 2050 when the merge adds in float32, 2048 when it rounds each step."""
    parts = [(np.array([0]), np.array([v], np.float16)) for v in (2048, 1, 1)]
    assert reduce_parts(parts, ReduceOp.SUM, np.float32)[1].tolist() == [2050.0]
    assert reduce_parts(parts, ReduceOp.SUM)[1].tolist() == [2048.0]


def test_bitmap_chunk_is_the_ceiling_of_the_packed_bytes_per_rank():
    for n in (0, 1, 7, 8, 9, 63, 64, 4000, 4001):
        for p in (1, 2, 3, 4, 5, 8):
            packed = -(-n // 8)  # bytes of n bits
            assert bitmap_chunk(n, p) == -(-packed // p), (n, p)


def test_reduce_parts_zero_fill_and_order():
    parts = [(np.array([0, 4]), np.array([-3.0, 2.0])), (np.array([4, 9]), np.array([5.0, -1.0]))]
    idx, val = reduce_parts(parts, ReduceOp.MAX)
    assert idx.tolist() == [0, 4, 9] and val.tolist() == [0.0, 5.0, 0.0]


def _skewed_inputs(rng, sizes, n):
    """Sorted unique indices per rank: unequal nnz, half of each from a hot range of 1% of n."""
    out = []
    for k in sizes:
        hot = rng.integers(0, n // 100, k // 2)
        cold = rng.integers(0, n, k - k // 2) ** 2 // n  # denser towards 0
        out.append(np.unique(np.concatenate([hot, cold])))
    return out


@pytest.mark.parametrize("sizes", [(20, 2000, 60000, 500), (50000, 10, 3000), (7, 90000),
                                   (1000, 1000, 1000, 1000, 1, 40000, 5, 300)])
def test_region_bounds_balance_unequal_skewed_ranks(sizes):
    """Each region holds 1/P of all entries within 3/SAMPLES + P/N, whatever each rank's nnz.

    A sample of rank r stands for nnz_r/SAMPLES entries, so each bound is off by at most one
    sample per rank (N/SAMPLES entries in all, up to the floor of the sample positions, one index
    per rank) and a region by twice that, plus the samples equal to a bound.
    """
    rng = np.random.default_rng(len(sizes))
    n = 10**7
    inputs = _skewed_inputs(rng, sizes, n)
    p, total = len(inputs), sum(a.size for a in inputs)
    bounds = split.region_bounds(np.stack([split.local_samples(a) for a in inputs]), n)
    assert bounds[0] == 0 and bounds[-1] == n and np.all(np.diff(bounds) >= 0)
    everything = np.concatenate(inputs)  # first principles: count every entry per region
    share = np.histogram(everything, bins=bounds)[0] / total  # every index < n: bins half-open
    bound = 3 / split.SAMPLES + p / total
    assert np.all(np.abs(share - 1 / p) <= bound), (share, bound)


def test_region_bounds_without_entries_cut_evenly():
    empty = split.region_bounds(np.stack([split.local_samples(np.empty(0, int))] * 3), 10)
    assert empty.tolist() == [0, 3, 6, 10]
    n = 2**62 - 1  # the largest n: j * n passes 2**63 from P = 4
    huge = split.region_bounds(np.stack([split.local_samples(np.empty(0, int))] * 4), n)
    assert huge.tolist() == [0, n // 4, n // 2, 3 * n // 4, n]


def _bounds_reference(samples: np.ndarray, n: int) -> list[int]:
    """Region bounds from the documented rule in Python integers: b_j is the smallest sample
    value whose cumulative weight (nnz_r per sample of rank r) reaches ceil(j * total / P)."""
    p = len(samples)
    pairs = sorted((int(v), int(row[0])) for row in samples for v in row[1:])
    total = sum(w for _, w in pairs)
    if total == 0:
        return [j * n // p for j in range(p)] + [n]
    out = [0]
    for j in range(1, p):
        target, acc = -(-j * total // p), 0
        for v, w in pairs:
            acc += w
            if acc >= target:
                out.append(max(v, out[-1]))
                break
    return out + [n]


def test_region_bounds_exact_integer_arithmetic():
    """Weights near 2**58 where j * total / P in float64 rounds down onto a cumulative weight,
    and an even cut of n = 2**61 + 1 without entries: both must be exact integer results."""
    s = split.SAMPLES
    k = 2**44  # rank 0: 43 samples weigh exactly floor(total / 3), one less than the target
    samples = np.zeros((3, s + 1), np.int64)
    samples[0, 0], samples[0, 1:] = 128 * k - 1, np.arange(s)
    samples[1, 0], samples[1, 1:] = k, 1000 + np.arange(s)
    assert split.region_bounds(samples, 10**6).tolist() == _bounds_reference(samples, 10**6)
    assert split.region_bounds(samples, 10**6).tolist()[1] == 43
    empty = np.zeros((3, s + 1), np.int64)
    n = 2**61 + 1
    assert split.region_bounds(empty, n).tolist() == _bounds_reference(empty, n)


def test_prefer_dense_threshold():
    # float32 rows, int32 indices: dense is 4n + n/8 bytes, sparse 8 per entry
    assert not recursive_doubling.prefer_dense(500, 1000, 4, 4)
    assert recursive_doubling.prefer_dense(600, 1000, 4, 4)


def test_auto_picks_by_predicted_time():
    """P = 1 moves nothing (allgather); inputs half dense go dense with the shipped profile;
    the pick is always the least predicted time (tests/test_tuner.py checks the predictions)."""
    def shape(p, n, nnz, width=0):
        return Shape(p, n, width, 4, 4, (nnz,) * p)
    assert auto.choose(shape(1, 10**6, 10**5)) == "allgather"
    assert auto.choose(shape(4, 10**6, 5 * 10**5)) == "dense"
    for s in (shape(4, 10**6, 100), shape(3, 1 << 24, 1 << 17), shape(4, 10**4, 10, 64)):
        times = auto.predicted_times(s)
        assert auto.choose(s) == min(times, key=times.get)


def test_cost_model_closed_forms():
    # allgather, P=4, rank 1, float32 1-D, int32 indices, nnz 10/20/30/40 (the counts came
    # with the validation: no size round)
    s = Shape(4, 1000, 0, 4, 4, (10, 20, 30, 40))
    c = record("sparse", "allgather").cost(s, 1)
    assert c.received == {"allgather": (10 + 30 + 40) * 8}
    assert c.messages == {"allgather": 3}  # one packed block per peer
    compact = record("sparse", "allgather").cost(dataclasses.replace(s, wire=Wire(True, None)), 1)
    assert compact.received["allgather.counts"] == 3 * 2 * 8  # (count, bytes) pairs
    d = record("sparse", "dense").cost(s, 0)  # float sum: -0 fills and a one-value tail
    assert d.received == {"dense.allreduce": 3 * (4000 + 4) // 2}
    ints = dataclasses.replace(s, float_values=False)  # integers 1-D: the presence bitmap
    assert record("sparse", "dense").cost(ints, 0).received == {"dense.allreduce": 6000,
                                                      "dense.union": 3 * 32 + 3 * 32}
    rows = record("sparse", "dense").cost(Shape(4, 1000, 8, 4, 4, (10, 20, 30, 40), float_values=False), 0)
    assert rows.received == {"dense.allreduce": 3 * 1000 * (32 + 4) // 2}  # + a count per row
    # header (verb, collective count: 4 words) + 10 fields as max/-min + 3 words per rank, and
    # an entry slot of 256 / P words per rank (sparse/small.py)
    # header 4, 10 signed fields, 3 maxima, 3 words a rank (error, detail, nnz), the slots
    assert validation_cost(4).received == {
        "sparse.validate": (4 + 2 * 10 + 3 + 3 * 4 + 256) * 8 * 6 // 4}
    assert validation_cost(64).received == {
        "sparse.validate": (4 + 20 + 3 + 3 * 64) * 8 * 126 // 64}
    assert validation_cost(1).received == {}


def test_one_rank_semantics(comm):
    idx = np.array([5, 1, 5, 3], np.int32)
    val = np.array([2.0, -1.0, 4.0, 7.0], np.float32)
    for algorithm in ALL:
        for op, want in (("sum", [-1, 7, 6]), ("max", [-1, 7, 4]), ("min", [-1, 7, 2]),
                         ("prod", [-1, 7, 8]), ("avg", [-1, 7, 6])):
            res = sparse_allreduce(idx, val, 8, op=op, algorithm=algorithm, comm=comm)
            assert isinstance(res, SparseResult) and res.n == 8
            assert res.indices.dtype == np.int32 and res.values.dtype == np.float32
            assert res.indices.tolist() == [1, 3, 5] and res.values.tolist() == want
    assert idx.tolist() == [5, 1, 5, 3] and val.tolist() == [2.0, -1.0, 4.0, 7.0]


def test_result_never_aliases_input(comm):
    idx, val = np.array([1, 2]), np.array([3.0, 4.0])
    for algorithm in ALL:
        res = sparse_allreduce(idx, val, 4, op="avg", algorithm=algorithm, comm=comm)
        assert not np.shares_memory(res.values, val) and not np.shares_memory(res.indices, idx)


def test_float16_accumulates_in_float32(comm):
    idx = np.zeros(3, np.int64)
    val = np.array([2048, 1, 1], np.float16)
    low = sparse_allreduce(idx, val, 1, comm=comm)
    high = sparse_allreduce(idx, val, 1, comm=comm, accumulate_dtype=np.float32)
    assert low.values.tolist() == [2048.0]
    assert high.values.tolist() == [2050.0] and high.values.dtype == np.float16


def test_rows_and_empty_input(comm):
    res = sparse_allreduce(np.empty(0, np.int64), np.empty((0, 3), np.float64), 10, comm=comm)
    assert res.indices.shape == (0,) and res.values.shape == (0, 3)
    rows = np.arange(6.0).reshape(2, 3)
    res = sparse_allreduce(np.array([4, 4]), rows, 10, comm=comm, algorithm="dense")
    assert res.values.tolist() == [[3.0, 5.0, 7.0]]


def test_one_rank_errors(comm):
    with pytest.raises(InvalidArgument, match="valid: .*split"):
        sparse_allreduce(np.array([1]), np.array([1.0]), 4, algorithm="ring", comm=comm)
    with pytest.raises(InvalidArgument, match="'indices' on rank 0.*got 4"):
        sparse_allreduce(np.array([4]), np.array([1.0]), 4, comm=comm)
    with pytest.raises(InvalidType, match="'values'"):
        sparse_allreduce(np.array([1]), np.array([True]), 4, comm=comm)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_every_nan_of_a_result_has_numpys_bits(comm, dtype):
    """A negative NaN with a payload in, numpy's NaN out, one entry or several, 1-D or rows."""
    bits = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}[dtype]
    odd_nan = (np.array(np.nan, dtype).view(bits) | bits(1) | (bits(1) << bits(8 * np.dtype(
        dtype).itemsize - 1))).view(dtype)
    canonical = np.array(np.nan, dtype).view(bits)
    for idx, shape in ((np.array([2]), (1,)), (np.array([4, 1, 2]), (3,)), (np.array([3]), (1, 2))):
        val = np.full(shape, odd_nan, dtype)
        for algorithm in ALL:
            res = sparse_allreduce(idx, val, 8, algorithm=algorithm, comm=comm)
            assert np.all(res.values.view(bits) == canonical), (algorithm, shape, res.values)


def test_split_cost_estimate_without_inputs():
    """Without the inputs split's model assumes balanced regions: rank r gets nnz_q // P entries
    from every other rank q and U // P of the union from every other region (E = 8 bytes)."""
    s = Shape(4, 10**6, 0, 4, 4, (101, 203, 0, 402))  # not multiples of P: // is tested
    c = split.cost(s, 1)
    region = s.union // 4
    assert region > 0 and s.union % 4
    assert c.received == {"split.samples": 3 * 129 * 8, "split.counts": 24,
                          "split.scatter": (25 + 0 + 100) * 8, "split.gather.counts": 24,
                          "split.gather": 3 * region * 8}
    assert c.messages == {"split.samples": 3, "split.counts": 3, "split.scatter": 2,
                          "split.gather.counts": 3, "split.gather": 3}  # one block per peer
    tiny = Shape(4, 10**6, 0, 4, 4, (1, 2, 0, 0))  # a union below P: empty regions, no message
    assert 0 < tiny.union < 4
    c = split.cost(tiny, 1)
    assert c.received.get("split.gather", 0) == 0 and c.messages.get("split.gather", 0) == 0


def test_region_bounds_and_cuts_exact_beyond_float64():
    """Indices near 2**62 (float64 spacing 1024 there): bounds are exact sample values and the
    cuts equal an integer searchsorted, so no step may pass through floats."""
    base = 2**62
    # odd indices: none is a multiple of 1024, so a bound that went through float64 is no index
    inputs = [base + 1 + 2 * np.arange(r, 4000, 3, dtype=np.int64) for r in range(3)]
    bounds = split.region_bounds(np.stack([split.local_samples(a) for a in inputs]), 2**63 - 1)
    assert bounds.dtype == np.int64
    everything = np.concatenate(inputs)
    assert all(b in everything for b in bounds[1:-1].tolist())
    class ThreeRanks:  # what split._cuts needs of a communicator
        size, xp = 3, np

    for a in inputs:
        want = [0] + [int(np.searchsorted(a, b)) for b in bounds[1:-1].tolist()] + [a.size]
        assert split._cuts(ThreeRanks(), a, bounds).tolist() == want


def test_prefer_dense_only_when_sparse_costs_strictly_more():
    """recursive doubling densifies when nnz entries of index + row bytes cost more than the
    dense rows plus the presence bitmap (DELTA = 1): at equality it stays sparse."""
    from cupycoll.sparse.recursive_doubling import DELTA, prefer_dense

    assert DELTA == 1.0
    # n = 64 float32 rows: 64 * 4 + 8 bitmap bytes = 264 = 33 entries of int32 + float32
    assert not prefer_dense(33, 64, 4, 4)
    assert prefer_dense(34, 64, 4, 4)
    assert not prefer_dense(0, 1, 8, 4)


@pytest.mark.parametrize("value_dtype, wire_values, nnz", [
    (np.float32, "bfloat16", 400), (np.float64, "float16", 600), (np.float32, None, 600)])
def test_recursive_doubling_switches_on_the_bytes_on_the_wire(value_dtype, wire_values, nnz):
    """A block goes dense where its rows as they travel (rounded by ``wire_values``) make the
    sparse block the larger one: P = 2 (threads), each rank's own input is the one block."""
    from tests._threaded import on_communicators

    n, value_bytes = 1000, 2 if wire_values else np.dtype(value_dtype).itemsize
    sparse_bytes, dense_bytes = nnz * (4 + value_bytes), n * value_bytes + (n + 7) // 8
    assert sparse_bytes > dense_bytes  # the case: dense is smaller on the wire

    def fn(comm):
        rng = np.random.default_rng(comm.rank)
        idx = np.sort(rng.choice(n, nnz, replace=False)).astype(np.int32)
        val = rng.integers(-8, 9, nnz).astype(value_dtype)
        got = sparse_allreduce(idx, val, n, algorithm="recursive_doubling", comm=comm,
                               wire_values=wire_values)
        return idx, val, got

    runs = on_communicators(2, fn)
    received = [sum(entry[1] for entry in log if entry[0] == "recursive_doubling")
                for _, log in runs]
    assert received == [dense_bytes, dense_bytes]
    want = np.zeros(n)
    for (idx, val, _), _ in runs:
        np.add.at(want, idx, val)
    union = np.union1d(runs[0][0][0], runs[1][0][0])
    for (_, _, got), _ in runs:
        assert np.array_equal(got.indices, union)
        assert np.array_equal(got.values, want[got.indices].astype(value_dtype))

