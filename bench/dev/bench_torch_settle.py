"""What completing torch Futures in a thread of their own costs the ``cupycoll`` backend.

An asynchronous ``all_reduce`` of a small tensor per call, ways side by side, interleaved round
by round: ``future`` (``get_future().wait()``, as DDP and callbacks use it: cupycoll's
completer completes the operation and a settler thread the torch Future, so a callback may
wait for another operation), ``future inline`` (the same with the completer completing the
torch Future itself, as before the settlers: a callback that waits for another operation
hangs), ``wait`` (``work.wait()`` with no future asked for: completed where the operation
ends, no hop) and ``sync`` (a blocking ``all_reduce``, the floor). Medians of the rounds'
means, microseconds per call, rank 0's.

    mpiexec -n 2 python -m mpi4py bench/dev/bench_torch_settle.py -n 2000 --rounds 6
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist

import cupycoll.torch  # noqa: F401  registers the backend
from cupycoll import _torch_work
from cupycoll._arguments import positive_int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=positive_int, default=2000, help="calls per round and way")
    parser.add_argument("--rounds", type=positive_int, default=6)
    parser.add_argument("--numel", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("cupycoll", init_method="cupycoll://")
    x = torch.ones(args.numel)
    settlers = _torch_work.torch_settlers()
    submit = settlers.submit

    def inline(fn) -> None:  # in the completer's thread, the settle's bookkeeping kept
        settlers.settled()
        fn()

    def run(way: str) -> float:
        settlers.submit = inline if way == "future inline" else submit
        start = time.perf_counter()
        for _ in range(args.n):
            if way == "sync":
                dist.all_reduce(x)
            elif way == "wait":
                dist.all_reduce(x, async_op=True).wait()
            else:
                dist.all_reduce(x, async_op=True).get_future().wait()
        return (time.perf_counter() - start) / args.n * 1e6

    ways = ("future", "future inline", "wait", "sync")
    times: dict[str, list[float]] = {w: [] for w in ways}
    for r in range(args.rounds + 1):
        for way in ways[r % 4:] + ways[:r % 4]:  # each round starts with another way
            seconds = run(way)
            if r:  # the first round warms up
                times[way].append(seconds)
    settlers.submit = submit
    if dist.get_rank() == 0:
        print(f"# P = {dist.get_world_size()}, {args.numel} float32, {args.n} calls x "
              f"{args.rounds} rounds, median of round means (us per call)")
        for way in ways:
            print(f"{way:>13} {np.median(times[way]):8.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
