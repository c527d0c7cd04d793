"""Independent references and seeded inputs for the top-k workers (plain numpy/Python, no cupycoll).

Inputs are multiples of 1/8 (or small integers) so every sum over ranks is exact in float16/32/64
and a reference can be compared bit for bit, whatever order an algorithm adds in.
"""

from __future__ import annotations

import numpy as np

from _common import rng_for


def inputs(seed: int, nranks: int, n: int, dtype: str = "float32", *, noise: int = 64,
           base: int = 512, zeros: bool = False) -> list[np.ndarray]:
    """Every rank's input: a shared heavy-tailed component plus per-rank noise (integers; /8 for
    float32/64, folded into [-48, 48] for float16 so sums stay exact)."""
    if zeros:
        return [np.zeros(n, dtype) for _ in range(nranks)]
    tail = rng_for(seed, 10_000).standard_t(2, size=n) * base / 8  # heavy tails, like gradients
    shared = np.clip(np.round(tail), -64 * base, 64 * base).astype(np.int64)
    scale = 1.0 if dtype == "float16" else 1 / 8
    out = []
    for q in range(nranks):
        own = rng_for(seed, q).integers(-noise, noise + 1, size=n)
        vals = shared + own if dtype != "float16" else (shared + own) % 97 - 48
        out.append((vals * scale).astype(dtype))
    return out


def order(values: np.ndarray, indices: np.ndarray | None = None) -> np.ndarray:
    """Positions sorted by magnitude descending, ties by index ascending."""
    idx = np.arange(values.size) if indices is None else indices
    return np.lexsort((idx, -np.abs(values.astype(np.float64))))


def topk(values: np.ndarray, k: int) -> np.ndarray:
    """Ascending indices of the exact top-k of a dense vector (ties to the lower index)."""
    return np.sort(order(values)[:k])


def top_of(indices: np.ndarray, values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of a sparse (indices, values) set, returned ascending."""
    pos = np.sort(order(values, indices)[:k])
    return indices[pos], values[pos]


def union_sum(selections: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Sum of sparse sets over ranks (a dict, no numpy reductions), ascending indices."""
    acc: dict[int, float] = {}
    for idx, val in selections:
        for i, v in zip(idx.tolist(), val.astype(np.float64).tolist()):
            acc[i] = acc.get(i, 0.0) + v
    keys = np.array(sorted(acc), dtype=np.int64)
    return keys, np.array([acc[i] for i in keys.tolist()], dtype=np.float64)


def gtopk(locals_: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Simulate gTopk on P ranks: fold into the power-of-two core, pairwise top-k merges."""
    p = len(locals_)
    sets = [dict(zip(i.tolist(), v.astype(np.float64).tolist())) for i, v in locals_]

    def merge(a: dict, b: dict) -> dict:
        out = dict(a)
        for i, v in b.items():
            out[i] = out.get(i, 0.0) + v
        keep = sorted(out, key=lambda i: (-abs(out[i]), i))[:k]
        return {i: out[i] for i in keep}

    p2 = 1 << (p.bit_length() - 1)
    for r in range(p2, p):
        sets[r - p2] = merge(sets[r - p2], sets[r])
    step = 1
    while step < p2:
        for r in range(0, p2, 2 * step):
            sets[r] = merge(sets[r], sets[r + step])
        step *= 2
    keys = np.array(sorted(sets[0]), dtype=np.int64)
    return keys, np.array([sets[0][i] for i in keys.tolist()], dtype=np.float64)


def recall(got: np.ndarray, want: np.ndarray) -> float:
    """Fraction of ``want`` found in ``got``."""
    return len(set(got.tolist()) & set(want.tolist())) / max(1, len(want))
