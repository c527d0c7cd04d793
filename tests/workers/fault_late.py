"""Fault injection: a late rank at every verb; the others must name it and the communicator die.

    fault_late.py TIMEOUT PREFIX LATE_COUNT

For every verb (dense sync and async, sparse sync and async, top-k, the compressor, the
Communicator's allgatherv/alltoallv/barrier): a fresh communicator, PREFIX good calls, then
LATE_COUNT ranks stay away (sleep past the timeout, then skip the call) while the others call.
Every rank that times out must raise CollectiveTimeout with ``missing_ranks`` == the late ranks,
``op_name`` == the verb, after about TIMEOUT seconds, and its next call must raise at once.
(A rooted verb may complete on ranks that need nothing from the late one.) Rank 0 prints one
line per scenario: verb, P, what each rank raised, after how many seconds.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

import cupycoll as cc
from cupycoll.errors import CollectiveTimeout
from _common import napping_barrier

WORLD = MPI.COMM_WORLD
TIMEOUT, PREFIX, LATE_COUNT = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
P, RANK = WORLD.size, WORLD.rank


def late_ranks(step: int) -> list[int]:
    return sorted({(step + i) % P for i in range(LATE_COUNT)})


def verbs(step: int) -> dict:
    """verb name -> call(comm); every call is collective and cheap. Roots are chosen so that
    a punctual rank must wait for a late one (broadcast from a late root, reduce to a punctual
    one)."""
    late = late_ranks(step)
    punctual = [r for r in range(P) if r not in late]
    x = np.arange(4 * P, dtype=np.float32) + RANK
    blocks = np.ones(8192 * P, np.float32)  # 32 KiB blocks: the pairwise reduce_scatter
    big = np.ones(1 << 16, np.float32)  # 256 KiB: reduce as a pairwise exchange and a gather
    idx = np.array([RANK, P + 1], np.int64)
    val = np.ones(2, np.float32)
    sparse = cc.algorithms("sparse")
    topk = [a for a in cc.algorithms("topk")]
    compressor: dict = {}

    def compress(comm):
        comp = compressor.setdefault(id(comm), cc.TopkCompressor(x.size, 0.25, comm=comm))
        return comp.step(x)

    return {
        "allreduce": lambda c: cc.allreduce(x, comm=c),
        "broadcast": lambda c: cc.broadcast(x, root=late[0], comm=c),
        "reduce": lambda c: cc.reduce(x, root=punctual[0], comm=c),
        "reduce/pairwise": lambda c: cc.reduce(big, root=punctual[0], comm=c),
        "allgather": lambda c: cc.allgather(x, comm=c),
        "reduce_scatter": lambda c: cc.reduce_scatter(x, comm=c),
        "reduce_scatter/pairwise": lambda c: cc.reduce_scatter(blocks, comm=c),
        "allreduce/async": lambda c: cc.allreduce(x, comm=c, async_op=True).wait(),
        "sparse_allreduce": lambda c: cc.sparse_allreduce(
            idx, val, 4 * P, comm=c, algorithm=sparse[step % len(sparse)]),
        "sparse_allreduce/async": lambda c: cc.sparse_allreduce(
            idx, val, 4 * P, comm=c, async_op=True).wait(),
        "topk_allreduce": lambda c: cc.topk_allreduce(x, 3, comm=c,
                                                      algorithm=topk[step % len(topk)]),
        "TopkCompressor.step": compress,
        "allgatherv": lambda c: c.allgatherv(x[:RANK + 1]),
        "alltoallv": lambda c: c.alltoallv([x[:r + 1] for r in range(P)]),
        "barrier": lambda c: c.barrier(),
    }


def scenario(step: int, name: str, call) -> tuple:
    """Run one scenario; return (outcome, seconds) of this rank."""
    comm = cc.init("mpi", timeout=0)  # good calls without a timeout: a loaded machine may
    late = late_ranks(step)           # stall them, and they are not what is tested
    for _ in range(PREFIX):
        call(comm)
    napping_barrier()
    comm.timeout = TIMEOUT
    if RANK in late:
        time.sleep(TIMEOUT + 0.3)  # the others have given up by now; skip the call
        return "late", 0.0
    start = time.monotonic()
    try:
        call(comm)
    except CollectiveTimeout as exc:
        took = time.monotonic() - start
        verb = name.split("/")[0]
        assert exc.missing_ranks == late, (name, exc.missing_ranks, late, str(exc))
        assert exc.op_name == verb, (name, exc.op_name)
        assert f"rank{'s' if len(late) > 1 else ''} {', '.join(map(str, late))}" in str(exc)
        assert TIMEOUT * 0.9 <= took <= TIMEOUT + 5, (name, took)
        again = time.monotonic()
        try:
            call(comm)
        except CollectiveTimeout as dead:
            assert "aborted in" in str(dead) and verb in str(dead), str(dead)
            assert dead.missing_ranks == late
        else:
            raise AssertionError(f"{name}: a dead communicator answered")
        assert time.monotonic() - again < 0.5, "a dead communicator must raise at once"
        return f"CollectiveTimeout{exc.missing_ranks}", took
    return "completed", time.monotonic() - start


def main() -> None:
    from cupycoll.primitives._accel import ready

    ready()  # numba's import in the background would hold the GIL in the timed calls
    rows = []
    for step, (name, call) in enumerate(verbs(0).items()):
        call = verbs(step)[name]
        outcome, took = scenario(step, name, call)
        napping_barrier()  # the late ranks are still asleep
        every = WORLD.gather((outcome, took), root=0)
        if RANK == 0:
            raised = [o for o, _ in every if o.startswith("CollectiveTimeout")]
            assert raised, f"{name}: nobody timed out"
            if name.split("/")[0] not in ("broadcast", "reduce"):  # these may complete
                assert all(o != "completed" for o, _ in every), (name, every)  # on some ranks
            cells = ", ".join(f"r{r}: {o}" + (f" {t:.2f}s" if t else "")
                              for r, (o, t) in enumerate(every))
            rows.append(f"LATE {name:<24} P={P} prefix={PREFIX}  {cells}")
        napping_barrier()
    if RANK == 0:
        print("\n".join(rows))
        print("OK")


main()
