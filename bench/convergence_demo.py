"""Data-parallel training of a small MLP on scikit-learn's digits: dense SGD vs sparse top-k SGD.

    mpiexec -n 4 python -m mpi4py bench/convergence_demo.py                  # density 1%
    mpiexec -n 4 python -m mpi4py bench/convergence_demo.py --density 0.05 --plot digits5.png
    mpiexec -n 4 python -m mpi4py bench/convergence_demo.py --wire compact --wire-values bfloat16

Every rank holds the same model (one flat float32 parameter vector, as Ok-Topk flattens the whole
model into one buffer) and a quarter of every global mini-batch. Dense SGD averages the
gradients with one allreduce; the sparse runs use ``TopkCompressor`` (residual error feedback)
with each top-k algorithm at the same density, and apply the averaged sparse update. All runs use
the same seeds, initial weights, batches and learning rate. The digits data set ships inside
scikit-learn (no download); scikit-learn and matplotlib are optional extras (``pip install
'.[demo]'``): without matplotlib the plot is skipped with a message. The arrays are cupy when
cupycoll runs on the NCCL backend, numpy otherwise.

Printed (rank 0): final test accuracy, its gap to dense SGD, the mean of the last five
evaluations (every ``--eval-every`` steps), the real density (mean result entries per step / n:
what was actually communicated, against the ``--density`` asked for), bytes received per rank
per step (max over ranks, every phase and control message included) and time per step (compute
included). ``--policy reference`` runs Ok-Topk and Gaussian-k with the reference code's
threshold heuristics instead of the default per-step control.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import cupycoll as cc
from cupycoll.topk import Gaussian, Threshold, TopkCompressor
from _common import (Parser, data_out, fraction, listed, non_negative_int, non_negative_float,
                     one_of, positive_int)

ALGORITHMS = ("dense-sgd", "oktopk", "topka", "gtopk", "gaussiank")


def load(seed: int):
    """Digits (1797 8x8 images, 10 classes) scaled to [0, 1], split 80/20 with a fixed seed."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("convergence_demo needs scikit-learn: pip install 'cupycoll[demo]'")
    data = load_digits()
    x, y = data.data.astype(np.float32) / 16.0, data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


class MLP:
    """64 -> hidden (ReLU) -> 10 with softmax cross-entropy; parameters in one flat vector."""

    def __init__(self, xp, hidden: int, seed: int) -> None:
        self.xp, self.shapes = xp, [(64, hidden), (hidden,), (hidden, 10), (10,)]
        rng = np.random.default_rng(seed)
        parts = [rng.standard_normal(64 * hidden) * np.sqrt(2 / 64), np.zeros(hidden),
                 rng.standard_normal(hidden * 10) * np.sqrt(1 / hidden), np.zeros(10)]
        self.w = xp.asarray(np.concatenate(parts).astype(np.float32))

    def unpack(self, w):
        out, at = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape))
            out.append(w[at:at + size].reshape(shape))
            at += size
        return out

    def grad(self, x, y):
        """Gradient of the mean cross-entropy over (x, y), flat."""
        xp = self.xp
        w1, b1, w2, b2 = self.unpack(self.w)
        h = xp.maximum(x @ w1 + b1, 0)
        logits = h @ w2 + b2
        p = xp.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[xp.arange(len(y)), y] -= 1
        p /= len(y)
        dh = (p @ w2.T) * (h > 0)
        parts = [x.T @ dh, dh.sum(axis=0), h.T @ p, p.sum(axis=0)]
        return xp.concatenate([g.ravel() for g in parts]).astype(xp.float32)

    def accuracy(self, x, y) -> float:
        w1, b1, w2, b2 = self.unpack(self.w)
        pred = (self.xp.maximum(x @ w1 + b1, 0) @ w2 + b2).argmax(axis=1)
        return float((pred == y).mean())


