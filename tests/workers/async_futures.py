"""Work as a future: dense, sparse and compressor Works complete their futures and callbacks, and
TopkCompressor.step(async_op=True) gives bit for bit what the synchronous step gives.

    mpiexec -n P python -m mpi4py tests/workers/async_futures.py
"""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np

import cupycoll as cc

comm = cc.init("mpi")
P, RANK = comm.size, comm.rank

# dense: future result, callback order, exceptions
x = np.full(1000, RANK + 1.0, np.float32)
out = np.empty_like(x)
work = cc.allreduce(x, out=out, async_op=True)
seen, called = [], threading.Event()
work.add_done_callback(lambda w: (seen.append(w is work), called.set()))
fut = work.get_future()
assert isinstance(fut, concurrent.futures.Future) and fut is work.get_future()
fut.result(timeout=60)
assert (out == P * (P + 1) / 2).all()
assert called.wait(60) and seen == [True]
work.add_done_callback(lambda w: seen.append("late"))  # already done: called at once
assert seen == [True, "late"]

# sparse: the future carries the SparseResult, equal to an independent dense reference
rng = np.random.default_rng([7, RANK])
idx = rng.integers(0, 500, 40).astype(np.int32)
val = rng.integers(-3, 4, 40).astype(np.float32)
res = cc.sparse_allreduce(idx, val, 500, async_op=True).get_future().result(timeout=60)
dense = np.zeros(500)
for r in range(P):
    g = np.random.default_rng([7, r])
    i, v = g.integers(0, 500, 40), g.integers(-3, 4, 40)
    np.add.at(dense, i, v)
assert np.array_equal(res.to_dense(), dense.astype(np.float32))

# a failing finalize reaches the future as its exception
bad = cc.comm.Work(finalize=lambda: 1 / 0)
assert isinstance(bad.get_future().exception(timeout=60), ZeroDivisionError)

# compressor: async steps (several in flight) == synchronous steps, bit for bit
n = 4096
grads = [np.random.default_rng([s, RANK]).standard_normal(n).astype(np.float32)
         for s in range(6)]
sync = cc.TopkCompressor(n, 0.02, tau_prime=2)
asyn = cc.TopkCompressor(n, 0.02, tau_prime=2)
expected = [sync.step(g) for g in grads]
works = [asyn.step(g, async_op=True) for g in grads]
for want, work in zip(expected, works):
    got = work.get_future().result(timeout=60)
    assert np.array_equal(got.indices, want.indices) and np.array_equal(got.values, want.values)
assert np.array_equal(asyn.residual, sync.residual)
asyn.step(grads[0])  # a synchronous step after async ones waits for them first
print(f"rank {RANK}: ok")
