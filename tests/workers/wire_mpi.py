"""Wire formats across ranks: compact == coo bitwise, byte models == comm.stats, error feedback.

Usage: wire_mpi.py SEED

1. sparse_allreduce, every algorithm, op, dtype pair (int32/int64 indices; float32, float64,
   int32, int64, float16 via float32 values), width (1-D and rows), input pattern (random,
   empty odd ranks, indices near 2**31 with int32, near 2**40 with int64): ``wire="compact"``
   gives the bits of ``wire="coo"``, which equals an independent numpy reference; with
   ``wire_values`` the result is identical on every rank and close to the reference, and
   float16 values give the bits they give without it (they travel as they are).
2. Every rank's ``comm.stats`` equals the cost model (validation + algorithm) for coo,
   compact and compact+bfloat16, on exact shapes.
3. topk_allreduce, every algorithm (Ok-Topk with and without the padded allgather): compact ==
   coo bitwise over several steps; TopkA moves one message per peer, and its compact bytes are
   the peers' k values plus the encoded size of their top-k, counted here with numpy.
4. TopkCompressor with bfloat16 / float16 values, coo and compact, every algorithm, many steps:
   sum of residuals + P * update == sum of old residuals + grads (float64 check).
5. Bad ``wire`` / ``wire_values`` on one rank raise InvalidArgument on every rank.
"""

from __future__ import annotations

import dataclasses
import sys
import zlib

import numpy as np
from _common import rng_for, topk_compact_equals_coo, unique
from mpi4py import MPI

import cupycoll as cc
from cupycoll.comm.mpi import MPICommunicator
from cupycoll.errors import InvalidArgument
from cupycoll.sparse import sparse_allreduce
from cupycoll.sparse._cost import Shape
from cupycoll.sparse.auto import call_cost
from cupycoll.topk import topk_allreduce
from cupycoll.wire import encoded_nbytes
from cupycoll.wire._pack import Wire

ALGORITHMS = ["allgather", "mask", "dense", "recursive_doubling", "split", "auto"]
DTYPES = [("int32", "float32", None), ("int64", "float64", None), ("int32", "int32", None),
          ("int64", "int64", None), ("int32", "float16", "float32")]
UFUNCS = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def pattern_input(pattern: str, rank: int, size: int, itype: str, rng) -> tuple[np.ndarray, int]:
    """(sorted unique indices, n) of one rank."""
    if pattern == "near31":  # int32 indices up to 2**31 - 2
        n = 2**31 - 1
        idx = n - 1 - rng.choice(6000, 150, replace=False)
    elif pattern == "near40":
        n = 2**40 + 5000
        idx = 2**40 - 3000 + rng.choice(8000, 150, replace=False)
    else:
        n = 3000
        idx = rng.choice(n, 200, replace=False)
        if pattern == "empty_odd" and rank % 2:
            idx = idx[:0]
    return unique(idx).astype(itype), n


def reference(inputs, n, op: str, acc: str, width: int):
    union = unique(np.concatenate([i for i, _ in inputs]))
    row = (width,) if width else ()
    total = None
    for idx, val in inputs:
        full = np.zeros((union.size,) + row, dtype=acc)
        full[np.searchsorted(union, idx)] = val.astype(acc)
        total = full if total is None else UFUNCS[op](total, full)
    if op == "avg":
        total = total / len(inputs) if total.dtype.kind == "f" else \
            np.trunc(total / len(inputs)).astype(total.dtype)
    return union, total


def same_everywhere(comm, arr) -> bool:
    digest = zlib.crc32(np.ascontiguousarray(arr).tobytes())
    return len(set(MPI.COMM_WORLD.allgather(digest))) == 1


