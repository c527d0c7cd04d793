"""A ``cupycoll`` backend for torch.distributed: a process group written in Python.

    # mpiexec -n 4 python -m mpi4py train.py
    import torch.distributed as dist
    import cupycoll._torch_backend  # registers "cupycoll" and cupycoll:// (idempotent)
    dist.init_process_group("cupycoll", init_method="cupycoll://")  # rank and size from MPI
    dist.all_reduce(embedding.weight.grad)  # a sparse COO gradient: cupycoll.sparse_allreduce

Every verb runs cupycoll's collective on the group's communicator (CPU tensors: the MPI
backend; CUDA tensors: an NCCL communicator over the same ranks, made at the first CUDA call)
and returns a :class:`~._torch_work.TorchWork`: complete already for a call torch waits on at
once, else completed by cupycoll's completer thread. Verbs the group does not have raise
NotImplementedError naming the verb. The limits of a process group written in Python are in
docs/torch_backend.md.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist

from . import collectives
from ._background import in_call_order, runner
from ._config import debug
from ._torch_coalesced import CoalescedVerbs
from ._torch_p2p import PointToPointVerbs
from ._torch_tensors import (Refused, as_array, byte_tensor, check_device, copied_back,
                             dense_length, dtype_code, holding, reduce_op, reduction_tensor,
                             sparse_parts, sparse_tensor)
from ._torch_work import TorchWork, dist_error, network_error
from ._torch_world import forget_world, group_comm, rendezvous, timeout_seconds
from ._types import ReduceOp
from .comm import Communicator
from .comm._checks import agreed_settings
from .comm.mpi import MPICommunicator
from .errors import BackendUnavailable, CupycollError, InvalidArgument, InvalidType
from .sparse import sparse_allreduce

__all__ = ["ProcessGroupCupycoll", "register", "BACKEND"]

BACKEND = "cupycoll"

def _on_device(tensor: torch.Tensor) -> Any:
    """The context a CUDA tensor's collective is started in: CuPy's current device and stream
    are torch's, so cupycoll orders its work after what torch queued. CPU: nothing."""
    if not tensor.is_cuda:
        return contextlib.nullcontext()
    import cupy

    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(tensor.device.index))
    stream = torch.cuda.current_stream(tensor.device)
    stack.enter_context(cupy.cuda.ExternalStream(stream.cuda_stream, tensor.device.index))
    return stack


def _blocking(opts: Any) -> bool:
    """Whether torch waits for the call at once (``asyncOp`` False: ``dist.all_reduce(t)``)."""
    return opts is not None and not getattr(opts, "asyncOp", True)


