"""Time of one ``sparse_allreduce`` call predicted from the cost models and a :class:`Profile`.

Per rank: ``fixed[algorithm]`` + alpha x rounds + alpha_msg x point-to-point messages + beta x
bytes (point-to-point and native collectives priced apart, from the exact per-op traffic of each
algorithm's ``cost``) + gamma x local work. The call takes as long as its slowest rank (the ranks with the fewest and the most
entries are evaluated: the first receives the most, the second merges and sends the most).

Local work, in the units ``gamma`` prices (N = total nnz, U = union, W = max(width, 1)):

- ``merge``: entries entering a k-way merge (allgather: N; split: its region's N/P);
- ``merge2``: entries entering a two-way merge (recursive doubling: both partners' partial
  results every sparse round);
- ``row``: value elements copied or scattered besides the merge (rows packed to send, result
  rows);
- ``dense``: value elements of an n-long dense pass (the ``dense`` algorithm's union scan of
  1-D values; recursive doubling's dense rounds: fill, scatter, gather);
- ``dense_rows``, ``dense_wide``: rows and value elements of the ``dense`` algorithm's union
  scan of rows (width > 1), which tests each row: its cost per element falls with the width;
- ``dense_row``: value elements the ``dense`` algorithm writes into its n-long buffer (the
  rank's rows) or reads back from it (the union's);
- ``scan``: dense positions scanned for presence (bitmap, presence fields, flatnonzero).
- ``code`` (compact wire only): indices encoded or decoded, about two per entry received.
- ``fold``, ``fold2``: value elements of rows merged by a k-way and by a two-way merge
  beyond the first of each row (``merge`` or ``merge2`` prices the entry and its first
  element: a merge of rows is those two, no ``row``);
- ``union``: indices entering mask's union of index sets (and its lookup of its own);
- ``fill``: elements of an n-long output zeroed with its rows written (``output="dense"``:
  the ``dense`` algorithm's input before its in-place allreduce, every other one's result;
  mask: the U rows its allreduce reduces).
"""

from __future__ import annotations

import dataclasses
import sys

from .._registry import record
from ..sparse._cost import Cost, Shape, validation_cost
from ..wire._choice import DEFAULT_CODE_COST
from .profile import Profile

__all__ = ["work", "predict", "rank_time", "comm_time", "local_time", "coding_time",
           "densified_output"]


def work(algorithm: str, shape: Shape, rank: int, profile: Profile | None = None
         ) -> dict[str, float]:
    """Units of local work ``rank`` does in ``algorithm`` (see the module docstring): the
    algorithm's own work model (:attr:`cupycoll._registry.Algorithm.work`; none: no work)."""
    model = record("sparse", algorithm).work
    return model(shape, rank, profile) if model is not None else {}


def comm_time(cost: Cost, profile: Profile) -> float:
    """alpha x rounds + alpha_msg x messages + beta x bytes point-to-point (bytes read in
    place: none, the merge that reads them prices them); native collectives each by the
    profile's measured curve (:meth:`Profile.native_time`), else alpha + beta x bytes."""
    p2p_bytes = cost.copied_bytes - cost.native_bytes
    p2p_messages = cost.messages_received - cost.native_messages
    p2p = (profile.alpha_p2p * (cost.rounds - cost.native_rounds)
           + profile.alpha_msg * p2p_messages + profile.beta_p2p * p2p_bytes)
    if profile.native_curve and len(cost.native_volumes) == cost.native_rounds:
        return p2p + sum(profile.native_time(v) for v in cost.native_volumes)
    return (p2p + profile.alpha_native * cost.native_rounds
            + profile.beta_native * cost.native_bytes)


def local_time(units: dict[str, float], profile: Profile) -> float:
    """Seconds of ``units`` of local work at ``profile``'s prices."""
    return sum(profile.price(k) * v for k, v in units.items())


def coded_indices(cost: Cost, shape: Shape) -> float:
    """Indices a rank encodes or decodes on the compact wire: about two per entry received
    point to point (the entries' exchanges; a native collective, the validation's or a dense
    allreduce, carries no coded index)."""
    if not shape.wire.compact:
        return 0.0
    return 2.0 * (cost.bytes_received - cost.native_bytes) / max(shape.entry_bytes, 1)


def coding_time(cost: Cost, shape: Shape, profile: Profile) -> float:
    """Seconds of coding the indices of ``cost``'s traffic (compact wire only)."""
    return profile.gamma.get("code", DEFAULT_CODE_COST) * coded_indices(cost, shape)


def rank_time(algorithm: str, shape: Shape, rank: int, profile: Profile) -> float:
    """Seconds of ``rank`` in one call: the algorithm's fixed cost, traffic (validation
    included), local work and index coding, and a dense output's writing; or the algorithm's
    own time model (:attr:`cupycoll._registry.Algorithm.time`)."""
    found = record("sparse", algorithm)
    if found.time is not None:
        return found.time(shape, rank, profile, sys.modules[__name__])
    cost = validation_cost(shape.size).add(found.cost(shape, rank, profile))
    local = local_time(work(algorithm, shape, rank, profile), profile)
    return (profile.fixed.get(algorithm, 0.0) + comm_time(cost, profile) + local
            + coding_time(cost, shape, profile) + densified_output(algorithm, shape, profile))


def densified_output(algorithm: str, shape: Shape, profile: Profile) -> float:
    """Seconds of writing a sparse result into the n-vector of ``output="dense"``."""
    if shape.output != "dense" or record("sparse", algorithm).dense_output is not None:
        return 0.0  # an algorithm with a dense variant prices it in its work model
    return profile.price("fill") * shape.n * max(shape.width, 1)


def predict(algorithm: str, shape: Shape, profile: Profile) -> float:
    """Predicted seconds of one call (its slowest rank); estimated shapes (no inputs) use the
    uniform-random union estimates of the cost models."""
    shape = dataclasses.replace(shape, inputs=None) if shape.inputs is not None else shape
    if shape.size == 1:
        return rank_time(algorithm, shape, 0, profile)
    ranks = {min(range(shape.size), key=shape.nnz.__getitem__),
             max(range(shape.size), key=shape.nnz.__getitem__)}
    if record("sparse", algorithm).time is not None:  # e.g. a short last node's rails
        ranks.add(shape.size - 1)
    return max(rank_time(algorithm, shape, r, profile) for r in sorted(ranks))