def check_sparse(comm, seed: int) -> int:
    checked = 0
    for c, pattern in enumerate(("random", "empty_odd", "near31", "near40")):
        for d, (itype, vtype, acc) in enumerate(DTYPES):
            if pattern == "near31" and itype != "int32" or pattern == "near40" and itype != "int64":
                continue
            for width in (0, 3):
                inputs = []
                for r in range(comm.size):
                    rng = rng_for(seed, r, c * 100 + d * 10 + width)
                    idx, n = pattern_input(pattern, r, comm.size, itype, rng)
                    shape = (idx.size, width) if width else (idx.size,)
                    inputs.append((idx, rng.integers(-3, 4, shape).astype(vtype)))
                ops = list(UFUNCS) if (d == 0 and width == 0) else ["sum", "max"]
                for op in ops:
                    want_i, want_v = reference(inputs, n, op, acc or vtype, width)
                    for algorithm in ALGORITHMS:
                        if algorithm == "dense" and n > 10**6:
                            continue
                        kw = dict(n=n, op=op, algorithm=algorithm, comm=comm,
                                  accumulate_dtype=acc)
                        coo = sparse_allreduce(*inputs[comm.rank], wire="coo", **kw)
                        cpt = sparse_allreduce(*inputs[comm.rank], wire="compact", **kw)
                        tag = (pattern, itype, vtype, width, op, algorithm)
                        assert coo.indices.tobytes() == cpt.indices.tobytes(), tag
                        assert coo.values.tobytes() == cpt.values.tobytes(), tag
                        assert cpt.indices.dtype == np.dtype(itype), tag
                        assert np.array_equal(coo.indices, want_i), tag
                        np.testing.assert_allclose(coo.values.astype(np.float64),
                                                   want_v.astype(np.float64), rtol=1e-6,
                                                   err_msg=str(tag))
                        checked += 2
    return checked


def check_rounded(comm, seed: int) -> int:
    """wire_values: identical on every rank, close to the reference (random normal values)."""
    checked = 0
    for fmt, rtol in (("bfloat16", 2**-6), ("float16", 2**-9)):
        inputs = []
        for r in range(comm.size):
            rng = rng_for(seed, r, 777)
            idx = unique(rng.choice(5000, 300, replace=False)).astype(np.int32)
            inputs.append((idx, rng.standard_normal(idx.size).astype(np.float32) + 4))
        want_i, want_v = reference(inputs, 5000, "sum", "float64", 0)
        for algorithm in ALGORITHMS:
            for wire in ("coo", "compact"):
                res = sparse_allreduce(*inputs[comm.rank], 5000, algorithm=algorithm, comm=comm,
                                       wire=wire, wire_values=fmt)
                assert np.array_equal(res.indices, want_i), (fmt, algorithm)
                assert same_everywhere(comm, res.values), (fmt, algorithm, wire)
                np.testing.assert_allclose(res.values, want_v, rtol=rtol * comm.size,
                                           err_msg=f"{fmt} {algorithm} {wire}")
                half = [(i, v.astype(np.float16)) for i, v in inputs]  # travels as it is:
                plain = sparse_allreduce(*half[comm.rank], 5000, algorithm=algorithm,
                                         comm=comm, wire=wire)
                rounded = sparse_allreduce(*half[comm.rank], 5000, algorithm=algorithm,
                                           comm=comm, wire=wire, wire_values=fmt)
                assert np.array_equal(plain.values.view(np.uint16),
                                      rounded.values.view(np.uint16)), (fmt, algorithm, wire)
                ints = [(i, (v * 1e6).astype(np.int64)) for i, v in inputs]  # as they are,
                want = reference(ints, 5000, "sum", "float64", 0)[1]  # a float accumulate
                got = sparse_allreduce(*ints[comm.rank], 5000, algorithm=algorithm,  # too
                                       comm=comm, wire=wire, wire_values=fmt,
                                       accumulate_dtype=np.float64)
                assert np.array_equal(got.values, want.astype(np.int64)), (fmt, algorithm)
                for op in ("avg", "sum"):  # a dense output rounds what the sparse one does
                    call = dict(algorithm=algorithm, comm=comm, wire=wire, wire_values=fmt,
                                op=op, accumulate_dtype=np.float64)  # (split rounded the
                    gathered = comm.stats.by_op.get("split.gather")
                    dense = sparse_allreduce(*inputs[comm.rank], 5000, output="dense",
                                             **call)  # finished value: twice, after avg)
                    by_regions = algorithm == "split" and \
                        comm.stats.by_op.get("split.gather") == gathered  # (not rounded)
                    assert by_regions or np.array_equal(dense, sparse_allreduce(
                        *inputs[comm.rank], 5000, **call).to_dense()), (fmt, algorithm, op)
                checked += 1
    return checked


