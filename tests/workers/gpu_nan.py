"""The sparse NaN and signed-zero contract on NCCL (emulated GPUs, cupycoll.testing.emulation).

Usage: gpu_nan.py MODE[,MODE...] SEED

NCCL's float max/min kernels return the non-NaN operand (fmaxf/fminf/__hmax), and an in-switch
reduction (NVLS) does not document -0 + -0 = -0. This worker makes the emulated NCCL reduce
that way (:func:`nccl_reductions`), whatever the emulator's own choice, and checks every sparse
algorithm against the numpy reference of ``sparse_random`` (absent entries +0, NaN wins, a
+0/-0 tie gives +0 for max and -0 for min, every NaN numpy's):

  nan    float max/min, float16/32/64, 1-D and rows of 3, indices on every rank ("full": ties
         and NaN meet real values) or on some (absent entries); NaN on one rank only, +-inf,
         +-0: every algorithm, and ``output="dense"`` where it has a path of its own (dense's
         ``dense_result``, split's regions, auto's choice), bit for bit, every NaN with
         numpy's bits, so every algorithm gives the same bits
  flush  the emulated sum also turns a -0 result into +0: float sums and averages of rows of
         width 0, 3 and 8 (the dense algorithm's three presence methods) keep the exact union
         in every algorithm, values equal up to the sign of zero (a -0 every rank holds may
         come back +0 from such a network)

Every result is also bitwise identical on every rank; NCCL call logs are compared per mode.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import cupycoll.testing.emulation as emu

emu.install(int(os.environ.get("CC_EMU_DEVICES", "2")))
import cupy  # noqa: E402  (the emulated one)
from _common import assert_identical_across_ranks, rng_for  # noqa: E402
from mpi4py import MPI  # noqa: E402
from sparse_random import ALGORITHMS, reference, same_bits  # noqa: E402

import cupycoll as cc  # noqa: E402
import cupycoll.testing.emulation.nccl as emulated_nccl  # noqa: E402
from cupycoll.testing.emulation.nccl_core import STATE  # noqa: E402

MODE, SEED = sys.argv[1], int(sys.argv[2])
WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
N = 40
EXACT = np.array([-2, -1, -0.5, -0.0, 0.0, 0.5, 1, 2, np.inf, -np.inf])
#: the algorithms with a path of their own for output="dense" (the others densify their result)
DENSE_OUTPUT = ("dense", "split", "auto")
#: the bits of numpy's NaN in each float dtype: every NaN of a result must have them.
CANONICAL = {d: np.array(np.nan, d).view(f"u{np.dtype(d).itemsize}")
             for d in ("float16", "float32", "float64")}


def nccl_reductions(flush_minus_zero: bool) -> None:
    """Make the emulated NCCL reduce as NCCL's kernels may: float max/min drop a NaN (fmax,
    fmin: the other operand wins), and with ``flush_minus_zero`` a float sum that comes out
    -0 is +0. Other reductions stay the emulator's."""
    real, emulated = STATE["real"], getattr(emulated_nccl, "_reduce_rows_of_emulator", None)
    if emulated is None:
        emulated = emulated_nccl._reduce_rows_of_emulator = emulated_nccl.reduce_rows
    drop_nan = {real.NCCL_MAX: np.fmax, real.NCCL_MIN: np.fmin}

    def reduce_rows(stack: np.ndarray, op: int, datatype: int) -> np.ndarray:
        if stack.dtype.kind == "f" and int(op) in drop_nan:
            out = stack[0].copy()
            for row in stack[1:]:
                drop_nan[int(op)](out, row, out=out)
            return out
        out = emulated(stack, op, datatype)
        if flush_minus_zero and stack.dtype.kind == "f" and int(op) == real.NCCL_SUM:
            out[out == 0] = 0  # -0 (and +0) stored as +0
        return out

    emulated_nccl.reduce_rows = reduce_rows


def confirm_reductions(comm, flush_minus_zero: bool) -> None:
    """The NCCL backend's own allreduce drops a NaN (and flushes -0): what the checks below
    must survive is really there."""
    x = cupy.asarray(np.array([np.nan if RANK == 0 else 1.0, -0.0], np.float32))
    cc.allreduce(x, op="max", comm=comm, out=x)
    assert x[0].get() == 1.0, "the emulated NCCL max kept a NaN"
    y = cupy.asarray(np.array([-0.0], np.float32))
    cc.allreduce(y, op="sum", comm=comm, out=y)
    assert bool(np.signbit(y.get()[0])) is not flush_minus_zero, y.get()


