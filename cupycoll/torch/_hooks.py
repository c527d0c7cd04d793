"""The DDP communication hooks: ``allreduce_hook`` (a plain averaged allreduce) and
``topk_hook`` (Ok-Topk with error feedback per bucket, state in :class:`TopkHookState`).

Dense buckets are averaged on the hooks' own duplicate of the communicator; a sparse bucket
(DDP hands one per sparse parameter, e.g. ``nn.Embedding(sparse=True)``) is averaged exactly by
the sparse allreduce, on cupycoll's background worker (DDP's last bucket, once the worker is
idle, in the hook itself: the backward pass has nothing left to overlap it with); the bucket's
tensor, the parameter's gradient, then holds the coalesced average (DDP copies nothing).
"""

import dataclasses
import weakref
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .._background import runner
from .._result import SparseResult
from .._types import ReduceOp
from ..comm import Communicator, comm_or_default, get_comm
from ..errors import InvalidArgument, InvalidType
from ..topk import TopkCompressor
from ..wire._choice import check_wire, check_wire_values
from . import _sparse
from ._tensors import as_array, future_of, working_copy, working_dtype, written_back

__all__ = ["TopkHookState", "topk_hook", "allreduce_hook"]


def _background(comm: Communicator | None) -> Communicator:
    """The hooks' own communicator: a duplicate, so DDP's buckets never cross the user's calls,
    and its background worker (both collective: made here, not in the first sparse bucket's
    hook, which must not wait for the other ranks)."""
    own = comm_or_default(comm).dup()
    runner(own)
    return own


