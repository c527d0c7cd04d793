"""The numba merge folds rows straight from each part (up to ``_DIRECT_PARTS`` parts) or from
their concatenation (more parts): both, serial and cut over threads, bit for bit against the
numpy loops (``ufunc.at`` on identity-filled blocks)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

import cupycoll.primitives as P  # noqa: E402
from cupycoll.primitives import _accel, _common  # noqa: E402
from cupycoll.primitives import _numba as K  # noqa: E402

pytestmark = pytest.mark.numba
OPS = ("sum", "prod", "max", "min")


def twin(monkeypatch: pytest.MonkeyPatch, parts: list, op: str, acc: str) -> tuple:
    """merge_sorted by the numpy loops (``ufunc.at`` per block, no numba), then by numba's."""
    monkeypatch.setattr(_accel, "_FAST_FROM", 0)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "off")
    want = P.merge_sorted(parts, op, acc)
    monkeypatch.setenv("CUPYCOLL_NUMBA", "on")
    assert _accel._fast(0) is not None
    return want, P.merge_sorted(parts, op, acc)


def rows(rng: np.random.Generator, shape: tuple, dtype: str) -> np.ndarray:
    """Values with zeros of both signs, NaN and infinities (floats)."""
    v = (rng.standard_normal(shape) * 3).astype(dtype)
    if v.dtype.kind == "f":
        for special, share in ((-0.0, 0.1), (0.0, 0.1), (np.nan, 0.02), (np.inf, 0.02)):
            v[rng.random(shape) < share] = special
    return v


@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("direct", [8, 0])
def test_merge_direct_and_concatenated(monkeypatch: pytest.MonkeyPatch, threads: str,
                                       direct: int) -> None:
    monkeypatch.setattr(K, "_PIECE", 1)  # several pieces (threads) even for small merges
    monkeypatch.setattr(K, "_DIRECT_PARTS", direct)
    monkeypatch.setattr(_common, "_MERGE_BLOCK", 256)  # many blocks per piece
    monkeypatch.setenv("CUPYCOLL_THREADS", threads)
    rng = np.random.default_rng(int(threads) + direct)
    cases = 0
    for nparts, universe, row, dtype, acc in ((2, 5000, (3,), "float32", "float32"),
                                              (3, 2**20, (), "float64", "float64"),
                                              (5, 300, (4,), "float16", "float32"),
                                              (11, 4000, (2,), "int32", "int64")):
        parts = []
        for p in range(nparts):
            size = 0 if p == 1 else int(rng.integers(1, min(universe, 1500)))
            idx = np.unique(rng.integers(0, universe, size)).astype(np.int64)
            parts.append((idx, rows(rng, (idx.size,) + row, dtype)))
        for op in OPS:
            want, got = twin(monkeypatch, parts, op, acc)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.tobytes() == w.tobytes(), (nparts, op)
            cases += 1
    assert cases == 16
