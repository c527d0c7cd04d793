"""Helpers shared by the mpiexec workers: seeded per-rank inputs and agreement checks."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time

import numpy as np
from mpi4py import MPI


def emulation(argv: list[str]):
    """``cupycoll.testing.emulation``, installed (2 devices, as the workers' emulated runs use),
    when ``argv[2]`` is "emulated" (``WORKER SEED emulated``); else None. Call before importing
    cupycoll's communicators."""
    if len(argv) > 2 and argv[2] == "emulated":
        import cupycoll.testing.emulation as emu

        emu.install(2, 14)
        return emu
    return None


def napping_barrier(comm=MPI.COMM_WORLD) -> None:
    """A barrier whose wait sleeps 1 ms between tests: a rank that comes first (kept waiting
    on purpose while its peers time out, or done with its share of a check) leaves its core to
    the others instead of spinning in MPI's progress loop, as a blocking MPI call would."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.001)


def host(obj):
    """A numpy copy of a device or host array; inside results, tuples and lists, of each one."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(host(o) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(host(o) for o in obj)
    if hasattr(obj, "get") and not isinstance(obj, np.ndarray):
        return obj.get()
    return np.asarray(obj) if isinstance(obj, np.ndarray) else obj


def rng_for(seed: int, rank: int, *extra: int) -> np.random.Generator:
    """Return the generator of ``rank``'s input: any rank can rebuild any other rank's input."""
    return np.random.default_rng([seed, rank, *extra])


def digest(*arrays: np.ndarray) -> bytes:
    """Return a hash of the arrays' dtypes, shapes and bytes (for bitwise cross-rank checks)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.digest()


def assert_identical_across_ranks(*arrays: np.ndarray, comm=MPI.COMM_WORLD) -> None:
    """Raise AssertionError unless every rank holds bitwise the same arrays."""
    mine = digest(*arrays)
    every = comm.allgather(mine)
    assert all(d == every[0] for d in every), f"rank {comm.rank}: results differ across ranks"


def expect_raises(exc_type, fn, *args, **kwargs):
    """Call fn and return the exception; AssertionError if it does not raise ``exc_type``."""
    try:
        fn(*args, **kwargs)
    except exc_type as exc:
        return exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc_type}")


class DLPackOnly:
    """A foreign CPU tensor that only speaks DLPack (stands in for torch.Tensor)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()



def unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` of a 1-D integer array by a sort and a mask (numpy 2's ``unique`` hashes
    first, several times slower on integer keys)."""
    a = np.sort(a)
    return a[np.concatenate([[True], a[1:] != a[:-1]])] if a.size else a


def union_reference(parts, n: int, width: int):
    """The exact sum of every rank's (indices, values; an index may repeat): the union and its
    rows (float64 sums of small integers, cast to float32: what every algorithm returns)."""
    dense = np.zeros((n, width) if width else n, np.float64)
    for idx, val in parts:
        np.add.at(dense, idx, val)
    union = unique(np.concatenate([idx for idx, _ in parts]))
    return union, dense[union].astype(np.float32)


def check_result(res, want) -> None:
    """A SparseResult bitwise equal to ``union_reference``'s."""
    assert np.array_equal(host(res.indices), want[0])
    assert host(res.values).tobytes() == want[1].tobytes()


def slowed(algorithm, seconds: float):
    """A registry record whose run function sleeps ``seconds`` before every call."""
    fn = algorithm.run

    @functools.wraps(fn)
    def slow(*args, **kwargs):
        time.sleep(seconds)
        return fn(*args, **kwargs)
    return dataclasses.replace(algorithm, run=slow)

def topk_compact_equals_coo(comm, k: int, inputs, steps: int, tau: int, tau_prime: int) -> int:
    """Run every top-k algorithm (Ok-Topk padded and native) on ``coo`` and ``compact`` wires,
    ``steps`` steps of ``inputs(t)`` each, and assert bit-equal results; returns the count."""
    from cupycoll import algorithms
    from cupycoll.topk import TopkState, topk_allreduce

    checked = 0
    for algorithm in algorithms("topk"):
        for padded in ((False, True) if algorithm == "oktopk" else (None,)):
            states = [TopkState(tau=tau, tau_prime=tau_prime, padded_allgather=padded)
                      for _ in range(2)]
            for t in range(steps):
                x = inputs(t)
                coo, cpt = (topk_allreduce(x, k, algorithm=algorithm, comm=comm, state=s,
                                           wire=wire)
                            for s, wire in zip(states, ("coo", "compact")))
                tag = (algorithm, padded, t)
                assert coo.indices.tobytes() == cpt.indices.tobytes(), tag
                assert coo.values.tobytes() == cpt.values.tobytes(), tag
                checked += 1
    return checked
