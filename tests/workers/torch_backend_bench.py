"""Side by side in one run: ``dist.all_reduce`` through the cupycoll process group and gloo.

    mpiexec -n P python -m mpi4py tests/workers/torch_backend_bench.py [REPS]

Two cases: a dense float32 allreduce of 4 MiB, and an embedding-like sparse gradient (what
``nn.Embedding(V, 64, sparse=True)`` gives for a batch of Zipf-distributed tokens: uncoalesced,
about 1.5% of V rows per rank, V = 262,144) in the default group's op (SUM). Each repetition
runs both groups on clones of the same input, in alternating order, each call after a
barrier; a repetition's time is the slowest rank's (call to completion). Rank 0 prints one
line per case: median ms of each and the ratio cupycoll / gloo.
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

warnings.simplefilter("ignore")
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
WORLD = MPI.COMM_WORLD
dist.init_process_group("cupycoll", init_method="cupycoll://")
RANK, P = dist.get_rank(), dist.get_world_size()
GROUPS = {"cupycoll": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
VOCAB, WIDTH, TOKENS = 262_144, 64, 4096


def embedding_gradient() -> torch.Tensor:
    """This rank's gradient of an embedding lookup of TOKENS Zipf tokens (rows repeat)."""
    rng = np.random.default_rng([3, RANK])
    tokens = torch.from_numpy((rng.zipf(1.1, TOKENS) - 1) % VOCAB)
    values = torch.from_numpy(rng.standard_normal((TOKENS, WIDTH), dtype=np.float32))
    return torch.sparse_coo_tensor(tokens[None], values, (VOCAB, WIDTH), check_invariants=True)


def timed(tensor: torch.Tensor, group: dist.ProcessGroup) -> float:
    """Seconds of one all_reduce of a clone of ``tensor`` on the slowest rank."""
    work = tensor.clone()
    WORLD.Barrier()
    start = time.perf_counter()
    dist.all_reduce(work, group=group)
    return WORLD.allreduce(time.perf_counter() - start, op=MPI.MAX)


def compare(name: str, tensor: torch.Tensor) -> None:
    times: dict[str, list[float]] = {g: [] for g in GROUPS}
    for rep in range(REPS + 3):
        order = list(GROUPS) if rep % 2 else list(GROUPS)[::-1]
        for g in order:
            took = timed(tensor, GROUPS[g])
            if rep >= 3:  # the first repetitions warm up
                times[g].append(took)
    if RANK == 0:
        ours, gloo = (statistics.median(times[g]) * 1e3 for g in GROUPS)
        print(f"P={P}  {name:<34} cupycoll {ours:8.2f} ms  gloo {gloo:8.2f} ms  "
              f"ratio {ours / gloo:5.2f}", flush=True)


grad = embedding_gradient()
rows = WORLD.allreduce(grad.coalesce()._nnz()) / P
compare("dense float32, 4 MiB", torch.ones(1 << 20))
compare(f"sparse {VOCAB}x{WIDTH}, {rows / VOCAB:.1%} rows/rank", grad)
dist.destroy_process_group()
