"""Host time of one call, in one process: what cupycoll itself costs around the library call.

On one rank nothing waits for a peer, so the time of a call is cupycoll's Python plus the
library's own (tiny) local call; the raw mpi4py call is printed for scale. The NCCL rows run the
NCCL backend's own code over a null NCCL (every NCCL call returns at once, CuPy's real NCCL
constants, host buffers, events that are already done), so they are the backend's host time per
dense call excluding the NCCL call itself (as if P = 2). Small float32 buffers (256 entries
where the size does not matter), ``out=`` preallocated; a time is the 10th percentile of
``-n`` calls (the machine is shared: the low percentile is the undisturbed cost).

    python bench/dev/bench_host.py -n 3000
    python bench/dev/bench_host.py -n 3000 --cold --no-nccl   # caches evicted before every call
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from cupycoll._arguments import positive_int
import cupycoll as cc
from cupycoll.sparse._validate import prepare
from cupycoll.topk.api import validate


def percentile10(fn: Callable[[], Any], iters: int) -> float:
    """10th percentile of ``iters`` timed calls of ``fn`` (after a warm-up), in microseconds."""
    for _ in range(max(10, iters // 20)):
        fn()
    times = np.empty(iters)
    for i in range(iters):
        t0 = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t0
    return float(np.percentile(times, 10)) * 1e6


def cold_medians(fns: list[Callable[[], Any]], iters: int) -> list[float]:
    """Median time of each of ``fns`` in microseconds, the calls interleaved (one of each per
    round) and a 4 MiB buffer rewritten before every call (untimed): the caches are cold, as
    after a step's own data, and load drifts hit every row alike."""
    evict = np.ones(4 << 20, np.uint8)
    times = np.empty((len(fns), iters))
    for fn in fns:
        fn()
    for i in range(iters):
        for j, fn in enumerate(fns):
            evict += 1
            t0 = time.perf_counter()
            fn()
            times[j, i] = time.perf_counter() - t0
    return [float(t) * 1e6 for t in np.median(times, axis=1)]


class _NullNccl:
    """A ``cupy.cuda.nccl`` communicator whose calls return at once (rank 0 of 2)."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args: None

    def rank_id(self) -> int:
        return 0

    def size(self) -> int:
        return 2

    def device_id(self) -> int:
        return 0


class _HostDevice:
    """CudaDevice's members over host memory: addresses, stream handles, done events."""

    errors = ()

    class Stream:
        ptr = 0

        def __enter__(self) -> None:
            pass

        def __exit__(self, *exc: object) -> None:
            pass

    class Done:
        done = True

        def synchronize(self) -> None:
            pass

    def __init__(self) -> None:
        self._current = self.Stream()

    def pointer(self, a: np.ndarray) -> int:
        return a.ctypes.data

    def current(self) -> "_HostDevice.Stream":
        return self._current

    def current_device(self) -> int:
        return getattr(self, "_device_id", 0)  # the one activated (per thread on a GPU)

    def new_stream(self) -> "_HostDevice.Stream":
        return self.Stream()

    @staticmethod
    def handle(stream: "_HostDevice.Stream") -> int:
        return stream.ptr

    def record(self, stream: Any = None) -> "_HostDevice.Done":
        return self.Done()

    @staticmethod
    def wait_event(stream: Any, event: Any) -> None:
        pass

    @staticmethod
    def using(stream: Any) -> Any:
        return stream

    def activate(self, device_id: int) -> None:
        self._device_id = device_id

    def on_device(self, device_id: int) -> Any:
        return contextlib.nullcontext()


def nccl_comm() -> Any:
    """The NCCL backend over the null NCCL (needs CuPy's NCCL constants, not a device)."""
    from cupy.cuda import nccl

    from cupycoll.comm.nccl import NCCLCommunicator

    return NCCLCommunicator.wrap(_NullNccl(), nccl=nccl, device=_HostDevice(), xp=np)


def _test_loop(request: MPI.Request) -> None:
    while not request.Test():
        pass


def dense_calls(comm: Any) -> dict[str, Callable[[], Any]]:
    x = np.ones(256, np.float32)
    out, gathered = np.empty_like(x), np.empty(256 * comm.size, np.float32)
    block = np.empty(256 // comm.size, np.float32)
    return {
        "allreduce": lambda: cc.allreduce(x, out=out, comm=comm),
        "broadcast": lambda: cc.broadcast(x, out=out, comm=comm),
        "reduce": lambda: cc.reduce(x, out=out, comm=comm),
        "allgather": lambda: cc.allgather(x, out=gathered, comm=comm),
        "reduce_scatter": lambda: cc.reduce_scatter(x, out=block, comm=comm),
        "allreduce async_op": lambda: cc.allreduce(x, out=out, comm=comm, async_op=True).wait(),
        "allreduce fresh": lambda: cc.allreduce(x, comm=comm),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", "--iters", type=positive_int, default=3000)
    parser.add_argument("--no-nccl", action="store_true", help="skip the NCCL rows")
    parser.add_argument("--cold", action="store_true",
                        help="cold caches: a 4 MiB buffer rewritten before every call, the "
                        "rows interleaved, medians")
    args = parser.parse_args()
    comm = cc.init("mpi")
    x, out = np.ones(256, np.float32), np.empty(256, np.float32)
    rng = np.random.default_rng(7)
    idx = np.sort(rng.choice(1000, 10, replace=False)).astype(np.int64)
    val = rng.standard_normal(10).astype(np.float32)
    dense = rng.standard_normal(1000).astype(np.float32)
    rows = [("mpi4py", "Allreduce (raw)", lambda: comm.mpi_comm.Allreduce(x, out)),
            ("mpi4py", "Iallreduce + Test (raw)", lambda: _test_loop(comm.mpi_comm.Iallreduce(
                x, out)))]
    rows += [("mpi", name, fn) for name, fn in dense_calls(comm).items()]
    rows += [("mpi", "sparse validation (10 entries)", lambda: prepare(
        comm, idx, val, 1000, op="sum", algorithm=None, accumulate_dtype=None, alloc_fn=None,
        completion_fn=None, async_op=False)),
        ("mpi", "sparse_allreduce (10 entries)", lambda: cc.sparse_allreduce(idx, val, 1000,
                                                                             comm=comm)),
        ("mpi", "topk validation (n=1000)", lambda: validate(comm, dense, 10, "oktopk")),
        ("mpi", "topk_allreduce (n=1000, k=10)", lambda: cc.topk_allreduce(dense, 10,
                                                                          comm=comm))]
    if not args.no_nccl:
        rows += [("nccl", name, fn) for name, fn in dense_calls(nccl_comm()).items()]
    what = "median, interleaved, cold caches" if args.cold else "10th percentile"
    print(f"# one process, host time per call ({what} of {args.iters}), MPI "
          f"{MPI.Get_library_version().splitlines()[0][:40]}")
    print(f"# {'backend':<8}{'call':<34}{'time(us)':>10}")
    if args.cold:
        times = cold_medians([fn for _, _, fn in rows], args.iters)
    for i, (backend, name, fn) in enumerate(rows):
        t = times[i] if args.cold else percentile10(fn, args.iters)
        print(f"  {backend:<8}{name:<34}{t:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
