"""``oktopk``: Ok-Topk's O(k) sparse allreduce (Li & Hoefler, PPoPP'22), Algorithm 1 in full.

What is selected where, at step t of a :class:`TopkState` (spec section 1):

1. Local selection, on every rank, by ``state.selector`` (default :class:`Threshold`, quantile
   policy: a sampled k-th magnitude every step, 0.8k..1.1k entries; ``policy="reference"``:
   exact k-th magnitude when ``t % tau' == 0``, reused with count feedback in between). Call it
   L.
2. When ``t % tau == 0`` (or the boundaries are missing or stale; ``tau="auto"``: see
   :func:`auto_tau`): region boundaries
   ``0 = B_0 <= ... <= B_P = n``. Each rank proposes ``S[i*c]``, i = 1..P-1, from its sorted
   selection S with ``c = |S| // P`` (equal split points when ``|S| < P``); one allreduce (sum,
   int64) and a floor division by P average them. Identical on every rank.
3. Split and reduce (:mod:`._oktopk_phases`): rank r owns region r and receives every rank's
   selected pairs in it; rotated schedule (step s sends to r+s, receives from r-s), in buckets of
   ``min(4, P)`` steps, the scatter-add of one bucket overlapping the next bucket's transfer.
   ``red`` = the sum over the ranks that selected each index; sources are added in a fixed order.
4. Refresh step (``t % tau' == 0``): every rank allgathers all nonzeros of every region; the
   exact top-k of them (``k' = min(k, total)``) is the result and its k'-th magnitude becomes the
   global threshold (the same on every rank: it comes from the same gathered data; an inf one,
   from inf inputs or a float16 sum that overflowed, the dtype's largest finite value, so the
   next step's histogram starts from a finite window and finds 0.9k..1.1k again).
5. Other steps: the global threshold of this step comes from an allreduced log-scale histogram
   of every region's nonzero sums (:mod:`._global_threshold`: 34 counts, more rounds only when
   the threshold moved more than an octave or the k-th sum is on a large tie), so the count T of
   ``|red| >= global_th`` is 0.9k..1.1k. (``Threshold(policy="reference")``: the shared
   threshold is used as it is and corrected afterwards from T alone, ``T < 2k/3``: divide by
   1.008; ``T > 4k/3``: multiply -- the reference code's feedback.) Each owner selects its
   entries, counts are allgathered, the selections are balanced by interval overlap into blocks
   of ``T//P`` or ``T//P + 1``, and allgathered (natively, or as an allgather of blocks padded to
   ``ceil(T/P)`` with the sentinel index n where the backend has no allgatherv).

Result: identical on every rank (it is allgathered), ascending indices (regions are contiguous
and each is emitted in order), values = sums over the ranks that selected the index locally.
``included`` = L ∩ result: a rank's value at i is in the result iff it selected i and i is in
the result; values reduced but cut by the global threshold stay in their ranks' residuals.

Cost (per rank, words; 1 word = an int32 index or an fp32 value; spec Eqs. 1-3):
split and reduce 2k(P-1)/P on selections the boundaries split evenly (up to 2k(P-1) at one
region's owner where every selection has moved into its region since the boundaries were
set); balance <= 2k(P-1)/P (all on one rank: the owner ships (P-1)/P of its 2k words, every
peer receives 2k/P); allgather 2k(P-1)/P: at most 6k(P-1)/P on a non-refresh step with even
splits, latency <= 2P + 2 log2 P. Not in the model: the count exchanges
(``oktopk.reduce.counts``: P-1 int64; ``oktopk.balance.counts``: an allgather of one int64), the
boundary allreduce every tau steps (``oktopk.boundaries``), the threshold histogram
(``oktopk.threshold``: an allreduce of 34 int32 per round), the validation allreduce
(``topk.validate``), and on refresh steps the allgatherv of all reduced nonzeros
(``oktopk.refresh``: up to 2k(P-1) words, amortised over tau').
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._result import SparseResult
from .._types import ReduceOp
from ..comm._topology import topology
from ..primitives import select_abs_ge, topk_abs
from .._registry import register
from ._common import WordCost, TopkOutcome, TopkState, index_dtype, log2_ceil, sorted_member
from ._global_threshold import COUNT_RANGE, histogram_threshold
from ..wire import round_values
from ..wire._values import rounding_error
from ..wire._exchange import gather_entries
from ..wire._pack import COO
from ._oktopk_phases import allgather_blocks, balance, split_and_reduce
from .selectors import (Threshold, min_abs, positive_threshold, reference_threshold,
                        smallest_positive)

__all__ = ["oktopk", "cost", "region_boundaries", "boundary_proposal", "proposed_cuts", "auto_tau",
           "GLOBAL_FEEDBACK", "AUTO_TAU", "SHARE_NOISE"]

#: count feedback of the global threshold: (low, high, scale) -- T < low*k divides the threshold
#: by scale, T > high*k multiplies it (the reference code's VGG values).
GLOBAL_FEEDBACK = (2 / 3, 4 / 3, 1.008)


#: ``tau="auto"``: the repartition period when the regions' shares are steady (the paper's tau).
AUTO_TAU = 64
#: ``tau="auto"``: repartition every step when the expected excess of the fullest region over
#: its fair share, ``sqrt(2 ln P * P / k)``, is above this (few selected entries per region).
SHARE_NOISE = 0.05


def auto_tau(k: int, p: int) -> int:
    """The repartition period ``tau="auto"`` stands for: 1 or :data:`AUTO_TAU`.

    A region's count of selected entries fluctuates from step to step by about
    ``sqrt(P / k)`` of its share when the ranks select nearly the same indices (a shared
    gradient component: the region then holds P copies of ~k/P indices), and the fullest of P
    regions by ``sqrt(2 ln P)`` times that. Boundaries computed on an earlier step cannot follow
    such noise, so above ``SHARE_NOISE`` the regions are recomputed from this step's selections
    (one allreduce of P-1 int64, about the threshold histogram's cost; docs/topk.md has the
    reduce phase's share with tau = 64 and with tau = 1).
    """
    if p < 2 or k < 1:
        return AUTO_TAU
    return 1 if math.sqrt(2.0 * math.log(p) * p / k) > SHARE_NOISE else AUTO_TAU


def cost(p: int, k: int, n: int) -> WordCost:
    """Words received per rank (non-refresh upper bound) and latency of ``oktopk`` on p ranks."""
    return WordCost(6.0 * k * (p - 1) / p, 2.0 * p + 2.0 * log2_ceil(p))


def region_boundaries(comm: Any, selected: Any, n: int) -> np.ndarray:
    """Return the P+1 region boundaries (host int64) averaged over the ranks' local selections.

    Rank proposals: ``selected[i*c]`` for i = 1..P-1, ``c = len(selected) // P``; a rank with
    fewer than P selected entries proposes equal split points ``i*n // P`` instead.
    """
    p, xp = comm.size, comm.xp
    if p == 1:
        return np.array([0, n], dtype=np.int64)
    proposal = boundary_proposal(xp, selected, n, p)
    total = xp.empty_like(proposal)
    cuts = comm.fetch(comm.allreduce(proposal, total, ReduceOp.SUM,
                                     op_name="oktopk.boundaries"), total) // p
    return np.concatenate([[0], cuts, [n]]).astype(np.int64)


def boundary_proposal(xp: Any, selected: Any, n: int, p: int) -> Any:
    """One rank's P-1 proposed cuts (int64 array of ``xp``): see :func:`proposed_cuts`."""
    return xp.asarray(proposed_cuts(selected, n, p), dtype=np.int64)


def proposed_cuts(selected: Any, n: int, p: int) -> Any:
    """``selected[i*c]`` for i = 1..P-1, ``c = len(selected) // P`` (a slice of ``selected``,
    an array or a list), or ``i*n // P`` when fewer than P entries were selected."""
    c = len(selected) // p
    if c > 0:
        return selected[c:p * c:c]
    return [i * n // p for i in range(1, p)]


def _stale(state: TopkState, n: int, p: int) -> bool:
    b = state.boundaries
    return b is None or b.shape[0] != p + 1 or int(b[-1]) != n


def _padded(comm: Any, state: TopkState) -> bool:
    """Use the padded allgather when asked to, or when the backend has no native allgatherv."""
    if state.padded_allgather is not None:
        return bool(state.padded_allgather)
    return not comm.native_allgatherv


def _refresh(comm: Any, red: Any, lo: int, hi: int, k: int, n: int, state: TopkState
             ) -> tuple[Any, Any, tuple]:
    """Gather all reduced nonzeros; return their exact top-k, set the global threshold, and
    this owner's rounding errors of the gathered values (as remainders) when the wire rounds."""
    wire, xp = state.wire or COO, comm.xp
    nz_i, nz_v = select_abs_ge(red, smallest_positive(red.dtype))
    gidx = nz_i.astype(index_dtype(n)) + lo
    parts, counts = gather_entries(comm, gidx, nz_v, "oktopk.refresh", wire, lo, hi)
    all_i = xp.concatenate([a for a, _ in parts])
    all_v = xp.concatenate([b for _, b in parts])
    total = int(counts.sum())
    state.last["global_count"] = total
    if total == 0:
        state.global_th = smallest_positive(red.dtype)
        return all_i, all_v, ()
    pos, val = topk_abs(all_v, min(k, total))
    state.global_th = positive_threshold(min_abs(val), red.dtype)
    res_i = all_i[pos]
    if not wire.rounds(red.dtype):
        return res_i, val, ()
    reached = sorted_member(gidx, res_i)
    return res_i, val, ((gidx[reached], rounding_error(nz_v, parts[comm.rank][1])[reached]),)


def _select_balance_gather(comm: Any, red: Any, lo: int, k: int, n: int,
                           state: TopkState) -> tuple[Any, Any, tuple]:
    """Select ``|red| >= global threshold``, balance the selections, allgather them.

    Quantile policy: the threshold of this step from the allreduced histogram of every region's
    nonzero sums (:mod:`._global_threshold`). Reference policy: the shared threshold as it is,
    corrected afterwards from the count T alone (GLOBAL_FEEDBACK), for the next step.
    """
    if reference_threshold(state.selector):
        sel_i, sel_v = select_abs_ge(red, state.global_th)
    else:
        nz_i, nz_v = select_abs_ge(red, smallest_positive(red.dtype))
        state.global_th, _ = histogram_threshold(comm, comm.xp.abs(nz_v), k, n,
                                                 state.global_th, red.dtype)
        pos, sel_v = select_abs_ge(nz_v, state.global_th)
        sel_i = nz_i[pos]
    gidx = sel_i.astype(index_dtype(n)) + lo
    counts = comm.allgather_counts(int(gidx.shape[0]), "oktopk.balance.counts")
    total = int(counts.sum())
    if reference_threshold(state.selector):
        low, high, scale = GLOBAL_FEEDBACK
        if total < low * k:
            state.global_th = positive_threshold(state.global_th / scale, red.dtype)
        elif total > high * k:
            state.global_th = positive_threshold(state.global_th * scale, red.dtype)
    elif total > COUNT_RANGE[1] * k:  # ties the threshold cannot split
        gidx, sel_v, counts = cut_ties(comm, gidx, sel_v, counts, k)
        total = int(counts.sum())
    state.last["global_count"] = total
    wire, remainders = state.wire or COO, ()
    if wire.rounds(sel_v.dtype):  # rounded once, here: balance and allgather move them as is
        _, rounded = round_values(sel_v, wire.values)
        remainders, sel_v = ((gidx, rounding_error(sel_v, rounded)),), rounded
    if total == 0:
        return gidx, sel_v, remainders
    blk_i, blk_v, blocks = balance(comm, gidx, sel_v, counts, wire, n)
    topo = topology(comm) if comm.size > 1 else None
    return (*allgather_blocks(comm, blk_i, blk_v, blocks, n, padded=_padded(comm, state),
                              wire=wire, topo=topo), remainders)


def cut_ties(comm: Any, idx: Any, val: Any, counts: np.ndarray, k: int
             ) -> tuple[Any, Any, np.ndarray]:
    """Of a global selection of more than k entries (``counts``: every rank's, its region's in
    ascending index order), keep those above the least selected magnitude and, of those at it
    (ties), the lowest indices up to k in all; return this rank's entries and every rank's new
    count. Two small collectives: the least magnitude's minimum and the counts above it."""
    xp = comm.xp
    mag = xp.abs(val)
    least = xp.full(1, np.inf, dtype=np.float64)
    if mag.shape[0]:
        least[0] = mag.min()
    comm.allreduce(least, least, ReduceOp.MIN, op_name="oktopk.ties").wait()
    above = mag > least[0]
    above_counts = comm.allgather_counts(int(xp.count_nonzero(above)), "oktopk.ties.counts")
    tied = counts - above_counts
    quota = np.clip(k - int(above_counts.sum()) - (np.cumsum(tied) - tied), 0, tied)
    at = ~above
    keep = xp.flatnonzero(above | (at & (xp.cumsum(at) <= int(quota[comm.rank]))))
    return idx[keep], val[keep], above_counts + quota


def oktopk(comm: Any, x: Any, k: int, state: TopkState) -> TopkOutcome:
    """Ok-Topk: split-and-reduce over balanced regions, then a thresholded, balanced allgather."""
    n, p = int(x.shape[0]), comm.size
    refresh = state.refresh or state.global_th is None or state.k != k or k >= n
    state.k = k
    sel = state.selector.select(x, k, refresh=state.refresh)
    state.last = {"refresh": refresh, "local_count": sel.count}
    if state.repartition(auto_tau(k, p)) or _stale(state, n, p):
        state.boundaries = region_boundaries(comm, sel.indices, n)
        state.last["repartition"] = True
    red, lo, errors = split_and_reduce(comm, sel.indices, sel.values, state.boundaries,
                                       state.wire or COO)
    if refresh:
        hi = int(state.boundaries[comm.rank + 1])
        res_i, res_v, remainders = _refresh(comm, red, lo, hi, k, n, state)
    else:
        res_i, res_v, remainders = _select_balance_gather(comm, red, lo, k, n, state)
    member = sorted_member(sel.indices, res_i)
    included = sel.indices[member]
    if errors is not None:  # this rank's sent values that reached the result
        remainders = ((included, errors[member]),) + remainders
    return TopkOutcome(SparseResult(res_i, res_v, n), included, sel, remainders)


ALGORITHM = register("topk", "oktopk", oktopk, cost=cost, selector=Threshold)
