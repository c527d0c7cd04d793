"""``CUPYCOLL_AUTO=learn`` (cupycoll/sparse/learn.py) on P ranks.

Usage: auto_learn.py SEED [emulated]   (emulated: init("nccl") on cupycoll.testing.emulation)

Every algorithm the model ranks is a candidate (``WITHIN`` raised) and the model's pick is
slowed by a sleep in its registry entry: the first calls of the class run it (its warm-up and
``SAMPLES`` timed calls), then each other candidate in turn; the record then chooses another
one, every rank the same (records identical), and keeps it. Then that choice is slowed too: its
own calls show it, and the learner leaves it for a faster candidate (a slowed candidate is
abandoned). Where a loaded machine's noise hides the sleep (the learner's pairs rule keeps
its pick in noise: legitimately), the same runs again on a new communicator with a sleep
``4x`` longer, at most ``TRIES`` times; every rank takes the same branch (records identical).
Every result against a dense numpy reference (small integer values: exact whichever
algorithm sums them); asynchronous calls run the current choice and are not timed; the time of
a call travels in the next validation (no collective is added: ``comm.stats`` shows none). What
was learned is saved and loaded into a new communicator, whose first call runs the choice (another
node layout, another class). At P = 1 nothing is timed; ranks that disagree on the mode raise on
every rank.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile

import numpy as np
from _common import check_result as check, emulation, expect_raises, rng_for, slowed
from _common import union_reference as reference
from mpi4py import MPI

SEED = int(sys.argv[1])
emu = emulation(sys.argv)
EMULATED = emu is not None

import cupycoll as cc  # noqa: E402
from cupycoll import _registry  # noqa: E402
from cupycoll.primitives._accel import ready  # noqa: E402
from cupycoll.errors import MismatchError  # noqa: E402
from cupycoll.sparse import learn  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
SLOW = 0.03  # seconds a slowed algorithm sleeps: above a call's spread on a quiet machine
TRIES = 3  # each try sleeps 4x longer: on a loaded one a call can take 5x its median


def inputs(n: int, k: int, width: int):
    out = []
    for r in range(P):
        rng = rng_for(SEED, r, width)
        idx = rng.choice(n, k, replace=False).astype(np.int32)
        out.append((idx, rng.integers(-4, 5, (k, width) if width else k).astype(np.float32)))
    return out


def identical(comm) -> dict:
    """Every rank's records (the same on every rank, asserted)."""
    table = {k: dataclass_tuple(r) for k, r in learn.records(comm).items()}
    blobs = WORLD.allgather(pickle.dumps(table))
    assert all(b == blobs[0] for b in blobs), "ranks' records differ"
    return table


def dataclass_tuple(record: learn.Record) -> tuple:
    return (record.candidates, record.warmed, record.seconds, record.abandoned, record.calls)


def leaves_slowed_algorithms(comm, call, slow: float) -> learn.Record | None:
    """The model's pick slowed by ``slow`` s: the record tries the others and chooses another;
    then that choice slowed too is left. The record, or None where the machine's noise kept a
    slowed algorithm (the pairs rule of learn.clearly_faster is built to sit still in noise):
    the records are identical, so every rank returns the same. The registry is restored."""
    (record,) = learn.records(comm).values()
    assert len(record.candidates) == learn.CANDIDATES
    sparse = _registry._REGISTRY["sparse"]
    first = record.candidates[0]  # the model's pick: made slow
    fast = {name: sparse[name] for name in record.candidates}
    try:
        sparse[first] = slowed(fast[first], slow)
        trials = learn.CANDIDATES * (1 + learn.SAMPLES)
        for i in range(trials + 4):
            if i == 3:  # asynchronous: runs the current choice, not timed
                calls = record.calls
                call(async_op=True)
                assert record.calls == calls
            call()
        assert not [op for op in comm.stats.by_op if "learn" in op or "measure" in op]
        identical(comm)
        assert record.exploring() is None
        assert min(record.seconds[first]) >= slow, record  # the sleep is in every time
        chosen = record.choice()
        if chosen == first:
            return None
        # the choice slows down: its own calls show it, and the learner leaves it (at the
        # latest once the others' trials have started again)
        sparse[chosen] = slowed(fast[chosen], slow)
        for _ in range(2 * learn.RECHECK + learn.WINDOW):
            call()
        identical(comm)
        return None if record.choice() == chosen else record
    finally:
        sparse.update(fast)


def main() -> None:
    os.environ["CUPYCOLL_AUTO"] = "learn"
    os.environ["CUPYCOLL_NUMBA"] = "on"  # no import in the background during the trials
    ready()  # nor one an earlier job of the batch started (its calls would not count)
    learn.WITHIN = float("inf")  # every algorithm the model ranks first is a candidate
    comm = cc.init("nccl" if EMULATED else "mpi")
    xp = comm.xp
    n, width = 3000, 2
    parts = inputs(n, 400, width)
    want = reference(parts, n, width)
    idx, val = (xp.asarray(a) for a in parts[RANK])

    def call(**kwargs):
        res = cc.sparse_allreduce(idx, val, n, comm=comm, **kwargs)
        res = res.result() if kwargs.get("async_op") else res
        check(res, want)

    call()
    if P == 1:
        assert not learn.records(comm), "nothing is timed on one rank"
    else:
        for attempt in range(TRIES):
            record = leaves_slowed_algorithms(comm, call, SLOW * 4**attempt)
            if record is not None:
                break
            comm = comm.dup()  # the noise hid the sleep: new records, a longer sleep
            call()
        assert record is not None, f"a {SLOW * 4**(TRIES - 1)} s sleep stayed hidden"
        # saved and loaded: a new communicator runs the choice from its first call
        path = WORLD.bcast(tempfile.mkstemp(suffix=".json")[1] if RANK == 0 else None)
        learn.save(comm, path)
        other = comm.dup()
        assert learn.load(other, path) == 1
        loaded = next(iter(learn.records(other).values()))
        assert loaded.choice() == record.choice() and loaded.exploring() is None
        check(cc.sparse_allreduce(idx, val, n, comm=other), want)
        assert [key[1] for key in other.stats.calls] == [record.choice()]
        os.environ["CUPYCOLL_RANKS_PER_NODE"] = "1"  # the key holds the nodes: a new class
        check(cc.sparse_allreduce(idx, val, n, comm=other), want)
        assert len(learn.records(other)) == 2, list(learn.records(other))
        del os.environ["CUPYCOLL_RANKS_PER_NODE"]
        if RANK == 0:
            os.unlink(path)
        # the mode must agree
        os.environ["CUPYCOLL_AUTO"] = "learn" if RANK == 0 else "estimate"
        err = expect_raises(MismatchError, cc.sparse_allreduce, idx, val, n, comm=comm)
        assert "auto (CUPYCOLL_AUTO=learn) on rank 0" in str(err), err  # each with its ranks
        assert "auto (CUPYCOLL_AUTO=estimate) on rank" in str(err), err
        os.environ["CUPYCOLL_AUTO"] = "learn"
        call()
    if EMULATED:
        emu.check_logs()
    if RANK == 0:
        print(f"ok auto learn on {P} ranks" + (" (emulated nccl)" if EMULATED else ""))


main()
