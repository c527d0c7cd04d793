"""``CUPYCOLL_AUTO=measure`` (cupycoll/sparse/measure.py) on P ranks.

Usage: auto_measure.py SEED [emulated]   (emulated: init("nccl") on cupycoll.testing.emulation)

Every algorithm is made a candidate (``WITHIN`` raised) and the model's best is slowed down by
a sleep in its registry entry, so the trials must end on another candidate. For two kinds of
call (1-D and rows) run in turn: every result against a dense numpy reference (small integer
values: exact whichever algorithm sums them), every rank's table of trials identical, each
candidate timed exactly ``SAMPLES`` + 1 times (the first a warm-up), then the pick kept (not
the slowed one) and no more timing collectives; asynchronous calls during the trials are not
timed and still right. Ranks
that disagree on the mode, or a bad mode, raise on every rank. At P = 1 nothing is timed. On
the emulated NCCL tier, the same, device arrays in and out (a trial waits for its device work).
"""

from __future__ import annotations

import os
import pickle
import sys

import numpy as np
from _common import check_result as check, emulation, expect_raises, rng_for, slowed
from _common import union_reference as reference
from mpi4py import MPI

SEED = int(sys.argv[1])
emu = emulation(sys.argv)
EMULATED = emu is not None

import cupycoll as cc  # noqa: E402
from cupycoll import _registry  # noqa: E402
from cupycoll.errors import InvalidArgument, MismatchError  # noqa: E402
from cupycoll.sparse import measure  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
SLOW = 0.03  # seconds the slowed candidate sleeps: far above any trial's spread here


def inputs(case: int, n: int, k: int, width: int):
    out = []
    for r in range(P):
        rng = rng_for(SEED, r, case)
        idx = rng.choice(n, k, replace=False).astype(np.int32)
        out.append((idx, rng.integers(-4, 5, (k, width) if width else k).astype(np.float32)))
    return out


def tables_identical(comm) -> dict:
    table = {k: (t.candidates, t.seconds, t.pick) for k, t in measure.measured(comm).items()}
    blobs = WORLD.allgather(pickle.dumps(table))
    assert all(b == blobs[0] for b in blobs), "ranks' trials differ"
    return table


def main() -> None:
    os.environ["CUPYCOLL_AUTO"] = "measure"
    measure.WITHIN = float("inf")  # every algorithm a candidate: the model ranks them
    comm = cc.init("nccl" if EMULATED else "mpi")
    xp = comm.xp
    cases = [(0, 3000, 400, 0), (1, 800, 90, 4)]
    slowed_names = {}
    for case, n, k, width in cases:
        parts = inputs(case, n, k, width)
        want = reference(parts, n, width)
        idx, val = (xp.asarray(a) for a in parts[RANK])
        table = measure.measured(comm)
        before = set(table)
        check(cc.sparse_allreduce(idx, val, n, comm=comm), want)
        if P == 1:
            assert not table, "nothing is timed on one rank"
            continue
        (new,) = set(table) - before
        trials = table[new]
        assert len(trials.candidates) == measure.CANDIDATES
        first = trials.candidates[0]  # the model's best: made the slowest
        sparse = _registry._REGISTRY["sparse"]
        slowed_names[first] = sparse[first]
        sparse[first] = slowed(sparse[first], SLOW)
        calls = (measure.SAMPLES + 1) * len(trials.candidates)  # + each one's warm-up
        for i in range(1, calls + 3):
            if i == 2:  # an asynchronous call during the trials: not timed
                timed = sum(map(len, trials.seconds.values()))
                check(cc.sparse_allreduce(idx, val, n, comm=comm, async_op=True).result(), want)
                assert sum(map(len, trials.seconds.values())) == timed
            stats = comm.stats.by_op.get("auto.measure")
            timings = stats.bytes_received if stats else 0
            check(cc.sparse_allreduce(idx, val, n, comm=comm), want)
            stats = comm.stats.by_op.get("auto.measure")
            timed_now = (stats.bytes_received if stats else 0) > timings
            assert timed_now == (i < calls), (i, calls)  # no timing once the pick is kept
        tables_identical(comm)
        assert all(len(s) == measure.SAMPLES + 1 for s in trials.seconds.values())
        assert set(trials.seconds) == set(trials.candidates)
        assert trials.pick is not None and trials.pick != first, (trials.pick, first)
        assert min(trials.seconds[first][1:]) >= SLOW  # its first trial ran before the sleep
        sparse[first] = slowed_names.pop(first)
    if P > 1:  # the mode must agree; a bad mode raises everywhere
        parts = inputs(9, 500, 60, 0)
        idx, val = (xp.asarray(a) for a in parts[RANK])
        os.environ["CUPYCOLL_AUTO"] = "measure" if RANK == 0 else "estimate"
        err = expect_raises(MismatchError, cc.sparse_allreduce, idx, val, 500, comm=comm)
        assert "CUPYCOLL_AUTO=measure" in str(err) and "algorithm" in str(err), err
        os.environ["CUPYCOLL_AUTO"] = "sometimes" if RANK == P - 1 else "measure"
        expect_raises((InvalidArgument, MismatchError), cc.sparse_allreduce, idx, val, 500,
                      comm=comm)
        os.environ["CUPYCOLL_AUTO"] = "measure"
        # the node layout set on one rank only, at a communicator's first call (which detects
        # the nodes) or a later one, for every node-aware verb: every rank raises, naming it
        fresh = comm.dup()
        for step, per_node in enumerate(("1", "2")):
            os.environ["CUPYCOLL_RANKS_PER_NODE"] = "1"
            if RANK == 0:
                os.environ["CUPYCOLL_RANKS_PER_NODE"] = per_node
            elif step == 0:
                os.environ.pop("CUPYCOLL_RANKS_PER_NODE")
            for call in (lambda: cc.sparse_allreduce(idx, val, 500, comm=fresh,
                                                     algorithm="hierarchical"),
                         lambda: cc.sparse_allreduce(idx, val, 500, comm=fresh),
                         lambda: cc.topk_allreduce(xp.ones(64, dtype=np.float32), 4, comm=fresh)):
                err = expect_raises(MismatchError, call)
                assert "CUPYCOLL_RANKS_PER_NODE" in str(err), err
                if step == 0 and "algorithm" in str(err):  # set on rank 0 only: both shown
                    assert "CUPYCOLL_RANKS_PER_NODE=unset" in str(err) and \
                        "CUPYCOLL_RANKS_PER_NODE=1" in str(err), err
            os.environ["CUPYCOLL_RANKS_PER_NODE"] = "1"
            cc.sparse_allreduce(idx, val, 500, comm=fresh, algorithm="hierarchical")
        os.environ.pop("CUPYCOLL_RANKS_PER_NODE", None)
        # a setting one rank cannot read: the others' error names it too
        if RANK == P - 1:
            os.environ["CUPYCOLL_NUMBA"] = "sometimes"
        err = expect_raises(InvalidArgument, cc.sparse_allreduce, idx, val, 500, comm=comm)
        assert err.argument == "CUPYCOLL_NUMBA", err
        os.environ.pop("CUPYCOLL_NUMBA", None)
        check(cc.sparse_allreduce(idx, val, 500, comm=comm), reference(parts, 500, 0))
    if EMULATED:
        emu.check_logs()
    if RANK == 0:
        print(f"ok auto measure on {P} ranks" + (" (emulated nccl)" if EMULATED else ""))


main()
