"""DDP on the digits data with cupycoll's hooks against DDP's default allreduce (gloo).

    mpiexec -n P python -m mpi4py tests/workers/torch_ddp.py STEPS [--report]

Checks on every rank: parameters bitwise identical across ranks after every step (hash
allgathered over MPI); the residual mass of the Ok-Topk hook conserved (sum over ranks of the
residuals + P x the sum of the averaged updates == the sum over ranks of every gradient fed in);
accuracy of the Ok-Topk hook at 5% within 2 points of the default hook; a bfloat16 model
through both hooks, with every bucket that allreduce_hook returns within bfloat16 rounding of
the float64 average of the ranks' buckets; and every check of torch_sparse.py (sparse
embeddings through both hooks, cct.sparse_allreduce against gloo) at this P. Rank 0 prints one
JSON line per run with --report.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import cupycoll as cc
import cupycoll.torch as cct
from torch_sparse import init_gloo, params_hash
from torch_sparse import run_all as sparse_checks

world = MPI.COMM_WORLD
RANK, P = world.Get_rank(), world.Get_size()


@functools.cache
def data():
    """scikit-learn's digits (1,797 8x8 images), read from its CSV without importing
    scikit-learn (seconds of CPU a rank): the same arrays as ``load_digits()``."""
    package = Path(importlib.util.find_spec("sklearn").submodule_search_locations[0])
    table = np.loadtxt(package / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    x = torch.tensor(table[:, :-1] / 16.0, dtype=torch.float32)
    y = torch.tensor(table[:, -1].astype(np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


def recording_hook(state: cct.TopkHookState, totals: dict):
    """topk_hook, adding every compressed bucket's gradient sum and averaged update sum (float64)
    into ``totals`` (fed, sent), under a lock: two buckets' callbacks may run at once (a
    settler thread starts another while one has run a millisecond: docs/torch_backend.md)."""
    lock = threading.Lock()

    def hook(state, bucket):
        grad = bucket.buffer().detach().numpy().astype(np.float64).sum()
        compressed = state.iteration >= state.warmup_steps
        future = cct.topk_hook(state, bucket)

        def account(fut):
            if compressed:
                sent = fut.value().detach().numpy().astype(np.float64).sum()
                with lock:
                    totals["fed"] += grad
                    totals["sent"] += sent
            return fut.value()

        return future.then(account)

    return hook


def make_model(dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, DDP]:
    """The MLP 64-64-10 (same seed every time) and its DDP wrapper."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10)).to(dtype)
    # two float32 buckets (714 and 4,096 parameters): torch 2.13 puts every parameter in one
    # bucket and never rebuilds it unless unused parameters are searched for (the 4 KB cap
    # alone: one bucket)
    return model, DDP(model, bucket_cap_mb=0.004, find_unused_parameters=True)


