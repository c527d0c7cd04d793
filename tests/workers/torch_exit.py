"""A cupycoll default group with a gloo subgroup used, destroyed, then the process exits: every
rank must exit 0 (rank 0's TCPStore, under the gloo subgroup's store, must outlive the other
ranks' teardown; ``cupycoll._torch_world._leave_together``).

    mpiexec -n 4 python -m mpi4py tests/workers/torch_exit.py
"""

import torch
import torch.distributed as dist

import cupycoll.torch  # noqa: F401  registers "cupycoll" and cupycoll://

dist.init_process_group("cupycoll", init_method="cupycoll://")
gloo = dist.new_group(backend="gloo")
for _ in range(8):
    dist.all_reduce(torch.ones(4), group=gloo)
dist.destroy_process_group()
