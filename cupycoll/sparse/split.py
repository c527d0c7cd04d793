"""``split``: regions balanced by the indices, rotated reduce-scatter to owners, allgatherv.

SparCML's split-allgather and Ok-Topk's phase 1, exact:

1. Balance: every rank allgathers ``SAMPLES`` evenly spaced samples of its sorted indices plus
   its nnz (fixed size, one native allgather); every rank computes the same P regions
   ``[b_r, b_{r+1})`` from the weighted quantiles of the samples, so each region holds about
   1/P of all entries whatever the indices' distribution (clustered or skewed).
2. Reduce-scatter: rank r owns region r. Counts go first (one int64 per peer), then every rank
   posts its slice of region r+s to rank r+s for s = 1..P-1 (rotated destinations, one batch),
   indices and rows packed in one message (:mod:`cupycoll.wire`; compact wire: (count, bytes)
   pairs go first, and each slice's index stream is encoded over its region).
   The owner merges the P slices in rank order (absent counting as 0).
3. Allgatherv of the reduced regions (counts, then indices and rows in one exchange round,
   straight into the output): concatenated in rank order they are the sorted result, and each
   value was computed once, by its owner, so every rank has the same bits.

Cost per rank (E = index + row bytes): samples (P-1)*(SAMPLES+1)*8; counts (P-1)*8; the other
ranks' slices of this rank's region * E (one message per non-empty slice); the allgatherv
counts (P-1)*8 and (union - own region's union) * E (one message per non-empty region).
Compact wire: 16 bytes per size record and the encoded index bytes in place of I per entry.
Balanced, that is about (N/P + U)(P-1)/P * E for N total entries: less than allgather as soon
as indices overlap, with a P-times smaller local merge.

``output="dense"`` (:func:`dense_result`, the region variant): phases 1 and 2 as above, then the
owners' regions travel either as sparse entries that every rank writes into its zeroed output,
or dense: each owner writes its region into an n/P-row block (for sums it accumulates the P
slices there directly, in rank order, instead of merging them, and then settles -0 as the merge
would) and one allgatherv of the blocks fills the output. Which one: :func:`gathers_dense`, the
cheaper by the profile's prices, decided from every rank's nnz (known from phase 1) the same on
every rank.
Dense regions cost n*R'*(P-1)/P bytes received (R': a row of the caller's dtype, as the owners
finish their regions before the gather; one message per non-empty peer region).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from .._registry import register
from .._types import ReduceOp, distinct, to_host
from ..wire._exchange import exchange_sizes, post_blocks
from ..wire._pack import COO, Wire, pack, unpack
from ._common import allgatherv_entries, held_by, presence, reduce_parts, union_of_presence
from .dense import add_into, dense_output, densify_into, row_bits
from ._cost import Cost, Shape

__all__ = ["split", "cost", "dense_result", "gathers_dense", "SAMPLES", "local_samples",
           "region_bounds", "reduce_scatter", "work", "ALGORITHM"]

#: index samples per rank that balance the regions (the region loads are within ~1/SAMPLES).
SAMPLES = 128


def local_samples(indices: Any, xp: Any = np) -> Any:
    """Return ``[nnz, SAMPLES evenly spaced indices]`` (int64) of sorted local ``indices``."""
    nnz = int(indices.shape[0])
    out = xp.zeros(SAMPLES + 1, dtype=np.int64)
    out[0] = nnz
    if nnz:
        pos = (xp.arange(SAMPLES, dtype=np.int64) * nnz) // SAMPLES
        out[1:] = indices[pos]
    return out


def region_bounds(samples: np.ndarray, n: int, parts: int | None = None) -> np.ndarray:
    """Return P+1 region bounds ``0 = b_0 <= ... <= b_P = n`` from every rank's samples.

    ``samples`` is (P, SAMPLES+1) as made by :func:`local_samples`. A sample of rank r stands
    for nnz_r / SAMPLES entries; bound b_j is the first sample value where the cumulative weight
    reaches j/P of the total (integer arithmetic: the same on every rank). ``parts`` regions
    instead of P if given (the hierarchical algorithm's regions).
    """
    p = samples.shape[0] if parts is None else parts
    weights = np.repeat(samples[:, 0], SAMPLES)
    values = samples[:, 1:].reshape(-1)
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order])
    total = int(cumulative[-1]) if cumulative.size else 0
    bounds = np.empty(p + 1, dtype=np.int64)
    bounds[0], bounds[p] = 0, n
    if total == 0:
        bounds[1:p] = [j * n // p for j in range(1, p)]  # Python ints: j * n may pass 2**63
        return bounds
    targets = -(-(np.arange(1, p, dtype=np.int64) * total) // p)  # ceil(j * total / P)
    bounds[1:p] = values[np.searchsorted(cumulative, targets, side="left")]
    return np.maximum.accumulate(bounds)


def _samples(comm: Any, indices: Any, op_name: str = "split.samples") -> np.ndarray:
    """Every rank's :func:`local_samples` (host, (P, SAMPLES + 1)): one native allgather."""
    send = local_samples(indices, comm.xp)
    recv = comm.xp.empty(comm.size * (SAMPLES + 1), dtype=np.int64)
    return comm.fetch(comm.allgather(send, recv, op_name), recv).reshape(comm.size, SAMPLES + 1)


def _bounds(comm: Any, indices: Any, n: int, op_name: str = "split.samples",
            parts: int | None = None) -> np.ndarray:
    return region_bounds(_samples(comm, indices, op_name), n, parts)


def _cuts(comm: Any, indices: Any, bounds: np.ndarray) -> Any:
    """Device offsets of the P regions in sorted ``indices`` (P+1 int64, first 0, last nnz)."""
    xp = comm.xp
    inner = xp.asarray(bounds[1:-1]).astype(indices.dtype, copy=False)  # sample values: fit
    cuts = xp.zeros(comm.size + 1, dtype=np.int64)
    cuts[1:-1] = xp.searchsorted(indices, inner)
    cuts[-1] = indices.shape[0]
    return cuts


def _scatter(comm: Any, indices: Any, values: Any, bounds: np.ndarray, wire: Wire,
             name: str = "split") -> list[tuple[Any, Any]]:
    """Send every region's slice to its owner as one packed block (in a send buffer of the
    communicator, handed back once the exchange is done); return the P slices of this rank's
    region in rank order (sizes first: one host read for coo, two for compact). Booked as
    ``<name>.counts`` and ``<name>.scatter``."""
    p, rank, xp = comm.size, comm.rank, comm.xp
    row = tuple(values.shape[1:])
    cuts_d = _cuts(comm, indices, bounds)
    blocks, sizes = {}, xp.diff(cuts_d)
    if wire.compact:  # the encoded sizes must be known before the size exchange
        cuts = [int(c) for c in to_host(cuts_d)]
        blocks = {d: pack(xp, indices[cuts[d]:cuts[d + 1]], values[cuts[d]:cuts[d + 1]], wire,
                          int(bounds[d]), int(bounds[d + 1]), comm.send_buffer)
                  for d in range(p) if d != rank and cuts[d + 1] > cuts[d]}
        sizes = np.diff(cuts)
    sent, counts, nbytes = exchange_sizes(comm, sizes, blocks, wire, row,
                                          indices.dtype, values.dtype, name + ".counts")
    cuts = [0] + np.cumsum(sent).tolist()
    if not wire.compact:
        blocks = {d: pack(xp, indices[cuts[d]:cuts[d + 1]], values[cuts[d]:cuts[d + 1]], wire,
                          buffer=comm.send_buffer)
                  for d in range(p) if d != rank and sent[d]}
    order = [(rank + s) % p for s in range(1, p)]  # rotated destinations
    work, slots = post_blocks(comm, {d: blocks[d] for d in order if d in blocks},
                              [(rank - s) % p for s in range(1, p)], counts, nbytes,
                              name + ".scatter")
    comm.stream_order(work)
    for block in blocks.values():
        comm.release_send_buffer(block.buf)
    parts = []
    for r in range(p):
        if r == rank:
            parts.append((indices[cuts[r]:cuts[r + 1]], values[cuts[r]:cuts[r + 1]]))
        elif r in slots:
            parts.append(unpack(slots[r], int(counts[r]), row, indices.dtype, values.dtype,
                                wire))
        else:
            parts.append((indices[:0], values[:0]))
    return parts


def split(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp,
          accumulate_dtype: Any = None, wire: Wire = COO, *, profile: Any) -> tuple[Any, Any]:
    """Reduce-scatter balanced index regions to their owners, then allgatherv the regions
    (dense or as entries, as :func:`gathers_dense` prices them with ``profile``, the same on
    every rank)."""
    p, rank = comm.size, comm.rank
    if p == 1:
        return indices, values
    samples = _samples(comm, indices)
    bounds = region_bounds(samples, n)
    own_idx, own_val = reduce_scatter(comm, indices, values, bounds, op, accumulate_dtype,
                                      wire=wire)
    shape = Shape(p, n, math.prod(own_val.shape[1:]) if own_val.ndim > 1 else 0,
                  indices.dtype.itemsize, own_val.dtype.itemsize,
                  tuple(int(c) for c in samples[:, 0]), wire=wire)
    if gathers_dense(shape, profile):
        return _gather_regions(comm, own_idx, own_val, bounds)
    all_idx, all_val, _ = allgatherv_entries(comm, own_idx, own_val, "split.gather", wire,
                                             int(bounds[rank]), int(bounds[rank + 1]))
    return all_idx, all_val


def _gather_regions(comm: Any, own_idx: Any, own_val: Any, bounds: np.ndarray
                    ) -> tuple[Any, Any]:
    """Phase 3 dense (a sparse output): every owner's region as n/P-ish rows and a bit per row
    (present or not), allgathered; every rank reads the union back from the bits. The same
    entries and bits as the sparse gather: the owners' reduced rows, moved as they are."""
    xp, rank = comm.xp, comm.rank
    spans = np.diff(bounds)
    lo, row = int(bounds[rank]), tuple(own_val.shape[1:])
    local = own_idx - lo
    block = densify_into(xp.empty((int(spans[rank]),) + row, dtype=own_val.dtype), local,
                         own_val)
    full = xp.empty((int(bounds[-1]),) + row, dtype=own_val.dtype)
    comm.run("_allgatherv_into", block, full, spans, op_name="split.regions")
    packed = -(-spans // 8)
    bits = xp.empty(int(packed.sum()), dtype=np.uint8)
    comm.run("_allgatherv_into", xp.packbits(presence(local, int(spans[rank]))), bits, packed,
             op_name="split.presence")
    starts = np.concatenate([[0], np.cumsum(packed)])
    union = union_of_presence(xp.concatenate([
        xp.unpackbits(bits[starts[r]:starts[r + 1]])[:int(spans[r])]
        for r in range(comm.size)]).view(bool), own_idx.dtype)
    return union, xp.take(full, union, axis=0)


def reduce_scatter(comm: Any, indices: Any, values: Any, bounds: np.ndarray, op: ReduceOp,
                   accumulate_dtype: Any = None, name: str = "split", wire: Wire = COO
                   ) -> tuple[Any, Any]:
    """Phase 2: rank r gets region ``[bounds[r], bounds[r+1])`` reduced over all ranks.

    Booked as ``<name>.counts`` and ``<name>.scatter``; the hierarchical algorithm runs it
    among the ranks of a node.
    """
    return reduce_parts(_scatter(comm, indices, values, bounds, wire, name), op,
                        accumulate_dtype)


def _finished(shape: Shape) -> Shape:
    """``shape`` with values of the caller's dtype: a dense output's owners finish (cast) their
    entries before phase 3 gathers them."""
    if not shape.result_bytes or shape.result_bytes == shape.value_bytes:
        return shape
    return dataclasses.replace(shape, value_bytes=shape.result_bytes,
                               float_values=shape.float_values and shape.result_bytes >= 4)


def gathers_dense(shape: Shape, profile: Any = None) -> bool:
    """Whether the owners' regions travel dense. A sparse output: the union's entries (after
    a count allgather), or the n rows and a bit each (one more exchange of P-1 messages, a fill
    of the owner's region, a scan of the n bits on every rank), whichever the profile prices
    lower. ``output="dense"``: predicted seconds of the
    two ways with the profile's prices (default: :func:`cupycoll.tuner.profile.load_profile`),
    from the nnz alone (union estimated, ``inputs`` ignored: what every rank knows after
    phase 1). Sparse: the union's entries ((P-1)/P of U x E bytes), the owner's merge of N/P
    entries and a fill of the whole output. Dense: (P-1)/P of the n rows, the owner's N/P
    rows accumulated and a fill of its region."""
    if profile is None:
        from ..tuner.profile import load_profile

        profile = load_profile(size=shape.size)
    shape = shape if shape.inputs is None else dataclasses.replace(shape, inputs=None)
    p, w, price = shape.size, max(shape.width, 1), profile.price
    region, share = shape.total_nnz / p, profile.beta_p2p * (p - 1) / p
    if shape.output != "dense":  # the merge and the union's rows cost the same both ways
        sparse = share * shape.union * shape.entry_bytes + profile.alpha_native  # + counts
        dense = (share * shape.n * (shape.row_bytes + 1 / 8) + price("fill") * shape.n * w / p
                 + price("scan") * shape.n + profile.alpha_p2p + profile.alpha_msg * (p - 1))
        return p > 1 and dense < sparse
    sparse = (share * shape.union * _finished(shape).entry_bytes + price("merge") * region
              + price("fill") * shape.n * w)
    dense = (share * shape.n * shape.result_row_bytes + price("row") * region * w
             + price("fill") * shape.n * w / p)
    return dense < sparse


def dense_result(comm: Any, indices: Any, values: Any, n: int, op: ReduceOp, out: Any,
                 finish: Callable[[Any], Any], minus_zero: bool, wire: Wire = COO, *,
                 profile: Any) -> Any:
    """``output="dense"`` by regions (see the module docstring) into ``out``, the output
    array (the caller's dtype). ``finish(values)`` turns reduced values (a region's rows or
    its entries' rows) into the caller's: avg, the cast, NaN bits. A sum's owner accumulates
    its slices in a block: the first slice written, the others added, the merge's additions in
    the same order; ``minus_zero`` (some rank holds a -0 value): its -0 elements are then
    settled, since a -0 sum stays only where every rank holds the row. ``profile``: as
    :func:`split`'s."""
    if comm.size == 1:  # nothing to split: the dense algorithm's single pass
        return dense_output(comm, indices, values, n, op, out, finish)
    p, rank, xp = comm.size, comm.rank, comm.xp
    samples = _samples(comm, indices)
    bounds = region_bounds(samples, n)
    shape = Shape(p, n, math.prod(values.shape[1:]) if values.ndim > 1
                  else 0, indices.dtype.itemsize, values.dtype.itemsize,
                  tuple(int(c) for c in samples[:, 0]), wire=wire, output="dense",
                  result_bytes=out.dtype.itemsize)
    dense = gathers_dense(shape, profile)
    parts = _scatter(comm, indices, values, bounds, wire)
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    row = tuple(values.shape[1:])
    if dense and op is ReduceOp.SUM:
        block = densify_into(xp.empty((hi - lo,) + row, dtype=values.dtype), parts[0][0] - lo,
                             parts[0][1])
        for idx, val in parts[1:]:
            add_into(block, idx, lo, val)
        if minus_zero:
            _settle_minus_zero(xp, block, parts, lo)
        block = finish(block)
    else:
        own_idx, own_val = reduce_parts(parts, op)
        rounded = not dense and wire.rounds(own_val.dtype)  # as the sparse result: the sum
        own_val = own_val if rounded else finish(own_val)  # rounded for the wire, then avg
        if not dense:  # and the cast (not the finished value rounded)
            all_idx, all_val, _ = allgatherv_entries(comm, own_idx, own_val, "split.gather",
                                                     wire, lo, hi)
            return densify_into(out, all_idx, finish(all_val) if rounded else all_val)
        block = densify_into(xp.empty((hi - lo,) + row, dtype=out.dtype), own_idx - lo,
                             own_val)
    comm.run("_allgatherv_into", block, out, np.diff(bounds), op_name="split.regions")
    return out


def _settle_minus_zero(xp: Any, block: Any, parts: list[tuple[Any, Any]], lo: int) -> None:
    """In a summed block, make +0 the -0 elements of rows some rank does not hold (an absent
    entry counts +0; only later ranks' absence can leave a -0 that the merge would not)."""
    bits, minus_zero = row_bits(block)
    negative = bits == minus_zero  # one pass over the block's bits
    rows = xp.flatnonzero(negative.any(axis=1))
    if rows.shape[0] == 0:
        return
    wanted = (rows + lo).astype(parts[0][0].dtype, copy=False)
    held = held_by(wanted, [idx for idx, _ in parts])
    partial = rows[held < len(parts)]
    bits[partial] = xp.where(negative[partial], bits.dtype.type(0), bits[partial])


def cost(shape: Shape, rank: int, profile: Any = None) -> Cost:
    """Bytes and messages ``rank`` receives (without the validation allreduce).

    Exact when ``shape.inputs`` is given (regions computed as the algorithm does), otherwise
    with perfectly balanced regions of independent uniformly random indices. A dense output
    gathers dense regions where :func:`gathers_dense` (with ``profile``) says so.
    """
    p, c = shape.size, Cost()
    if p == 1:
        return c
    gathers = _finished(shape) if shape.output == "dense" else shape  # what phase 3 moves
    c.allgather("split.samples", p, p * (SAMPLES + 1) * 8)
    c.alltoall_counts("split.counts", p, shape.size_words)
    if shape.inputs is not None:
        samples = np.stack([local_samples(a) for a in shape.inputs])
        bounds = region_bounds(samples, shape.n)
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        got = [shape.block_bytes(s.size, s, lo, hi) for r, s in enumerate(
            a[(a >= lo) & (a < hi)] for a in shape.inputs) if r != rank]
        unions = [distinct(np, [a[(a >= bounds[q]) & (a < bounds[q + 1])]
                                for a in shape.inputs]) for q in range(p)]
        gathered = [gathers.block_bytes(u.size, u, int(bounds[q]), int(bounds[q + 1]))
                    for q, u in enumerate(unions)]
    else:
        span = shape.n // p
        got = [shape.block_bytes(shape.nnz[r] // p, None, 0, span)
               for r in range(p) if r != rank]
        gathered = [gathers.block_bytes(shape.union // p, None, 0, span)] * p
    c.book("split.scatter", sum(got), sum(1 for g in got if g))
    if gathers_dense(shape, profile):
        spans = (np.diff(bounds) if shape.inputs is not None
                 else [shape.n // p + (r < shape.n % p) for r in range(p)])
        if shape.output == "dense":
            return c.allgatherv("split.regions", p, rank, spans, shape.result_row_bytes,
                                with_counts=False)
        c.allgatherv("split.regions", p, rank, spans, shape.row_bytes, with_counts=False)
        return c.allgatherv("split.presence", p, rank, [-(-int(s) // 8) for s in spans], 1,
                            with_counts=False)
    return c.allgatherv_entries("split.gather", p, rank, gathered, shape.size_words)


def work(shape: Shape, rank: int, profile: Any = None) -> dict[str, float]:
    """A dense output: the region variant (:func:`dense_result`) writes the owner's region
    (accumulating its rows instead of merging them) or the whole output. A sparse output
    gathered as dense regions: the owner's region filled, and every rank scans the n presence
    bits before it takes the union's rows. ``profile`` decides the regions' form
    (:func:`gathers_dense`; default: the shipped profile)."""
    if shape.size == 1:
        return {"fill": shape.n * max(shape.width, 1)} if shape.output == "dense" else {}
    w, region = max(shape.width, 1), shape.total_nnz / shape.size
    dense_regions = gathers_dense(shape, profile)
    if shape.output == "dense" and dense_regions:
        return {"row": region * w, "fill": shape.n * w / shape.size}
    out = {"merge": region, "row": (region + shape.union) * w, "fold": region * (w - 1)}
    if shape.output == "dense":
        return {**out, "fill": shape.n * w}
    return {**out, "fill": shape.n * w / shape.size, "scan": shape.n} if dense_regions else out


ALGORITHM = register("sparse", "split", split, cost=cost, work=work, dense_output=dense_result,
                     prices=("profile",))
