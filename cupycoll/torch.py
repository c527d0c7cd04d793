"""PyTorch integration: DDP communication hooks and a sparse allreduce of torch sparse tensors.

    import cupycoll.torch as cct
    state = cct.TopkHookState(density=0.01)               # Ok-Topk, error feedback per bucket
    ddp_model.register_comm_hook(state, cct.topk_hook)    # DDP's documented extension point

Importing ``cupycoll`` never imports torch; this module does (``pip install 'cupycoll[torch]'``).
CPU tensors travel as numpy views (no copy), CUDA tensors through DLPack as CuPy arrays on the
NCCL backend; bfloat16 buckets are reduced in a float32 copy. The hooks run cupycoll's
collectives on their own duplicate of the communicator, in bucket order (the same on every
rank), so they overlap the rest of the backward pass.
"""

import dataclasses
import functools
import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ._result import SparseResult
from ._types import ReduceOp
from .comm import Communicator, Work, get_comm
from .errors import InvalidArgument, InvalidType
from .sparse import sparse_allreduce as _sparse_allreduce
from .topk import TopkCompressor
from .wire._choice import check_wire, check_wire_values

__all__ = ["TopkHookState", "topk_hook", "allreduce_hook", "sparse_allreduce"]


def _as_array(tensor: torch.Tensor) -> Any:
    """A zero-copy numpy (CPU) or CuPy (CUDA) view of a contiguous tensor."""
    if tensor.is_cuda:
        import cupy

        return cupy.from_dlpack(tensor)
    return tensor.detach().numpy()


#: bucket dtype -> the dtype the hooks reduce it in: bfloat16 in a float32 copy (numpy, the MPI
#: backend and the top-k tables have no bfloat16), written back with torch's rounding.
_WORKING_DTYPES = {torch.float16: torch.float16, torch.float32: torch.float32,
                   torch.float64: torch.float64, torch.bfloat16: torch.float32}


def _working_copy(buffer: torch.Tensor, rank: int) -> torch.Tensor:
    """The tensor a hook reduces: the bucket itself, or a float32 copy of a bfloat16 bucket.

    Raises:
        InvalidType: a bucket dtype the hooks do not reduce (named, with this rank).
    """
    dtype = _WORKING_DTYPES.get(buffer.dtype)
    if dtype is None:
        raise InvalidType("bucket", str(buffer.dtype), "a float16, bfloat16, float32 or "
                          "float64 gradient bucket", rank=rank)
    return buffer if dtype == buffer.dtype else buffer.to(dtype)


def _written_back(buffer: torch.Tensor, reduced: torch.Tensor) -> torch.Tensor:
    """The bucket holding ``reduced`` (rounded by torch where it is a float32 copy)."""
    return buffer if reduced is buffer else buffer.copy_(reduced)


def _future_of(work: Work, finish: Any, buffer: torch.Tensor) -> torch.futures.Future:
    """A torch Future completed with ``finish(work.wait())`` (or its exception).

    For a CUDA bucket the Future names its device, so torch records an event on the current
    stream when the value is set and DDP's wait makes its own stream wait for that event.
    """
    future: torch.futures.Future = torch.futures.Future(
        devices=[buffer.device] if buffer.is_cuda else None)

    def done(_: Work) -> None:
        try:
            future.set_result(finish(work.wait()))
        except BaseException as exc:  # DDP re-raises it from the backward pass
            future.set_exception(exc)

    work.add_done_callback(done)
    return future


def _background(comm: Communicator | None) -> Communicator:
    """The hooks' own communicator: a duplicate, so DDP's buckets never cross the user's calls."""
    return (comm or get_comm()).dup()


