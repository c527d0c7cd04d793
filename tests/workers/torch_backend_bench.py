"""Side by side in one run: ``dist.all_reduce`` through the cupycoll process group and gloo.

    mpiexec -n P python -m mpi4py tests/workers/torch_backend_bench.py [REPS]

Cases: a dense float32 allreduce of 4 MiB, and embedding-like sparse gradients (what
``nn.Embedding(V, 64, sparse=True)`` gives for a batch of Zipf-distributed tokens, exponent 1.1:
uncoalesced, one row per token, tokens drawn until 1.5% of the V rows are hit on each rank;
V = 262,144 and 1,048,576) with the default op (SUM). Each repetition runs both groups on
clones of the same input, in alternating order, each call after a barrier; a repetition's time
is the slowest rank's (call to completion). The first ``WARMUP`` repetitions of a case are not
timed: they cover ``auto``'s learn trials of the case's shape class, and numba's loops are
loaded before the first (their import otherwise runs in a background thread during the first
calls, holding the interpreter lock). Rank 0 prints one line per case: median ms of each
and the ratio cupycoll / gloo.
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import cupycoll._torch_backend  # noqa: F401  registers "cupycoll" and cupycoll://
from cupycoll.primitives import _accel
from cupycoll.sparse import learn

warnings.simplefilter("ignore")
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
WORLD = MPI.COMM_WORLD
dist.init_process_group("cupycoll", init_method="cupycoll://")
RANK, P = dist.get_rank(), dist.get_world_size()
GROUPS = {"cupycoll": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
WIDTH, HIT = 64, 0.015
#: untimed repetitions per case: learn's trials of a new shape class and one more
WARMUP = 1 + learn.TRIAL_CALLS
_accel.ready()


def embedding_gradient(vocab: int) -> torch.Tensor:
    """This rank's gradient of an embedding lookup of Zipf tokens, drawn until HIT of the
    rows are hit (rows repeat: one gradient row per token)."""
    rng = np.random.default_rng([3, RANK, vocab])
    tokens = np.empty(0, np.int64)
    while np.unique(tokens).size < HIT * vocab:
        tokens = np.concatenate([tokens, (rng.zipf(1.1, 4096) - 1) % vocab])
    values = rng.standard_normal((tokens.size, WIDTH), dtype=np.float32)
    return torch.sparse_coo_tensor(torch.from_numpy(tokens)[None], torch.from_numpy(values),
                                   (vocab, WIDTH), check_invariants=True)


def timed(tensor: torch.Tensor, group: dist.ProcessGroup) -> float:
    """Seconds of one all_reduce of a clone of ``tensor`` on the slowest rank."""
    work = tensor.clone()
    WORLD.Barrier()
    start = time.perf_counter()
    dist.all_reduce(work, group=group)
    return WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)


def compare(name: str, tensor: torch.Tensor) -> None:
    times: dict[str, list[float]] = {g: [] for g in GROUPS}
    for rep in range(REPS + WARMUP):
        order = list(GROUPS) if rep % 2 else list(GROUPS)[::-1]
        for g in order:
            took = timed(tensor, GROUPS[g])
            if rep >= WARMUP:
                times[g].append(took)
    if RANK == 0:
        ours, gloo = (statistics.median(times[g]) * 1e3 for g in GROUPS)
        print(f"P={P}  {name:<34} cupycoll {ours:8.2f} ms  gloo {gloo:8.2f} ms  "
              f"ratio {ours / gloo:5.2f}", flush=True)


compare("dense float32, 4 MiB", torch.ones(1 << 20))
for vocab in (1 << 18, 1 << 20):
    grad = embedding_gradient(vocab)
    compare(f"sparse {vocab}x{WIDTH}, {grad._nnz()} tokens", grad)
dist.destroy_process_group()
