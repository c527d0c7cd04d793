"""Benchmark the wire formats (cupycoll.wire): sizes, and codec speed against a plain copy.

Single process. ``--sweep`` prints only the design comparison: bytes per index of varints
and of bit-packed blocks of 8..128 gaps (the chosen format uses 32). Otherwise part 1 prints the encoded size of uniform random index streams per density
(bytes per index, ratio to raw int32, to raw int64 and to a bitmap of the stream's span). Part 2 times
encode/decode of the index stream of an n = 2**24 vector at 1 % (numpy loops, numba loops on one
thread and on the default threads, and cupy when a GPU is there), and rounding values to
bfloat16/float16, interleaved with a plain copy of the same input, medians:

    python bench/bench_wire.py                  # n = 2**24, density 1 %
    python bench/bench_wire.py --log2n 20 --json out.json

``vs copy`` = codec time / time of ``idx.copy()`` (values: ``val.copy()``), for the median
and for the best of the rounds (steadier on a loaded machine).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np
from _common import (Table, common_parser, fraction, implementations, measure,
                     non_negative_int, positive_int, under)

from cupycoll import wire

SIZE_COLUMNS = ["density", "format", "bytes/index", "vs int32", "vs int64", "vs bitmap"]
TIME_COLUMNS = ["operation", "impl", "time(ms)", "best(ms)", "copy(ms)", "copy best", "vs copy",
                "best vs copy", "GB/s in", "#wrong"]
SWEEP_COLUMNS = ["density", "varint", *(f"blocks of {b}" for b in (8, 16, 32, 64, 128)),
                 "bitmap"]
DENSITIES = (1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2, 0.3, 0.5)


def timed(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, tuple[float, float]]:
    """(median, best) seconds of each function over ``reps`` round-robin rounds: on a loaded
    machine the best of the rounds is the steadier figure."""
    rounds = [measure(fns, 1) for _ in range(reps)]
    return {name: (float(np.median([r[name] for r in rounds])), min(r[name] for r in rounds))
            for name in fns}


def stream(rng: np.random.Generator, n: int, density: float) -> np.ndarray:
    return np.flatnonzero(rng.random(n) < density).astype(np.int32)


def streams(rng: np.random.Generator, n: int, densities: tuple, least: int) -> Any:
    """(density, stream) for each density whose stream has at least ``least`` indices (a small
    n at a low density draws too few to size per index)."""
    for density in densities:
        idx = stream(rng, n, density)
        if idx.size >= least:
            yield density, idx


def bench_sizes(table: Table, rng: np.random.Generator, n: int) -> None:
    for density, idx in streams(rng, n, DENSITIES, 1):
        size = wire.encoded_nbytes(idx, 0, n)
        tag = chr(wire.encode_indices(idx, 0, n)[0])
        bitmap = (int(idx[-1]) - int(idx[0])) // 8 + 1
        table.add({"density": density, "format": {"D": "delta", "B": "bitmap"}[tag],
                   "bytes/index": size / idx.size, "vs int32": size / (4 * idx.size),
                   "vs int64": size / (8 * idx.size), "vs bitmap": size / bitmap})


def varint_bytes(values: np.ndarray) -> int:
    """Bytes of ``values`` (uint64) as LEB128 varints."""
    total, rest = values.size, values >> np.uint64(7)
    while rest.any():
        total += int(np.count_nonzero(rest))
        rest >>= np.uint64(7)
    return total


def block_bytes(gaps: np.ndarray, block: int) -> int:
    """Bytes of ``gaps`` bit-packed in blocks of ``block`` with one width byte per block."""
    nblocks = -(-gaps.size // block)
    padded = np.zeros(nblocks * block, np.uint64)
    padded[:gaps.size] = gaps
    widths = wire._index_codec.bit_lengths(padded.reshape(nblocks, block).max(axis=1)).astype(int)
    lens = np.full(nblocks, block)
    lens[-1] = gaps.size - block * (nblocks - 1)
    return nblocks + int(((lens * widths + 7) // 8).sum())


def bench_sweep(table: Table, rng: np.random.Generator, n: int) -> None:
    """The design choice: varints against bit-packed blocks of 8..128 and a bitmap."""
    for density, idx in streams(rng, n, (1e-3, 1e-2, 0.05, 0.1, 0.3), 2):
        gaps = (np.diff(idx.astype(np.int64)) - 1).astype(np.uint64)
        row = {"density": density, "varint": varint_bytes(gaps) / idx.size}
        for block in (8, 16, 32, 64, 128):
            row[f"blocks of {block}"] = block_bytes(gaps, block) / idx.size
        row["bitmap"] = (int(idx[-1]) - int(idx[0])) // 8 / idx.size
        table.add(row)


def _devices() -> Any:
    """cupy when a CUDA device is usable, else None."""
    try:
        import cupy

        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:
        return None


def bench_codec(table: Table, rng: np.random.Generator, n: int, density: float, reps: int,
                impls: list[str]) -> None:
    idx = stream(rng, n, density)
    enc = wire.encode_indices(idx, 0, n)
    val = rng.standard_normal(idx.size).astype(np.float32)
    case = f"n=2^{int(np.log2(n))} d={density:g} k={idx.size}"
    fns: dict[str, Callable[[], Any]] = {"copy idx": idx.copy, "copy val": val.copy}
    read: dict[str, int] = {}  # bytes of each operation's input
    for impl in impls:
        fns[f"encode {impl}"] = under(impl, lambda: wire.encode_indices(idx, 0, n))
        fns[f"decode {impl}"] = under(impl, lambda: wire.decode_indices(enc, np.int32))
        read[f"encode {impl}"], read[f"decode {impl}"] = idx.nbytes, enc.nbytes
    fns["nbytes auto"] = lambda: wire.encoded_nbytes(idx, 0, n)  # numba when installed
    read["nbytes auto"] = idx.nbytes
    for fmt in wire.FORMATS:
        fns[f"round {fmt}"] = lambda fmt=fmt: wire.round_values(val, fmt)
        payload = wire.round_values(val, fmt)[0]
        fns[f"widen {fmt}"] = lambda fmt=fmt, payload=payload: wire.widen_values(payload, fmt)
        read[f"round {fmt}"], read[f"widen {fmt}"] = val.nbytes, payload.nbytes
    times = timed(fns, reps)
    for name, fn in fns.items():
        if name.startswith("copy"):
            continue
        op, impl = name.split(" ")
        ref = "copy val" if op in ("round", "widen") else "copy idx"
        wrong = 0
        if op == "encode":
            wrong = int(not np.array_equal(fn(), enc))
        elif op == "decode":
            wrong = int(not np.array_equal(fn(), idx))
        table.add({"operation": f"{op}_{'values' if ref == 'copy val' else 'indices'}",
                   "impl": impl, "case": case, **_cells(times[name], times[ref], read[name]),
                   "#wrong": wrong})
    cupy = _devices()
    if cupy is not None:
        bench_gpu(table, cupy, idx, enc, n, case, reps)


def bench_gpu(table: Table, cupy: Any, idx: np.ndarray, enc: np.ndarray, n: int, case: str,
              reps: int) -> None:
    didx, denc = cupy.asarray(idx), cupy.asarray(enc)

    def synced(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            out = fn()
            cupy.cuda.Device().synchronize()
            return out
        return run

    fns = {"copy": synced(didx.copy), "encode": synced(lambda: wire.encode_indices(didx, 0, n)),
           "decode": synced(lambda: wire.decode_indices(denc, np.int32))}
    times = timed(fns, reps)
    for op, want, given in (("encode", enc, idx), ("decode", idx, enc)):
        wrong = int(not np.array_equal(cupy.asnumpy(fns[op]()), want))
        table.add({"operation": f"{op}_indices", "impl": "cupy", "case": case,
                   **_cells(times[op], times["copy"], given.nbytes), "#wrong": wrong})


def _cells(mine: tuple[float, float], copy: tuple[float, float], nbytes: int) -> dict:
    """Table cells of one timing (median, best) against the copy's."""
    return {"time(ms)": mine[0] * 1e3, "best(ms)": mine[1] * 1e3, "copy(ms)": copy[0] * 1e3,
            "copy best": copy[1] * 1e3, "vs copy": mine[0] / copy[0],
            "best vs copy": mine[1] / copy[1], "GB/s in": nbytes / mine[1] / 1e9}


