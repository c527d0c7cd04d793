"""In-process tests of cupycoll/comm/_base.py written for mutation testing (tests/mutation/run.py):
the base class's defaults that the MPI backend overrides."""

from __future__ import annotations

import numpy as np


def test_base_run_runs_the_verb_to_completion():
    """``Communicator.run`` (the default the MPI backend overrides): the verb's result, with and
    without an op name (one rank: the allreduce is a copy)."""
    from mpi4py import MPI

    import cupycoll as cc
    from cupycoll._types import ReduceOp
    from cupycoll.comm._base import Communicator

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    send = np.arange(5, dtype=np.float64)
    for op_name in (None, "test.run"):
        recv = np.zeros(5)
        Communicator.run(comm, "allreduce", send, recv, ReduceOp.SUM, op_name=op_name)
        np.testing.assert_array_equal(recv, send)


def test_an_interrupted_wait_aborts_the_communicator_naming_the_call():
    """A wait interrupted by KeyboardInterrupt leaves its operation pending: the communicator is
    aborted, and every later call raises, naming the operation, its collective number and the
    interruption (a fresh one-rank communicator, other communicators unaffected)."""
    import pytest
    from mpi4py import MPI

    import cupycoll as cc
    from cupycoll.errors import BackendError

    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    comm._interrupted("test.op")
    with pytest.raises(BackendError, match=r"aborted in test\.op \(collective #0, interrupted\)"):
        comm._check_alive()
    cc.init("mpi", mpi_comm=MPI.COMM_SELF)._check_alive()


def test_count_exchange_books_under_its_name():
    """``alltoall_counts`` books its traffic under the op name it is given (one rank)."""
    from mpi4py import MPI

    import cupycoll as cc
    comm = cc.init("mpi", mpi_comm=MPI.COMM_SELF)
    got = comm.alltoall_counts([7], "test.counts")
    assert got.tolist() == [7] and "test.counts" in comm.stats.by_op