def train(comm, algorithm: str, data, args) -> dict:
    """Train one model; return its accuracy curve, bytes received per step and time per step."""
    xp, p, r = comm.xp, comm.size, comm.rank
    xtr, ytr, xte, yte = (xp.asarray(a) for a in data)
    model = MLP(xp, args.hidden, args.seed)
    selector = {"oktopk": Threshold(policy=args.policy),
                "gaussiank": Gaussian(policy="reference" if args.policy == "reference"
                                      else "corrected")}.get(algorithm)
    comp = None if algorithm == "dense-sgd" else TopkCompressor(
        model.w.size, args.density, algorithm=algorithm, comm=comm, tau=args.tau,
        tau_prime=args.tau_prime, selector=selector, wire=args.wire,
        wire_values=None if args.wire_values == "none" else args.wire_values)
    rng = np.random.default_rng(args.seed + 1)
    per_rank = args.batch // p
    curve, step, sent = [], 0, 0
    comm.stats.reset()
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        order = rng.permutation(len(ytr))
        for first in range(0, len(order) - args.batch + 1, args.batch):
            mine = order[first + r * per_rank:first + (r + 1) * per_rank]
            g = model.grad(xtr[mine], ytr[mine])
            if comp is None:
                model.w -= args.lr * cc.allreduce(g, comm=comm) / p
            else:
                upd = comp.step(g)
                model.w[upd.indices] -= args.lr * upd.values
                sent += upd.nnz
            step += 1
            if step % args.eval_every == 0:
                curve.append((step, model.accuracy(xte, yte)))
    seconds = time.perf_counter() - t0
    curve.append((step, model.accuracy(xte, yte)))
    received = comm.mpi_comm.allreduce(comm.stats.bytes_received / step, op=_mpi_max())
    return {"algorithm": algorithm, "accuracy": curve[-1][1], "curve": curve,
            "last5": float(np.mean([a for _, a in curve[-5:]])),
            "bytes_per_step": received,
            "real_density": 1.0 if comp is None else sent / step / model.w.size,
            "ms_per_step": 1e3 * seconds / step, "steps": step,
            "params": int(model.w.size),
            "k": None if comp is None else comp.k}


def _mpi_max():
    from mpi4py import MPI

    return MPI.MAX


def plot(results: list[dict], path: str, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is not installed: no plot (pip install 'cupycoll[demo]')")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for res in results:
        steps, acc = zip(*res["curve"])
        ax.plot(steps, acc, label=f"{res['algorithm']} ({res['accuracy']:.3f})")
    ax.set_xlabel("step")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.5, 1.0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"# plot written to {path}")


def main() -> None:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--density", type=fraction, default=0.01, help="k / n, in (0, 1]")
    ap.add_argument("--epochs", type=positive_int, default=30)
    ap.add_argument("--batch", type=positive_int, default=64,
                    help="global mini-batch (split over ranks; at least one sample a rank)")
    ap.add_argument("--hidden", type=positive_int, default=128)
    ap.add_argument("--lr", type=non_negative_float, default=0.2)
    ap.add_argument("--tau", type=lambda v: v if v == "auto" else positive_int(v),
                    default="auto",
                    help="Ok-Topk repartition period: an int or \"auto\" (default)")
    ap.add_argument("--tau-prime", type=positive_int, default=32)
    ap.add_argument("--eval-every", type=positive_int, default=25)
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument("--algorithms", type=listed(one_of(*ALGORITHMS)),
                    default=",".join(ALGORITHMS))
    ap.add_argument("--policy", choices=("quantile", "reference"), default="quantile",
                    help="threshold policy of oktopk and gaussiank (reference = the reference "
                         "code's heuristics)")
    ap.add_argument("--wire", default="auto", choices=("coo", "compact", "auto"),
                    help="wire format of the compressors' sparse entries")
    ap.add_argument("--wire-values", default="none", choices=("none", "bfloat16", "float16"),
                    help="values on the wire (rounded, with error feedback)")
    ap.add_argument("--plot", default=None, help="PNG path (default convergence_d<density>.png)")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="write the results as JSON to PATH ('-' = stdout)")
    args = ap.parse_args()
    comm = cc.init()
    data = load(args.seed)
    if not comm.size <= args.batch <= len(data[1]):  # every rank alike: each one exits
        ap.error(f"--batch {args.batch}: must be from the number of ranks, {comm.size}, to the "
                 f"training samples, {len(data[1])}")
    results = [train(comm, alg, data, args) for alg in args.algorithms]
    if comm.rank != 0:
        return
    dense = next((r["accuracy"] for r in results if r["algorithm"] == "dense-sgd"), None)
    title = (f"digits MLP ({results[0]['params']} params), P={comm.size}, "
             f"density {args.density:g}, {results[0]['steps']} steps")
    print(f"# {title}")
    print(f"# {'algorithm':>10} {'test acc':>9} {'vs dense':>9} {'last-5 mean':>12} "
          f"{'real density':>13} {'bytes recv/rank/step':>21} {'ms/step':>8}")
    for res in results:
        gap = "" if dense is None else f"{100 * (res['accuracy'] - dense):+.1f} pt"
        print(f"  {res['algorithm']:>10} {res['accuracy']:9.3f} {gap:>9} {res['last5']:12.3f} "
              f"{res['real_density']:13.5f} {res['bytes_per_step']:21.0f} "
              f"{res['ms_per_step']:8.2f}")
    plot(results, args.plot or f"convergence_d{args.density:g}.png", title)
    if args.json:
        doc = {"args": vars(args), "results": results}
        if args.json == "-":
            json.dump(doc, data_out(), indent=1)
            print(file=data_out(), flush=True)
        else:
            with open(args.json, "w") as fh:
                json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
