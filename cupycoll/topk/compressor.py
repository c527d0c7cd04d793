"""``TopkCompressor``: Ok-Topk SGD's error feedback (spec section 3) for numpy/CuPy/PyTorch trainers.

Each step adds the gradient to this rank's residual (``acc = residual + grad``), runs a top-k
allreduce of ``acc`` and returns the **averaged** sparse update (sum of the communicated
contributions divided by P). The residual keeps everything that was not communicated: the
algorithm reports which of this rank's entries are inside the result (``included``), and exactly
those are zeroed (with ``wire_values``, the rounding errors of the values this rank sent, or
re-sent as an owner, that reached the result are then added back). Values that left their rank but were dropped later (gTopk's pairwise
re-selection, Ok-Topk's global threshold) are therefore still in the contributing rank's
residual, so mass is conserved exactly for every algorithm::

    sum over ranks of new residual + P * update == sum over ranks of (old residual + grad)

up to float rounding. The learning rate stays outside (as in the reference code): apply it to
the update, e.g. ``w[upd.indices] -= lr * upd.values``.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import numpy as np

from .._config import setting
from .._result import SparseResult
from .._pipeline import Delivery, Plan, call
from .._types import ReduceOp, array_namespace, as_array
from ..comm import Communicator, comm_or_default, get_comm, made_comm
from ..errors import InvalidArgument
from ..primitives import densify, topk_abs
from ._common import TopkState, check_int, to_namespace
from ..wire._choice import check_wire
from .api import run, state_crc, validate
from .selectors import Selector

__all__ = ["TopkCompressor"]


class TopkCompressor:
    """Sparsify gradients with a top-k allreduce and keep the rest in a per-rank residual.

    Args:
        n: gradient length (the same on every rank).
        density: fraction of entries communicated; ``k = max(1, floor(density * n))``.
        algorithm: a top-k algorithm (``cupycoll.algorithms("topk")``), default "oktopk".
        comm: communicator (default ``cupycoll.get_comm()``).
        tau, tau_prime: Ok-Topk's repartition ("auto": see ``TopkState``) and threshold-refresh
            periods.
        selector: local selector (default: the algorithm's).
        warmup_steps: the first steps send the whole accumulated gradient densely (one dense
            allreduce; the update then covers all n entries and the residual becomes zero).
        measure_xi: record the spec's xi per step in ``xi``: ||top-k(sum of acc) - result|| /
            ||sum of grad|| (two extra dense allreduces per step: diagnostics only).
        wire, wire_values: the wire format (see :func:`cupycoll.topk_allreduce`); with
            ``wire_values`` every rounding error lands in some rank's residual (the sender's for
            its values, the owner's for a reduced value it re-sends), so mass is conserved.
    Attributes:
        k, n, state (:class:`TopkState`), residual (this rank's dense array, the gradient's
        array library), xi (list of floats), steps (calls so far).
    Example::

        comp = cc.TopkCompressor(w.size, 0.01)
        upd = comp.step(grad)                 # every rank: the same averaged sparse update
        w[upd.indices] -= lr * upd.values
    """

    def __init__(self, n: int, density: float, *, algorithm: str | None = None,
                 comm: Communicator | None = None, tau: int | str = "auto",
                 tau_prime: int = 32,
                 selector: Selector | None = None, warmup_steps: int = 0,
                 measure_xi: bool = False, wire: str | None = None,
                 wire_values: str | None = None) -> None:
        self.n: int = check_int("n", n, 1)
        if isinstance(density, bool) or not isinstance(density, numbers.Real) or \
                not 0 < density <= 1:
            raise InvalidArgument("density", density, "must be a number in (0, 1]")
        self.density: float = float(density)
        # a few ulps up: 0.29 * 100 is 28.999999999999996, 2 / 6 * 6 is 2.0
        self.k: int = max(1, math.floor(self.density * self.n * (1 + 4 * sys.float_info.epsilon)))
        self._algorithm_from = "algorithm" if algorithm is not None else \
            "CUPYCOLL_TOPK_ALGORITHM"
        self.algorithm: str = setting("CUPYCOLL_TOPK_ALGORITHM", algorithm)
        self.wire, self.wire_values = wire, wire_values
        self.comm: Communicator = comm_or_default(comm)
        self.state: TopkState = TopkState(tau=tau, tau_prime=tau_prime, selector=selector)
        self.warmup_steps: int = check_int("warmup_steps", warmup_steps, 0)
        self.measure_xi: bool = bool(measure_xi)
        self.xi: list[float] = []
        self.steps: int = 0
        self._called = 0  # steps called (an asynchronous one may still run)
        self._residual: Any = None
        self._pending: Any = None  # the Work of the last async step

    def __getstate__(self) -> dict[str, Any]:
        """What a checkpoint keeps (``pickle``, ``torch.save``, ``copy.deepcopy``): everything
        but the communicator, after a step in flight completes; loading puts the default
        communicator in its place (set ``comm`` to use another), or, when none was made yet,
        the first step does (a rank may load a checkpoint alone: nothing collective)."""
        if self._pending is not None:
            self._pending.wait()
        return {**self.__dict__, "comm": None, "_pending": None}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        self.__dict__.update({"_algorithm_from": "algorithm", **saved})  # older checkpoints
        self.comm = made_comm()

    @property
    def residual(self) -> Any:
        """This rank's residual (dense, length n; zeros before the first step)."""
        if self._residual is None:
            return (np if self.comm is None else self.comm.xp).zeros(self.n, dtype=np.float32)
        return self._residual

    @residual.setter
    def residual(self, value: Any) -> None:
        """Replace the residual (e.g. mass carried over when gradient buckets are rebuilt)."""
        arr = as_array(value, "residual")
        if arr.ndim != 1 or int(arr.shape[0]) != self.n or arr.dtype.kind != "f":
            raise InvalidArgument("residual", f"{arr.dtype}{tuple(arr.shape)}",
                                  f"must be a 1-D float array of length n={self.n}",
                                  rank=getattr(self.comm, "rank", None))
        self._residual = arr

    def step(self, grad: Any, *, async_op: bool = False) -> Any:
        """Add ``grad`` to the residual, communicate, return the averaged sparse update.

        ``grad``: numpy, cupy or ``__dlpack__`` (e.g. a torch tensor), float, length n on every
        rank. Returns a SparseResult in numpy (host gradients) or cupy (device gradients) whose
        values are averages over ranks. Raises on every rank as ``topk_allreduce`` does.
        With ``async_op=True`` returns a :class:`~cupycoll.comm.Work` once the arguments are
        agreed (``wait()``, ``get_future()``, ``add_done_callback()``): the step runs in call
        order on the communicator's background worker, over a duplicate of it, so it overlaps
        the caller's work (e.g. the rest of a backward pass). Do not modify ``grad`` nor read
        ``residual`` until it completes; a later synchronous step waits for it first.
        """
        if not async_op and self._pending is not None:
            self._pending.wait()
            self._pending = None  # the state is at rest (see _settings)
        if self.comm is None:  # loaded before any communicator was made
            self.comm = get_comm()
        done = call(self.comm, "TopkCompressor.step",
                    lambda: validate(self.comm, grad, self.k, self.algorithm, argument="grad",
                                     state=self.state, n=self.n,
                                     verb="TopkCompressor.step", wire=self.wire,
                                     wire_values=self.wire_values,
                                     settings=self._settings(), async_op=async_op,
                                     algorithm_from=self._algorithm_from),
                    lambda agreed: Plan(self.algorithm, None,
                                        lambda on: self._advance(on, *agreed)),
                    lambda agreed: Delivery(agreed[0], agreed[0], self.n), async_op)
        self._called += 1
        if async_op:
            self._pending = done
        return done

    def _settings(self) -> dict[str, Any]:
        """What of this compressor decides the collectives of its next step (agreed by the
        step's validation): whether it is a warm-up step, measure_xi, Ok-Topk's periods and
        the step count (ranks restored from different checkpoints would run different
        collectives), the padded allgather, and the crc32 of the state's boundaries and
        global threshold (from different checkpoints they differ). Read in the caller's
        thread, while an asynchronous step may still run: from the steps called so far, not
        those done; the crc where no asynchronous step was called since the last synchronous
        one, restore or construction (every rank calls alike, so every rank includes it or
        none)."""
        # a state replaced by something else reads as None here: the validation names it
        state = self.state if isinstance(self.state, TopkState) else None
        crc = state_crc(state) if state is not None and self._pending is None else None
        return {"warmup": self._called < self.warmup_steps, "measure_xi": self.measure_xi,
                "tau": getattr(state, "tau", None),
                "tau_prime": getattr(state, "tau_prime", None), "step": self._called,
                "padded_allgather": getattr(state, "padded_allgather", None),
                "state crc32": crc}

    def _advance(self, comm: Communicator, arr: Any, k: int) -> SparseResult:
        """One validated step over ``comm`` (the compressor's communicator or its background
        duplicate): the update, the residual and the step count advanced."""
        xp = array_namespace(arr)
        dtype = np.float32 if arr.dtype == np.float16 else arr.dtype
        if self._residual is None or array_namespace(self._residual) is not xp \
                or self._residual.dtype != dtype:
            self._residual = to_namespace(self.residual, xp).astype(dtype)
        with np.errstate(all="ignore"):  # an overflow is inf on every rank's residual alike,
            acc = self._residual + arr.astype(dtype, copy=False)  # never raised on one alone
        acc_c = to_namespace(acc, comm.xp)
        if self.steps < self.warmup_steps:
            update = self._dense_step(acc_c, comm)
            self._residual = xp.zeros_like(acc)
        else:
            outcome = run(comm, acc_c, k, self.algorithm, None, self.state,
                          check_wire(self.wire), self.wire_values)
            update = outcome.result
            if self.measure_xi:
                self.xi.append(self._xi(acc_c, to_namespace(arr.astype(dtype), comm.xp),
                                        update, comm))
            acc[to_namespace(outcome.included, xp)] = 0
            for where, error in outcome.remainders:  # rounding errors (wire_values)
                with np.errstate(all="ignore"):
                    acc[to_namespace(where, xp)] += to_namespace(error, xp).astype(dtype)
            self._residual = acc
            update = SparseResult(update.indices, _averaged(update.values, comm.size), self.n)
        self.steps += 1
        return update

    def _dense_step(self, acc: Any, comm: Communicator) -> SparseResult:
        """Warm-up: the dense average of acc, as a SparseResult over all n indices."""
        xp = comm.xp
        total = xp.empty_like(acc)
        comm.allreduce(acc, total, ReduceOp.SUM, op_name="compressor.warmup").wait()
        idx = xp.arange(self.n, dtype=np.int32 if self.n < 2**31 else np.int64)
        return SparseResult(idx, _averaged(total, comm.size), self.n)

    def _xi(self, acc: Any, grad: Any, result: SparseResult, comm: Communicator) -> float:
        """||top-k(sum of acc) - result|| / ||sum of grad|| (sums over ranks)."""
        xp = comm.xp
        sums = [xp.empty_like(acc), xp.empty_like(grad)]
        comm.allreduce(acc, sums[0], ReduceOp.SUM, op_name="compressor.xi").wait()
        comm.allreduce(grad, sums[1], ReduceOp.SUM, op_name="compressor.xi").wait()
        ti, tv = topk_abs(sums[0], self.k)
        diff = densify(ti, tv, self.n) - densify(result.indices, result.values, self.n)
        scale = float(xp.linalg.norm(sums[1]))
        return float(xp.linalg.norm(diff)) / scale if scale > 0 else 0.0


def _averaged(total: Any, size: int) -> Any:
    """``total / size``, a subnormal's quotient 0 under any caller's error state (never a raise
    on the one rank that holds it)."""
    with np.errstate(all="ignore"):
        return total / size