class ProcessGroupCupycoll(CoalescedVerbs, PointToPointVerbs, dist.ProcessGroup):
    """torch.distributed's process group over cupycoll's communicators (see the module).

    Made by torch through ``dist.init_process_group("cupycoll")`` or
    ``dist.new_group(backend="cupycoll")``; ``mpi_comm`` holds the group's ranks in its order,
    ``timeout`` bounds every wait (seconds; None: none).
    """

    def __init__(self, rank: int, size: int, mpi_comm: Any, timeout: float | None,
                 owned: bool = False) -> None:
        super().__init__(rank, size)  # 2.13: only this constructor makes a Python subclass
        self._mpi_comm, self._timeout, self._owned = mpi_comm, timeout, owned
        self._host: Communicator = MPICommunicator(mpi_comm, timeout=timeout)
        self._worker = runner(self._host)  # its duplicate is made here, collectively
        self._device: Communicator | None = None

    def getBackendName(self) -> str:
        return BACKEND

    # torch keeps a group's name and description in its C++ backends, which a Python group
    # has none of: kept here, so functional collectives can find the group by name
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    def shutdown(self) -> None:
        """Release the group's communicators (``destroy_process_group`` calls it on every
        rank, after the group's pending Works)."""
        for comm in (self._device, self._host):
            if comm is not None:
                comm.close()
        forget_world(self._mpi_comm)
        if self._owned:  # a subgroup's communicator, made for it (its communicators worked
            self._owned = False  # on duplicates): MPI has a few thousand ids in all
            self._mpi_comm.Free()

    def abort(self) -> None:
        """Abort the group's communicators: every later call on them raises at once (and a
        later default group forms its world anew, as after :meth:`shutdown`)."""
        for comm in (self._device, self._host):
            if comm is not None:
                comm.abort()
        forget_world(self._mpi_comm)

    def __repr__(self) -> str:
        return f"ProcessGroupCupycoll(rank={self.rank()}, size={self.size()})"

    # helpers
    def _comm(self, tensor: torch.Tensor) -> Communicator:
        """The host communicator, or (a CUDA tensor) the NCCL one, made at the first CUDA
        call (collective: every rank makes its first CUDA call in the same collective)."""
        if not tensor.is_cuda:
            return self._host
        if self._device is None:
            from .comm.nccl import NCCLCommunicator

            with _on_device(tensor):
                self._device = NCCLCommunicator(self._mpi_comm, timeout=self._timeout)
        return self._device

    def _single(self, tensors: Any, verb: str, sparse: bool = False) -> Any:
        """The one tensor (or list) of a verb's list (torch passes a list of one per process);
        a tensor must be dense, or with ``sparse`` (allreduce) sparse COO."""
        if not isinstance(tensors, torch.Tensor):
            if len(tensors) != 1:
                raise InvalidArgument(f"{verb}: tensors", f"a list of {len(tensors)}",
                                      "one tensor per process", rank=self.rank())
            tensors = tensors[0]
        if isinstance(tensors, torch.Tensor) and not (sparse and
                                                      tensors.layout == torch.sparse_coo):
            self._dense(verb, tensors)
        return tensors

    def _dense(self, verb: str, *tensors: torch.Tensor) -> None:
        """Raise InvalidType naming ``verb`` unless every tensor is dense (strided)."""
        for tensor in tensors:
            if tensor.layout != torch.strided:
                raise InvalidType(f"{verb}: tensor", str(tensor.layout), "a dense (strided) "
                                  "tensor (only allreduce takes a sparse COO one)",
                                  rank=self.rank())
            check_device(tensor, f"{verb}: tensor", self.rank())

    def _launch(self, verb: str, tensor: torch.Tensor, opts: Any,
                finish: Callable[[Any], list[torch.Tensor]], call: Callable[..., Any],
                *args: Any, agreed: tuple[str, int] | None = None, **kwargs: Any) -> TorchWork:
        """Run ``call(*args, comm=, async_op=, **kwargs)`` (a cupycoll verb) on ``tensor``'s
        communicator and device; return its TorchWork, whose value is ``finish(result)``.
        ``agreed`` (verb, root): ``call`` moves ``tensor``'s bytes; with CUPYCOLL_DEBUG the
        ranks agree first on that verb, root, ``tensor``'s dtype and elements.

        A call torch makes with ``asyncOp`` False (``dist.all_reduce(t)``: it waits at once)
        runs to completion here, in the calling thread; others (``async_op=True``, DDP's) start
        and return, and cupycoll's completer thread completes them.
        """
        blocking = _blocking(opts)
        devices = [tensor.device] if tensor.is_cuda else None
        try:
            comm = self._comm(tensor)
            with _on_device(tensor):
                if agreed is not None:
                    collectives.agree_exchange(comm, *agreed, dtype_code(tensor.dtype),
                                               tensor.numel())
                outcome = call(*args, comm=comm, async_op=not blocking, **kwargs)
        except Exception as exc:
            error = dist_error(exc)
            if error is exc:
                raise
            raise error from exc
        if blocking:
            return TorchWork(None, lambda _: finish(outcome), devices, verb)
        return TorchWork(outcome, finish, devices, verb)

    def _check_like(self, verb: str, name: str, tensors: Sequence[torch.Tensor],
                    like: torch.Tensor, count: int) -> None:
        """Raise InvalidArgument unless ``tensors`` are ``count`` dense tensors of ``like``'s
        dtype and number of elements."""
        self._dense(verb, *tensors)
        if len(tensors) != count or any(t.dtype != like.dtype or t.numel() != like.numel()
                                        for t in tensors):
            raise InvalidArgument(f"{verb}: {name}", [(tuple(t.shape), str(t.dtype))
                                                      for t in tensors],
                                  f"{count} tensors of {like.numel()} {like.dtype} elements",
                                  rank=self.rank())

    @contextlib.contextmanager
    def _checks(self, verb: str, tensors: Any) -> Iterator[None]:
        """This rank's checks of a dense verb's arguments (``verb``: the cupycoll verb it
        runs on ``tensors``' communicator: a tensor or a list): with CUPYCOLL_DEBUG a bad
        argument takes part in that verb's agreement, so every rank raises
        (:func:`cupycoll.collectives.refuse`); without, it raises here (and no communicator
        is made for it)."""
        try:
            yield
        except CupycollError as exc:
            if debug():
                first = tensors if isinstance(tensors, torch.Tensor) else next(iter(tensors),
                                                                                None)
                collectives.refuse(self._comm(first) if first is not None else self._host,
                                   verb, exc)
            raise

    def _op(self, opts: Any, verb: str, tensor: Any = None) -> ReduceOp:
        return reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, verb,
                         self.rank(), getattr(tensor, "dtype", None))

    # verbs
    def allreduce(self, tensors: Any, opts: Any = None) -> TorchWork:
        """Dense: every rank gets op over ranks, in place. Sparse COO: cupycoll's sparse
        allreduce; the tensor becomes the coalesced result (as gloo leaves it)."""
        with self._checks("allreduce", tensors):
            tensor = self._single(tensors, "allreduce", sparse=True)
        if tensor.layout == torch.sparse_coo:
            return self._sparse_allreduce(tensor, opts)
        with self._checks("allreduce", tensor):
            op = self._op(opts, "allreduce", tensor)
            worked = reduction_tensor(tensor, op, "tensor", self.rank())
        array = as_array(worked)
        return self._launch("allreduce", tensor, opts, lambda _: [copied_back(tensor, worked)],
                            collectives.allreduce, array, op, out=array)

    def _sparse_allreduce(self, tensor: torch.Tensor, opts: Any) -> TorchWork:
        """A blocking call (or a CUDA tensor's) runs as :meth:`_launch` runs it (on the host
        over the worker's duplicate, :func:`~._background.in_call_order`: ranks may differ in
        ``asyncOp``); an asynchronous one on the host runs whole (validation included) on the
        host communicator's background worker, in call order, which completes the Work itself:
        the caller (DDP's autograd thread) does not wait for the other ranks, and no thread
        hop through the completer follows. A bad op or dtype is raised by cupycoll's
        validation round (:class:`Refused`)."""
        try:
            op = self._op(opts, "allreduce")
            index, values, n = sparse_parts(tensor, op, self.rank())
        except CupycollError as exc:
            op, index, values = ReduceOp.SUM, np.empty(0, np.int64), Refused(exc)
            n = dense_length(tensor)

        def finish(result: Any) -> list[torch.Tensor]:
            return [holding(tensor, sparse_tensor(result, tensor))]

        if tensor.is_cuda or _blocking(opts):
            call = sparse_allreduce if tensor.is_cuda else in_call_order(sparse_allreduce)
            return self._launch("allreduce", tensor, opts, finish, call, index, values, n, op=op)
        return TorchWork(self._worker.submit(sparse_allreduce, index, values, n, op=op,
                                             comm=self._worker.comm), finish, None, "allreduce")

    def broadcast(self, tensors: Any, opts: Any = None) -> TorchWork:
        with self._checks("broadcast", tensors):
            tensor = self._single(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        data = byte_tensor(tensor)
        array = as_array(data)
        return self._launch("broadcast", tensor, opts, lambda _: [copied_back(tensor, data)],
                            collectives.broadcast, array, root, out=array,
                            agreed=("broadcast", root))

    def reduce(self, tensors: Any, opts: Any = None) -> TorchWork:
        """op over ranks into root's tensor; the others' tensors are left as they were."""
        root = opts.rootRank if opts is not None else 0
        with self._checks("reduce", tensors):
            tensor = self._single(tensors, "reduce")
            op = self._op(opts, "reduce", tensor)
            worked = reduction_tensor(tensor, op, "tensor", self.rank())
        array = as_array(worked)
        out = array if self.rank() == root else None
        return self._launch(
            "reduce", tensor, opts,
            lambda _: [copied_back(tensor, worked) if out is not None else tensor],
            collectives.reduce, array, root, op, out=out)

    def allgather(self, output_tensors: Any, input_tensors: Any,
                  opts: Any = None) -> TorchWork:
        """Every rank's input into ``output_tensors[0][r]``, any dtype."""
        with self._checks("allgather", input_tensors):
            tensor = self._single(input_tensors, "allgather")
            outputs = self._single(output_tensors, "allgather") if not isinstance(
                output_tensors[0], torch.Tensor) else output_tensors
            self._check_like("allgather", "output_tensors", outputs, tensor, self.size())
        data = byte_tensor(tensor)
        gathered = torch.empty(data.numel() * self.size(), dtype=torch.uint8,
                               device=tensor.device)
        send, recv = as_array(data), as_array(gathered)
        blocks = gathered.chunk(self.size()) if data.numel() else [gathered] * self.size()
        return self._launch("allgather", tensor, opts,
                            lambda _: [copied_back(o, b) for o, b in zip(outputs, blocks)],
                            collectives.allgather, send, out=recv, agreed=("allgather", -1))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> TorchWork:
        """Every rank's input, in rank order, into one output of P times its elements."""
        with self._checks("allgather", input):
            self._dense("all_gather_into_tensor", output, input)
            if output.dtype != input.dtype or output.numel() != input.numel() * self.size():
                raise InvalidArgument("all_gather_into_tensor: output", (tuple(output.shape),
                                      str(output.dtype)), f"{self.size()} x {input.numel()} "
                                      f"{input.dtype} elements", rank=self.rank())
        data, gathered = byte_tensor(input), byte_tensor(output)
        send, recv = as_array(data), as_array(gathered)
        return self._launch("all_gather_into_tensor", input, opts,
                            lambda _: [copied_back(output, gathered)], collectives.allgather,
                            send, out=recv, agreed=("allgather", -1))

    _allgather_base = all_gather_single

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any,
                       opts: Any = None) -> TorchWork:
        """op over ranks of ``input_tensors[0][r]`` into rank r's output."""
        with self._checks("reduce_scatter", output_tensors):
            output = self._single(output_tensors, "reduce_scatter")
            inputs = self._single(input_tensors, "reduce_scatter") if not isinstance(
                input_tensors[0], torch.Tensor) else input_tensors
            self._check_like("reduce_scatter", "input_tensors", inputs, output, self.size())
        flat = torch.cat([t.reshape(-1) for t in inputs])
        return self._reduce_scatter(output, flat, opts, "reduce_scatter")

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> TorchWork:
        """op over ranks of ``input`` (P blocks of the output's size) into this rank's block."""
        with self._checks("reduce_scatter", output):
            self._dense("reduce_scatter_tensor", output, input)
            if output.dtype != input.dtype or input.numel() != output.numel() * self.size():
                raise InvalidArgument("reduce_scatter_tensor: input", (tuple(input.shape),
                                      str(input.dtype)), f"{self.size()} x {output.numel()} "
                                      f"{output.dtype} elements", rank=self.rank())
        return self._reduce_scatter(output, input, opts, "reduce_scatter_tensor")

    _reduce_scatter_base = reduce_scatter_single

    def _reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, opts: Any,
                        verb: str) -> TorchWork:
        with self._checks("reduce_scatter", output):
            op = self._op(opts, verb, input)
            send_t = reduction_tensor(input, op, "input", self.rank())
            recv_t = reduction_tensor(output, op, "output", self.rank())
        send, recv = as_array(send_t.reshape(-1)), as_array(recv_t.reshape(-1))
        return self._launch(verb, output, opts, lambda _: [copied_back(output, recv_t)],
                            collectives.reduce_scatter, send, op, out=recv)

    def barrier(self, opts: Any = None) -> TorchWork:
        """Complete when every rank has called it (a one-element allreduce on the host)."""
        flag = torch.zeros(1, dtype=torch.int32)
        array = as_array(flag)
        return self._launch("barrier", flag, opts, lambda _: [], collectives.allreduce, array,
                            ReduceOp.SUM, out=array, agreed=("barrier", -1))


