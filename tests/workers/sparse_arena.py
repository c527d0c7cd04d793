"""recursive_doubling's blocks read in place from the exchange arena (comm/_mpi_arena.py).

A sequence of calls on one communicator, small, then large enough that the window is made
again larger, then small again, with empty ranks, duplicate indices, 1-D values and rows, and
a case dense enough that the rounds go dense: every result against a dense reference after
the whole sequence ran (a result that still lay in the window would have been overwritten by
the calls after it), none in the window, and every call used it (the least size a call takes
the arena from lowered to 0; by default a call below it copies); ``auto`` prices such a call
as read in place (``Shape.in_place``). Then the same calls on a communicator where one rank has
no room for a window: none is made, on any rank, and ``auto`` prices its blocks as copied.

Usage: sparse_arena.py SEED
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from _common import check_result, rng_for, union_reference
from mpi4py import MPI

import cupycoll as cc
from cupycoll.comm import _mpi_arena
from cupycoll.sparse import _validate, sparse_allreduce
from cupycoll.sparse._cost import Shape

#: (n, entries a rank, width): the fourth outgrows the window the first three made
CASES = [(1000, 40, 0), (5000, 300, 3), (200, 150, 0), (400_000, 60_000, 4), (3000, 20, 2),
         (64, 60, 0), (1000, 0, 0)]


def inputs(seed: int, rank: int, case: int) -> tuple[np.ndarray, np.ndarray]:
    n, entries, width = CASES[case]
    rng = rng_for(seed, rank, case)
    count = 0 if rank == 1 and case == 2 else entries  # rank 1 holds nothing there
    idx = rng.integers(0, n, count)  # duplicates: coalesced on the way
    shape = (count, width) if width else (count,)
    return idx, rng.integers(-8, 9, shape).astype(np.float32)  # exact sums in any order


def expected(seed: int, size: int, case: int) -> tuple[np.ndarray, np.ndarray]:
    n, _, width = CASES[case]
    return union_reference([inputs(seed, r, case) for r in range(size)], n, width)


def priced_shape(seed: int, comm: Any) -> Shape:
    """The Shape ``auto`` prices the largest case by on ``comm`` (the front door's)."""
    made, shape_of = [], _validate.Prepared.shape
    _validate.Prepared.shape = lambda *a, **k: made.append(shape_of(*a, **k)) or made[-1]
    try:
        sparse_allreduce(*inputs(seed, comm.rank, 3), CASES[3][0], comm=comm, algorithm="auto")
    finally:
        _validate.Prepared.shape = shape_of
    assert made and made[-1].host, made
    return made[-1]


def main() -> None:
    seed = int(sys.argv[1])
    world = MPI.COMM_WORLD
    least = _mpi_arena.FROM
    small = cc.init("mpi")  # a call below FROM bytes copies; one above takes the arena
    sparse_allreduce(*inputs(seed, small.rank, 1), CASES[1][0], comm=small,
                     algorithm="recursive_doubling")
    assert _mpi_arena._ARENAS.get(small) is None
    sparse_allreduce(*inputs(seed, small.rank, 3), CASES[3][0], comm=small,
                     algorithm="recursive_doubling")
    assert _mpi_arena._ARENAS.get(small) is not None
    _mpi_arena.FROM = 0  # every call below takes the arena
    comm = cc.init("mpi")
    assert priced_shape(seed, comm).in_place
    begun, begin = [], _mpi_arena.Arena.begin
    _mpi_arena.Arena.begin = lambda self: begun.append(self) or begin(self)
    results = [sparse_allreduce(*inputs(seed, comm.rank, case), CASES[case][0], comm=comm,
                                algorithm="recursive_doubling") for case in range(len(CASES))]
    arena = _mpi_arena._ARENAS.get(comm)
    assert arena is not None and len(begun) >= 4 and begun[-1] is arena, begun  # (the
    # smallest calls ride in the validation: sparse/small.py)
    assert arena.half >= 2 * _mpi_arena._LEAST, arena.half  # made again, larger
    for case, result in enumerate(results):
        check_result(result, expected(seed, comm.size, case))
        assert not arena.holds(result.indices) and not arena.holds(result.values), case
    # rank 0 without room for a window: no rank makes one, and every call copies its blocks
    _mpi_arena._room = lambda nbytes: comm.rank != 0
    other = cc.init("mpi")
    for case in range(len(CASES)):
        check_result(sparse_allreduce(*inputs(seed, comm.rank, case), CASES[case][0],
                                      comm=other, algorithm="recursive_doubling"),
                     expected(seed, comm.size, case))
    assert _mpi_arena._ARENAS.get(other) is None and not priced_shape(seed, other).in_place
    _mpi_arena.FROM = least
    world.Barrier()
    if comm.rank == 0:
        print(f"ok {len(CASES)} arena calls on {comm.size} ranks, half {arena.half}")


if __name__ == "__main__":
    main()
