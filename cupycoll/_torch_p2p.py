"""The verbs of the ``cupycoll`` process group built on ``Communicator.exchange``: all-to-all,
gather and scatter.

Each moves every tensor as its bytes (any dtype), posting all of a rank's sends and receives at
once; an empty block is no message on either side. Root's own block is a local copy. The
point-to-point verbs themselves (and coalescing on request) raise NotImplementedError.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from . import collectives
from ._torch_tensors import as_array, byte_tensor, copied_back
from .comm import Communicator
from .errors import InvalidArgument

__all__ = ["PointToPointVerbs", "NOT_WRITTEN"]

#: verbs of torch's ProcessGroup this group does not have (each raises NotImplementedError).
NOT_WRITTEN = ("send", "recv", "recv_anysource", "_start_coalescing", "_end_coalescing")


def _exchanged(sends: list, recvs: list, *, comm: Communicator, async_op: bool,
               op_name: str, root: int) -> Any:
    """``comm.exchange`` as a front door (with CUPYCOLL_DEBUG after every rank's agreement):
    its Work (``async_op``), or None once complete."""
    collectives.agree_exchange(comm, op_name, root)
    work = comm.exchange(sends, recvs, op_name=op_name)
    return work if async_op else work.wait()


class PointToPointVerbs:
    """Mixin of :class:`~._torch_backend.ProcessGroupCupycoll` (uses its ``_launch``,
    ``_checks``, ``_check_like``, ``_dense``, ``rank`` and ``size``)."""

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: Sequence[int], input_split_sizes: Sequence[int],
                          opts: Any = None) -> Any:
        """Rows (dim 0) of ``input`` split by ``input_split_sizes`` (empty: equal) to each
        rank; what each rank sends here into ``output``, split by ``output_split_sizes``."""
        with self._checks("all_to_all_single", input):
            self._dense("all_to_all_single", output, input)
            sends = self._row_blocks(input, input_split_sizes, "input_split_sizes")
            out_bytes = byte_tensor(output)
            recvs = self._row_blocks(output, output_split_sizes, "output_split_sizes",
                                     out_bytes)
            self._own_block("all_to_all_single", "input_split_sizes", list(input_split_sizes),
                            sends, recvs)
        return self._exchange("all_to_all_single", input, opts, sends, recvs,
                              lambda _: [copied_back(output, out_bytes)])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> Any:
        """``input_tensors[r]`` to rank r; what rank r sends here into ``output_tensors[r]``."""
        with self._checks("alltoall", input_tensors):
            self._dense("alltoall", *input_tensors, *output_tensors)
            for name, given in (("input_tensors", input_tensors),
                                ("output_tensors", output_tensors)):
                self._per_rank("alltoall", name, given)
            sends = [byte_tensor(t) for t in input_tensors]
            recvs = [byte_tensor(t) for t in output_tensors]
            self._own_block("alltoall", "input_tensors",
                            [tuple(t.shape) for t in input_tensors], sends, recvs)
        return self._exchange(
            "alltoall", input_tensors[self.rank()], opts, sends, recvs,
            lambda _: [copied_back(o, r) for o, r in zip(output_tensors, recvs)])

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> Any:
        """Every rank's input into root's ``output_tensors[0][r]`` (other ranks pass none)."""
        root = opts.rootRank
        with self._checks("gather", input_tensors):
            tensor = self._single(input_tensors, "gather")
            if self.rank() == root:
                outputs = self._single(output_tensors, "gather")
                self._check_like("gather", "output_tensors", outputs, tensor, self.size())
        if self.rank() != root:
            return self._exchange("gather", tensor, opts, self._to(root, byte_tensor(tensor)),
                                  [], lambda _: [], root)
        recvs = [byte_tensor(t) for t in outputs]
        recvs[root] = torch.empty(0, dtype=torch.uint8)  # root's own: copied at the end
        return self._exchange("gather", tensor, opts, [], recvs, lambda _: [
            copied_back(o, b if r != root else tensor)
            for r, (o, b) in enumerate(zip(outputs, recvs))], root)

    def scatter(self, output_tensors: list[torch.Tensor],
                input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Any:
        """Root's ``input_tensors[0][r]`` into rank r's output (other ranks pass none)."""
        root = opts.rootRank
        with self._checks("scatter", output_tensors):
            output = self._single(output_tensors, "scatter")
            if self.rank() == root:
                inputs = self._single(input_tensors, "scatter")
                self._check_like("scatter", "input_tensors", inputs, output, self.size())
        if self.rank() != root:
            data = byte_tensor(output)
            return self._exchange("scatter", output, opts, [], self._to(root, data),
                                  lambda _: [copied_back(output, data)], root)
        sends = [byte_tensor(t) if r != root else torch.empty(0, dtype=torch.uint8)
                 for r, t in enumerate(inputs)]
        return self._exchange("scatter", output, opts, sends, [],
                              lambda _: [copied_back(output, inputs[root])], root)

    def _to(self, peer: int, data: torch.Tensor) -> list[torch.Tensor]:
        """Per-rank blocks: ``data`` for ``peer``, nothing for the others."""
        return [data if r == peer else torch.empty(0, dtype=torch.uint8)
                for r in range(self.size())]

    def _per_rank(self, verb: str, name: str, given: Sequence[torch.Tensor]) -> None:
        if len(given) != self.size():
            raise InvalidArgument(f"{verb}: {name}", len(given),
                                  f"one tensor per rank ({self.size()})", rank=self.rank())

    def _row_blocks(self, tensor: torch.Tensor, splits: Sequence[int], name: str,
                    data: torch.Tensor | None = None) -> list[torch.Tensor]:
        """``tensor``'s bytes cut into one block of rows (dim 0) per rank."""
        rows = tensor.shape[0] if tensor.dim() else 1
        counts = list(splits) or ([rows // self.size()] * self.size())
        if len(counts) != self.size() or sum(counts) != rows or min(counts) < 0:
            raise InvalidArgument(f"all_to_all_single: {name}", list(splits),
                                  f"{self.size()} row counts summing to {rows} (empty: equal "
                                  "splits of a row count the ranks divide)", rank=self.rank())
        data = byte_tensor(tensor) if data is None else data
        row_bytes = data.numel() // rows if rows else 0
        return list(data.split([c * row_bytes for c in counts]))

    def _own_block(self, verb: str, name: str, given: Any, sends: list[torch.Tensor],
                   recvs: list[torch.Tensor]) -> None:
        """Raise InvalidArgument unless the block this rank sends itself fills the block it
        expects from itself (a local copy: checked here, where the sizes other ranks send are
        not)."""
        rank = self.rank()
        if sends[rank].numel() != recvs[rank].numel():
            raise InvalidArgument(f"{verb}: {name}", given, f"rank {rank}'s block to itself "
                                  f"({sends[rank].numel()} bytes) must fill the block expected "
                                  f"from it ({recvs[rank].numel()} bytes)", rank=rank)

    def _exchange(self, verb: str, tensor: torch.Tensor, opts: Any,
                  sends: list[torch.Tensor], recvs: list[torch.Tensor],
                  finish: Callable[[Any], list[torch.Tensor]], root: int = -1) -> Any:
        """Send ``sends[r]`` to rank r and receive ``recvs[r]`` from it (an empty list: none
        at all); ``root``: gather's and scatter's, which every rank agrees on under
        CUPYCOLL_DEBUG."""
        pairs_out = [(r, as_array(b)) for r, b in enumerate(sends) if b.numel()]
        pairs_in = [(r, as_array(b)) for r, b in enumerate(recvs) if b.numel()]
        return self._launch(verb, tensor, opts, finish, _exchanged, pairs_out, pairs_in,
                            op_name=verb, root=root)


def _not_written(verb: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if verb == "_start_coalescing":  # torch marked the group coalescing before it asked:
            from torch.distributed.distributed_c10d import _world  # unmarked, its later calls

            _world.pg_coalesce_state.pop(self, None)  # run (marked, they would only be noted)
        raise NotImplementedError(
            f"cupycoll's process group (rank {self.rank()}) has no {verb}; it has allreduce "
            "(dense and sparse), broadcast, reduce, allgather, all_gather_single, "
            "reduce_scatter, reduce_scatter_single, all_to_all_single, alltoall, gather, "
            "scatter, barrier and the coalesced allreduce, allgather, all_gather_single and "
            "reduce_scatter_single (docs/torch_backend.md)")

    method.__name__ = verb
    return method


for _verb in NOT_WRITTEN:
    setattr(PointToPointVerbs, _verb, _not_written(_verb))