def rank_input(case: int, rank: int, pattern: str, width: int, dtype: str, nan_rank: int):
    """One rank's entries: every index ("full") or a random half; values from EXACT, and NaN
    in a few entries of ``nan_rank`` only."""
    rng = rng_for(SEED, rank, case)
    idx = np.arange(N) if pattern == "full" else np.flatnonzero(rng.random(N) < 0.5)
    rng.shuffle(idx)
    shape = (idx.size,) + ((width,) if width else ())
    val = rng.choice(EXACT, shape)
    if rank == nan_rank:
        val[rng.random(shape) < 0.15] = np.nan
    return idx.astype(np.int64), val.astype(dtype)


def run(comm, inputs, op, algorithm, output):
    """This rank's call on the device; the result on the host as (indices, values)."""
    idx, val = (cupy.asarray(a) for a in inputs[RANK])
    res = cc.sparse_allreduce(idx, val, N, op=op, algorithm=algorithm, comm=comm,
                              output=output)
    if output == "dense":
        return res.get()
    return res.indices.get(), res.values.get()


def check_nan_bits(got: np.ndarray, dtype: str, where: str) -> None:
    nan = got[np.isnan(got)]
    assert np.all(nan.view(f"u{nan.itemsize}") == CANONICAL[dtype]), \
        f"{where}: a NaN without numpy's NaN bits"


def mode_nan(comm) -> list:
    """Float max/min on NCCL: the reference's bits in every algorithm and output."""
    nccl_reductions(flush_minus_zero=False)
    confirm_reductions(comm, flush_minus_zero=False)
    results, case = [], 0
    for dtype in ("float16", "float32", "float64"):
        for op in ("max", "min"):
            for pattern in ("full", "some"):
                for width in (0, 3):
                    case += 1
                    prm = dict(op=op, dtype=dtype, width=width)
                    inputs = [rank_input(case, r, pattern, width, dtype, case % P)
                              for r in range(P)]
                    ref_idx, ref_val, _, _ = reference(inputs, prm, P)
                    want = ref_val.astype(dtype)
                    absent = np.setdiff1d(np.arange(N), ref_idx)
                    for algorithm in ALGORITHMS:
                        where = f"{algorithm} {prm} {pattern}"
                        got_idx, got_val = run(comm, inputs, op, algorithm, "sparse")
                        assert np.array_equal(got_idx, ref_idx), where
                        assert same_bits(got_val, want), \
                            f"{where}: got\n{got_val}\nwant\n{want}"
                        check_nan_bits(got_val, dtype, where)
                        results += [got_idx, got_val]
                        if algorithm not in DENSE_OUTPUT:
                            continue
                        dense = run(comm, inputs, op, algorithm, "dense")
                        assert not dense[absent].view(np.uint8).any(), f"{where}: not +0"
                        assert same_bits(dense[ref_idx], want), \
                            f"{where}, dense output: got\n{dense[ref_idx]}\nwant\n{want}"
                        check_nan_bits(dense, dtype, where)
                        results.append(dense)
    if RANK == 0:
        print(f"nan: {case} cases x {len(ALGORITHMS)} algorithms, dense output by "
              f"{', '.join(DENSE_OUTPUT)}")
    return results


def mode_flush(comm) -> list:
    """Float sums on a network that loses -0: the exact union everywhere."""
    nccl_reductions(flush_minus_zero=True)
    confirm_reductions(comm, flush_minus_zero=True)
    results, case = [], 100
    for dtype in ("float32", "float64"):
        for op in ("sum", "avg"):
            for width in (0, 3, 8):
                case += 1
                prm = dict(op=op, dtype=dtype, width=width)
                inputs = [rank_input(case, r, "some", width, dtype, case % P)
                          for r in range(P)]
                ref_idx, ref_val, _, _ = reference(inputs, prm, P)
                want = ref_val.astype(dtype)
                for algorithm in ALGORITHMS:
                    where = f"{algorithm} {prm}"
                    got_idx, got_val = run(comm, inputs, op, algorithm, "sparse")
                    assert np.array_equal(got_idx, ref_idx), \
                        f"{where}: union\n{got_idx}\nwant\n{ref_idx}"
                    assert np.array_equal(got_val, want, equal_nan=True), \
                        f"{where}: got\n{got_val}\nwant\n{want}"
                    check_nan_bits(got_val, dtype, where)
                    results += [got_idx, got_val]
    if RANK == 0:
        print(f"flush: {case - 100} cases x {len(ALGORITHMS)} algorithms")
    return results


MODES = {"nan": mode_nan, "flush": mode_flush}


def main() -> None:
    np.seterr(all="ignore")  # the reference meets inf - inf on purpose
    comm = cc.init("nccl", timeout=60)
    assert comm.backend == "nccl" and comm.xp is cupy, comm
    for mode in MODE.split(","):
        assert_identical_across_ranks(*MODES[mode](comm))
        emu.check_logs()
    WORLD.Barrier()
    if RANK == 0:
        print(f"gpu_nan {MODE}: ok on {P} ranks")


if __name__ == "__main__":
    main()
