"""The ``cupycoll`` process group under torchrun: processes started apart, joined by MPI ports.

    torchrun --standalone --nproc-per-node P --no-python mpiexec -n 1 \\
        python tests/workers/torch_backend_torchrun.py SEED

Each process is an MPI world of one (asserted); ``init_process_group("cupycoll")`` (env://,
torchrun's store) joins them. Checks: the group's ranks are torch's; a dense and a sparse
allreduce (one rank without rows) equal numpy on every rank's seeded input (each rank rebuilds
the others'); a cupycoll subgroup of the first and last ranks; a DDP step of a sparse embedding
leaves the parameters identical (a hash allgathered through the group), and so does one
through cupycoll's allreduce_hook, whose default communicator spans the joined processes
(as cupycoll.torch.sparse_allreduce without a comm). Every rank prints
"rank R of P: ok".
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import cupycoll._torch_backend  # noqa: F401  registers "cupycoll"

SEED = int(sys.argv[1])
assert MPI.COMM_WORLD.Get_size() == 1, "each process must be started apart"
import cupycoll as cc  # noqa: E402
import cupycoll.torch as cct  # noqa: E402

EARLY = cct.TopkHookState(0.5)  # made before the group: over this process alone, until then
dist.init_process_group("cupycoll")
RANK, P = dist.get_rank(), dist.get_world_size()


def dense_input(rank: int) -> np.ndarray:
    return np.random.default_rng([SEED, rank]).integers(-5, 6, 8).astype(np.float32)


def sparse_input(rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([SEED, rank, 1])
    rows = 0 if rank == 1 else 4
    return rng.integers(0, 10, rows), rng.integers(-5, 6, (rows, 3)).astype(np.float32)


x = torch.from_numpy(dense_input(RANK))
dist.all_reduce(x)
assert np.array_equal(x.numpy(), sum(dense_input(r) for r in range(P))), x

index, rows = sparse_input(RANK)
s = torch.sparse_coo_tensor(torch.from_numpy(index)[None], torch.from_numpy(rows), (10, 3),
                            check_invariants=True)
dist.all_reduce(s)
want = np.zeros((10, 3), np.float32)
for r in range(P):
    i, v = sparse_input(r)
    np.add.at(want, i, v)
assert np.array_equal(s.to_dense().numpy(), want) and s.is_coalesced()

ends = dist.new_group([0, P - 1], backend="cupycoll")
if RANK in (0, P - 1):
    y = torch.full((2,), float(RANK))
    dist.all_reduce(y, group=ends)
    assert y.tolist() == [float(P - 1)] * 2, y

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(50, 4, sparse=True), torch.nn.Flatten(),
                            torch.nn.Linear(12, 2))
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
tokens = torch.from_numpy(np.random.default_rng([SEED, RANK, 2]).integers(0, 50, (4, 3)))
ddp(tokens).sum().backward()
opt.step()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
hashes = [None] * P
dist.all_gather_object(hashes, digest.hexdigest())
assert len(set(hashes)) == 1, "parameters differ across ranks"

# cupycoll without a comm (its default, the hooks') spans torch's whole world, not this
# process alone (before: an MPI world of one, so the hooks left every rank its own gradient)
assert cc.get_comm().size == P, cc.get_comm().size
again = cct.sparse_allreduce(torch.sparse_coo_tensor(
    torch.from_numpy(index)[None], torch.from_numpy(rows), (10, 3), check_invariants=True))
assert np.array_equal(again.to_dense().numpy(), want)
hooked = DDP(model)
hooked.register_comm_hook(None, cct.allreduce_hook)
hooked(tokens).sum().backward()
torch.optim.SGD(hooked.parameters(), lr=0.1).step()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
dist.all_gather_object(hashes, digest.hexdigest())
assert len(set(hashes)) == 1, "parameters differ across ranks after the hooked step"
topk = DDP(model)  # a state made before the group follows the default to torch's world
topk.register_comm_hook(EARLY, cct.topk_hook)
for _ in range(2):  # a warm-up step, then a compressed one
    topk(tokens).sum().backward()
    torch.optim.SGD(topk.parameters(), lr=0.1).step()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
dist.all_gather_object(hashes, digest.hexdigest())
assert len(set(hashes)) == 1, "parameters differ across ranks after the top-k steps"
sys.stdout.write(f"rank {RANK} of {P}: ok\n")
sys.stdout.flush()
dist.destroy_process_group()
