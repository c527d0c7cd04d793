"""allgather, mask, recursive_doubling, split and auto on a torch gradient (cct.sparse_allreduce).

The gradient is uncoalesced, as DDP hands it: ``--gradient bench`` is bench_torch.py's (Zipf
tokens scattered over the V rows, 1.5% of the rows a rank), ``--gradient backend`` that of
tests/workers/torch_backend_bench.py (Zipf tokens at the lowest ids, drawn until 1.5% of the rows
are hit). The algorithms run interleaved (``tuner.calibrate.interleaved``: each round in its own
shuffled order, after a barrier; a sample is the slowest rank's time); rank 0 prints the medians,
in milliseconds::

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py bench/dev/bench_torch_algorithms.py --vocab 1M

``--idle MS``: each rank sleeps MS milliseconds before each call's barrier, so the call starts
on a core that was idle, as one after a call that blocks in its waits (gloo's) does; a
``numpy.sort`` of a fixed array runs interleaved with the calls as a control of the machine's
own slowdown after idling. ``--gloo`` adds gloo's sparse ``all_reduce`` of the same gradient.

``--cpu`` also prints, per algorithm, each rank's CPU time per timed call, user and system
(``getrusage`` around each call): where ranks outnumber cores, a call's time is about the
CPU of the ranks sharing a core, and MPICH's single-copy transfers between ranks count as
system time.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import parse_size  # noqa: E402

from cupycoll._arguments import positive_int
import cupycoll as cc  # noqa: E402
import cupycoll.torch as cct  # noqa: E402
from cupycoll.tuner.calibrate import interleaved  # noqa: E402

ALGORITHMS = ("allgather", "mask", "recursive_doubling", "split", "auto")


def backend_gradient(vocab: int, rank: int) -> torch.Tensor:
    """torch_backend_bench.py's gradient: Zipf tokens at the lowest ids, one row per token."""
    rng = np.random.default_rng([3, rank, vocab])
    tokens = np.empty(0, np.int64)
    while np.unique(tokens).size < 0.015 * vocab:
        tokens = np.concatenate([tokens, (rng.zipf(1.1, 4096) - 1) % vocab])
    values = rng.standard_normal((tokens.size, 64), dtype=np.float32)
    return torch.sparse_coo_tensor(torch.from_numpy(tokens)[None], torch.from_numpy(values),
                                   (vocab, 64), check_invariants=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", default="1M", help="embedding rows V")
    p.add_argument("--gradient", choices=("bench", "backend"), default="backend")
    p.add_argument("-n", "--iters", type=positive_int, default=25)
    p.add_argument("-w", "--warmup", type=int, default=4)
    p.add_argument("--cpu", action="store_true", help="also each rank's CPU time per call")
    p.add_argument("--idle", type=float, default=0.0,
                   help="milliseconds each rank sleeps before each call's barrier")
    p.add_argument("--gloo", action="store_true",
                   help="also gloo's sparse all_reduce of the gradient (a fresh clone each)")
    args = p.parse_args()
    torch.set_num_threads(1)
    comm = cc.init("mpi")
    vocab = parse_size(args.vocab)
    if args.gradient == "bench":
        import bench_torch

        grad = bench_torch.gradient(vocab, *bench_torch.batches(vocab, 0.015, comm.rank)[0])
    else:
        grad = backend_gradient(vocab, comm.rank)
    used: dict[str, list] = {name: [] for name in ALGORITHMS}  # each call's (user, system) s
    calls = {name: (lambda a: lambda: cpu_of(
        lambda: cct.sparse_allreduce(grad, comm=comm, algorithm=a), used[a]))(name)
             for name in ALGORITHMS}
    if args.gloo:
        import torch.distributed as dist
        from bench_torch import init_gloo

        init_gloo(comm)
        clones = [grad.clone() for _ in range(args.iters + args.warmup)]
        calls["gloo"] = lambda: dist.all_reduce(clones.pop())
    control = np.random.default_rng(0).standard_normal(1 << 15)
    calls["numpy.sort"] = lambda: np.sort(control)
    samples = interleaved(calls, args.iters, args.warmup, comm, pause=args.idle / 1e3)
    if comm.rank == 0:
        print(f"# P = {comm.size}, V = {vocab}, {args.gradient} gradient ({grad._nnz()} rows), "
              f"idle {args.idle:g} ms before each call; ms, median of the slowest rank")
        print("  ".join(f"{name} {np.median(t) * 1e3:.2f}" for name, t in samples.items()))
    if args.cpu:
        per_call = comm.mpi_comm.gather({a: np.median(used[a][args.warmup:], axis=0) * 1e3
                                         for a in ALGORITHMS}, root=0)
        if comm.rank == 0:
            print("# CPU per timed call, ms (user + system), medians, rank 0, 1, ...")
            for a in ALGORITHMS:
                print(f"{a:<20}" + "  ".join(f"{u:.1f} + {s:.1f}"
                                             for u, s in (ranks[a] for ranks in per_call)))
    return 0


def cpu_of(call, used: list) -> None:
    """Run ``call``; append the user and system CPU seconds it took to ``used``."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    call()
    after = resource.getrusage(resource.RUSAGE_SELF)
    used.append((after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime))


if __name__ == "__main__":
    raise SystemExit(main())
