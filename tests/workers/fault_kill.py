"""A rank dies mid-loop; the whole mpiexec job must end (nonzero) instead of hanging.

    fault_kill.py sigkill|raise

sigkill: the last rank SIGKILLs itself after 5 allreduces; raise: rank 1 raises an uncaught
exception between collectives (``python -m mpi4py`` turns it into MPI_Abort). The other ranks
loop on allreduce and sparse_allreduce without a timeout. The test checks the exit status and
how long the job took.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

import cupycoll as cc

comm = cc.init("mpi", timeout=0)
x = np.ones(16, np.float32)
idx, val = np.array([comm.rank], np.int64), np.ones(1, np.float32)
for step in range(10**6):
    if step == 5 and comm.rank == comm.size - 1 and sys.argv[1] == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 5 and comm.rank == 1 and sys.argv[1] == "raise":
        raise RuntimeError("rank 1 fails between collectives")
    cc.allreduce(x, comm=comm)
    cc.sparse_allreduce(idx, val, comm.size, comm=comm)
