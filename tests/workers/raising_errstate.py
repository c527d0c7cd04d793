"""Every sparse and top-k algorithm under a caller's ``np.errstate(all="raise")`` (run under
mpiexec).

The library meets harmless floating-point events on purpose (inf - inf in a rounding error
that is then dropped, float64 sums beyond float32's range rounded for a bfloat16 wire, NaN
sums): a caller's raising error state must not turn them into a FloatingPointError on one rank
in the middle of a collective (the others would wait). Inputs hold +-inf, NaN, a subnormal and
values whose sum overflows float32; every top-k algorithm with and without a state, coo and
bfloat16 wires, the compressor, and every sparse algorithm and op on 1-D values and rows, coo,
compact, bfloat16 and float16 wires, values that underflow those wires; Ok-Topk's threshold
search after a step of zeros and after a jump in magnitude; every top-k algorithm and Gaussian
selector on odd data on one rank only; averages (sparse, dense, the compressor's) of
subnormals; a compressor whose residual overflows on one rank only (before: FloatingPointError
there while the others waited); an accumulate dtype whose sum is past the caller's dtype, and
input past a narrower accumulate dtype (inf, as without it). Prints "ok raising error state on
P ranks".
"""

from __future__ import annotations

import numpy as np

import cupycoll as cc
from cupycoll.topk import Gaussian, TopkCompressor, TopkState, topk_allreduce


