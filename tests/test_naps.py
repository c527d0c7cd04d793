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


def counted_sleeps(monkeypatch) -> list[float]:
    """Every ``time.sleep`` of this thread from here on, recorded (and slept)."""
    naps: list[float] = []
    sleep, waiter = time.sleep, threading.get_ident()

    def counted(seconds: float) -> None:
        if threading.get_ident() == waiter:
            naps.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", counted)
    return naps


def test_a_long_nccl_wait_naps_ever_longer(monkeypatch):
    naps = counted_sleeps(monkeypatch)
    start = time.monotonic()
    spin(lambda: time.monotonic() - start >= WAIT)
    assert time.monotonic() - start >= WAIT
    assert 0 < len(naps) < MOST_NAPS and max(naps) == _naps.NAP_MAX, len(naps)
    assert naps == sorted(naps)


def test_a_long_mpi_wait_naps_ever_longer(monkeypatch):
    """A request that completes WAIT seconds later (a message this rank sends itself from
    another thread)."""
    comm = MPICommunicator(MPI.COMM_SELF, timeout=30)
    got = np.zeros(1)
    request = comm.mpi_comm.Irecv(got, source=0, tag=99)
    sender = threading.Timer(WAIT, lambda: comm.mpi_comm.Send(np.ones(1), dest=0, tag=99))
    naps = counted_sleeps(monkeypatch)
    start = time.monotonic()
    sender.start()
    comm.wait([request], "test.wait")
    sender.join()
    assert got[0] == 1.0 and time.monotonic() - start >= WAIT
    assert 0 < len(naps) < MOST_NAPS and max(naps) == _naps.NAP_MAX, len(naps)



def first_nap(monkeypatch, spin_text: str) -> float | None:
    """Seconds into a 0.3 s MPI wait of this thread at which it first sleeps (None: never),
    on a communicator made under ``CUPYCOLL_SPIN=spin_text``."""
    monkeypatch.setenv("CUPYCOLL_SPIN", spin_text)
    comm = MPICommunicator(MPI.COMM_SELF, timeout=30)
    got = np.zeros(1)
    request = comm.mpi_comm.Irecv(got, source=0, tag=98)
    sender = threading.Timer(0.3, lambda: comm.mpi_comm.Send(np.ones(1), dest=0, tag=98))
    first: list[float] = []
    sleep, waiter, start = time.sleep, threading.get_ident(), time.monotonic()

    def noted(seconds: float) -> None:
        if threading.get_ident() == waiter and not first:
            first.append(time.monotonic() - start)
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", noted)
    sender.start()
    comm.wait([request], "test.wait")
    sender.join()
    monkeypatch.setattr(time, "sleep", sleep)
    assert got[0] == 1.0
    return first[0] if first else None


def test_an_mpi_wait_spins_for_cupycoll_spin_seconds_then_naps(monkeypatch):
    """CUPYCOLL_SPIN, read when the communicator is made: the wait naps from its first yield
    under 0, never within 10 s under 10; a negative, infinite or unparsable value raises
    naming it."""
    assert first_nap(monkeypatch, "0") < 0.05
    assert first_nap(monkeypatch, "10") is None
    for bad in ("-1", "nan", "soon", "inf"):
        monkeypatch.setenv("CUPYCOLL_SPIN", bad)
        with pytest.raises(InvalidArgument, match="CUPYCOLL_SPIN"):
            MPICommunicator(MPI.COMM_SELF)
