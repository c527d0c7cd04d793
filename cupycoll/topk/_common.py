"""What every top-k algorithm shares: its outcome, the state carried across calls, cost models.

An algorithm is ``fn(comm, x, k, state) -> TopkOutcome``: ``x`` is this rank's dense vector (an
array of ``comm.xp``), ``k`` the number of entries asked for, ``state`` a :class:`TopkState` whose
``selector`` the front door has already set. Result values are **sums** over the contributions
that made it into the result; :class:`TopkOutcome.included` tells this rank which of its own
entries those were, which is what the residual compressor zeroes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .._result import SparseResult
from .._types import array_namespace, to_host
from ..errors import InvalidArgument, InvalidType

from .selectors import Selector

if TYPE_CHECKING:
    from .selectors import Selection

__all__ = ["TopkState", "TopkOutcome", "WordCost", "index_dtype", "sorted_member", "to_host",
           "to_namespace", "check_int", "check_boundaries", "log2_ceil"]


class WordCost(NamedTuple):
    """Per-rank cost of one call in the papers' terms: ``words`` received (1 word = one int32
    index or one fp32 value) and ``latency`` (alpha terms on the critical path), both as the
    algorithm's model states (the bytes a call books are :class:`cupycoll.sparse._cost.Cost`)."""

    words: float
    latency: float


class TopkOutcome(NamedTuple):
    """What an algorithm returns on every rank.

    ``result``: the identical sparse result (ascending unique indices, values = sums).
    ``included``: ascending indices of this rank's entries whose full value is inside
    ``result.values`` (the compressor zeroes exactly these in the residual).
    ``selection``: this rank's local selection (for diagnostics).
    ``remainders``: (indices, values) pairs, each with unique indices, that this rank adds back
    into its residual after zeroing ``included``: the rounding errors of the values it sent
    that reached the result (``wire_values``), so error feedback keeps every bit of mass.
    """

    result: SparseResult
    included: Any
    selection: Selection
    remainders: tuple = ()


@dataclasses.dataclass
class TopkState:
    """What a sequence of top-k allreduce calls carries from one call to the next.

    Attributes:
        tau: Ok-Topk repartitions the regions when ``step % tau == 0``; ``"auto"`` (default)
            repartitions every step when the regions' expected share noise is above
            :data:`cupycoll.topk.oktopk.SHARE_NOISE` (few entries per region), every
            :data:`cupycoll.topk.oktopk.AUTO_TAU` steps otherwise.
        tau_prime: refresh step when ``step % tau_prime == 0``: Ok-Topk's result is the exact
            top-k of the reduced sums (and the reference policy recomputes its thresholds
            exactly, reusing them with count feedback in between).
        step: number of calls made with this state (the next call is step ``step``; an int
            >= 0).
        selector: the local selector (set to the algorithm's default on first use).
        boundaries: Ok-Topk's region boundaries ``B_0 = 0 <= ... <= B_P = n`` (host int64,
            identical on every rank: computed from an allreduce; checked by every call, see
            :meth:`check`).
        global_th: Ok-Topk's global threshold of the last step (identical on every rank:
            computed from gathered or allreduced data only).
        padded_allgather: Ok-Topk's final allgather as an allgather of blocks padded to
            ``ceil(T/P)`` with a sentinel index (NCCL has no allgatherv) instead of an
            allgatherv; None = when the communicator has no native allgatherv.
        k: k of the previous call (Ok-Topk refreshes its global threshold when k changes).
        wire: the wire format of the current call (:class:`cupycoll.wire.Wire`, set by the
            front door from its ``wire`` / ``wire_values`` keywords; None = raw COO).
        last: diagnostics of the last call: ``refresh``, ``local_count`` (this rank's
            selection), ``global_count`` (entries passing the global selection; on Ok-Topk
            refresh steps, all reduced nonzeros gathered).
    """

    tau: int | str = "auto"
    tau_prime: int = 32
    step: int = 0
    selector: Selector | None = None
    boundaries: np.ndarray | None = None
    global_th: float | None = None
    padded_allgather: bool | None = None
    k: int | None = None
    last: dict = dataclasses.field(default_factory=dict)
    wire: Any = None

    def __post_init__(self) -> None:
        self.tau, self.tau_prime, self.step, self.padded_allgather = self.check()

    def check(self, n: int | None = None, p: int | None = None) -> tuple:
        """Raise InvalidType / InvalidArgument naming a bad field; return tau, tau_prime, step
        and padded_allgather as int / bool. Run at construction and by every call (fields can
        be set in between), which passes its n and P: boundaries of this length and last entry
        are then used as they are, so they must ascend from 0 (others are recomputed)."""
        if isinstance(self.tau, str):
            if self.tau != "auto":
                raise InvalidArgument("tau", self.tau, 'must be an int >= 1 or "auto"')
            tau: int | str = "auto"
        else:
            tau = check_int("tau", self.tau, 1)
        if self.selector is not None and not isinstance(self.selector, Selector):
            raise InvalidType("selector", type(self.selector).__name__,
                              "a cupycoll.topk selector (Exact, Threshold, Gaussian)")
        padded = self.padded_allgather
        if padded is not None and not isinstance(padded, (bool, np.bool_)):
            raise InvalidType("padded_allgather", type(padded).__name__, "None or a bool")
        th = self.global_th
        if th is not None and (isinstance(th, (bool, np.bool_)) or
                               not isinstance(th, (int, float, np.integer, np.floating))
                               or not th > 0):
            raise InvalidArgument("global_th", th, "must be None or a number > 0")
        check_boundaries(self.boundaries, n, p)
        return (tau, check_int("tau_prime", self.tau_prime, 1), check_int("step", self.step, 0),
                None if padded is None else bool(padded))

    @property
    def refresh(self) -> bool:
        """True when the current step recomputes thresholds exactly."""
        return self.step % self.tau_prime == 0

    def repartition(self, every: int) -> bool:
        """True when the current step recomputes Ok-Topk's region boundaries (``every`` is
        the period that ``tau="auto"`` stands for at this call's k and P)."""
        return self.step % (every if self.tau == "auto" else self.tau) == 0