def check_volume(comm, seed: int) -> int:
    checked = 0
    for c, (pattern, itype, vtype, width) in enumerate(
            (("random", "int32", "float32", 0), ("empty_odd", "int64", "float64", 2),
             ("near40", "int64", "float32", 0), ("random", "int32", "int32", 0))):
        inputs = []
        for r in range(comm.size):
            rng = rng_for(seed, r, 5000 + c)
            idx, n = pattern_input(pattern, r, comm.size, itype, rng)
            shape = (idx.size, width) if width else (idx.size,)
            inputs.append((idx, rng.standard_normal(shape).astype(vtype)))
        base = Shape.from_inputs([i for i, _ in inputs], n, width, np.dtype(itype).itemsize,
                                 np.dtype(vtype).itemsize)
        base = dataclasses.replace(base, float_values=np.dtype(vtype).kind == "f")
        for wire, values in (("coo", None), ("compact", None), ("compact", "bfloat16"),
                             ("coo", "float16")):
            model_shape = dataclasses.replace(base, wire=Wire(wire == "compact", values))
            for algorithm in ALGORITHMS:
                if algorithm == "dense" and n > 10**6:
                    continue
                comm.stats.reset()
                sparse_allreduce(*inputs[comm.rank], n, algorithm=algorithm, comm=comm,
                                 wire=wire, wire_values=values)
                model = call_cost(algorithm, model_shape, comm.rank)
                want = {op: (model.received[op], model.messages[op]) for op in model.received}
                got = {op: (s.bytes_received, s.messages_received)
                       for op, s in comm.stats.by_op.items()
                       if s.bytes_received or s.messages_received}
                assert got == want, (f"rank {comm.rank} {algorithm} {pattern} {wire}/{values}"
                                     f"\n got  {sorted(got.items())}\n want {sorted(want.items())}")
                checked += 1
    return checked


def topk_input(seed: int, rank: int, n: int, t: int) -> np.ndarray:
    base = np.random.default_rng([seed, 1, rank]).standard_normal(n)
    noise = np.random.default_rng([seed, 2, rank, t]).standard_normal(n)
    return (base + 0.5 * noise).astype(np.float32)


def check_topk(comm, seed: int) -> int:
    p, r, checked = comm.size, comm.rank, 0
    n, k = 4096, 48
    checked += topk_compact_equals_coo(comm, k, lambda t: topk_input(seed, r, n, t), steps=6,
                                       tau=4, tau_prime=3)
    # TopkA: one message per peer; compact bytes counted from the peers' exact top-k
    xs = [topk_input(seed, q, n, 99) for q in range(p)]
    for wire in ("coo", "compact"):
        comm.stats.reset()
        topk_allreduce(xs[r], k, algorithm="topka", comm=comm, wire=wire)
        st = comm.stats.by_op["topka.allgather"]
        tops = [np.sort(np.argsort(-np.abs(x), kind="stable")[:k]).astype(np.int32) for x in xs]
        if wire == "coo":
            want = (p - 1) * k * 8
        else:
            want = sum(4 * k + encoded_nbytes(tops[q], 0, n) for q in range(p) if q != r)
        assert (st.bytes_received, st.messages_received) == (want, p - 1), (wire, st, want)
        checked += 1
    return checked


