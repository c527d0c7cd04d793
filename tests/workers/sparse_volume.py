"""Bytes and messages of every sparse algorithm against its cost model, exactly, per rank.

Usage: sparse_volume.py SEED

Constructed inputs (disjoint, identical, random overlap, dense enough for recursive doubling's
switch, empty ranks) are rebuilt on every rank; after each call this rank's ``comm.stats``
(per operation name: bytes and messages received) must equal the model of the algorithm plus
the validation allreduce. Entries travel as raw COO (``wire="coo"``: whether ``auto`` codes them
depends on the machine profile; the compact wire's traffic is checked in wire_mpi.py). split's traffic is also derived here from first principles (regions
from the documented sampling rule, slices and unions counted with numpy on the gathered inputs),
independently of the library's model, including on skewed inputs with unequal nnz per rank.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
from _common import rng_for, unique
from mpi4py import MPI

from cupycoll.comm.mpi import MPICommunicator
from cupycoll.sparse import sparse_allreduce
from cupycoll.sparse._cost import Shape
from cupycoll.sparse.auto import call_cost
from cupycoll.sparse.recursive_doubling import reads_in_place

ALGORITHMS = ["allgather", "mask", "dense", "recursive_doubling", "split", "auto"]
#: hierarchical runs once per emulated node size (CUPYCOLL_RANKS_PER_NODE), the last node short.
RANKS_PER_NODE = (1, 2, 3)
#: a case whose one rail of every rank (one rank per node) runs split from P = 4 on: its dense
#: output densifies split's sparse result (the model priced split's dense regions)
RAIL_SPLIT = ("random", 1 << 16, 120000, 0, "float32", None, "int64")


SAMPLES = 128  # split's documented samples per rank


def indices_for(pattern: str, rank: int, size: int, n: int, k: int, rng) -> np.ndarray:
    if pattern == "skewed":  # nnz k, 4k, 9k, ...: half from a hot 1% range, the rest spread
        m = k * (rank + 1) ** 2
        return unique(np.concatenate([rng.integers(0, n // 100, m // 2),
                                         rng.integers(0, n, m - m // 2)]))
    if pattern == "disjoint":
        return np.arange(rank, n, size)[:k]
    if pattern == "identical":
        return np.arange(0, n, max(n // max(k, 1), 1))[:k]
    if pattern == "empty_some":
        return np.empty(0, np.int64) if rank % 2 else unique(rng.integers(0, n, k))
    return unique(rng.integers(0, n, k))


def split_regions(inputs: list[np.ndarray], n: int) -> np.ndarray:
    """Region bounds by split's documented rule, written from the rule, not from the library.

    Every rank's SAMPLES samples ``a[i * nnz // SAMPLES]`` weigh nnz each; bound j (0 < j < P) is
    the smallest sample value whose samples at or below it weigh at least j/P of all samples
    (rounded up); with no entries anywhere the bounds cut [0, n) evenly.
    """
    p = len(inputs)
    values = np.concatenate([a[(np.arange(SAMPLES) * a.size) // SAMPLES] for a in inputs if a.size]
                            or [np.empty(0, np.int64)])
    weights = np.concatenate([np.full(SAMPLES, a.size) for a in inputs if a.size]
                             or [np.empty(0, np.int64)])
    total = int(weights.sum())
    if total == 0:
        return np.array([j * n // p for j in range(p)] + [n])
    distinct = unique(values)
    at_or_below = np.array([weights[values <= v].sum() for v in distinct])
    bounds = [0]
    for j in range(1, p):
        target = -(-j * total // p)
        bounds.append(max(bounds[-1], int(distinct[np.argmax(at_or_below >= target)])))
    return np.array(bounds + [n])


def split_traffic(inputs: list[np.ndarray], n: int, rank: int, entry_bytes: int,
                  region_row_bytes: int | bool = False, gathered_bytes: int | None = None,
                  presence: bool = False) -> dict:
    """split's (bytes, messages) received by ``rank`` per operation, counted with numpy;
    ``region_row_bytes``: regions gathered dense, as rows of that many bytes (every peer's
    region whole, no counts), and with ``presence`` (a sparse output) a bit per row, each
    region's bits packed in whole bytes; ``gathered_bytes``: bytes of one gathered entry
    (default ``entry_bytes``; a dense output's owners gather entries of the caller's dtype)."""
    p = len(inputs)
    if p == 1:
        return {}
    bounds = split_regions(inputs, n)
    region = [[a[(a >= bounds[r]) & (a < bounds[r + 1])] for a in inputs] for r in range(p)]
    mine = [region[rank][q].size for q in range(p) if q != rank]  # others' slices of my region
    unions = [unique(np.concatenate(region[r])).size for r in range(p) if r != rank]
    peers = (p - 1) * 8
    want = {"split.samples": ((p - 1) * (SAMPLES + 1) * 8, p - 1), "split.counts": (peers, p - 1)}
    if sum(mine):
        want["split.scatter"] = (sum(mine) * entry_bytes, sum(1 for c in mine if c))
    if region_row_bytes:
        spans = [int(bounds[r + 1] - bounds[r]) for r in range(p) if r != rank]
        if sum(spans):
            want["split.regions"] = (sum(spans) * region_row_bytes, sum(1 for s in spans if s))
            if presence:
                want["split.presence"] = (sum(-(-s // 8) for s in spans),
                                          sum(1 for s in spans if s))
        return want
    want["split.gather.counts"] = (peers, p - 1)
    if sum(unions):
        want["split.gather"] = (sum(unions) * (gathered_bytes or entry_bytes),
                                sum(1 for u in unions if u))
    return want


def measured(comm) -> dict:
    return {op: (s.bytes_received, s.messages_received) for op, s in comm.stats.by_op.items()
            if s.bytes_received or s.messages_received}


def main() -> None:
    seed = int(sys.argv[1])
    comm = MPICommunicator(MPI.COMM_WORLD, timeout=60)
    size, rank = comm.size, comm.rank
    cases = [(pattern, n, k, width, dtype, acc, itype)
             for pattern, n, k in (("disjoint", 4000, 300), ("identical", 4000, 300),
                                   ("random", 4000, 300), ("random", 64, 40),
                                   ("random", 1 << 20, 5000), ("empty_some", 500, 60),
                                   ("skewed", 1 << 22, 400))
             for width, dtype, acc, itype in ((0, "float32", None, "int32"),
                                              (3, "float16", "float32", "int64"),
                                              (0, "int64", None, "int64"))]
    cases.append(RAIL_SPLIT)
    checked = dense_regions = 0
    for c, (pattern, n, k, width, dtype, acc, itype) in enumerate(cases):
        rng = rng_for(seed, rank, c)
        idx = indices_for(pattern, rank, size, n, k, rng).astype(itype)
        shape = (idx.size, width) if width else (idx.size,)
        # every rank's input, gathered by raw mpi4py: O(1) generation per rank, not O(P)
        inputs = MPI.COMM_WORLD.allgather((idx, rng.integers(-9, 10, shape).astype(dtype)))
        vbytes = np.dtype(acc or dtype).itemsize
        model_shape = Shape.from_inputs([i for i, _ in inputs], n, width,
                                        np.dtype(itype).itemsize, vbytes)
        model_shape = dataclasses.replace(  # blocks read in place as the front door sees them
            model_shape, float_values=np.dtype(acc or dtype).kind == "f" and vbytes >= 4,
            in_place=reads_in_place(comm, model_shape.nnz, n, np.dtype(itype).itemsize,
                                    np.dtype(dtype).itemsize * max(width, 1)))
        runs = [("hierarchical", 1, o) for o in ("sparse", "dense")] if cases[c] is RAIL_SPLIT \
            else ([(a, None, "sparse") for a in ALGORITHMS]
                  + [("hierarchical", r, "sparse") for r in RANKS_PER_NODE]
                  + [(a, None, "dense") for a in ALGORITHMS]
                  + [("hierarchical", r, "dense") for r in (*RANKS_PER_NODE, size)])
        for algorithm, per_node, output in runs:
            shape = dataclasses.replace(model_shape, output=output,
                                        result_bytes=np.dtype(dtype).itemsize)
            if per_node is not None:
                os.environ["CUPYCOLL_RANKS_PER_NODE"] = str(per_node)
                shape = dataclasses.replace(shape, nodes=tuple(r // per_node for r in range(size)))
            comm.stats.reset()
            sparse_allreduce(*inputs[rank], n, algorithm=algorithm, comm=comm,
                             accumulate_dtype=acc, output=output, wire="coo")
            os.environ.pop("CUPYCOLL_RANKS_PER_NODE", None)
            model = call_cost(algorithm, shape, rank)
            want = {op: (model.received[op], model.messages[op]) for op in model.received}
            got = measured(comm)
            assert got == want, (f"rank {rank} {algorithm}/{per_node} {pattern} n={n} k={k} w={width} "
                                 f"{dtype}/{acc} {itype}:\n got  {sorted(got.items())}\n"
                                 f" want {sorted(want.items())}")
            assert comm.stats.bytes_received == model.bytes_received
            if algorithm == "split":
                result_row = np.dtype(dtype).itemsize * max(width, 1)
                sparse_rows = output == "sparse" and "split.regions" in got
                dense_regions += sparse_rows
                regions = "split.regions" in got and (vbytes * max(width, 1) if sparse_rows
                                                      else result_row)
                first = split_traffic([i for i, _ in inputs], n, rank,
                                      np.dtype(itype).itemsize + vbytes * max(width, 1), regions,
                                      np.dtype(itype).itemsize + result_row
                                      if output == "dense" else None, sparse_rows)
                got.pop("sparse.validate", None)
                assert got == first, (f"rank {rank} split {pattern} n={n}: numpy count differs"
                                      f"\n got  {sorted(got.items())}\n want {sorted(first.items())}")
            checked += 1
    if rank == 0:
        print(f"ok {checked} volume checks on {size} ranks; split's sparse results gathered "
              f"as dense regions: {dense_regions}")


if __name__ == "__main__":
    main()
