"""What the torch sparse-bucket path gains from two choices, each against its alternative in the
same process, interleaved call by call (one of each per round after a barrier, a sample being
the slowest rank's time; ratios of medians):

- ``fold``: an uncoalesced embedding gradient summed by ``mask`` straight into the union rows
  it allreduces (``primitives._unfolded``) against coalescing it first (``coo_reduce``, then
  mask's scatter of the coalesced rows), through ``cupycoll.torch.sparse_allreduce`` (sum and
  avg, mask named) and ``auto``;
- ``block``: an uncoalesced gradient summed by ``recursive_doubling`` straight into the block
  it sends (``wire._pack``) against summing it into a coalesced copy, then packing that;
- ``inline``: ``allreduce_hook`` on DDP's last bucket run in the hook while the worker is idle
  against the same call queued on the background worker;
- ``handover``: ``dist.all_reduce`` of the gradient on a ``cupycoll`` process group, the tensor
  taking the result's buffers (``.data``) against copying the result into it (``copy_``, which
  clones them).

The gradient is bench_torch.py's (Zipf tokens, ``nn.Embedding(V, 64, sparse=True)``, about 2% of
the rows a rank). Milliseconds::

    mpiexec -n 2 python -m mpi4py bench/dev/bench_sparse_bucket.py --vocab 256K -n 40
    mpiexec -n 2 python -m mpi4py bench/dev/bench_sparse_bucket.py --only block
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import bench_torch as bt  # noqa: E402
from cupycoll._arguments import positive_int
import cupycoll as cc  # noqa: E402
import cupycoll.torch as cct  # noqa: E402
from _common import parse_size  # noqa: E402
from cupycoll import _background, _torch_backend  # noqa: E402
from cupycoll.sparse import _validate  # noqa: E402
from cupycoll._registry import record  # noqa: E402
from cupycoll.tuner.calibrate import interleaved  # noqa: E402


def copied(tensor, result):
    """The handover's alternative: the result cloned into the tensor."""
    with torch.no_grad():
        tensor.copy_(result)
    return tensor


def calls(grad, hook_comm, group, count: int) -> dict:
    """name -> call (a hook's call on one of ``count`` clones of ``grad`` each: the hook
    leaves its result in the bucket's tensor); the alternatives switch the library's choice
    for their call only."""
    unfold, idle, holding = _validate.unfold, _background._Runner.idle, _torch_backend.holding
    inline_grads, worker_grads = bt.clones(grad, count), bt.clones(grad, count)
    held_grads, copied_grads = bt.clones(grad, count), bt.clones(grad, count)

    def with_fold(folds: bool, **kwargs):
        _validate.unfold = unfold if folds else (lambda *a: None)
        return cct.sparse_allreduce(grad, **kwargs)

    def hook(inline: bool):
        _background._Runner.idle = idle if inline else (lambda self: False)
        _validate.unfold = unfold
        bucket = bt.Bucket(inline_grads() if inline else worker_grads())
        return cct.allreduce_hook(hook_comm, bucket).wait()

    out = {}
    for label, kwargs in (("mask sum", {"algorithm": "mask"}),
                          ("mask avg", {"algorithm": "mask", "op": "avg"}), ("auto", {})):
        out[("fold", label, "folded where the rows land")] = \
            lambda kw=kwargs: with_fold(True, **kw)
        out[("fold", label, "coalesced first")] = lambda kw=kwargs: with_fold(False, **kw)
    rd = record("sparse", "recursive_doubling")

    def into_block(folds: bool):  # its record's flag, for this call only
        _validate.unfold = unfold
        object.__setattr__(rd, "unfolded", folds)
        try:
            return cct.sparse_allreduce(grad, algorithm="recursive_doubling")
        finally:
            object.__setattr__(rd, "unfolded", True)

    out[("block", "recursive_doubling", "folded into its block")] = lambda: into_block(True)
    out[("block", "recursive_doubling", "folded, then packed")] = lambda: into_block(False)
    out[("inline", "hook, last bucket", "in the hook")] = lambda: hook(True)
    out[("inline", "hook, last bucket", "on the worker")] = lambda: hook(False)

    def handover(held: bool):
        _validate.unfold = unfold
        _torch_backend.holding = holding if held else copied
        dist.all_reduce(held_grads() if held else copied_grads(), group=group)

    out[("handover", "backend, sparse", "held")] = lambda: handover(True)
    out[("handover", "backend, sparse", "copied")] = lambda: handover(False)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", default="256K", help="embedding rows V")
    p.add_argument("-n", "--iters", type=positive_int, default=40, help="timed rounds")
    p.add_argument("--only", default="", help="comma-separated choices to run alone (e.g. "
                   "block): each pair interleaved with nothing else")
    args = p.parse_args()
    comm = cc.init("mpi")
    store = bt.init_gloo(comm)  # DDP's setting: a gloo group beside cupycoll
    try:
        run(args, comm)
    finally:
        dist.destroy_process_group()
        comm.mpi_comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(store, ignore_errors=True)
    return 0


def run(args: argparse.Namespace, comm) -> None:
    """Time every choice against its alternative; rank 0 prints."""
    hook_comm = comm.dup()
    _background.runner(hook_comm)
    vocab = parse_size(args.vocab)
    grad = bt.gradient(vocab, *bt.batches(vocab, 0.02, comm.rank)[0])
    group, why_not = bt.backend_group()
    if group is None:
        raise SystemExit(why_not)
    table = calls(grad, hook_comm, group, args.iters + 3)
    if args.only:
        table = {key: call for key, call in table.items() if key[0] in args.only.split(",")}
    times = interleaved(table, args.iters, 3, comm)
    if comm.rank == 0:
        print(f"# P = {comm.size}, V = {vocab}, {grad._nnz()} gradient rows a rank")
        print(f"# {'choice':8s} {'call':20s} {'this (ms)':>10s} {'other (ms)':>11s} {'ratio':>6s}")
        keys = list(table)
        for mine, other in zip(keys[::2], keys[1::2]):
            a, b = np.median(times[mine]) * 1e3, np.median(times[other]) * 1e3
            print(f"  {mine[0]:8s} {mine[1]:20s} {a:10.3f} {b:11.3f} {a / b:6.3f}   "
                  f"({mine[2]} / {other[2]})")


if __name__ == "__main__":
    sys.exit(main())