def allreduce_hook(comm: Communicator | None,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: average the bucket with cupycoll's dense allreduce. ``comm``: the
    communicator to run on (pass ``cc.get_comm().dup()`` to keep DDP's traffic apart from
    your own calls), or None for a duplicate of the default one, made once. A bfloat16
    bucket is averaged in float32 and rounded back once."""
    comm = comm or _hook_comm()
    buffer = bucket.buffer()
    reduced = _working_copy(buffer, comm.rank)
    array = _as_array(reduced)
    work = comm.allreduce(array, array, ReduceOp.AVG, op_name="torch.allreduce_hook")
    return _future_of(work, lambda _: _written_back(buffer, reduced), buffer)


@functools.lru_cache(maxsize=None)
def _hook_comm() -> Communicator:
    return _background(None)


@dataclasses.dataclass
class TopkHookState:
    """State of :func:`topk_hook`: one :class:`TopkCompressor` (and residual) per gradient bucket.

    Args:
        density: fraction of each bucket's entries sent per step (k = density x bucket size).
        algorithm: top-k algorithm (``cupycoll.algorithms("topk")``), default "oktopk".
        warmup_steps: iterations that send plain averaged allreduces first (>= 1: DDP rebuilds
            its buckets after the first iteration, so compression starts on the final buckets).
        comm: communicator to duplicate for the hook (default: the default communicator).
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
    _params: dict = dataclasses.field(default_factory=dict)  # bucket key -> its parameters
    _loose: dict = dataclasses.field(default_factory=dict)  # id(parameter) -> retired residual

    def __post_init__(self) -> None:
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) \
                or self.warmup_steps < 1:
            raise InvalidArgument("warmup_steps", self.warmup_steps,
                                  "must be an int >= 1: DDP rebuilds buckets after iteration 1")
        if not isinstance(self.density, (int, float)) or not 0 < self.density <= 1:
            raise InvalidArgument("density", self.density, "must be a number in (0, 1]")
        check_wire(self.wire)
        check_wire_values(self.wire_values)
        self.comm = _background(self.comm)

    @property
    def bytes_sent(self) -> int:
        return self.comm.stats.bytes_sent

    def compressor(self, bucket: dist.GradBucket) -> TopkCompressor:
        """This bucket's compressor; a rebuilt bucket inherits its parameters' residuals."""
        buffer = bucket.buffer()
        key = (bucket.index(), buffer.numel())
        found = self.compressors.get(key)
        if found is not None:
            return found
        found = TopkCompressor(buffer.numel(), self.density, algorithm=self.algorithm,
                               comm=self.comm, tau=self.tau, tau_prime=self.tau_prime,
                               wire=self.wire, wire_values=self.wire_values)
        params = list(bucket.parameters())
        carried = self._carry_residuals(params)
        if carried is not None:
            found.residual = carried
        self.compressors[key], self._params[key] = found, params
        return found

    def _carry_residuals(self, params: list) -> Any:
        """Residual of a new bucket assembled, parameter by parameter, from the residuals of
        retired buckets that held the same parameters, so no gradient mass is lost when DDP
        re-buckets. Slices of parameters that went elsewhere wait for their new bucket."""
        wanted = {id(p) for p in params}
        for key in [k for k, ps in self._params.items() if wanted & {id(p) for p in ps}]:
            residual, offset = self.compressors.pop(key).residual, 0
            for p in self._params.pop(key):
                self._loose[id(p)] = residual[offset:offset + p.numel()]
                offset += p.numel()
        if not wanted & set(self._loose):
            return None
        xp = self.comm.xp
        return xp.concatenate([xp.asarray(self._loose.pop(id(p)), dtype=np.float32)
                               if id(p) in self._loose else xp.zeros(p.numel(), np.float32)
                               for p in params])


def topk_hook(state: TopkHookState,
              bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: Ok-Topk (or another top-k) allreduce with error feedback.

    Warm-up iterations average the bucket densely; afterwards each bucket's gradient joins its
    residual, about ``density`` of its entries are reduced across ranks, the averaged sparse
    update is written densely into the bucket (zeros elsewhere) and the rest stays in the
    residual for later steps. Returns a torch Future, completed from cupycoll's worker.
    A bfloat16 bucket is fed to its compressor as a float32 copy (float32 residual; the update
    is rounded to bfloat16 where it is written into the bucket).
    """
    buffer = bucket.buffer()
    reduced = _working_copy(buffer, state.comm.rank)
    if bucket.is_last():
        state.iteration += 1
        iteration = state.iteration - 1
    else:
        iteration = state.iteration
    array = _as_array(reduced)
    if iteration < state.warmup_steps:
        work = state.comm.allreduce(array, array, ReduceOp.AVG, op_name="torch.warmup")
        return _future_of(work, lambda _: _written_back(buffer, reduced), buffer)
    work = state.compressor(bucket).step(array, async_op=True)

    def write(update: SparseResult) -> torch.Tensor:
        buffer.zero_()
        if update.nnz:
            index = torch.as_tensor(update.indices, device=buffer.device).long()
            buffer[index] = torch.as_tensor(update.values, device=buffer.device).to(buffer.dtype)
        return buffer

    return _future_of(work, write, buffer)


def sparse_allreduce(tensor: torch.Tensor, *, op: str = "sum",
                     comm: Communicator | None = None, **kwargs: Any) -> torch.Tensor:
    """Allreduce a ``torch.sparse_coo_tensor`` (e.g. an ``nn.Embedding(sparse=True)`` gradient).

    Any dense trailing dimensions are rows. Returns a coalesced sparse tensor of the same
    shape, identical on every rank, as ``torch.distributed.all_reduce`` returns for gloo
    (values reduced with ``op``; indices sorted, unique). ``kwargs`` go to
    :func:`cupycoll.sparse_allreduce` (``algorithm``, ``accumulate_dtype``...).
    """
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        raise InvalidType("tensor", type(tensor).__name__, "a torch.sparse_coo_tensor")
    if tensor.sparse_dim() != 1:
        raise InvalidArgument("tensor", f"sparse_dim={tensor.sparse_dim()}",
                              "one sparse dimension (rows), like an embedding gradient")
    coalesced = tensor.coalesce()
    indices = _as_array(coalesced.indices()[0].contiguous())
    values = _as_array(coalesced.values().contiguous())
    rows = math.prod(values.shape[1:]) if values.ndim > 1 else 0
    flat = values.reshape(values.shape[0], rows) if values.ndim > 2 else values
    result = _sparse_allreduce(indices, flat, tensor.shape[0], op=op, comm=comm, **kwargs)
    out_values = torch.as_tensor(result.values, device=tensor.device)
    out_values = out_values.reshape((-1, *tensor.shape[1:]))
    out_indices = torch.as_tensor(result.indices, device=tensor.device).long().unsqueeze(0)
    return torch.sparse_coo_tensor(out_indices, out_values, tensor.shape, is_coalesced=True,
                                   check_invariants=False)  # sorted and unique by construction