def main(argv: list[str] | None = None) -> int:
    p = common_parser(__doc__.splitlines()[0], flags="")
    p.add_argument("--log2n", type=non_negative_int, default=24, help="dense length n = 2**log2n")
    p.add_argument("--density", type=fraction, default=0.01, help="density of the timed stream")
    p.add_argument("--reps", type=positive_int, default=9, help="repetitions (median reported)")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--impl", choices=("both", "numpy", "numba1", "numba"), default="both")
    p.add_argument("--sweep", action="store_true",
                   help="only the design sweep: varints against bit-packed block sizes")
    args = p.parse_args(argv)
    if args.log2n > 31:
        p.error(f"--log2n {args.log2n}: at most 31 (the streams hold int32 indices)")
    rng = np.random.default_rng(args.seed)
    n = 1 << args.log2n
    if args.sweep:
        sweep = Table(SWEEP_COLUMNS, rank=0)
        sweep.header(f"bytes per index of each candidate coding, uniform random, n=2^{args.log2n}")
        bench_sweep(sweep, rng, n)
        return sweep.finish(args)

    sizes = Table(SIZE_COLUMNS, rank=0)
    sizes.header(f"encoded size of uniform random int32 streams, n=2^{args.log2n}")
    bench_sizes(sizes, rng, n)
    table = Table(TIME_COLUMNS, rank=0)
    table.widths = [18, 9, 10, 10, 10, 10, 9, 13, 9, 7]
    table.header(f"codec speed, n=2^{args.log2n} density {args.density:g}, numpy "
                 f"{np.__version__}; median and best of {args.reps} rounds; vs copy = time / "
                 "copy time; GB/s of input at the best time")
    bench_codec(table, rng, n, args.density, args.reps, implementations(args.impl))
    table.rows = sizes.rows + table.rows
    return table.finish(args)


if __name__ == "__main__":
    sys.exit(main())
