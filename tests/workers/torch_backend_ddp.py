"""DDP without a hook on the ``cupycoll`` process group, beside DDP on gloo (torch_backend.py).

A sparse embedding (Zipf-distributed tokens, so ranks share hot rows) and a dense head with a
BatchNorm layer (its float and int64 buffers are broadcast from rank 0 at every forward), in
float32, float64 and bfloat16: after every step the parameters are bitwise identical on every
rank (a hash allgathered over mpi4py) and within rounding of the same model trained through
gloo on the same batches (the sums run in another order; bfloat16: gloo sums in bfloat16,
cupycoll in float32 rounded once).
"""

from __future__ import annotations

import copy
import hashlib

import torch
import torch.distributed as dist
from _common import rng_for
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = MPI.COMM_WORLD
VOCAB, DIM, TOKENS, BATCH, STEPS = 1000, 8, 5, 16, 6
#: dtype -> (rtol, atol) of cupycoll's parameters against gloo's after each step
TOLERANCE = {torch.float32: (1e-5, 1e-6), torch.float64: (1e-12, 1e-13),
             torch.bfloat16: (2e-2, 2e-2)}


class Net(torch.nn.Module):
    """Embedding(sparse=True) -> flatten -> Linear -> BatchNorm1d -> ReLU -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, DIM, sparse=True)
        self.head = torch.nn.Sequential(torch.nn.Linear(TOKENS * DIM, 16),
                                        torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                        torch.nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(x).flatten(1))


def params_hash(model: torch.nn.Module) -> str:
    """Hash of every parameter's bits (buffers are rank 0's at each forward, then updated
    from each rank's own batch)."""
    h = hashlib.sha256()
    for t in model.parameters():
        h.update(t.detach().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def batch(seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of one step: Zipf tokens, random labels."""
    rng = rng_for(seed, WORLD.rank, 1000 + step)
    tokens = (rng.zipf(1.3, (BATCH, TOKENS)) - 1) % VOCAB
    return torch.from_numpy(tokens), torch.from_numpy(rng.integers(0, 4, BATCH))


def check_ddp(seed: int, gloo: dist.ProcessGroup) -> int:
    """Train both DDPs for STEPS steps per dtype; return the number of steps checked."""
    checked = 0
    for dtype, (rtol, atol) in TOLERANCE.items():
        torch.manual_seed(seed)
        ours = Net().to(dtype)
        theirs = copy.deepcopy(ours)
        pairs = [(DDP(ours), torch.optim.SGD(ours.parameters(), lr=0.05)),
                 (DDP(theirs, process_group=gloo), torch.optim.SGD(theirs.parameters(), lr=0.05))]
        for step in range(STEPS):
            x, y = batch(seed, step)
            for ddp, opt in pairs:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x).float(), y).backward()
                opt.step()
            assert ours.embedding.weight.grad.is_sparse
            hashes = WORLD.allgather(params_hash(ours))
            assert len(set(hashes)) == 1, f"{dtype}: parameters differ across ranks, step {step}"
            for a, b in zip(ours.parameters(), theirs.parameters()):
                torch.testing.assert_close(a, b, rtol=rtol, atol=atol,
                                           msg=lambda m: f"{dtype} step {step} vs gloo: {m}")
            checked += 1
    return checked