def _create(options: Any, backend_options: Any = None) -> ProcessGroupCupycoll:
    """torch's creator of a ``cupycoll`` group (the extended API: it names the members)."""
    try:  # a bad CUPYCOLL_* setting: raised once the members can agree on it (all raise)
        timeout, refused = timeout_seconds(options.timeout), None
    except CupycollError as exc:
        timeout, refused = timeout_seconds(options.timeout, environment=False), exc
    rank, size = options.group_rank, options.group_size
    owned = bool(list(options.global_ranks_in_group))
    try:
        mpi_comm = group_comm(options.store, rank, size, list(options.global_ranks_in_group),
                              timeout)
    except BackendUnavailable as exc:
        error = network_error(exc)
        if error is exc:
            raise
        raise error from exc
    try:
        agreed_settings(mpi_comm, lambda: _raised(refused))
        return ProcessGroupCupycoll(rank, size, mpi_comm, timeout, owned=owned)
    except CupycollError:  # (the communicators' own settings are agreed as they are made)
        forget_world(mpi_comm)
        if owned:
            mpi_comm.Free()
        raise


def _raised(error: CupycollError | None) -> None:
    if error is not None:
        raise error


def register() -> None:
    """Make ``cupycoll`` a torch.distributed backend (CPU and CUDA tensors) and
    ``cupycoll://`` a rendezvous; calling it again changes nothing."""
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                      devices=["cpu", "cuda"])
    with contextlib.suppress(RuntimeError):  # "already registered"
        dist.register_rendezvous_handler(BACKEND, rendezvous)


register()
