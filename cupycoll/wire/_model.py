"""Bytes of packed blocks for the cost models: exact from indices, expected from a shape.

A block of ``count`` entries with rows of ``row_bytes`` (on the wire) costs
``count * row_bytes`` plus its index part: ``count * index_bytes`` raw, or the codec's stream
for ``compact``: :func:`encoded_nbytes` of the actual indices when the model has them, else
:func:`expected_index_nbytes` for ``count`` uniformly random indices over a span.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .._types import distinct
from ._pack import Wire

__all__ = ["block_nbytes", "expected_index_nbytes", "SAMPLE"]

#: indices the expected-size estimate encodes (a fixed pseudo-random sample, the same on every
#: rank), scaled to the block's count.
SAMPLE = 4096


@functools.lru_cache(maxsize=512)
def _bytes_per_index(gap_bucket: int) -> float:
    """Encoded bytes per index of SAMPLE uniform random indices at mean gap 2^(bucket/8) (at
    most the gap of a span of 2^62, the largest n: int64 draws stop at 2^63)."""
    from . import encoded_nbytes

    gap = 2.0 ** (gap_bucket / 8)
    span = min(max(int(math.ceil(SAMPLE * gap)), SAMPLE), 1 << 62)
    rng = np.random.default_rng(12345)
    idx = distinct(np, rng.integers(0, span, SAMPLE, dtype=np.int64))
    return encoded_nbytes(idx, 0, span) / idx.size


def expected_index_nbytes(count: int, span: int, index_bytes: int) -> int:
    """Expected encoded bytes of ``count`` uniformly random sorted unique indices in a span."""
    count, span = int(count), max(int(span), 1)
    if count <= 0:
        return 0
    if count >= span:  # every position: at least as cheap as a bitmap
        return (span + 7) // 8 + 16
    bucket = int(round(8 * math.log2(max(span / count, 1.0))))
    return int(math.ceil(count * _bytes_per_index(bucket)))


def block_nbytes(wire: Wire, count: int, row_bytes: int, index_bytes: int,
                 indices: Any = None, lo: int = 0, hi: int = 0) -> int:
    """Bytes of one packed block (0 for an empty one): exact when ``indices`` are given."""
    count = int(count)
    if count == 0:
        return 0
    if not wire.compact:
        return count * (index_bytes + row_bytes)
    if indices is not None:
        from . import encoded_nbytes

        return count * row_bytes + int(encoded_nbytes(np.asarray(indices), lo, hi))
    return count * row_bytes + expected_index_nbytes(count, hi - lo, index_bytes)