def check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as an int, or raise InvalidType / InvalidArgument (below ``minimum``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidType(name, type(value).__name__, "an int")
    if value < minimum:
        raise InvalidArgument(name, value, f"must be >= {minimum}")
    return int(value)


def check_boundaries(b: Any, n: int | None, p: int | None) -> None:
    """Raise unless ``b`` is None or a 1-D integer numpy array; where it has P+1 entries and
    ends at n (Ok-Topk uses it then), unless it ascends from 0 (so it lies within [0, n])."""
    if b is None:
        return
    if not isinstance(b, np.ndarray) or b.ndim != 1 or b.dtype.kind not in "iu":
        raise InvalidType("boundaries", type(b).__name__, "None or a 1-D integer numpy array")
    if n is None or b.shape[0] != p + 1 or int(b[-1]) != n:
        return  # another n or P: Ok-Topk recomputes them
    if int(b[0]) != 0 or bool(np.any(np.diff(b.astype(np.int64)) < 0)):
        raise InvalidArgument("boundaries", b.tolist(),
                              f"must ascend from 0 to n = {n} (P + 1 = {p + 1} entries)")


def index_dtype(n: int) -> np.dtype:
    """Index dtype of a vector of length n (the primitives' rule: int32 below 2**31)."""
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def sorted_member(a: Any, b: Any) -> Any:
    """Boolean mask over ascending ``a``: which entries are also in ascending ``b``."""
    xp = array_namespace(a)
    if b.shape[0] == 0 or a.shape[0] == 0:
        return xp.zeros(a.shape[0], dtype=bool)
    pos = xp.searchsorted(b, a)
    pos = xp.minimum(pos, b.shape[0] - 1)
    return b[pos] == a


def to_namespace(arr: Any, xp: Any) -> Any:
    """Return ``arr`` as an array of ``xp`` (numpy or cupy; device arrays go through the host)."""
    if array_namespace(arr) is xp:
        return arr
    return xp.asarray(to_host(arr))


def log2_ceil(p: int) -> int:
    """ceil(log2 p) for p >= 1."""
    return (p - 1).bit_length()
