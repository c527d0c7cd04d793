"""PyTorch sparse embeddings: the sparse gradient's allreduce and the DDP step, cupycoll vs gloo.

A language-model-like network: Zipf-distributed tokens (exponent 1.1, hot tokens scattered over
the table), ``nn.Embedding(V, 64, sparse=True)`` averaged over each sample's tokens, a small
dense head (64 -> 256 -> 64 classes); each rank's batch touches ``--rows`` of the V rows per
step. Everything is timed side by side in one run, interleaved (one call of each per round,
after a barrier; a sample is the slowest rank's time), and reported as a ratio to gloo.

    mpiexec -n 4 python -m cupycoll bench torch                       # V = 256K and 1M
    mpiexec -n 2 python -m cupycoll bench torch --vocab 1M -n 30 --json torch.json

Table 1, one step's embedding gradient (uncoalesced, as DDP hands it; size = the dense
V x 64 float32 bytes, nnz = rows per rank, mean), reduced by:

    hook              cct.allreduce_hook on a bucket of it, until its Future is done
                      (coalesce, average, the sparse tensor DDP copies into the gradient)
    cupycoll          cct.sparse_allreduce(grad): the same sum, synchronously
    coalesce+cupycoll grad.coalesce(), then cct.sparse_allreduce: raw / this = the cost of
                      coalescing on cupycoll's side instead of torch's
    backend           dist.all_reduce(grad) on a process group of the ``cupycoll`` backend
                      (cupycoll._torch_backend), when that module imports
    gloo              dist.all_reduce(grad) on gloo: allgather of indices and values
    gloo dense        dist.all_reduce of the densified gradient (what a dense embedding sends)
    coalesce          this rank's coalescing alone by cupycoll.coo_reduce (#wrong: values off
                      torch's coalesce() beyond float32 order, as for the reductions); the
                      sparse allreduce's mask algorithm sums the duplicates where its rows
                      land instead, other algorithms coalesce so
    torch coalesce    grad.coalesce() alone (the share of it in gloo's time)

Calls that auto's learn mode times (the hook's, cupycoll's, the backend's blocking ones) run
its trials of the gradient's shape class first, untimed (``TRIALS`` calls), and gloo's calls as
many (their first calls are slower too): the rows show what a training loop runs once they are
done; bench_regret.py shows what the trials cost a loop.

Table 2, one DDP training step (forward, backward, SGD) with the sparse embedding through the
hook, the backend and gloo, and with a dense embedding on gloo (its steps are not checked).
Table 1's ``#wrong`` counts values off gloo's result by more than float32 summation order
explains (rtol 1e-5, atol 1e-6).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

try:
    import torch
except ImportError:  # before --help too: the whole benchmark is torch's
    raise SystemExit("bench torch needs PyTorch: pip install 'cupycoll[torch]'") from None
import torch.distributed as dist
from _common import (DENSE_COLUMNS, Table, bandwidths, common_parser, fraction, interleaved,
                     listed, parse_length, positive_int, sample_stats)
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import cupycoll as cc
from cupycoll.primitives import coo_reduce
import cupycoll.torch as cct
from cupycoll._background import runner
from cupycoll.comm import bus_factor
from cupycoll.sparse import learn

WIDTH, HIDDEN, CLASSES, SAMPLES = 64, 256, 64, 64
#: untimed calls before the timing of each call that auto's learn mode times: its trials of a
#: new shape class and one more
TRIALS = 1 + learn.TRIAL_CALLS
REDOPS = {"hook": "avg", "coalesce": "none", "torch coalesce": "none"}
REDUCE_COLUMNS = DENSE_COLUMNS + ["density", "nnz", "algorithm", "wire(B)", "x_gloo"]
STEP_COLUMNS = ["vocab", "rows/rank", "ddp", "time(us)", "min(us)", "p95(us)", "x_gloo"]


def arguments():
    p = common_parser(__doc__.splitlines()[0], flags="nw")
    p.add_argument("--vocab", type=listed(parse_length), default="256K,1M",
                   help="embedding rows V, comma-separated")
    p.add_argument("--rows", type=fraction, default=0.015,
                   help="share of the V rows each rank's batch touches per step (0.01-0.02)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per rank")
    p.set_defaults(iters=20, warmup_iters=3)
    args = p.parse_args()
    if int(args.rows * min(args.vocab)) < 1:
        p.error(f"--rows {args.rows:g} of --vocab {min(args.vocab)}: less than one row a rank")
    return args


class Net(torch.nn.Module):
    """Embedding rows averaged per sample, then a dense head."""

    def __init__(self, vocab: int, sparse: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, WIDTH, sparse=sparse)
        self.head = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(),
                                        torch.nn.Linear(HIDDEN, CLASSES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(tokens).mean(1))


def batches(vocab: int, rows: float, rank: int, count: int = 4) -> list:
    """``count`` batches of this rank: (SAMPLES, L) Zipf tokens whose distinct ids are about
    ``rows`` x V, and labels."""
    scatter = np.random.default_rng(0).permutation(vocab)
    out = []
    for b in range(count):
        rng = np.random.default_rng([rank, b])
        stream = np.minimum(rng.zipf(1.1, size=40 * int(rows * vocab)), vocab) - 1
        first = np.sort(np.unique(stream, return_index=True)[1])
        tokens = int(first[min(int(rows * vocab), first.size) - 1]) + 1
        length = max(1, tokens // SAMPLES)
        ids = torch.as_tensor(scatter[stream[:SAMPLES * length]].reshape(SAMPLES, length))
        out.append((ids, torch.as_tensor(rng.integers(0, CLASSES, SAMPLES))))
    return out


class Bucket:
    """The part of dist.GradBucket that cct.allreduce_hook reads."""

    def __init__(self, grad: torch.Tensor) -> None:
        self._grad = grad

    def buffer(self) -> torch.Tensor:
        return self._grad

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True

    def parameters(self) -> list:
        return []


def backend_group():
    """A process group of the ``cupycoll`` torch.distributed backend, or (None, why not)."""
    try:
        import cupycoll._torch_backend  # noqa: F401  (registers the backend)
    except ImportError as exc:
        return None, f"backend column skipped: cupycoll._torch_backend does not import ({exc})"
    try:
        return dist.new_group(backend="cupycoll"), ""
    except Exception as exc:  # a backend still being written: say so, measure the rest
        return None, f"backend column skipped: new_group(backend='cupycoll') raised {exc!r}"


def gradient(vocab: int, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One step's embedding gradient, uncoalesced (as DDP hands it to a hook)."""
    model = Net(vocab, sparse=True)
    torch.nn.functional.cross_entropy(model(tokens), labels).backward()
    return model.emb.weight.grad


