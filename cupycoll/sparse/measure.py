"""``CUPYCOLL_AUTO=measure``: auto times its best candidates on the first calls of each kind of
call and keeps the fastest (FFTW's MEASURE planner, cuDNN's benchmark mode).

The time model prices every algorithm from a profile measured once; on a machine whose speed
drifts, or where the model misses some work, or whose profile was measured elsewhere, its
pick can be slower than the best (docs/tuning.md). Here the model only nominates: the
algorithms predicted within :data:`WITHIN` of its best (at most :data:`CANDIDATES`) run in turn
on the first synchronous calls of a kind of call (:func:`kind`: P, the element sizes, op,
output and wire, n, width and the total nnz to a power of two), each :data:`SAMPLES` + 1 times
(the first warms it up: imports, compiled loops, buffers: up to a second); then the one of
least median time runs on every later call of that kind (at most 24 trial calls a kind). A
trial's time is this rank's seconds in the algorithm (validation excluded; on NCCL from the end
of the device work queued before it to the end of its own: two host waits), agreed as the
slowest rank's by one 8-byte MAX allreduce: every rank keeps the same table and picks the same
algorithm. Asynchronous calls are not timed; they run the kept pick, or the model's while the
trials last. Results stay bitwise identical across ranks; which algorithm computed them (so
the rounding of a float sum) can differ between the trial calls and the later ones. The mode
must be the same on every rank (the validation checks it).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

import numpy as np

from .._types import ReduceOp
from ..primitives import _accel
from . import auto as _auto
from ._cost import Shape

__all__ = ["kind", "Trials", "plan", "settled", "record", "measured", "CANDIDATES", "WITHIN",
           "SAMPLES"]

#: algorithms tried at most per kind of call: the model's best and the next ones
CANDIDATES = 4
#: tried only when predicted within this factor of the model's best
WITHIN = 4.0
#: timed calls per candidate that count (after its first, a warm-up) before the pick is kept
SAMPLES = 5


def kind(shape: Shape) -> tuple:
    """What makes two calls the same kind: P, nodes, element sizes, op, output, wire and the
    result's cast exactly; n, width and the total nnz to the next power of two."""
    return (shape.size, shape.nodes, shape.index_bytes, shape.value_bytes, shape.op,
            shape.output, shape.wire, shape.float_values, shape.result_bytes,
            shape.n.bit_length(), shape.width.bit_length(), shape.total_nnz.bit_length())


@dataclasses.dataclass
class Trials:
    """One kind of call: its candidates in the model's order, the agreed seconds of each
    trial, and the pick once every candidate has :data:`SAMPLES` of them after its first."""

    candidates: list[str]
    seconds: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    pick: str | None = None

    def next(self) -> str:
        """The pick, else the candidate with the fewest trials (the model's order first)."""
        if self.pick is not None:
            return self.pick
        return min(self.candidates, key=lambda name: len(self.seconds.get(name, ())))


def measured(comm: Any) -> dict[tuple, Trials]:
    """``comm``'s table of trials by :func:`kind` (the same on every rank)."""
    return _auto.comm_table(comm, "_measured", _auto.Recent)


def plan(comm: Any, shape: Shape, op: Any, timed: bool) -> tuple[str, Trials | None]:
    """The algorithm this call runs and, when it is a trial to time (``timed``: a synchronous
    call), its Trials (pass them to :func:`record`); else None."""
    shape, profile = _auto.resolved(shape, comm=comm, op=op)
    table, key = measured(comm), kind(shape)
    trials = table.use(key)
    if trials is None:
        trials = table[key] = Trials(_auto.candidates(_auto.predicted_times(shape, profile),
                                                      WITHIN, CANDIDATES))
    if trials.pick is not None or not timed:
        return trials.pick or trials.candidates[0], None
    _accel.ready()  # a trial times numba's loops where they run, not numpy's while they load
    return trials.next(), trials


def settled(comm: Any) -> float:
    """The time once the device work queued so far has run (NCCL: a host wait; MPI's calls
    return done): a trial's start, and its end."""
    stream_work = getattr(comm, "stream_work", None)
    if stream_work is not None:
        stream_work("auto.measure").wait()
    return time.perf_counter()


def record(comm: Any, trials: Trials, name: str, started: float) -> None:
    """Add a trial of ``name`` started at ``started`` (:func:`settled` before it), ending when
    its device work has run: the slowest rank's seconds (one MAX allreduce, so every rank adds
    the same number), and the pick once complete."""
    seconds = comm.xp.asarray(np.array([settled(comm) - started], dtype=np.float64))
    slowest = comm.run_fetch("allreduce", seconds, seconds, ReduceOp.MAX, result=seconds,
                             op_name="auto.measure")
    trials.seconds.setdefault(name, []).append(float(slowest[0]))
    if all(len(trials.seconds.get(c, ())) > SAMPLES for c in trials.candidates):
        trials.pick = min(trials.candidates,  # a candidate's first trial warms it up
                          key=lambda c: (statistics.median(trials.seconds[c][1:]),
                                         trials.candidates.index(c)))
