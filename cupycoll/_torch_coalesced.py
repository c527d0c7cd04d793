"""The coalesced verbs of the ``cupycoll`` process group: one collective for a list of tensors.

torch's functional collectives (``all_gather_tensor``, ``reduce_scatter_tensor``) and
``all_reduce_coalesced`` call these. Each packs the list into one buffer, runs one cupycoll
collective on it and copies the results back into the list's tensors.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from . import collectives
from ._torch_tensors import as_array, byte_tensor, copied_back, reduction_tensor
from .errors import InvalidArgument

__all__ = ["CoalescedVerbs"]


class CoalescedVerbs:
    """Mixin of :class:`~._torch_backend.ProcessGroupCupycoll` (uses its ``_launch``,
    ``_checks``, ``_dense``, ``_op``, ``rank`` and ``size``)."""

    def _one_dtype(self, verb: str, tensors: Sequence[torch.Tensor]) -> None:
        """Raise InvalidArgument unless ``tensors`` is not empty and of one dtype and device
        (InvalidType for one that is not dense)."""
        self._dense(verb, *tensors)
        kinds = {(t.dtype, t.device) for t in tensors}
        if len(kinds) != 1:
            raise InvalidArgument(f"{verb}: tensors", sorted(map(str, kinds)),
                                  "one or more tensors of one dtype on one device",
                                  rank=self.rank())

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Dense allreduce of every tensor of the list, in place, as one collective."""
        with self._checks("allreduce", tensors):
            self._one_dtype("allreduce_coalesced", tensors)
            op = self._op(opts, "allreduce_coalesced", tensors[0])
            worked = reduction_tensor(torch.cat([t.reshape(-1) for t in tensors]), op,
                                      "tensors", self.rank())
        array = as_array(worked)
        blocks = worked.split([t.numel() for t in tensors])
        return self._launch("allreduce_coalesced", tensors[0], opts,
                            lambda _: [copied_back(t, b) for t, b in zip(tensors, blocks)],
                            collectives.allreduce, array, op, out=array)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """``all_gather_single`` of each (output, input) pair, as one allgather."""
        verb, p = "all_gather_single_coalesced", self.size()
        with self._checks("allgather", inputs):
            self._pairs(verb, outputs, inputs, lambda o, i: o.numel() == i.numel() * p,
                        f"{p} x its input's elements")
        send, recv, rows, spans = self._gathered(inputs)
        return self._launch(
            verb, inputs[0], opts,
            lambda _: [copied_back(out, rows[:, a:b].reshape(-1))
                       for out, (a, b) in zip(outputs, spans)],
            collectives.allgather, send, out=recv)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """Every rank's list of inputs into ``output_lists[r]``, as one allgather."""
        verb = "allgather_coalesced"
        with self._checks("allgather", inputs):
            self._dense(verb, *inputs, *(o for outs in output_lists for o in outs))
            if not inputs:
                raise InvalidArgument(f"{verb}: input_tensor_list", [], "one or more tensors",
                                      rank=self.rank())
            if len(output_lists) != self.size() or not all(
                    len(outs) == len(inputs) and all(o.dtype == i.dtype and
                                                     o.numel() == i.numel()
                                                     for o, i in zip(outs, inputs))
                    for outs in output_lists):
                raise InvalidArgument(f"{verb}: output_tensor_lists", len(output_lists),
                                      f"{self.size()} lists of tensors like the inputs",
                                      rank=self.rank())
        send, recv, rows, spans = self._gathered(inputs)
        return self._launch(
            verb, inputs[0], opts,
            lambda _: [[copied_back(o, rows[r, a:b]) for o, (a, b) in zip(outs, spans)]
                       for r, outs in enumerate(output_lists)],
            collectives.allgather, send, out=recv)

    def _gathered(self, inputs: Sequence[torch.Tensor]) -> tuple[Any, Any, torch.Tensor, list]:
        """(send, recv, rows, spans) of one allgather of every input's bytes: rank r's
        block is ``rows[r]``, input i's bytes in it ``rows[r, a:b]`` for ``spans[i] = (a, b)``."""
        data = [byte_tensor(t) for t in inputs]
        block = torch.cat(data) if data else torch.empty(0, dtype=torch.uint8)
        gathered = torch.empty(block.numel() * self.size(), dtype=torch.uint8,
                               device=block.device)
        ends = torch.tensor([d.numel() for d in data], dtype=torch.int64).cumsum(0).tolist()
        spans = [(end - d.numel(), end) for d, end in zip(data, ends)]
        return as_array(block), as_array(gathered), gathered.view(self.size(), block.numel()), spans

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """``reduce_scatter_single`` of each (output, input) pair, as one reduce-scatter."""
        verb, p = "reduce_scatter_single_coalesced", self.size()
        with self._checks("reduce_scatter", inputs):
            self._pairs(verb, outputs, inputs, lambda o, i: i.numel() == o.numel() * p,
                        f"1/{p} of its input's elements")
            self._one_dtype(verb, list(inputs) + list(outputs))
            op = self._op(opts, verb, inputs[0])
            rows = torch.cat([t.reshape(p, -1) for t in inputs], dim=1)  # rank r's: row r
            send_t = reduction_tensor(rows, op, "inputs", self.rank())
            recv_t = reduction_tensor(torch.empty(rows.shape[1], dtype=rows.dtype,
                                                  device=rows.device), op, "outputs",
                                      self.rank())
        send, recv = as_array(send_t.reshape(-1)), as_array(recv_t.reshape(-1))
        blocks = recv_t.split([t.numel() for t in outputs])
        return self._launch(verb, outputs[0], opts,
                            lambda _: [copied_back(t, b) for t, b in zip(outputs, blocks)],
                            collectives.reduce_scatter, send, op, out=recv)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _pairs(self, verb: str, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
               fits: Any, need: str) -> None:
        """Raise InvalidArgument unless outputs and inputs pair up, each pair of one dtype and
        ``fits(output, input)`` (``need`` says what an output holds); InvalidType for a
        tensor that is not dense."""
        self._dense(verb, *outputs, *inputs)
        if not inputs or len(outputs) != len(inputs) or not all(
                o.dtype == i.dtype and fits(o, i) for o, i in zip(outputs, inputs)):
            raise InvalidArgument(f"{verb}: outputs", [(tuple(o.shape), str(o.dtype))
                                                       for o in outputs],
                                  f"one output per input, of its dtype and {need}",
                                  rank=self.rank())