def run_steps(hook: str, model: torch.nn.Module, ddp: DDP, steps: int,
              after_backward=lambda: None) -> None:
    """SGD steps on this rank's batches, checking that parameters are identical on every rank
    after every step (each step's hash kept, all compared in one allgather at the end: a rank
    done with a step first would otherwise spin in MPI's allgather while the others compute);
    ``after_backward()`` runs once each step's gradients are averaged."""
    dtype = next(model.parameters()).dtype
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    (xt, yt), _ = data()
    gen = torch.Generator().manual_seed(1 + RANK)
    hashes = []
    for step in range(steps):
        batch = torch.randint(0, len(yt), (32,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(xt[batch].to(dtype)), yt[batch]).backward()
        after_backward()
        opt.step()
        hashes.append(params_hash(model))
    for step, same in enumerate(zip(*world.allgather(hashes))):
        assert len(set(same)) == 1, f"{hook}: parameters differ across ranks at step {step}"


def train(hook: str, density: float, steps: int, **wire: str) -> dict:
    model, ddp = make_model()
    state, totals = None, {"fed": 0.0, "sent": 0.0}
    if hook == "topk":
        state = cct.TopkHookState(density=density, warmup_steps=1, **wire)
        ddp.register_comm_hook(state, recording_hook(state, totals))
    elif hook == "cupycoll-allreduce":
        ddp.register_comm_hook(None, cct.allreduce_hook)
    start = time.perf_counter()
    run_steps(hook, model, ddp, steps)
    seconds = (time.perf_counter() - start) / steps
    _, (xv, yv) = data()
    with torch.no_grad():
        accuracy = float((model(xv).argmax(1) == yv).float().mean())
    result = {"hook": hook, "density": density, "P": P, "accuracy": accuracy, **wire,
              "step_ms": seconds * 1e3, "params": sum(p.numel() for p in model.parameters())}
    if state is not None:
        residual = sum(float(np.asarray(c.residual, np.float64).sum())
                       for c in state.compressors.values())
        summed = world.allreduce(np.array([residual, totals["fed"]]), op=MPI.SUM)
        conserved = summed[0] + P * totals["sent"]
        assert abs(conserved - summed[1]) <= 1e-3 * max(1.0, abs(summed[1])), (conserved, summed)
        check_checkpoint(state)
        result["bytes_per_step"] = state.bytes_sent / steps
        result["buckets"] = len(state.compressors)
        assert result["buckets"] == 2, f"{hook}: {result['buckets']} buckets, want 2"
    return result


def check_checkpoint(state: cct.TopkHookState) -> None:
    """The hook's state survives torch.save / torch.load (as PowerSGD's): its iteration and
    every bucket's residual bit for bit, on a communicator of its own again."""
    import io

    saved = io.BytesIO()
    torch.save(state, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert loaded.iteration == state.iteration and set(loaded.compressors) == set(state.compressors)
    assert loaded.comm is None  # made at its first hook call (here: by hand), on every rank
    comm = loaded.attached()
    for key, compressor in state.compressors.items():
        again = loaded.compressors[key]
        np.testing.assert_array_equal(np.asarray(again.residual), np.asarray(compressor.residual))
        assert again.comm is comm and comm.size == P


def check_hook_comm_follows_the_default() -> None:
    """allreduce_hook(None, ...) runs on a duplicate of the current default communicator: a
    new default (a world split, or rebuilt after an abort) gets a duplicate of its own."""
    from cupycoll.torch._hooks import _hook_comm

    first = _hook_comm()
    assert _hook_comm() is first
    cc.init("mpi")
    assert _hook_comm() is not first and _hook_comm().size == P


def check_bfloat16(steps: int) -> None:
    """A bfloat16 model through allreduce_hook and topk_hook (float32 inside): parameters
    identical on every rank after every step, and each bucket allreduce_hook returns within
    bfloat16 rounding (2^-8 relative, plus float32 sums) of the float64 average of the ranks'
    bfloat16 buckets."""
    fed: dict = {}
    averaged: dict = {}

    def recording(state, bucket):
        index = bucket.index()
        fed[index] = bucket.buffer().double().numpy()

        def keep(fut):
            averaged[index] = fut.value().double().numpy()
            return fut.value()

        return cct.allreduce_hook(state, bucket).then(keep)

    def check_averages():
        everyone = world.allgather(fed)
        assert set(averaged) == set(fed) and fed, (sorted(averaged), sorted(fed))
        for index, out in averaged.items():
            grads = np.stack([buckets[index] for buckets in everyone])
            reference = grads.mean(axis=0)
            bound = 2.0 ** -8 * np.abs(reference) + 2.0 ** -21 * np.abs(grads).mean(axis=0)
            worst = np.max(np.abs(out - reference) - bound)
            assert worst <= 0, f"bfloat16 bucket {index}: {worst} beyond bfloat16 rounding"
        fed.clear()
        averaged.clear()

    model, ddp = make_model(torch.bfloat16)
    ddp.register_comm_hook(None, recording)
    run_steps("bfloat16 allreduce_hook", model, ddp, steps, check_averages)
    model, ddp = make_model(torch.bfloat16)
    ddp.register_comm_hook(cct.TopkHookState(density=0.05), cct.topk_hook)
    run_steps("bfloat16 topk_hook", model, ddp, steps)


def main(steps: int, report: bool) -> None:
    """Every check of the module docstring, ``steps`` steps a run; with ``report`` rank 0
    prints each run's JSON line."""
    cc.init("mpi")
    store = init_gloo()
    sparse_checks()  # torch_sparse.py's, at this launch's P
    runs = [train("default", 0.0, steps), train("cupycoll-allreduce", 0.0, steps),
            train("topk", 0.05, steps), train("topk", 0.01, steps),
            train("topk", 0.05, steps, wire="compact", wire_values="bfloat16")]
    default = runs[0]["accuracy"]
    assert abs(runs[1]["accuracy"] - default) < 1e-6, runs  # same math, other transport
    assert runs[2]["accuracy"] >= default - 0.02, runs
    assert runs[4]["accuracy"] >= default - 0.02, runs  # compact indices, bfloat16 values
    check_bfloat16(min(steps, 20))  # after the timed runs: their step times stay comparable
    check_hook_comm_follows_the_default()
    if report and RANK == 0:
        for run in runs:
            print(json.dumps(run))
    dist.destroy_process_group()
    world.Barrier()  # every rank is done with the store's file
    if RANK == 0:
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), "--report" in sys.argv)
