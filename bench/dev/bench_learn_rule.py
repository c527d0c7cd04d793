"""Learn's choice rule against the median alone, side by side: bench_regret.py's loop with a
third auto method, ``learn-median``, learning on a second communicator whose records choose
the candidate of least median time (the pick left whenever another's median is lower).

    mpiexec -n 2 python -m mpi4py bench/dev/bench_learn_rule.py --seed 1

``learn`` keeps the model's pick unless another candidate is clearly faster
(:func:`cupycoll.sparse.learn.clearly_faster`); both see the same steps, in the same shuffled
rounds, so their ``cum/best`` compare directly (docs/tuning.md).
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_regret  # noqa: E402

import cupycoll as cc  # noqa: E402
from cupycoll.sparse import learn  # noqa: E402

_choice = learn.Record.choice
_BY_MEDIAN: set = set()  # ids of the records that choose by median alone


def _median_choice(record: learn.Record) -> str:
    if id(record) not in _BY_MEDIAN:
        return _choice(record)
    if record._choice is None:
        record._choice = min(record.candidates,
                             key=lambda c: (record.median(c), record.candidates.index(c)))
    return record._choice


def learn_by_median(comm, n: int):
    """The call of ``learn-median``: auto in learn mode on ``comm`` (a duplicate of the
    bench's communicator), whose records choose by median alone."""

    def call(idx, val):
        os.environ["CUPYCOLL_AUTO"] = "learn"
        result = cc.sparse_allreduce(idx, val, n, algorithm="auto", comm=comm)
        _BY_MEDIAN.update(id(r) for r in learn.records(comm).values())
        return result

    call.comm = comm
    return call


if __name__ == "__main__":
    learn.Record.choice = _median_choice
    bench_regret.EXTRA["learn-median"] = functools.partial(learn_by_median, cc.init("mpi").dup())
    sys.exit(bench_regret.main())
