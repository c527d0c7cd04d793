"""PyTorch integration: DDP communication hooks and a sparse allreduce of torch sparse tensors.

    import cupycoll.torch as cct
    state = cct.TopkHookState(density=0.01)               # Ok-Topk, error feedback per bucket
    ddp_model.register_comm_hook(state, cct.topk_hook)    # DDP's documented extension point
    grad = cct.sparse_allreduce(emb.weight.grad)          # an nn.Embedding(sparse=True) gradient

Importing ``cupycoll`` never imports torch; this package does (``pip install
'cupycoll[torch]'``). CPU tensors travel as numpy views (no copy), CUDA tensors through DLPack
as CuPy arrays on the NCCL backend; bfloat16 is reduced in a float32 copy. The hooks run
cupycoll's collectives on their own duplicate of the communicator, in bucket order (the same on
every rank), so they overlap the rest of the backward pass; a sparse bucket (an
``nn.Embedding(sparse=True)`` gradient) takes the exact sparse allreduce, in the background.
Importing it also registers the ``cupycoll`` backend of ``torch.distributed`` and its
``cupycoll://`` rendezvous (docs/torch_backend.md).
"""

try:
    import torch  # noqa: F401
except ImportError as exc:  # the optional extra: say which, not torch's bare ModuleNotFoundError
    raise ModuleNotFoundError(f"cupycoll.torch needs PyTorch ({exc}): pip install "
                              "'cupycoll[torch]'", name="torch") from exc

from .. import _torch_backend  # noqa: F401  registers the "cupycoll" backend and cupycoll://
from ._hooks import TopkHookState, allreduce_hook, topk_hook
from ._sparse import sparse_allreduce

__all__ = ["TopkHookState", "topk_hook", "allreduce_hook", "sparse_allreduce"]
