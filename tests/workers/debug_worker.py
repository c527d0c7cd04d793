"""CUPYCOLL_DEBUG: ranks that call different collectives, or differ in op/root/count, all raise."""

from __future__ import annotations

import os

import numpy as np
from _common import expect_raises

import cupycoll as cc
from cupycoll.errors import MismatchError

assert os.environ.get("CUPYCOLL_DEBUG") == "1"
comm = cc.init("mpi")
rank, p = comm.rank, comm.size
x = np.ones(6 * p, np.float32)
assert float(cc.allreduce(x)[0]) == p  # agreeing calls pass the check
assert comm.stats.by_op["debug.check"].messages_received == 2 * (p - 1)
# rank 0 broadcasts while the others allreduce: every rank raises, nobody hangs
call = (lambda: cc.broadcast(x, root=0)) if rank == 0 else (lambda: cc.allreduce(x))
e = expect_raises(MismatchError, call)
assert "collective" in str(e) and f"rank {rank}" in str(e)
e = expect_raises(MismatchError, cc.allreduce, x, op="max" if rank == p - 1 else "sum")
assert "'op'" in str(e)
e = expect_raises(MismatchError, cc.reduce, x, root=rank % 2)
assert "'root'" in str(e)
e = expect_raises(MismatchError, cc.allgather, np.ones(rank + 1, np.float32))
assert "'count'" in str(e)
e = expect_raises(MismatchError, cc.reduce_scatter, x.astype(np.float64 if rank else np.float32))
assert "'dtype'" in str(e)
# bad arguments on one rank: that rank raises its own error, the others MismatchError naming it
bad = p - 1
e = expect_raises(cc.errors.CupycollError, cc.allreduce, x, op="xor" if rank == bad else "sum")
assert isinstance(e, cc.errors.InvalidArgument if rank == bad else MismatchError), e
assert rank == bad or f"rank {bad} passed bad arguments" in str(e)
e = expect_raises(cc.errors.CupycollError, cc.broadcast, x, root=p if rank == 0 else 0)
assert rank == 0 or "rank 0 passed bad arguments" in str(e)
assert float(cc.allreduce(x)[0]) == p  # the communicator is still usable
print(f"rank {rank}: debug ok")