def allreduce_hook(comm: Communicator | None,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: average the bucket with cupycoll's dense allreduce, or a sparse bucket with its
    sparse allreduce. ``comm``: the communicator to run on (pass ``cc.get_comm().dup()`` to
    keep DDP's traffic apart from your own calls), or None for a duplicate of the default one,
    made once. A bfloat16 bucket is averaged in float32 and rounded back once."""
    _checked_state(comm, Communicator, "a cupycoll Communicator or None")
    comm = comm or _hook_comm()
    buffer = bucket.buffer()
    if buffer.is_sparse:
        return _sparse_bucket(comm, buffer, bucket.is_last())
    reduced = working_copy(buffer, comm.rank)
    array = as_array(reduced)
    work = comm.allreduce(array, array, ReduceOp.AVG, op_name="torch.allreduce_hook")
    return future_of(work, lambda _: written_back(buffer, reduced), buffer)


def _sparse_bucket(comm: Communicator, buffer: torch.Tensor, last: bool
                   ) -> torch.futures.Future:
    """The average of a sparse bucket over ranks, exact (union of rows, sum / P), coalesced,
    held by the bucket's tensor itself (the gradient: DDP's ``bucket.gradients.copy_`` of the
    Future's value into it, in ``reducer.cpp``, is then no copy). The whole call runs in the
    background (MPI) or on the communicator's stream (NCCL): the autograd thread does not wait
    for another rank here, except on MPI for the ``last`` bucket once the background worker
    is idle (then the call runs in the hook: nothing of the backward pass is left to overlap
    it with)."""
    working_dtype(buffer, comm.rank)  # a bad dtype raises here, before anything travels
    return _sparse.future(comm, buffer, {"op": ReduceOp.AVG, "in_place": True},
                          "torch.sparse_bucket", last)


def _checked_state(state: Any, kind: type, wanted: str) -> None:
    """Raise InvalidType naming ``state`` unless it is a ``kind`` (or None, for a
    Communicator): torch's own hooks take the process group as their state, these do not."""
    if not (isinstance(state, kind) or state is None and kind is Communicator):
        raise InvalidType("state", type(state).__name__, f"{wanted} (register_comm_hook's "
                          "first argument; cupycoll's hooks take no process group)")


#: the default communicator -> the hooks' duplicate of it
_HOOK_COMMS: "weakref.WeakKeyDictionary[Communicator, Communicator]" = \
    weakref.WeakKeyDictionary()


def _hook_comm() -> Communicator:
    """The hooks' duplicate of the current default communicator (a new one after
    ``cupycoll.init()`` made another default: a world split or rebuilt after an abort)."""
    default = get_comm()
    own = _HOOK_COMMS.get(default)
    if own is None:
        own = _HOOK_COMMS[default] = _background(default)
    return own


@dataclasses.dataclass
class TopkHookState:
    """State of :func:`topk_hook`: one :class:`TopkCompressor` (and residual) per gradient bucket.

    Args:
        density: fraction of each bucket's entries sent per step (k = density x bucket size).
        algorithm: top-k algorithm (``cupycoll.algorithms("topk")``), default "oktopk".
        warmup_steps: iterations that send plain averaged allreduces first (>= 1: DDP rebuilds
            its buckets after the first iteration, so compression starts on the final buckets).
        comm: communicator to duplicate for the hook (default: the hooks' duplicate of the
            default communicator, whichever it is at each call).
        tau, tau_prime: Ok-Topk's repartition ("auto": see ``TopkState``) and threshold-refresh
            periods.
        wire, wire_values: the wire format of every bucket's top-k allreduce (see
            :func:`cupycoll.topk_allreduce`; default ``CUPYCOLL_WIRE``, else "auto"); with
            ``wire_values`` the rounding errors land in the buckets' residuals.
    Attributes:
        iteration: completed iterations (counted at each iteration's last bucket).
        compressors: bucket key (index, size) -> TopkCompressor.
        bytes_sent: bytes this rank sent through the hook (all buckets, all iterations).
    """

    density: float
    algorithm: str = "oktopk"
    warmup_steps: int = 1
    comm: Communicator | None = None
    tau: int | str = "auto"
    tau_prime: int = 32
    wire: str | None = None
    wire_values: str | None = None
    iteration: int = 0
    compressors: dict = dataclasses.field(default_factory=dict)
    _params: dict = dataclasses.field(default_factory=dict, init=False, repr=False)  # bucket
    _loose: dict = dataclasses.field(default_factory=dict, init=False, repr=False)  # key ->
    # its parameters; id(parameter) -> a retired residual
    _shapes: dict = dataclasses.field(default_factory=dict, init=False, repr=False)  # key ->
    # the parameter shapes a loaded bucket was saved with, until DDP hands it again
    _resumed: int | None = dataclasses.field(default=None, init=False, repr=False)  # the
    # iteration this process loaded the state at (a warm-up one: DDP buckets anew)
    _defaulted: bool = dataclasses.field(default=False, init=False, repr=False)  # comm: the
    # hooks' duplicate of whichever communicator is the default (a torch group can change it)

    def __post_init__(self) -> None:
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) \
                or self.warmup_steps < 1:
            raise InvalidArgument("warmup_steps", self.warmup_steps,
                                  "must be an int >= 1: DDP rebuilds buckets after iteration 1")
        if not isinstance(self.density, (int, float)) or not 0 < self.density <= 1:
            raise InvalidArgument("density", self.density, "must be a number in (0, 1]")
        check_wire(self.wire)
        check_wire_values(self.wire_values)
        self._defaulted = self.comm is None
        self.comm = _hook_comm() if self._defaulted else _background(self.comm)

    def __getstate__(self) -> dict[str, Any]:
        """What a checkpoint keeps (as PowerSGD's state: ``torch.save``, ``pickle``): the
        settings, the iteration and every bucket's compressor with its residual (the mass not
        sent yet) and its parameters' shapes, not the communicator nor the parameters; loading
        makes the hooks' duplicate of the default communicator again (at the first hook call:
        a state loaded on one rank alone, to inspect it, makes nothing collective)."""
        return {**self.__dict__, "comm": None, "_params": {}, "_loose": {},
                "_shapes": {**self._shapes, **_shapes_of(self._params)}}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        """A loaded state's first iteration is a warm-up: a fresh DDP hands its first
        iteration's gradients in its initial buckets, not the rebuilt ones the residuals are
        laid out by; from the next iteration each bucket takes its saved compressor."""
        self.__dict__.update(saved)
        self._shapes = {**saved.get("_shapes", {}), **_shapes_of(self._params)}
        self._params, self._resumed, self._defaulted = {}, self.iteration, True

    def attached(self) -> Communicator:
        """The hook's communicator. Without one given (and in a loaded state) it is the hooks'
        duplicate of the current default communicator, made again where the default changed
        (a ``cupycoll`` torch group under torchrun spans processes the one made before it did
        not; collective: at a hook call, on every rank)."""
        if self.comm is None or self._defaulted:
            comm = _hook_comm()
            if comm is not self.comm:
                self.comm = comm
                for compressor in self.compressors.values():
                    compressor.comm = comm
        return self.comm

    @property
    def bytes_sent(self) -> int:
        return self.comm.stats.bytes_sent if self.comm is not None else 0

    def compressor(self, bucket: dist.GradBucket) -> TopkCompressor:
        """This bucket's compressor; a rebuilt bucket inherits its parameters' residuals."""
        buffer, comm = bucket.buffer(), self.attached()
        key, params = (bucket.index(), buffer.numel()), list(bucket.parameters())
        found = self.compressors.get(key)
        known = self._params.get(key)
        if found is not None and known is None:
            self._adopt(key, params)
            return found
        if found is not None and [id(p) for p in known] == [id(p) for p in params]:
            return found
        if found is not None:  # the key now holds other parameters (another DDP over this
            self._retire(key)  # state bucketed them otherwise): its residuals wait for them
        if self._shapes:  # a loaded bucket's residual would never be sent
            raise InvalidArgument("state", f"bucket {key}", f"one of the loaded state's "
                                  f"buckets {list(self._shapes)}: load it into the same model "
                                  "with the same DDP bucket size", rank=comm.rank)
        found = TopkCompressor(buffer.numel(), self.density, algorithm=self.algorithm,
                               comm=comm, tau=self.tau, tau_prime=self.tau_prime,
                               wire=self.wire, wire_values=self.wire_values)
        carried = self._carry_residuals(params)
        if carried is not None:
            found.residual = carried
        self.compressors[key], self._params[key] = found, params
        return found

    def _adopt(self, key: tuple[int, int], params: list) -> None:
        """A loaded bucket's parameters, checked against the shapes it was saved with (its
        residual is laid out by them)."""
        saved = self._shapes.get(key)
        if saved is None:
            return
        shapes = [tuple(p.shape) for p in params]
        if shapes != saved:
            raise InvalidArgument("state", f"bucket {key} of parameters {shapes}",
                                  f"the loaded state's bucket {key} held parameters {saved}: "
                                  "load it into the same model with the same DDP bucket size",
                                  rank=self.comm.rank)
        del self._shapes[key]
        self._params[key] = params

    def _carry_residuals(self, params: list) -> Any:
        """Residual of a new bucket assembled, parameter by parameter, from the residuals of
        retired buckets that held the same parameters, so no gradient mass is lost when DDP
        re-buckets. Slices of parameters that went elsewhere wait for their new bucket."""
        wanted = {id(p) for p in params}
        for key in [k for k, ps in self._params.items() if wanted & {id(p) for p in ps}]:
            self._retire(key)
        if not wanted & set(self._loose):
            return None
        xp, pieces = self.comm.xp, [self._loose.pop(id(p), None) for p in params]
        dtype = np.result_type(*(piece.dtype for piece in pieces if piece is not None))
        return xp.concatenate([xp.asarray(piece, dtype=dtype) if piece is not None
                               else xp.zeros(p.numel(), dtype) for piece, p in zip(pieces, params)])


    def _retire(self, key: tuple[int, int]) -> None:
        """Bucket ``key``'s compressor goes; its residual waits, parameter by parameter, for
        the buckets that hold them next."""
        residual, offset = self.compressors.pop(key).residual, 0
        for p in self._params.pop(key):
            self._loose[id(p)] = residual[offset:offset + p.numel()]
            offset += p.numel()


def _shapes_of(params: dict) -> dict:
    """Bucket key -> its parameters' shapes (what a checkpoint keeps of them)."""
    return {key: [tuple(p.shape) for p in ps] for key, ps in params.items()}


def topk_hook(state: TopkHookState,
              bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: Ok-Topk (or another top-k) allreduce with error feedback.

    Warm-up iterations average the bucket densely; afterwards each bucket's gradient joins its
    residual, about ``density`` of its entries are reduced across ranks, the averaged sparse
    update is written densely into the bucket (zeros elsewhere) and the rest stays in the
    residual for later steps. Returns a torch Future, completed from cupycoll's worker.
    A sparse bucket (a sparse parameter's gradient) is never compressed: it is averaged
    exactly, as :func:`allreduce_hook` does, warm-up or not. A bfloat16 bucket is fed to its
    compressor as a float32 copy (float32 residual; the update is rounded to bfloat16 where it
    is written into the bucket).
    """
    _checked_state(state, TopkHookState, "a cupycoll.torch.TopkHookState")
    buffer, comm = bucket.buffer(), state.attached()
    working_dtype(buffer, comm.rank)  # a bad dtype raises before the bucket counts
    if bucket.is_last():
        state.iteration += 1
        iteration = state.iteration - 1
    else:
        iteration = state.iteration
    if buffer.is_sparse:
        return _sparse_bucket(comm, buffer, bucket.is_last())
    reduced = working_copy(buffer, comm.rank)
    array = as_array(reduced)
    if iteration < state.warmup_steps or iteration == state._resumed:
        work = comm.allreduce(array, array, ReduceOp.AVG, op_name="torch.warmup")
        return future_of(work, lambda _: written_back(buffer, reduced), buffer)
    work = state.compressor(bucket).step(array, async_op=True)

    def write(update: SparseResult) -> torch.Tensor:
        buffer.zero_()
        if update.nnz:
            index = torch.as_tensor(update.indices, device=buffer.device).long()
            buffer[index] = torch.as_tensor(update.values, device=buffer.device).to(buffer.dtype)
        return buffer

    return future_of(work, write, buffer)

