"""Small sparse_allreduce calls finished inside the validation allreduce (sparse/small.py).

Against an independent dense numpy reference at P = 1..4 on MPI and P = 2, 3 on the NCCL
emulation tier: every op and dtype (NaN, +-inf, +-0), 1-D and rows; one collective per fused
call, traffic equal to the cost model; a rank overflowing its slot alone sends the call down the
normal path; bad input on one rank and mismatched n / dtype / op / algorithm raise everywhere;
async_op, alloc_fn, completion_fn and the wire keywords (same bits as ``allgather``).
"""

from __future__ import annotations

import numpy as np
import pytest

from cupycoll import _agreement
from cupycoll.sparse import small
from cupycoll.sparse._cost import Cost, Shape, validation_cost
from cupycoll.sparse.auto import call_cost
from tests._mpi import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_small_calls_against_numpy(nprocs):
    out = run_mpi(nprocs, "sparse_small.py", 31 + nprocs, timeout=300)
    assert f"ok small calls: 59 cases (50 fused) on {nprocs} ranks" in out


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_small_calls_on_emulated_nccl(nprocs):
    out = run_mpi(nprocs, "sparse_small.py", 41 + nprocs, "emulated", timeout=300)
    assert f"ok small calls: 59 cases (50 fused) on {nprocs} ranks (emulated nccl)" in out


def test_slots_are_bounded():
    """2 KiB of slots in all at most, none above 32 ranks: large P pays nothing extra."""
    for p in range(1, 200):
        assert _agreement.slot_words(p) * p <= _agreement.SLOT_WORDS_TOTAL
        assert (_agreement.slot_words(p) == 0) == (p > 32)
    fixed = _agreement.HEADER + 2 * _agreement.FIELDS + _agreement.MAXIMA
    assert _agreement.length(64) == fixed + (2 + _agreement.COLUMNS) * 64


def test_no_block_of_more_than_most_entries_fits():
    """small.MOST_ENTRIES bounds every fitting block (the front door skips the slot above it):
    the largest count that fits, found by counting up, on every P with slots and every index
    and row size."""
    for p in range(1, 33):
        words = _agreement.slot_words(p)
        for index_bytes in (4, 8):
            for row_bytes in (1, 2, 4, 8, 16, 64):
                largest = 0
                while (largest + 1) * (index_bytes + row_bytes) <= 8 * words:  # unpadded
                    largest += 1
                assert largest <= small.MOST_ENTRIES
                assert not small.fits_all(p, (small.MOST_ENTRIES + 1,), index_bytes, row_bytes)
    assert small.fits_all(1, (small.MOST_ENTRIES - 1,), 4, 1)  # the bound is nearly reached


def test_fits_and_cost_model():
    # P = 2: 128 words a slot; int32 + float32 entries: 4 + 4 bytes each, padded per stream
    assert small.block_words(10, 4, 4) == 10 and small.block_words(3, 4, 4) == 4
    assert small.fits(Shape(2, 1000, 0, 4, 4, (128, 0)))
    assert not small.fits(Shape(2, 1000, 0, 4, 4, (129, 3)))  # one rank over: normal path
    assert not small.fits(Shape(64, 1000, 0, 4, 4, (1,) * 64))  # no slots above 32 ranks
    fused = Shape(4, 1000, 2, 8, 4, (5, 0, 2, 5))
    assert call_cost("auto", fused, 1).received == validation_cost(4).received
    over = Shape(4, 1000, 0, 8, 8, (40, 0, 2, 1))
    assert set(call_cost("auto", over, 0).received) > {"sparse.validate"}
    assert call_cost("allgather", fused, 0).received != validation_cost(4).received


def test_small_is_a_record_a_caller_cannot_name():
    """``small`` is registered like every algorithm (its run function, traffic model and the
    ``rides`` flag), but it runs only where the entries rode in the validation: it is not among
    the names a caller may pass, auto never prices it, and naming it raises."""
    import cupycoll as cc
    from cupycoll._registry import priced, record
    from cupycoll.errors import InvalidArgument

    found = record("sparse", "small")
    assert found.rides and found.counts and found.run is small.small
    assert found.cost(Shape(2, 100, 0, 4, 4, (3, 3)), 0) == Cost()  # nothing beyond it
    assert "small" not in cc.algorithms("sparse") and "small" not in priced("sparse")
    with pytest.raises(InvalidArgument, match="algorithm"):
        cc.sparse_allreduce(np.array([1]), np.array([1.0], np.float32), 4, algorithm="small")


def test_small_merges_the_agreed_slots_in_rank_order():
    """The record's run function on slots packed as the validation packs them: every rank's
    block merged in rank order, equal to an independent dense fold."""
    from types import SimpleNamespace

    from cupycoll._types import ReduceOp

    blocks = [(np.array([0, 3, 5], np.int32), np.array([1.0, 2.0, -0.0], np.float32)),
              (np.array([3, 4], np.int32), np.array([10.0, 20.0], np.float32))]
    words = _agreement.slot_words(2)
    vec = np.zeros(2 * words, np.int64)
    comm = SimpleNamespace(xp=np, size=2)
    for r, (idx, val) in enumerate(blocks):
        small.pack(SimpleNamespace(xp=np, size=2), vec, r * words, idx, val, None)
    idx, val = small.small(comm, blocks[0][0], blocks[0][1], 8, ReduceOp.SUM,
                           np.dtype(np.float32), counts=(3, 2), slots=vec)
    dense = np.zeros(8, np.float32)
    for i, v in blocks:
        np.add.at(dense, i, v)
    assert idx.tolist() == [0, 3, 4, 5]
    assert val.tobytes() == dense[[0, 3, 4, 5]].tobytes()


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_small_call_with_a_dense_output_writes_the_folded_entries(op):
    """One process: a call whose entries ride in the validation, with ``output="dense"`` into
    the caller's ``out``: each index's entries folded in input order (the first copied, so a
    lone -0 stays -0), written into +0s; ``small`` ran."""
    import cupycoll as cc

    comm = cc.get_comm()
    idx = np.array([5, 1, 5, 3, 1])
    val = np.array([[1, 2], [3, 4], [5, -6], [-0.0, 7], [0.5, np.nan]], np.float32)
    fold = {"sum": np.add, "avg": np.add, "max": np.maximum}[op]
    want = np.zeros((8, 2), np.float32)
    for i in np.unique(idx):
        rows = val[idx == i]
        total = rows[0].copy()
        for row in rows[1:]:
            total = fold(total, row)
        want[i] = total
    out = np.full((8, 2), 9, np.float32)
    before = comm.stats.calls.get(("sparse_allreduce", "small", "coo"), 0)
    got = cc.sparse_allreduce(idx, val, 8, op=op, output="dense", out=out)
    assert got is out
    assert comm.stats.calls[("sparse_allreduce", "small", "coo")] == before + 1
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    finite = ~np.isnan(want)
    assert out[finite].view(np.int32).tolist() == want[finite].view(np.int32).tolist()
