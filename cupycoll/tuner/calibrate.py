"""``python -m cupycoll tune``: measure alpha, beta and gamma on this machine, write a profile.

Run it under ``mpiexec`` with the ranks the job will use (it prices the communicator it is
given). Every measurement is the median over repeats of the slowest rank (ranks timed together,
so the contention of a real call is in the numbers):

- native collectives: allreduce of 8 B and of ``LARGE`` B; alpha (per round) and beta (per
  byte :class:`~cupycoll.sparse._cost.Cost` books) from the two points, and its time at
  ``CURVE_SIZES`` in between (``native_curve``: each native collective is priced by its size);
- point-to-point: an exchange of 8 B with the two ring neighbours, of 8 B with every peer
  (alpha_msg: the extra per peer, from P = 4 on) and of ``LARGE / P`` B with every peer (beta);
- gamma (local work, the primitives the algorithms use): ``merge`` a P-way merge_sorted of 1-D
  float32 parts (unchecked, as the algorithms merge), per entry; ``merge2`` the same of two of
  the parts (numba's two-way merge, recursive doubling's every round); ``fold`` a merge of
  16-wide rows (half of each part's indices shared: most rows are added) minus the same merge
  of 1-D values, per element beyond the first of each row, and ``fold2`` the same of two of
  the parts (the two-way merge of rows); ``row`` a gather of 16-wide float32
  rows, per element; ``dense`` the dense algorithm's own passes over n, per element, and
  ``dense_row`` its work per row written or read back (from its host pass at 30% and 1%
  density); ``dense_rows`` and ``dense_wide`` the same pass over rows of 2 and of 32 (a 2-D
  buffer's union scan tests each row), per row and per element; ``scan`` presence bitmap
  packing and unpacking plus flatnonzero, per position; ``code`` the wire codec's encode +
  decode of a sorted index stream (10 % density), per index and direction; ``fill`` the dense
  output's densify (n zeroed, 10 % of the rows written), per element; ``union`` mask's index
  work: the union of the merge's P index sets and the first set's positions in it, per index
  entering;
- links (when the communicator spans several nodes: MPI's shared-memory split or
  ``CUPYCOLL_RANKS_PER_NODE``): the point-to-point measurement again among the ranks of each
  node (``links["intra"]``) and along the rails between nodes (``links["inter"]``), which the
  node-aware algorithms' phases are priced by (``Profile.link``);
- cold: the dense passes, the densify and the native allreduces of ``COLD_FROM`` bytes or more
  run after a sweep of the caches (their inputs read again): in a job other work runs between
  two calls, and a tight loop would price them with their buffers in the caches;
- ``fixed``: every algorithm on a small call (``FIXED_N``, ``FIXED_ENTRIES`` a rank: nothing
  but its rounds and overheads), the algorithms timed in turn as bench_sparse times them, in
  ``FIXED_PASSES`` passes spread over the tune (their median), minus what alpha, beta and
  gamma already account for.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

from .._types import ReduceOp
from ..comm._topology import node_ids as _node_ids
from ..primitives import _accel, merge_sorted
from ..primitives._numpy_few import TINY
from .._registry import priced
from ..sparse._common import positions_in, presence, union_of, union_of_presence
from ..sparse._cost import Cost, Shape
from ..sparse.dense import densify_into, local_pass
from ..sparse.recursive_doubling import reads_in_place
from ..wire import decode_indices, encode_indices
from .predict import rank_time
from .profile import Profile

__all__ = ["tune", "median_profile", "interleaved", "LARGE", "FIXED_N", "FIXED_ENTRIES"]

#: bytes of the large native allreduce (and of the P-1 large point-to-point messages together).
LARGE = 4 << 20


#: the seed of :func:`interleaved`'s orders (fixed: every rank draws the same).
ORDER_SEED = 20261129


def interleaved(calls: dict[str, Callable[[], Any]], iters: int, warmup: int,
                comm: Any, pause: float = 0.0,
                prepare: dict[str, Callable[[], Any]] | None = None) -> dict[str, np.ndarray]:
    """Time every call ``iters`` times, one of each per round, after a barrier each; a sample
    is the slowest rank's seconds. So drift on a shared machine hits the calls alike, and each
    call runs after the others, as it does in a job (between other work, not in a tight loop of
    itself, where a call runs faster than in a job). Each round takes its own order (a seeded
    shuffle, the same on every rank): a rotation would keep every call after the same one,
    whose caches and buffers it then always inherits (docs/tuning.md). ``pause``: seconds each
    rank sleeps before each barrier, so every call starts on a core that was idle (as one
    after a library call that blocks in its waits does). ``prepare``: name -> what runs before
    each of that call's barriers, untimed (a fresh copy of an input the call overwrites)."""
    names, prepare = list(calls), prepare or {}
    for _ in range(warmup):
        for name in names:
            if name in prepare:
                prepare[name]()
            calls[name]()
    samples = {name: np.empty(iters) for name in names}
    orders = np.random.default_rng(ORDER_SEED)
    for i in range(iters):
        for name in (names[j] for j in orders.permutation(len(names))):
            if name in prepare:
                prepare[name]()
            if pause:
                time.sleep(pause)
            comm.barrier()
            t0 = time.perf_counter()
            calls[name]()
            samples[name][i] = time.perf_counter() - t0
    if comm.size == 1:
        return samples
    from mpi4py import MPI

    slowest = {name: np.empty(iters) for name in names}
    for name in names:
        comm.mpi_comm.Allreduce(samples[name], slowest[name], op=MPI.MAX)
    return slowest


