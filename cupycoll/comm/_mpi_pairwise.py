"""The MPI backend's reduce-scatter as a pairwise exchange: every rank sends block j of its input
to rank j and folds the P blocks of its own in rank order (docs/dense.md: MPICH's
reduce-scatter was 1.1-5x slower on one node from 64 KiB blocks)."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .._types import ReduceOp, trunc_divide
from ._mpi_types import _MPI_TYPES, _address, _fold_blocks

_TAG_BLOCKS = 8  # the blocks' messages (apart from exchange's)


def pairwise_in_place(comm: Any, send: Any, recv: Any) -> bool | None:
    """Whether the pairwise exchange runs this call, in place (True) or apart (False), or not
    (None): from ``CUPYCOLL_REDUCE_SCATTER_PAIRWISE`` bytes a block, on P > 1, for host arrays
    of one dtype MPI reduces natively, C-contiguous, apart or ``recv`` exactly this rank's
    block. The threshold and the byte count are the same on every rank."""
    threshold = comm._pairwise_blocks
    if (threshold is None or recv.nbytes < threshold or comm.size == 1
            or type(send) is not np.ndarray or type(recv) is not np.ndarray
            or send.dtype is not recv.dtype or send.dtype not in _MPI_TYPES
            or not (send.flags.c_contiguous and recv.flags.c_contiguous)):
        return None
    if _address(recv) == _address(send.reshape(comm.size, -1)[comm.rank]):
        return True
    return None if np.shares_memory(send, recv) else False


def pairwise_reduce_scatter(comm: Any, send: np.ndarray, recv: np.ndarray, op: ReduceOp,
                            op_name: str, blocking: bool, in_place: bool):
    """Send block j of ``send`` to rank j and receive every rank's block of this rank (P - 1
    messages each way, into ``comm``'s pooled scratch), then fold them in rank order with the
    MPI backend's rules (:func:`._mpi_types._fold_blocks`; avg divides once). The bytes and
    the arrival notice are booked as the native collective's; a timeout names the peers whose
    blocks are missing. Returns a Work, or None when ``blocking`` (done)."""
    size, rank = comm.size, comm.rank
    comm._record_collective("reduce_scatter", send.nbytes, op_name=op_name)
    blocks = send.reshape(size, *recv.shape)
    scratch = comm._scratch((size,) + recv.shape, send.dtype)
    mpi_comm, requests, peers = comm.mpi_comm, [], []
    for step in range(1, size):
        source, dest = (rank - step) % size, (rank + step) % size
        requests.append(mpi_comm.Irecv([scratch[source], MPI.BYTE], source, _TAG_BLOCKS))
        requests.append(mpi_comm.Isend([blocks[dest], MPI.BYTE], dest, _TAG_BLOCKS))
        peers += [source, dest]

    def fold() -> None:
        _fold_blocks(blocks, scratch, recv, rank, op, in_place)
        if op is ReduceOp.AVG:
            trunc_divide(recv, size)
        comm._release(scratch)

    if not blocking:
        return comm._work(requests, op_name, fold, (send, recv, scratch), peers)
    try:
        comm.wait(requests, op_name, peers)
    except BaseException:
        comm._fate.abandon(requests, (send, recv, scratch))
        raise
    fold()
    return None