def check_mass(comm, seed: int) -> float:
    """Error feedback with rounded values conserves mass for every algorithm."""
    p, r, worst = comm.size, comm.rank, 0.0
    n = 3000
    for algorithm in cc.algorithms("topk"):
        for wire, fmt in (("coo", "bfloat16"), ("compact", "bfloat16"), ("compact", "float16")):
            comp = cc.TopkCompressor(n, 0.02, algorithm=algorithm, comm=comm, wire=wire,
                                     wire_values=fmt, tau=8, tau_prime=5)
            for t in range(20):
                g = np.random.default_rng([seed, 3, r, t]).standard_normal(n).astype(np.float32)
                before = comp.residual.astype(np.float64) + g.astype(np.float64)
                upd = comp.step(g)
                sums = np.stack([before, comp.residual.astype(np.float64)])
                MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)  # buffers: no pickles
                want, after = sums
                dense = np.zeros(n)
                dense[upd.indices] = upd.values.astype(np.float64) * p
                scale = max(1.0, float(np.abs(want).max()))
                err = float(np.abs(after + dense - want).max()) / scale
                worst = max(worst, err)
                assert err < 1e-5, (algorithm, wire, fmt, t, err)
                assert same_everywhere(comm, upd.values), (algorithm, wire, fmt, t)
    return worst


def check_overflow_once(comm, seed: int) -> int:
    """A gradient float16 cannot hold (rank 0's 1e5) makes one step's update inf there, as an
    AMP GradScaler expects, and only one: the residual keeps nothing of it (before: it kept the
    value, which overflowed again at every step, and the update stayed inf for good)."""
    p, r, checked = comm.size, comm.rank, 0
    n = 3000
    for algorithm in cc.algorithms("topk"):
        for wire in ("coo", "compact"):
            comp = cc.TopkCompressor(n, 0.02, algorithm=algorithm, comm=comm, wire=wire,
                                     wire_values="float16", tau=8, tau_prime=5)
            for t in range(4):
                g = np.random.default_rng([seed, 5, r, t]).standard_normal(n).astype(np.float32)
                if t == 0 and r == 0:
                    g[7] = 1e5
                upd = comp.step(g)
                finite = np.isfinite(upd.values).all() and np.isfinite(comp.residual).all()
                assert finite or t == 0, (algorithm, wire, t, "inf after the overflowed step")
                assert np.isfinite(comp.residual).all(), (algorithm, wire, t)
            checked += 1
    return checked


def check_errors(comm) -> int:
    p, r, checked = comm.size, comm.rank, 0
    idx, val = np.array([1, 2], np.int32), np.ones(2, np.float32)
    bad_rank = p - 1
    for kw in ({"wire": "bogus"}, {"wire_values": "int8"}, {"wire": 3}):
        mine = kw if r == bad_rank else {}
        calls = (lambda: sparse_allreduce(idx, val, 8, comm=comm, **mine),
                 lambda: topk_allreduce(np.arange(8, dtype=np.float32), 2, comm=comm, **mine),
                 lambda: cc.TopkCompressor(8, 0.25, comm=comm, **mine).step(
                     np.ones(8, np.float32)))
        for call in calls:
            try:
                call()
            except InvalidArgument as exc:
                assert str(bad_rank) in str(exc), str(exc)
                checked += 1
            else:
                raise AssertionError(f"rank {r}: no InvalidArgument for {kw}")
    return checked


def main() -> None:
    seed = int(sys.argv[1])
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=120)
    counts = {"sparse": check_sparse(comm, seed), "rounded": check_rounded(comm, seed),
              "volume": check_volume(comm, seed), "topk": check_topk(comm, seed)}
    worst = check_mass(comm, seed)
    counts["overflow"] = check_overflow_once(comm, seed)
    counts["errors"] = check_errors(comm)
    if comm.rank == 0:
        print(f"ok wire on {comm.size} ranks: {counts}, worst mass error {worst:.2e}")


if __name__ == "__main__":
    main()