def clones(tensor: torch.Tensor, count: int):
    """A call-per-call supply of ``count`` clones made up front (gloo writes its result into
    its input; cloning inside the timed call would charge gloo for the copy)."""
    pool = [tensor.clone() for _ in range(count)]
    return lambda: pool.pop()


class Fresh:
    """A fresh copy of ``tensor`` for each call of one kind (gloo, the hook and the backend
    leave their result in their input): :meth:`make` clones it before the call, untimed
    (``interleaved``'s ``prepare``), as DDP hands over a gradient the backward pass has just
    written; :meth:`take` hands it to the call (a clone made there outside ``interleaved``).
    One copy at a time, where a pool made up front held one a call (gigabytes a rank at
    V = 1.5M)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor, self._copy = tensor, None

    def make(self) -> None:
        self._copy = self._tensor.clone()

    def take(self) -> torch.Tensor:
        copy, self._copy = self._copy, None
        return self._tensor.clone() if copy is None else copy


def reduce_calls(grad: torch.Tensor, hook_comm, group) -> tuple[dict, dict]:
    """The calls of table 1 (each returns its result; the hook's is the average), and what
    runs before each, untimed."""
    dense = grad.to_dense()  # gloo dense: summed in place
    fresh = {name: Fresh(grad) for name in ("hook", "gloo", "backend")}
    calls = {"hook": lambda: cct.allreduce_hook(hook_comm, Bucket(fresh["hook"].take())).wait(),
             "cupycoll": lambda: cct.sparse_allreduce(grad),
             "coalesce+cupycoll": lambda: cct.sparse_allreduce(grad.coalesce()),
             "gloo": lambda: _reduced(fresh["gloo"].take()),
             "gloo dense": lambda: _reduced(dense)}
    if group is not None:
        calls["backend"] = lambda: _reduced(fresh["backend"].take(), group)
    return calls, {name: copies.make for name, copies in fresh.items() if name in calls}


def coalesced(grad: torch.Tensor) -> torch.Tensor:
    """``grad`` coalesced by ``cupycoll.coo_reduce`` (each row's duplicates added in input
    order)."""
    indices, values = coo_reduce(grad._indices()[0].numpy(),
                                    grad._values().reshape(grad._nnz(), -1).numpy())
    return torch.sparse_coo_tensor(torch.from_numpy(indices)[None],
                                   torch.from_numpy(values).reshape(-1, *grad.shape[1:]),
                                   grad.shape, check_invariants=True)


def _reduced(tensor: torch.Tensor, group=None) -> torch.Tensor:
    dist.all_reduce(tensor, group=group)
    return tensor


def wrong(result: torch.Tensor, expected: torch.Tensor, scale: float) -> int:
    """Values of ``result`` (x ``scale``) off gloo's ``expected`` beyond float32 order."""
    result = result.coalesce() if result.is_sparse else result
    if result.is_sparse:
        if not torch.equal(result.indices(), expected.indices()):
            return max(result._nnz(), expected._nnz())
        result, expected = result.values(), expected.values()
    else:
        expected = expected.to_dense()
    close = torch.isclose(result * scale, expected, rtol=1e-5, atol=1e-6)
    return int((~close).sum())


def table_reduce(table: Table, vocab: int, grad: torch.Tensor, hook_comm, group, args,
                 comm) -> dict:
    """Time table 1's calls for ``grad``; add one row each; return the medians."""
    calls, prepare = reduce_calls(grad, hook_comm, group)
    for _ in range(TRIALS):  # auto's learn trials, untimed, on fresh copies where consumed;
        cct.allreduce_hook(hook_comm, Bucket(grad.clone())).wait()  # gloo's calls as many
        cct.sparse_allreduce(grad)  # times (its first calls are slower too)
        cct.sparse_allreduce(grad.coalesce())
        _reduced(grad.clone())
        _reduced(grad.to_dense())
        if group is not None:
            _reduced(grad.clone(), group)
    expected = _reduced(grad.clone()).coalesce()
    bad = {name: wrong(fn() if name != "gloo dense" else _reduced(grad.to_dense()), expected,
                       comm.size if name == "hook" else 1) for name, fn in calls.items()}
    calls.update({"coalesce": lambda: coalesced(grad), "torch coalesce": grad.coalesce})
    bad["coalesce"] = wrong(coalesced(grad), grad.coalesce(), 1)
    bad["torch coalesce"] = 0
    sent = {}
    for name in ("hook", "cupycoll"):
        stats = (hook_comm if name == "hook" else comm).stats
        before = stats.bytes_sent
        calls[name]()
        sent[name] = stats.bytes_sent - before
    samples = interleaved(calls, args.iters, args.warmup_iters, comm, prepare=prepare)
    medians = {name: float(np.median(s)) for name, s in samples.items()}
    nbytes, nnz = vocab * WIDTH * 4, comm.mpi_comm.allreduce(grad.coalesce()._nnz()) / comm.size
    for name, s in samples.items():
        stats = sample_stats(s)
        algbw, busbw = bandwidths(nbytes, medians[name], bus_factor("allreduce", comm.size))
        table.add({"size(B)": nbytes, "count": vocab * WIDTH, "type": "float32",
                   "redop": REDOPS.get(name, "sum"), "root": -1,
                   "time(us)": stats["median(us)"], "algbw(GB/s)": algbw,
                   "busbw(GB/s)": busbw, "#wrong": bad[name], "density": nnz / vocab,
                   "nnz": int(nnz), "algorithm": name, "wire(B)": sent.get(name, ""),
                   "x_gloo": medians[name] / medians["gloo"], "min(us)": stats["min(us)"]})
    return medians


def ddp_models(vocab: int, hook_comm, group) -> dict:
    """The DDP variants of table 2: name -> (model, ddp, optimizer)."""
    made = {}
    for name, sparse in (("hook", True), ("backend", True), ("gloo", True),
                         ("gloo dense", False)):
        if name == "backend" and group is None:
            continue
        model = Net(vocab, sparse)
        ddp = DDP(model, process_group=group if name == "backend" else None)
        if name == "hook":
            ddp.register_comm_hook(hook_comm, cct.allreduce_hook)
        made[name] = (model, ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
    return made


def step_call(ddp: DDP, opt: torch.optim.Optimizer, data: list):
    state = {"i": 0}

    def step() -> None:
        tokens, labels = data[state["i"] % len(data)]
        state["i"] += 1
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(tokens), labels).backward()
        opt.step()

    return step


def table_steps(table: Table, vocab: int, data: list, hook_comm, group, args,
                comm) -> dict:
    """Time table 2's DDP steps; add one row each; return the medians."""
    models = ddp_models(vocab, hook_comm, group)
    calls = {name: step_call(ddp, opt, data) for name, (_, ddp, opt) in models.items()}
    for _ in range(TRIALS):  # auto's learn trials in the hook, untimed
        calls["hook"]()
    samples = interleaved(calls, args.iters, args.warmup_iters, comm)
    medians = {name: float(np.median(s)) for name, s in samples.items()}
    rows = comm.mpi_comm.allreduce(len(torch.unique(data[0][0]))) // comm.size
    for name, s in samples.items():
        stats = sample_stats(s)
        table.add({"vocab": vocab, "rows/rank": rows, "ddp": name,
                   "time(us)": stats["median(us)"], "min(us)": stats["min(us)"],
                   "p95(us)": stats["p95(us)"], "x_gloo": medians[name] / medians["gloo"]})
    return medians


def init_gloo(comm) -> str:
    """torch.distributed over gloo, rendezvous through a file in a fresh directory."""
    where = comm.mpi_comm.bcast(tempfile.mkdtemp(prefix="cupycoll-gloo-")
                                if comm.rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(where, 'store')}",
                            rank=comm.rank, world_size=comm.size)
    return where


