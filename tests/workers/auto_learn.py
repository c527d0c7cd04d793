"""``CUPYCOLL_AUTO=learn`` (cupycoll/sparse/learn.py) on P ranks.

Usage: auto_learn.py SEED [emulated]   (emulated: init("nccl") on cupycoll.testing.emulation)

Every algorithm the model ranks is a candidate (``WITHIN`` raised) and the model's pick is
slowed by a sleep in its registry entry: the first calls of the class run it (its warm-up and
``SAMPLES`` timed calls), then each other candidate in turn; the record then chooses another
one, every rank the same (records identical), and keeps it. Then that choice is slowed too: its
own calls show it, and the learner leaves it for a faster candidate (a slowed candidate is
abandoned). Every result against a dense numpy reference (small integer values: exact whichever
algorithm sums them); asynchronous calls run the current choice and are not timed; the time of
a call travels in the next validation (no collective is added: ``comm.stats`` shows none). What
was learned is saved and loaded into a new communicator, whose first call runs the choice. At
P = 1 nothing is timed; ranks that disagree on the mode raise on every rank.
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
from cupycoll.errors import MismatchError  # noqa: E402
from cupycoll.sparse import learn  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
SLOW = 0.03  # seconds a slowed candidate sleeps: far above any call's spread here


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


def main() -> None:
    os.environ["CUPYCOLL_AUTO"] = "learn"
    os.environ["CUPYCOLL_NUMBA"] = "on"  # no import in the background during the trials
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
    table = learn.records(comm)
    if P == 1:
        assert not table, "nothing is timed on one rank"
    else:
        (record,) = table.values()
        assert len(record.candidates) == learn.CANDIDATES
        sparse = _registry._REGISTRY["sparse"]
        first = record.candidates[0]  # the model's pick: made slow
        fast = {name: sparse[name] for name in record.candidates}
        sparse[first] = slowed(fast[first], SLOW)
        trials = learn.CANDIDATES * (1 + learn.SAMPLES)
        for i in range(trials + 4):
            if i == 3:  # asynchronous: runs the current choice, not timed
                calls = record.calls
                call(async_op=True)
                assert record.calls == calls
            call()
        assert not [op for op in comm.stats.by_op if "learn" in op or "measure" in op]
        identical(comm)
        chosen = record.choice()
        assert chosen != first and min(record.seconds[first]) >= SLOW, (chosen, record)
        assert record.exploring() is None
        # the choice slows down: its own calls show it, and the learner leaves it (at the
        # latest once the others' trials have started again)
        sparse[chosen] = slowed(fast[chosen], SLOW)
        for _ in range(2 * learn.RECHECK + learn.WINDOW):
            call()
        identical(comm)
        assert record.choice() != chosen, record
        for name, fn in fast.items():
            sparse[name] = fn
        # saved and loaded: a new communicator runs the choice from its first call
        path = WORLD.bcast(tempfile.mkstemp(suffix=".json")[1] if RANK == 0 else None)
        learn.save(comm, path)
        other = comm.dup()
        assert learn.load(other, path) == 1
        loaded = next(iter(learn.records(other).values()))
        assert loaded.choice() == record.choice() and loaded.exploring() is None
        check(cc.sparse_allreduce(idx, val, n, comm=other), want)
        assert [key[1] for key in other.stats.calls] == [record.choice()]
        if RANK == 0:
            os.unlink(path)
        # the mode must agree
        os.environ["CUPYCOLL_AUTO"] = "learn" if RANK == 0 else "estimate"
        err = expect_raises(MismatchError, cc.sparse_allreduce, idx, val, n, comm=comm)
        assert "CUPYCOLL_AUTO=learn" in str(err) and "algorithm" in str(err), err
        os.environ["CUPYCOLL_AUTO"] = "learn"
        call()
    if EMULATED:
        emu.check_logs()
    if RANK == 0:
        print(f"ok auto learn on {P} ranks" + (" (emulated nccl)" if EMULATED else ""))


main()