def _timed(comm: Any, fn: Callable[[], Any], repeats: int, cold: tuple | None = None
           ) -> float:
    """Median over ``repeats`` of the slowest rank's seconds for ``fn()`` (one warm-up).
    ``cold``: the caches are swept before each repeat (:func:`_sweep`, untimed) and these
    inputs of ``fn`` read again, so ``fn``'s own kept buffers start out of the caches and its
    inputs in them, as in a job, where other work runs between two calls."""
    prepare = None if cold is None else {"fn": lambda: _sweep(comm.xp, cold)}
    return float(np.median(interleaved({"fn": fn}, repeats, 1, comm, prepare=prepare)["fn"]))


def _last_level_cache() -> int:
    """Bytes of the L3 cache as the system reports them (0 where it does not)."""
    try:
        return max(os.sysconf("SC_LEVEL3_CACHE_SIZE"), 0)
    except (ValueError, OSError):  # a name this system does not know
        return 0


#: bytes :func:`_sweep` reads: twice the last-level cache, at least 64 MiB.
SWEEP_BYTES = max(2 * _last_level_cache(), 64 << 20)
_SWEPT: dict[Any, Any] = {}


def _sweep(xp: Any, inputs: tuple) -> None:
    """Read SWEEP_BYTES of other data (evicting what the last repeat left in the caches),
    then ``inputs`` (a call's input is fresh from the work that made it)."""
    if xp not in _SWEPT:
        _SWEPT[xp] = xp.ones(SWEEP_BYTES // 4, np.float32)  # written: real pages to read
    _SWEPT[xp].sum()
    for a in inputs:
        a.sum()


#: bytes of the native allreduces ``tune`` times (the curve of Profile.native_time).
CURVE_SIZES = (8, 2 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, LARGE)
#: native allreduces of this many bytes or more are timed cold (``_timed``): their buffers
#: and the transport's exceed a core's cache, and a job's calls find them swept out.
COLD_FROM = 1 << 20


def _native(comm: Any, repeats: int) -> tuple[float, float, list[list[float]]]:
    """alpha (per round) and beta (per booked byte) of a native allreduce, from 8 B and LARGE,
    and the curve of its time by booked bytes at CURVE_SIZES (monotone: a point below the one
    before takes its value)."""
    p, xp = comm.size, comm.xp
    curve: list[list[float]] = []
    for nbytes in CURVE_SIZES:
        a = xp.ones(nbytes // 4, np.float32)
        seconds = _timed(comm, lambda a=a, b=xp.empty_like(a): comm.allreduce(
            a, b, ReduceOp.SUM, op_name="tune").wait(), repeats,
            (a,) if nbytes >= COLD_FROM else None)
        volume = Cost().allreduce("tune", p, a.nbytes).native_bytes
        curve.append([float(volume), max(seconds, curve[-1][1] if curve else 0.0)])
    (b_small, t_small), (b_large, t_large) = curve[0], curve[-1]
    beta = max((t_large - t_small) / max(b_large - b_small, 1), 0.0)
    return max(t_small - beta * b_small, 0.0), beta, curve


def _p2p(comm: Any, repeats: int, group: list[int] | None = None
         ) -> tuple[float, float, float]:
    """alpha (per round), alpha_msg (per peer message) and beta (per byte) of an exchange
    among ``group`` (this rank's group of a partition of the ranks; default all): 8 B from the
    two group neighbours, 8 B from every group peer, LARGE / len(group) B from every group peer.
    Collective over ``comm`` (every rank times its own group at once)."""
    xp, rank = comm.xp, comm.rank
    group = list(range(comm.size)) if group is None else list(group)
    p, at = len(group), group.index(rank)
    every = [group[(at + s) % p] for s in range(1, p)]

    def exchange(peers: list[int], nbytes: int) -> float:
        send, recv = xp.ones(nbytes, np.uint8), xp.empty((comm.size, nbytes), np.uint8)
        return _timed(comm, lambda: comm.exchange(
            [(q, send) for q in peers], [(q, recv[q]) for q in peers], "tune").wait(), repeats)
    # pairs: with one peer, a rank talks to its group neighbours (both directions, one round)
    ring = sorted({group[(at + 1) % p], group[(at - 1) % p]} - {rank})
    one = exchange(ring, 8)
    t_all, large = exchange(every, 8), max(LARGE // p, 8)
    t_large = exchange(every, large)
    alpha_msg = max((t_all - one) / max(p - 1 - len(ring), 1), 0.0) if p > 3 else 0.0
    beta = max((t_large - t_all) / max((p - 1) * (large - 8), 1), 0.0)
    return max(one - alpha_msg * len(ring), 0.0), alpha_msg, beta


def _links(comm: Any, repeats: int) -> dict[str, dict[str, float]]:
    """Point-to-point prices per link kind when ``comm`` spans several nodes (nodes from
    :func:`cupycoll.comm._topology.topology`: MPI's shared-memory split or
    ``CUPYCOLL_RANKS_PER_NODE``): ``intra`` among the ranks of each node (when a node holds
    two), ``inter`` along the rails (the ranks of the same place in every node), as the
    node-aware algorithms use them. Empty on one node."""
    from ..comm._topology import topology

    topo = topology(comm)
    if comm.size == 1 or topo.count < 2:
        return {}
    node = topo.nodes[comm.rank]
    place = topo.members[node].index(comm.rank)
    groups = {"inter": [m[place] for m in topo.members if place < len(m)]}
    if topo.width > 1:
        groups["intra"] = list(topo.members[node])
    links = {}
    for kind in ("intra", "inter"):  # the same order on every rank: the timings are collective
        if kind in groups:
            alpha, alpha_msg, beta = _p2p(comm, repeats, groups[kind])
            links[kind] = {"alpha_p2p": alpha, "alpha_msg": alpha_msg, "beta_p2p": beta}
    return links


def _local(comm: Any, repeats: int, k: int = 1 << 16, n: int = 1 << 20) -> dict[str, float]:
    """Seconds per unit of each kind of local work (see predict.work)."""
    p, xp = comm.size, comm.xp
    rng = np.random.default_rng(comm.rank)
    parts = [(xp.asarray(np.sort(rng.choice(8 * k, k, replace=False))),
              xp.ones(k, np.float32)) for _ in range(max(p, 2))]
    # 16-wide rows, half of each part's indices shared with another: most rows are added
    narrow = [(xp.asarray(np.sort(rng.choice(2 * k, k, replace=False))),
               xp.ones(k, np.float32)) for _ in range(max(p, 2))]
    wide = [(i, xp.ones((k, 16), np.float32)) for i, _ in narrow]
    rows = xp.ones((k, 16), np.float32)
    order = xp.asarray(rng.permutation(k))
    idx = xp.asarray(np.sort(rng.choice(n, n // 10, replace=False)).astype(np.int32))

    ones = xp.ones(3 * n // 10, np.float32)  # values of the largest index set below

    def dense_local(idx: Any, width: int = 1) -> None:  # the dense pass (no allreduce)
        rows, values = n // width, ones[:idx.shape[0] * width]
        values = values.reshape(-1, width) if width > 1 else values
        if xp is np:
            local_pass(idx, values, rows)
        else:
            full = xp.zeros((rows, width) if width > 1 else rows, np.float32)
            full[idx] = values
            full[xp.flatnonzero(full.reshape(rows, -1).any(axis=1))]

    def scan() -> None:
        union_of_presence(xp.unpackbits(xp.packbits(presence(idx, n)))[:n].view(bool),
                          idx.dtype)

    def code() -> None:
        decode_indices(encode_indices(idx, 0, n), idx.dtype)

    sets = [i for i, _ in parts]

    def union() -> None:
        positions_in(union_of(sets, sets[0].dtype), sets[0])

    out = xp.empty(n, np.float32)

    per_row = _timed(comm, lambda: rows[order], repeats) / (k * 16)
    # the dense pass at 30% and 1% of n: its part per row written or read back (the rank's
    # scattered rows and the union's copied ones, 2 per entry of one rank) and per position
    many = xp.asarray(np.sort(rng.choice(n, 3 * n // 10, replace=False)).astype(np.int32))
    few = idx[::10]
    dense_many, dense_few = (_timed(comm, lambda: dense_local(i), repeats, (i, ones))
                             for i in (many, few))
    dense_row = max(dense_many - dense_few, 0.0) / (2 * (many.shape[0] - few.shape[0]))
    # the same pass over n elements as rows of 2 and of 32 at 1%: a 2-D buffer's union scan
    # tests each row, so its cost per element falls with the width (a part per row, a part
    # per element: docs/tuning.md)
    row_pass = {}
    for width in WIDE_ROWS:
        picked = xp.asarray(np.sort(rng.choice(n // width, n // width // 100, replace=False))
                            .astype(np.int32))
        seconds = _timed(comm, lambda: dense_local(picked, width), repeats, (picked, ones))
        written = 2 * picked.shape[0] * width * dense_row
        row_pass[width] = max(seconds - written, 0.0) / (n // width)
    narrow_row, wide_row = (row_pass[w] for w in WIDE_ROWS)
    dense_wide = max(wide_row - narrow_row, 0.0) / (WIDE_ROWS[1] - WIDE_ROWS[0])
    # unchecked, as the algorithms merge (their parts are sorted and unique by construction)
    merge = _timed(comm, lambda: merge_sorted(parts, checked=False), repeats)
    merge2 = _timed(comm, lambda: merge_sorted(parts[:2], checked=False), repeats)
    folds = _timed(comm, lambda: merge_sorted(wide, checked=False), repeats) - _timed(
        comm, lambda: merge_sorted(narrow, checked=False), repeats)
    folds2 = _timed(comm, lambda: merge_sorted(wide[:2], checked=False), repeats) - _timed(
        comm, lambda: merge_sorted(narrow[:2], checked=False), repeats)
    return {"merge": merge / (len(parts) * k), "merge2": merge2 / (2 * k),
            "fold": max(folds, 0.0) / (len(parts) * k * 15),
            "fold2": max(folds2, 0.0) / (2 * k * 15),
            "row": per_row,
            "dense": max(dense_few - 2 * few.shape[0] * dense_row, 0.0) / n,
            "dense_row": dense_row,
            "dense_wide": dense_wide,
            "dense_rows": max(narrow_row - WIDE_ROWS[0] * dense_wide, 0.0),
            "scan": _timed(comm, scan, repeats) / n,
            "code": _timed(comm, code, repeats) / (2 * idx.shape[0]),
            "union": _timed(comm, union, repeats) / (len(parts) * k),
            "fill": _timed(comm, lambda: densify_into(out, idx, ones[:idx.shape[0]]),
                           repeats, (idx, ones)) / n}


#: the row widths whose dense passes give ``dense_rows`` and ``dense_wide`` (per row and per
#: element of a 2-D buffer's union scan, the line through the two).
WIDE_ROWS = (2, 32)


#: the small call ``fixed`` is measured on: n, and entries per rank. TINY entries a rank: the
#: ranks' sum exceeds TINY, so merges take the path of calls below LOOP_SUM elements (numba's
#: pass, or without numba the one-sort path of calls below SMALL), not the Python fold of the
#: smallest sums (cheaper: a fixed cost measured there under-prices every other call; calls
#: of more than LOOP_SUM elements pay more than this fixed cost; docs/tuning.md).
FIXED_N, FIXED_ENTRIES = 1024, TINY
#: passes of the fixed-cost measurement, spread over the tune (a slow spell of a shared machine
#: seconds long then moves one pass, not the median of them).
FIXED_PASSES = 3


def _fixed_pass(comm: Any, repeats: int) -> dict[str, float]:
    """Median seconds of every algorithm on the small call, timed in turn (:func:`interleaved`),
    as calls run in a job and in bench_sparse."""
    from ..sparse import sparse_allreduce

    rng = np.random.default_rng([7, comm.rank])
    idx = comm.xp.asarray(np.sort(rng.choice(FIXED_N, FIXED_ENTRIES, replace=False))
                          .astype(np.int32))
    val = comm.xp.ones(FIXED_ENTRIES, np.float32)
    samples = interleaved({name: lambda a=name: sparse_allreduce(idx, val, FIXED_N, algorithm=a,
                                                                 comm=comm)
                           for name in priced("sparse")}, repeats, 1, comm)
    return {name: float(np.median(seconds)) for name, seconds in samples.items()}


def _fixed(comm: Any, passes: list[dict[str, float]], profile: Profile) -> dict[str, float]:
    """Per-call cost of every algorithm beyond its modelled traffic and work: the median of the
    passes' times of the small call, minus what ``profile`` predicts for it."""
    p, counts = comm.size, (FIXED_ENTRIES,) * comm.size
    shape = Shape(p, FIXED_N, 0, 4, 4, counts, host=comm.xp is np,
                  in_place=reads_in_place(comm, counts, FIXED_N, 4, 4))
    fixed = {}
    for name in passes[0]:
        model = max(rank_time(name, shape, r, profile) for r in range(p))
        fixed[name] = max(float(np.median([t[name] for t in passes])) - model, 0.0)
    return fixed


def median_profile(profiles: list[Profile]) -> Profile:
    """Every price the median of the profiles' (name and meta from the first): ``tune --runs``.

    A slow spell of a shared machine that spans a whole tune moves every price of that run
    together (docs/tuning.md); the median of three runs is the machine, not the spell."""
    def merged(values: list[Any]) -> Any:
        if isinstance(values[0], dict):
            return {key: merged([v[key] for v in values if key in v]) for key in values[0]}
        if isinstance(values[0], (int, float)) and not isinstance(values[0], bool):
            return float(np.median(values))
        if isinstance(values[0], list) and len({len(v) for v in values}) == 1:
            return [merged([v[i] for v in values]) for i in range(len(values[0]))]  # curves
        return values[0]

    data = [p.as_dict() for p in profiles]
    prices = {key: merged([d[key] for d in data]) for key in data[0] if key not in ("name", "meta")}
    return Profile.from_dict({**data[0], **prices})


def tune(comm: Any, repeats: int = 15, name: str = "tuned", runs: int = 1) -> Profile:
    """Measure this machine's profile over ``comm`` (collective; every rank returns it);
    ``runs`` > 1: that many measurements, every price their median (:func:`median_profile`)."""
    if runs > 1:
        return median_profile([tune(comm, repeats, name) for _ in range(runs)])
    _accel.ready()  # the local prices are numba's where it runs: not numpy's while it loads
    passes = [_fixed_pass(comm, repeats)]
    alpha_n, beta_n, curve = _native(comm, repeats) if comm.size > 1 else (0.0, 0.0, [])
    alpha_p, alpha_m, beta_p = _p2p(comm, repeats) if comm.size > 1 else (0.0, 0.0, 0.0)
    passes.append(_fixed_pass(comm, repeats))
    gamma = _local(comm, repeats)
    passes += [_fixed_pass(comm, repeats) for _ in range(FIXED_PASSES - len(passes))]
    fixed = _fixed(comm, passes, Profile(name, alpha_p, beta_p, alpha_n, beta_n, gamma, alpha_m,
                                         native_curve=curve))
    meta = {"ranks": comm.size, "backend": getattr(comm, "backend", "?"),
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    links = _links(comm, repeats)
    if links:
        meta["nodes"] = len(set(_node_ids(comm)))
    profile = Profile(name, alpha_p, beta_p, alpha_n, beta_n, gamma, alpha_m, fixed, meta,
                      links, curve)
    _SWEPT.clear()  # the sweep's buffer is not kept past the tune
    if getattr(comm, "mpi_comm", None) is not None and comm.size > 1:
        profile = Profile.from_dict(comm.mpi_comm.bcast(profile.as_dict(), root=0))
    return profile