def main() -> int:
    args = arguments()
    torch.set_num_threads(args.threads)
    comm = cc.init("mpi")
    store = init_gloo(comm)
    group, note = backend_group()
    hook_comm = comm.dup()  # the hook's own communicator, as DDP code would pass it
    runner(hook_comm)  # and its background worker (collective: made before the timing)
    reduce = Table(REDUCE_COLUMNS + ["min(us)"], comm.rank)
    steps = Table(STEP_COLUMNS, comm.rank)
    summary = []
    for vocab in args.vocab:
        data = batches(vocab, args.rows, comm.rank)
        reduce.header(f"P = {comm.size}, V = {vocab}: the embedding gradient's allreduce"
                      + (f" ({note})" if note else ""))
        times = table_reduce(reduce, vocab, gradient(vocab, *data[0]), hook_comm, group, args,
                             comm)
        steps.header(f"P = {comm.size}, V = {vocab}: one DDP step")
        step_times = table_steps(steps, vocab, data, hook_comm, group, args, comm)
        summary.append((vocab, times, step_times))
    if comm.rank == 0:
        for vocab, times, step_times in summary:
            print(f"# V = {vocab}: hook / gloo {times['hook'] / times['gloo']:.2f}x, "
                  f"raw / coalesce+cupycoll "
                  f"{times['cupycoll'] / times['coalesce+cupycoll']:.2f}x, DDP step hook / "
                  f"gloo {step_times['hook'] / step_times['gloo']:.2f}x"
                  + ("" if "backend" not in times else
                     f", backend / gloo {times['backend'] / times['gloo']:.2f}x"))
    reduce.rows.extend(steps.rows)
    status = reduce.finish(args)
    dist.destroy_process_group()
    comm.mpi_comm.Barrier()
    if comm.rank == 0:
        import shutil

        shutil.rmtree(store, ignore_errors=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
