"""The Communicator's derived verbs (``cupycoll/comm/_base.py``: allgather_counts, allgatherv,
alltoall_counts, alltoall_device_counts, alltoallv) on 1-4 ranks simulated by threads in
process: what every rank gets against numpy, the counts exchanged first under ``<op>.counts`` unless given, and the front-door verb they run under."""

from __future__ import annotations

import numpy as np
import pytest

from cupycoll.errors import InvalidArgument

from tests._threaded import on_communicators


def _rows(rank: int, count: int, width: int) -> np.ndarray:
    """Rank ``rank``'s ``count`` rows: values naming the rank and the row."""
    a = (100 * rank + np.arange(count * max(width, 1), dtype=np.float64))
    return a.reshape(count, width) if width else a


def _names(log):
    return [entry[0] for entry in log if entry[0] != "verb"]


@pytest.mark.parametrize("counts", [(3,), (2, 0), (1, 4, 2), (0, 0, 5, 1)])
@pytest.mark.parametrize("width", [0, 3])
def test_allgatherv_gathers_every_ranks_rows_in_rank_order(counts, width):
    p = len(counts)
    want = np.concatenate([_rows(r, c, width) for r, c in enumerate(counts)])

    def fn(comm):
        send = _rows(comm.rank, counts[comm.rank], width)
        got = comm.allgatherv(send, op_name="t.ag")
        given = comm.allgatherv(send, counts=np.array(counts, np.int32), op_name="t.given")
        sizes = comm.allgather_counts(counts[comm.rank] * 10, "t.sizes")
        return got, given, sizes

    for r, ((got, given, sizes), log) in enumerate(on_communicators(p, fn)):
        for recv, cnt in (got, given):
            assert recv.dtype == np.float64 and recv.shape == want.shape
            assert np.array_equal(recv, want), r
            assert cnt.dtype == np.int64 and cnt.tolist() == list(counts)
        assert type(sizes) is np.ndarray and sizes.dtype == np.int64
        assert sizes.tolist() == [10 * c for c in counts]
        m = sum(1 for q, c in enumerate(counts) if q != r and c)  # blocks received
        assert _names(log) == ["t.ag.counts"] + ["t.ag"] * m + ["t.given"] * m + ["t.sizes"]
        assert [e[1] for e in log if e[0] == "verb"] == ["allgatherv"] * 3 + [None]


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("width", [0, 2])
def test_alltoallv_sends_each_rank_its_block(p, width):
    """Rank r sends (r + j) % 3 rows to rank j (some empty): rank j gets rank r's rows for j."""
    def count(src, dst):
        return (src + dst) % 3

    def block(src, dst):
        return _rows(10 * src + dst, count(src, dst), width)

    def fn(comm):
        sends = [block(comm.rank, j) for j in range(p)]
        got = comm.alltoallv(sends, op_name="t.a2a")
        given = comm.alltoallv(sends, op_name="t.g", recv_counts=[count(s, comm.rank)
                                                                   for s in range(p)])
        counts = comm.alltoall_counts([7 * comm.rank + j for j in range(p)], "t.c")
        dev = comm.alltoall_device_counts(np.array([3 * comm.rank + j for j in range(p)],
                                                   np.int64), "t.d")
        return got, given, counts, dev

    for r, ((got, given, counts, (sent, received)), log) in enumerate(on_communicators(p, fn)):
        for recvs in (got, given):
            assert len(recvs) == p
            for s in range(p):
                want = block(s, r)
                assert recvs[s].dtype == np.float64 and recvs[s].shape == want.shape, (r, s)
                assert np.array_equal(recvs[s], want), (r, s)
        assert counts.dtype == np.int64 and counts.tolist() == [7 * s + r for s in range(p)]
        assert sent.tolist() == [3 * r + j for j in range(p)]
        assert received.tolist() == [3 * s + r for s in range(p)]
        names = _names(log)
        assert ("t.a2a.counts" in names) is (p > 1) and "t.g.counts" not in names
        assert set(names) <= {"t.a2a.counts", "t.a2a", "t.g", "t.c", "t.d"}, names
        verbs = [e[1] for e in log if e[0] == "verb"]
        assert verbs[:2] == ["alltoallv", "alltoallv"] and verbs[-2:] == [None, None], verbs


def test_counts_from_a_device_array_and_the_default_names():
    """allgather_counts takes a 1-element array as well as an int; allgatherv and alltoallv
    book under their own names by default (counts under ``<name>.counts``)."""
    def fn(comm):
        a = comm.allgather_counts(np.array([comm.rank + 5], np.int64), "t.dev")
        got, _ = comm.allgatherv(np.arange(comm.rank + 1.0))
        recvs = comm.alltoallv([np.ones(2)] * comm.size)
        return a, got, recvs

    for (a, got, recvs), log in on_communicators(3, fn):
        assert a.tolist() == [5, 6, 7] and got.tolist() == [0.0, 0.0, 1.0, 0.0, 1.0, 2.0]
        assert [x.tolist() for x in recvs] == [[1.0, 1.0]] * 3
        assert set(_names(log)) == {"t.dev", "allgatherv.counts", "allgatherv",
                                    "alltoallv.counts", "alltoallv"}


def test_alltoallv_needs_one_array_per_rank():
    def fn(comm):
        with pytest.raises(InvalidArgument) as info:
            comm.alltoallv([np.zeros(1)] * 3)
        return str(info.value)

    for rank, (msg, _) in enumerate(on_communicators(2, fn)):
        assert msg == (f"invalid argument 'sends' on rank {rank}: one array per rank (2) (got "
                       "'3 arrays')"), msg


def test_a_native_allgatherv_books_its_blocks_exactly():
    """``_record_allgatherv``: this rank's block to each peer, each peer's block in; empty
    blocks are no messages. ``_record_collective``: by the rule of ``Stats`` (a broadcast root
    sends, a reduce root receives; ring collectives by the bus factor) under the op name, else
    the collective's. Both are counted in ``sequence`` (a late rank is named by the board)."""
    def fn(comm):
        comm._record_allgatherv("t.ag", np.array([8, 0, 24, 16])[:comm.size])
        comm._record_collective("allreduce", 64, op_name="t.ar")
        comm._record_collective("allgather", 64)
        comm._record_collective("broadcast", 40, root=2, op_name="t.bc")
        comm._record_collective("reduce", 24, root=1)
        s = comm.stats.by_op
        return ({op: (v.bytes_sent, v.bytes_received, v.messages_sent, v.messages_received)
                 for op, v in s.items()}, comm.sequence)

    results = on_communicators(4, fn)
    for r, ((by_op, seq), _) in enumerate(results):
        blocks = [8, 0, 24, 16]
        own = blocks.pop(r)
        assert by_op["t.ag"] == (own * 3, sum(blocks), 3 if own else 0,
                                 sum(1 for b in blocks if b)), r
        assert by_op["t.ar"] == (96, 96, 6, 6) and by_op["allgather"] == (48, 48, 3, 3)
        assert by_op["t.bc"] == ((40, 0, 1, 0) if r == 2 else (0, 40, 0, 1)), r
        assert by_op["reduce"] == ((0, 24, 0, 1) if r == 1 else (24, 0, 1, 0)), r
        assert seq == 5