def main() -> None:
    comm = cc.init("mpi")
    rng = np.random.default_rng([0, comm.rank])
    x = rng.standard_normal(3000).astype(np.float32)
    x[[5, 6, 7, 8, 9, 10]] = [np.inf, -np.inf, np.nan, 1e-45, 3e38, 3e38]
    with np.errstate(over="ignore"):  # 3e38 is inf in float16
        xs = {dt: x.astype(dt) for dt in ("float16", "float32", "float64")}
    for alg in cc.algorithms("topk"):
        for dt, xd in xs.items():
            state = TopkState()
            with np.errstate(all="raise"):
                for _ in range(4):
                    topk_allreduce(xd, 30, algorithm=alg, comm=comm, state=state)
                    topk_allreduce(xd, 30, algorithm=alg, comm=comm)
                    if dt != "float16":
                        topk_allreduce(xd, 30, algorithm=alg, comm=comm, wire_values="bfloat16")
        for wire_values in (None, "bfloat16"):
            with np.errstate(all="raise"):
                comp = TopkCompressor(3000, 0.01, algorithm=alg, comm=comm,
                                      wire_values=wire_values)
                for _ in range(4):
                    comp.step(xs["float32"].copy())
    for alg in cc.algorithms("sparse"):
        for op in ("sum", "max", "min", "prod", "avg"):
            idx = np.sort(rng.choice(3000, 300, replace=False))
            for vals in (x[idx], rng.standard_normal((300, 4)).astype(np.float32)):
                with np.errstate(all="raise"):
                    for wire in ("coo", "compact"):
                        cc.sparse_allreduce(idx, vals, 3000, op=op, algorithm=alg, comm=comm,
                                            wire=wire)
                    for fmt in ("bfloat16", "float16"):
                        cc.sparse_allreduce(idx, vals, 3000, op=op, algorithm=alg, comm=comm,
                                            wire_values=fmt)
        tiny = np.full(300, 1e-300)  # underflows float32 and both wire formats
        tiny[::2] = 1e-6  # a float16 subnormal
        with np.errstate(under="ignore"):
            tinies = (tiny, tiny.astype(np.float32))
        with np.errstate(all="raise"):
            for fmt in ("bfloat16", "float16"):
                for vals in tinies:
                    cc.sparse_allreduce(np.arange(300), vals, 3000, algorithm=alg, comm=comm,
                                        wire_values=fmt)
    # sums beyond the range (float16 past 65504, float32 past 3.4e38: inf) and inf - inf
    # (NaN), every algorithm and output, on the numpy loops (small slices): no rank raises
    signs = np.where(np.arange(8) % 2 == comm.rank % 2, 1.0, -1.0)
    for alg in cc.algorithms("sparse"):
        for vals in (np.full(8, 6e4, np.float16), np.full(8, 3e38, np.float32),
                     (np.inf * signs).astype(np.float32)):
            for output in ("sparse", "dense"):
                for op in ("sum", "avg"):
                    with np.errstate(all="raise"):
                        cc.sparse_allreduce(np.arange(8), vals, 8, op=op, algorithm=alg,
                                            output=output, comm=comm)
    # an accumulate dtype whose sum is past the caller's range (float16 summed in float32,
    # float32 in float64: inf once cast back), and input past a narrower accumulate dtype
    # (float64 1e300 accumulated in float32: inf), every algorithm and output
    for alg in cc.algorithms("sparse"):
        for vals, acc in ((np.full(4, 6e4, np.float16), "float32"),
                          (np.full(4, 3e38, np.float32), "float64"),
                          (np.full(4, 1e300 if comm.rank == 0 else 1.0), "float32"),
                          (np.full(4, 1e-50), "float32")):  # below: 0
            for output in ("sparse", "dense"):
                with np.errstate(all="raise"):
                    got = cc.sparse_allreduce(np.arange(4), vals, 4, algorithm=alg,
                                              accumulate_dtype=acc, output=output, comm=comm)
                summed = got if output == "dense" else got.values
                if vals[0] == 1e-50:
                    assert not np.any(summed), (alg, acc, summed)
                    continue
                past = comm.size > 1 or vals.dtype == np.float64  # (1e300 on rank 0 alone)
                assert np.isinf(summed).all() == past, (alg, acc, summed)
        tiny16 = np.full(4, 2.0 ** -24 * (1 + comm.rank), np.float16)  # float16 subnormals:
        for acc in (None, "float32"):  # their average, widened, rounds back inexactly
            with np.errstate(all="raise"):
                cc.sparse_allreduce(np.arange(4), tiny16, 4, op="avg", algorithm=alg,
                                    accumulate_dtype=acc, comm=comm)
    plain = rng.standard_normal(3000)
    with np.errstate(all="raise"):  # the threshold search after a step of zeros, and after
        for later in (np.zeros_like(plain), plain * 1e12):  # magnitudes far above the first
            state = TopkState()
            for step in range(3):
                topk_allreduce(plain if step == 0 else later, 10, comm=comm, state=state)
    # odd data on one rank only (an infinity on rank 0, a subnormal gradient on rank 1):
    # a normal fit of it is NaN or subnormal, which raised there alone, the others waiting
    odd = rng.standard_normal(3000).astype(np.float32)
    if comm.rank == 0:
        odd[7] = np.inf
    elif comm.rank == 1:
        odd *= np.float32(1e-40)
    for alg in cc.algorithms("topk"):
        for selector in (None, Gaussian(policy="reference"), Gaussian()):
            with np.errstate(all="raise"):
                topk_allreduce(odd, 30, algorithm=alg, comm=comm, selector=selector)
    # an average whose sum is one subnormal on one rank's region (split's owner divides it
    # before the gather), the dense verb's average and the compressor's, of subnormals: the
    # quotient underflows to 0, never a raise there while the others wait
    n = 4000
    idx = np.append(np.arange(comm.rank * 10, comm.rank * 10 + 300), n - 1)
    vals = np.append(np.ones(300, np.float32), np.float32(1e-45 if comm.rank == 0 else 0))
    for alg in cc.algorithms("sparse"):
        for output in ("sparse", "dense"):
            with np.errstate(all="raise"):
                got = cc.sparse_allreduce(idx, vals, n, op="avg", algorithm=alg, output=output,
                                          comm=comm)
            last = got[-1] if output == "dense" else got.values[got.indices == n - 1]
            assert 0 <= float(np.sum(last)) <= np.float32(1e-45), (alg, output, last)
    with np.errstate(under="ignore"):
        subnormal = (rng.standard_normal(3000) * 1e-44).astype(np.float32)
    with np.errstate(all="raise"):
        cc.allreduce(np.full(5, 1e-45 if comm.rank == 0 else 0, np.float32), "avg", comm=comm)
        for alg in cc.algorithms("topk"):
            comp = TopkCompressor(3000, 0.01, algorithm=alg, comm=comm, warmup_steps=1)
            for _ in range(2):
                comp.step(subnormal.copy())
    for alg in ("dense", "oktopk"):  # a residual that overflows on one rank only: inf there
        comp = TopkCompressor(100, 0.05, algorithm=alg, comm=comm)
        big = np.zeros(100, np.float32)
        big[50] = 3e38 if comm.rank == 0 else -3e38 if comm.rank == 1 else 0
        with np.errstate(all="raise"):
            comp.step(big)  # sums to 0 at P = 2: index 50 stays in both residuals
            comp.step(big if comm.rank == 0 else np.zeros(100, np.float32))
    if comm.rank == 0:
        print(f"ok raising error state on {comm.size} ranks")


if __name__ == "__main__":
    main()
