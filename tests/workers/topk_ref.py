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


# ---- Ok-Topk's documented selection rules, re-implemented in plain numpy ----------------------

SMALLEST = {np.dtype(np.float16): float(np.finfo(np.float16).smallest_subnormal),
            np.dtype(np.float32): float(np.finfo(np.float32).smallest_subnormal),
            np.dtype(np.float64): float(np.finfo(np.float64).smallest_subnormal)}


def positive(th: float, dtype) -> float:
    """The documented rule: a threshold of 0 or NaN becomes the least positive value."""
    return th if th > 0 and th == th else SMALLEST[np.dtype(dtype)]


def kth_magnitude(x: np.ndarray, k: int) -> float:
    return float(np.sort(np.abs(x.astype(np.float64)))[-k])


def quantile_local(x: np.ndarray, k: int) -> np.ndarray:
    """Default policy: every nonzero entry whose magnitude reaches the exact k-th magnitude;
    over 1.1k of them (ties at it) are cut to the exact top k, ties to the lower index."""
    mag = np.abs(x.astype(np.float64))
    chosen = np.flatnonzero((mag >= kth_magnitude(x, k)) & (mag > 0))
    return chosen if chosen.size <= 1.1 * k else topk(x, k)


def upper_set(ui: np.ndarray, uv: np.ndarray, res_i: np.ndarray) -> bool:
    """True when ``res_i`` is every entry of the union above its least |u| and, of those at it
    (ties, cut to k in all), the lowest indices."""
    if res_i.size == 0:
        return True
    mag = np.abs(uv)
    t = mag[np.searchsorted(ui, res_i)].min()
    above, at = ui[mag > t], ui[mag == t]
    got_at = np.setdiff1d(res_i, above)
    return bool(np.isin(above, res_i).all()) and np.array_equal(got_at, at[:got_at.size])


class ReferencePolicy:
    """The reference code's heuristics (spec section 2, VGG values), one rank's local part and the
    shared global part, simulated step by step from the inputs alone."""

    def __init__(self, k: int, dtype=np.float32) -> None:
        self.k, self.dtype = k, np.dtype(dtype)
        self.local_th: float | None = None
        self.global_th: float | None = None

    def local(self, x: np.ndarray, refresh: bool) -> np.ndarray:
        k, mag = self.k, np.abs(x.astype(np.float64))
        if refresh or self.local_th is None:
            idx = topk(x, k)
            th = positive(float(mag[idx].min()), self.dtype)
            idx = idx[mag[idx] > 0]
        else:
            th = self.local_th
            idx = np.flatnonzero(mag >= th)
            tries = 0
            while idx.size > 4 / 3 * k and tries < 5:  # cap: x1.03 at most 5 times
                th *= 1.03
                tries += 1
                idx = idx[mag[idx] >= th]
        self.local_th = th
        if idx.size < 2 / 3 * k:
            self.local_th = positive(th / 1.012, self.dtype)
        elif idx.size > 5 / 4 * k:
            self.local_th = th * 1.012
        return idx

    def result(self, ui: np.ndarray, uv: np.ndarray, refresh: bool):
        """The global selection of the union sums (ui, uv); updates the global threshold."""
        k = self.k
        nz = uv != 0
        if refresh or self.global_th is None:
            ri, rv = top_of(ui[nz], uv[nz], k)
            self.global_th = positive(float(np.abs(rv).min()), self.dtype) if rv.size else \
                SMALLEST[self.dtype]
            return ri, rv
        keep = nz & (np.abs(uv) >= self.global_th)
        total = int(keep.sum())
        if total < 2 / 3 * k:
            self.global_th = positive(self.global_th / 1.008, self.dtype)
        elif total > 4 / 3 * k:
            self.global_th *= 1.008
        return ui[keep], uv[keep]


def gaussian_reference(x: np.ndarray, k: int) -> np.ndarray:
    """Gaussian-k as the reference code: mean + z std (signed mean), then, in the direction
    the first count calls for, up to 20 corrections ÷1.02 while fewer than 3k//4 pass or x1.02
    while more than 5k//4 do."""
    import statistics

    density = k / x.size
    z = statistics.NormalDist().inv_cdf(1 - density / 2) if density < 1 else 0.0
    th = positive(float(np.mean(x, dtype=np.float64)) +
                  z * float(np.std(x, dtype=np.float64)), x.dtype)
    mag = np.abs(x.astype(np.float64))

    def count(t):
        return int(np.count_nonzero(mag >= t))

    first, loops = count(th), 0
    while first < 3 * k // 4 and loops < 20 and count(th) < 3 * k // 4:
        th, loops = positive(th / 1.02, x.dtype), loops + 1
    while first > 5 * k // 4 and loops < 20 and count(th) > 5 * k // 4:
        th, loops = positive(th * 1.02, x.dtype), loops + 1
    return np.flatnonzero(mag >= th)


def gaussian_corrected_ok(x: np.ndarray, k: int, sel: np.ndarray) -> bool:
    """The default Gaussian-k rule as a property: a threshold selection (every entry reaching
    its smallest magnitude) with 3k/4..5k/4 entries -- or, when ties at the k-th magnitude make
    that impossible, the exact top-k (ties to the lower index)."""
    mag = np.abs(x.astype(np.float64))
    if sel.size == 0:
        return not mag.any()
    if np.array_equal(sel, topk(x, k)):
        return True
    if not np.array_equal(np.flatnonzero(mag >= mag[sel].min()), sel):
        return False
    return 3 / 4 * k <= sel.size <= 5 / 4 * k or np.array_equal(sel, quantile_local(x, k))
