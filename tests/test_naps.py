"""Host waits past their spin: naps that lengthen as the wait goes on (``comm._naps``), in both
backends' waits (``_nccl_guard.spin``, the MPI backend's ``_poll``)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

from cupycoll.comm import _naps
from cupycoll.comm._nccl_guard import spin
from cupycoll.comm.mpi import MPICommunicator
from cupycoll.errors import InvalidArgument

#: a wait of WAIT seconds sleeps about (WAIT - its spin) / NAP_MAX times, plus ~120 while its
#: naps grow; at a fixed NAP_MIN it would sleep at least (WAIT - spin) / (NAP_MIN + ~50 us)
WAIT, MOST_NAPS = 0.6, 1500


def test_a_nap_is_a_bounded_share_of_the_wait():
    for waited in (0.0, 1e-3, 5e-3, 0.02, 0.05, 0.3, 10.0, 3600.0):
        nap = _naps.nap(waited)
        assert _naps.NAP_MIN <= nap <= _naps.NAP_MAX
        assert nap <= max(_naps.NAP_MIN, _naps.NAP_SHARE * waited)
    assert _naps.nap(10.0) == _naps.NAP_MAX


def counted_sleeps(monkeypatch) -> list[tuple[float, float]]:
    """Every ``time.sleep`` of this thread from here on, recorded as (seconds since this call,
    seconds slept) and slept."""
    naps: list[tuple[float, float]] = []
    sleep, waiter, start = time.sleep, threading.get_ident(), time.monotonic()

    def counted(seconds: float) -> None:
        if threading.get_ident() == waiter:
            naps.append((time.monotonic() - start, seconds))
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", counted)
    return naps


def mpi_wait_naps(monkeypatch, wait: float, tag: int) -> list[tuple[float, float]]:
    """The naps (:func:`counted_sleeps`) of an MPI wait, on a communicator made now, for a
    request that completes ``wait`` seconds later (a message this rank sends itself from
    another thread)."""
    comm = MPICommunicator(MPI.COMM_SELF, timeout=30)
    got = np.zeros(1)
    request = comm.mpi_comm.Irecv(got, source=0, tag=tag)
    sender = threading.Timer(wait, lambda: comm.mpi_comm.Send(np.ones(1), dest=0, tag=tag))
    with monkeypatch.context() as patched:
        naps = counted_sleeps(patched)
        start = time.monotonic()
        sender.start()
        comm.wait([request], "test.wait")
        sender.join()
    assert got[0] == 1.0 and time.monotonic() - start >= wait
    return naps


def test_a_long_nccl_wait_naps_ever_longer(monkeypatch):
    counted = counted_sleeps(monkeypatch)
    start = time.monotonic()
    spin(lambda: time.monotonic() - start >= WAIT)
    assert time.monotonic() - start >= WAIT
    naps = [seconds for _, seconds in counted]
    assert 0 < len(naps) < MOST_NAPS and max(naps) == _naps.NAP_MAX, len(naps)
    assert naps == sorted(naps)


def test_a_long_mpi_wait_naps_ever_longer(monkeypatch):
    naps = [seconds for _, seconds in mpi_wait_naps(monkeypatch, WAIT, 99)]
    assert 0 < len(naps) < MOST_NAPS and max(naps) == _naps.NAP_MAX, len(naps)


def test_an_mpi_wait_spins_for_cupycoll_spin_seconds_then_naps(monkeypatch):
    """CUPYCOLL_SPIN, read when the communicator is made: a 0.3 s wait naps from its first
    yield under 0 (its first nap well inside the wait, loaded cores allowing for the tests
    before it), never under 10; a negative, infinite or unparsable value raises naming it."""
    monkeypatch.setenv("CUPYCOLL_SPIN", "0")
    assert mpi_wait_naps(monkeypatch, 0.3, 98)[0][0] < 0.15
    monkeypatch.setenv("CUPYCOLL_SPIN", "10")
    assert mpi_wait_naps(monkeypatch, 0.3, 98) == []
    for bad in ("-1", "nan", "soon", "inf"):
        monkeypatch.setenv("CUPYCOLL_SPIN", bad)
        with pytest.raises(InvalidArgument, match="CUPYCOLL_SPIN"):
            MPICommunicator(MPI.COMM_SELF)
