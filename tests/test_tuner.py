"""The tuner: profiles, auto's choice from predicted time, the simulator, the dense algorithm's
folded presence (multi-rank) and ``tune`` (multi-rank)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

import cupycoll as cc
from cupycoll._registry import priced
from cupycoll.sparse import auto
from cupycoll.sparse._cost import Cost, Shape
from cupycoll.tuner import Profile, default_profile, load_profile, save_profile
from cupycoll.tuner.simulate import TOPK_MODELS, sparse_rows, topk_rows

from ._mpi import Batch, run_mpi

ZERO_WORK = {"merge": 0.0, "row": 0.0, "dense": 0.0, "scan": 0.0}


def shape(p, n, k, width=0):
    return Shape(p, n, width, 4, 4, (k,) * p)


# one launch per rank count runs these workers in turn (auto_learn.py last: it sets
# CUPYCOLL_NUMBA=on for the rest of its process)
LAUNCHES = Batch({
    "sparse_dense_fold.py": {p: (5,) for p in (1, 2, 3, 4, 8)},
    "auto_measure.py": {p: (7 + p,) for p in (1, 2, 3, 4)},
    "auto_learn.py": {p: (27 + p,) for p in (1, 2, 3, 4)},
}, timeout=300)


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("sparse_dense_fold.py"))
def test_dense_folded_presence_and_tune(nprocs):
    out = LAUNCHES.output("sparse_dense_fold.py", nprocs)
    assert f"ok 20 dense cases on {nprocs} ranks" in out


def test_bandwidth_only_profile_picks_fewest_bytes():
    """beta = 1 s/B and nothing else: at 50% density 1-D float32 on 4 ranks the dense allreduce
    (2 * 3/4 * (4n + n/2) B) moves less than any sparse exchange of 8-byte entries, and at
    0.1% any sparse algorithm moves far less than it."""
    bytes_only = Profile("b", 0.0, 1.0, 0.0, 1.0, ZERO_WORK)
    n = 1 << 20
    assert auto.choose(shape(4, n, n // 2), bytes_only) == "dense"
    assert auto.choose(shape(4, n, n // 1000), bytes_only) != "dense"


def test_latency_only_profile_picks_fewest_rounds():
    """alpha = 1 s per round and nothing else: a small call costs its sequential rounds. After
    validation's one: allgather 1 (one exchange: the validation told every rank's count), dense
    1 for float sums (-0 fills, a one-element tail) and summed wide integer rows (a count
    folded in), else 3 (allreduce, bitmap exchange, allgather); mask 2 (index exchange,
    allreduce). On a tie the first in MODELS wins: allgather."""
    rounds_only = Profile("a", 1.0, 0.0, 1.0, 0.0, ZERO_WORK)
    for p in (2, 3, 4, 8):
        floats = shape(p, 64, 3)
        ints = dataclasses.replace(floats, float_values=False)
        for case, dense_rounds in ((floats, 1), (ints, 3), (dataclasses.replace(ints, op="max"), 3),
                                   (dataclasses.replace(ints, width=8), 1)):
            t = auto.predicted_times(case, rounds_only)
            assert (t["allgather"], t["dense"], t["mask"]) == (2, 1 + dense_rounds, 3)
            assert auto.choose(case, rounds_only) == "allgather"
    assert auto.choose(shape(1, 64, 3), rounds_only) == "allgather"  # P = 1: no traffic


def test_mask_prices_its_union_rows_as_a_fill_and_its_own_rows_as_writes():
    """mask zeroes the union's rows (its allreduce buffer, handed back as the result) and
    writes this rank's rows into it: with wide rows the union must cost the fill rate, once,
    not the gather rate twice (that priced mask 1.4-2.4x its measured time at P = 3, 4 and
    picked allgather where mask was faster). Same nnz, identical vs disjoint indices: only
    the fill grows with the union."""
    import numpy as np

    from cupycoll.tuner.predict import work

    n, k, width, p = 1 << 14, 300, 24, 4
    rng = np.random.default_rng(5)
    shared = np.sort(rng.choice(n, k, replace=False))
    apart = [np.sort(rng.choice(np.arange(r, n, p), k, replace=False)) for r in range(p)]
    same = Shape.from_inputs([shared] * p, n, width, 4, 4)
    spread = Shape.from_inputs(apart, n, width, 4, 4)
    assert (same.union, spread.union) == (k, p * k)
    for r in range(p):
        for case, union in ((same, k), (spread, p * k)):
            units = work("mask", case, r)
            assert units["row"] == k * width and units["fill"] == union * width
            assert units["union"] == p * k and "merge" not in units and "dense" not in units
    older = Profile("o", 0.0, 0.0, 0.0, 0.0, {**ZERO_WORK, "merge": 3.0, "dense": 2.0})
    assert (older.price("union"), older.price("fill"), older.price("merge2")) == (3.0, 2.0, 3.0)
    assert dataclasses.replace(older, gamma={**older.gamma, "union": 1.0}).price("union") == 1.0


def test_a_merge_of_rows_costs_its_entries_and_folds_and_only_the_own_rows_are_copied():
    """allgather and recursive doubling price a merge of rows as ``merge`` (or ``merge2``)
    per entry plus ``fold`` (or ``fold2``, recursive doubling's two-way merges) per element
    past a row's first, which ``tune`` measures as a whole 16-wide merge less a 1-D one (a
    profile without ``fold2`` prices it as ``fold``); ``row`` counts only the rows the rank
    packs to send (its own), as the received blocks merge where they arrive. A ``row`` on
    every merged element counts the elements twice (it priced merges of 16-64-wide rows
    2-2.7x high against 1-D ones: bench/dev/bench_merge_rows.py). Recursive doubling packs
    its own rows in its first round; a later round's block is written by the merge before it
    where that merge is a host float sum of numba's size on the raw coo wire
    (``_Rounds.packed_sum``), else packed from the merge's result."""
    from cupycoll.primitives._numpy_few import few_enough
    from cupycoll.tuner.predict import work

    for p, width in ((2, 0), (2, 1), (2, 16), (3, 4), (4, 64)):
        case = shape(p, 1 << 20, 1 << 8, width)  # sparse rounds only (1/4096 dense)
        w = max(width, 1)
        for r in range(p):
            units = work("allgather", case, r)
            assert units == {"merge": case.total_nnz, "row": case.nnz[r] * w,
                             "fold": case.total_nnz * (w - 1)}
        units = work("recursive_doubling", case, 0)
        assert units["fold2"] == units["merge2"] * (w - 1) and units["dense"] == 0
        packed = units["merge2"] / 2 * w  # its half of each round's merge
        for copied in (dataclasses.replace(case, host=False), dataclasses.replace(case, op="max"),
                       dataclasses.replace(case, result_bytes=2)):
            assert work("recursive_doubling", copied, 0)["row"] == packed
        assert work("recursive_doubling", dataclasses.replace(case, op="avg"), 0) == units
        first = case.nnz[0] * w
        merged_into_block = p > 2 and not few_enough(2 * case.nnz[0] * w)
        assert units["row"] == (first if p == 2 or merged_into_block else packed)
        assert (p, width, units["row"] < packed) in ((2, width, False), (3, 4, False),
                                                     (4, 64, True))
    older = Profile("o", 0.0, 0.0, 0.0, 0.0, {**ZERO_WORK, "fold": 3.0})
    assert older.price("fold2") == 3.0
    assert dataclasses.replace(older, gamma={**older.gamma, "fold2": 1.0}).price("fold2") == 1.0


def test_dense_prices_its_rows_by_its_own_unit():
    """The dense algorithm's scatter of the rank's rows and read-back of the union's are
    priced by ``dense_row`` (a sorted write or copy; the ``row`` gather is 3-5x dearer), once
    per row of each, on top of its pass over n; a profile measured before the unit existed
    prices them as ``row``."""
    from cupycoll.tuner.predict import work

    for p, width in ((2, 0), (4, 3)):
        case = shape(p, 1 << 16, 1 << 10, width)
        units = work("dense", case, 0)
        w = max(width, 1)
        assert units["dense_row"] == (case.nnz[0] + case.union) * w and "row" not in units
        if width:  # a 2-D buffer's scan tests each row: a price per row and per element
            assert (units["dense_rows"], units["dense_wide"]) == (case.n, case.n * w)
            assert "dense" not in units
        else:
            assert units["dense"] == case.n and "dense_rows" not in units
        cheap = Profile("c", 0.0, 0.0, 0.0, 0.0, {**ZERO_WORK, "row": 1.0, "dense_row": 0.1})
        dear = dataclasses.replace(cheap, gamma={**cheap.gamma, "dense_row": 1.0})
        low, high = (auto.predicted_times(case, f) for f in (cheap, dear))
        assert low["dense"] < high["dense"] and low["allgather"] == high["allgather"]
    older = Profile("o", 0.0, 0.0, 0.0, 0.0, {**ZERO_WORK, "row": 3.0, "dense": 2.0})
    assert (older.price("dense_row"), older.price("dense_rows"), older.price("dense_wide")) \
        == (3.0, 2.0, 2.0)


def test_the_compact_wire_codes_only_the_entries_exchanged_point_to_point():
    """Index coding is priced on the entries' exchanges: the dense algorithm (one native
    allreduce of the dense vector) costs the same on the compact wire as on coo, while an
    algorithm that exchanges entries pays for coding them."""
    from cupycoll.wire._pack import COO, Wire

    case = shape(64, 1 << 24, 1 << 17)
    compact = dataclasses.replace(case, wire=Wire(True, None))
    coding = Profile("c", 0.0, 0.0, 0.0, 0.0, {**ZERO_WORK, "code": 1e-9})
    coo_times, compact_times = (auto.predicted_times(c, coding) for c in (case, compact))
    assert case.wire == COO and compact_times["dense"] == coo_times["dense"]
    assert compact_times["allgather"] > coo_times["allgather"]


def test_dense_scan_of_rows_is_priced_per_row_and_per_element():
    """At a width > 1 the dense algorithm's scan costs ``dense_rows`` per row and
    ``dense_wide`` per element (not the 1-D ``dense`` price): a dearer row test raises the
    dense prediction of rows only, in proportion to n."""
    from cupycoll.tuner.predict import work

    base = Profile("b", 0.0, 0.0, 0.0, 0.0, {**ZERO_WORK, "dense_rows": 1e-9,
                                                "dense_wide": 1e-10})
    dear = dataclasses.replace(base, gamma={**base.gamma, "dense_rows": 5e-9})
    for width, n in ((4, 1 << 16), (16, 1 << 14)):
        case = shape(2, n, n // 100, width)
        low, high = (auto.predicted_times(case, f)["dense"] for f in (base, dear))
        assert high - low == pytest.approx(4e-9 * n)
        flat = shape(2, n * width, n // 100, 0)
        flat_times = [auto.predicted_times(flat, f)["dense"] for f in (base, dear)]
        assert flat_times[0] == flat_times[1]
        assert work("dense", case, 0)["dense_wide"] == n * width


def test_recursive_doublings_rounds_are_priced_as_two_way_merges():
    """Every sparse round of recursive doubling merges two partial results (numba's two-way
    merge on the host), allgather one P-way merge: the first is priced by ``merge2``, the
    second by ``merge``, so a profile where two-way merges are cheap makes only RD cheaper."""
    from cupycoll.tuner.predict import work

    for p in (2, 3, 4, 8):
        case = shape(p, 1 << 20, 1 << 10)
        rd, ag = work("recursive_doubling", case, 0), work("allgather", case, 0)
        assert rd["merge2"] > 0 and "merge" not in rd and ag["merge"] > 0 and "merge2" not in ag
        cheap_two = Profile("c", 0.0, 0.0, 0.0, 0.0, {**ZERO_WORK, "merge": 1.0, "merge2": 0.1})
        dear_two = Profile("d", 0.0, 0.0, 0.0, 0.0, {**ZERO_WORK, "merge": 1.0, "merge2": 1.0})
        cheap, dear = (auto.predicted_times(case, f) for f in (cheap_two, dear_two))
        assert cheap["recursive_doubling"] < dear["recursive_doubling"]
        assert cheap["allgather"] == dear["allgather"] and cheap["split"] == dear["split"]


def test_blocks_read_in_place_are_booked_as_received_but_priced_as_not_copied():
    """Where a rank's peers read its sparse blocks where it wrote them (``Shape.in_place``: an
    MPI communicator of host arrays on one node), recursive doubling's cost books the same
    bytes, messages and rounds as copied blocks (``comm.stats`` books them so) and counts its
    sparse blocks in ``in_place_bytes``; the time model prices those bytes at nothing (the
    merge that reads them is priced as before), and the wire choice saves no copy by coding
    them. Dense blocks, the compact wire and every other algorithm are copied."""
    from cupycoll.sparse import allgather, recursive_doubling as rd
    from cupycoll.tuner.predict import comm_time, predict
    from cupycoll.wire._pack import Wire

    profile = Profile("t", 1e-5, 1e-9, 1e-5, 1e-9, dict(ZERO_WORK))
    for p in (2, 3, 4, 8):
        case = shape(p, 1 << 20, 1 << 12, 16)
        here = dataclasses.replace(case, in_place=True)
        for r in range(p):
            copied, read = rd.cost(case, r), rd.cost(here, r)
            assert (read.received, read.messages, read.rounds) == (
                copied.received, copied.messages, copied.rounds)
            assert copied.in_place_bytes == 0 and read.copied_bytes == copied.bytes_received - (
                read.in_place_bytes)
            assert read.in_place_bytes == copied.received["recursive_doubling"] > 0
            assert comm_time(read, profile) == pytest.approx(
                comm_time(copied, profile) - 1e-9 * read.in_place_bytes)
            assert allgather.cost(here, r) == allgather.cost(case, r)
        assert predict("recursive_doubling", here, profile) < predict("recursive_doubling",
                                                                      case, profile)
        compact = dataclasses.replace(here, wire=Wire(True, None))
        assert all(rd.cost(compact, r).in_place_bytes == 0 for r in range(p))
    dense = dataclasses.replace(shape(4, 4096, 4000), in_place=True)  # every round dense
    assert all(rd.cost(dense, r).in_place_bytes == 0 for r in range(4))
    both = Cost().book("a", 100, 1, in_place=True).add(Cost().book("b", 50, 1))
    assert (both.bytes_received, both.in_place_bytes, both.copied_bytes) == (150, 100, 50)
    coded = Profile("w", 1e-5, 1e-6, 1e-5, 1e-9, {**ZERO_WORK, "code": 1e-12})
    big = shape(4, 1 << 24, 1 << 14)
    assert auto.choose_wire("recursive_doubling", big, "auto", profile=coded).compact
    assert not auto.choose_wire("recursive_doubling", dataclasses.replace(big, in_place=True),
                                "auto", profile=coded).compact


def test_rounds_booked_by_the_models():
    from cupycoll.sparse import allgather, mask, split

    s = shape(4, 4000, 100)
    assert (allgather.cost(s, 0).rounds, mask.cost(s, 0).rounds, split.cost(s, 0).rounds) == (
        1, 2, 5)
    assert auto.call_cost("allgather", s, 0).native_rounds == 1  # the validation


def test_local_work_dominated_profile_avoids_dense_passes():
    """Dense passes priced high and nothing else: a 0.01%-dense input never goes dense."""
    dense_costly = Profile("g", 0.0, 0.0, 0.0, 0.0, {**ZERO_WORK, "dense": 1.0, "scan": 1.0})
    assert auto.choose(shape(4, 1 << 20, 100), dense_costly) != "dense"


def test_dense_presence_paths_in_the_model():
    """Float sums: -0 fills and one tail element, no bitmap rounds, any width; integer rows of
    width >= 8 summed: a count per row; max (cannot count) and integer 1-D: the bitmap."""
    from cupycoll.sparse import dense

    for width in (0, 3, 8):
        one = dense.cost(shape(4, 1000, 100, width), 0)
        assert one.received == {"dense.allreduce": math.floor(1.5 * (1000 * 4 * max(width, 1)
                                                                      + 4))}
    wide = dataclasses.replace(shape(4, 1000, 100, width=8), float_values=False)
    assert dense.cost(wide, 0).received == {"dense.allreduce": math.floor(1.5 * 1000 * 36)}
    for other in (dataclasses.replace(shape(4, 1000, 100, width=8), op="max"),
                  dataclasses.replace(shape(4, 1000, 100), float_values=False)):
        assert "dense.union" in dense.cost(other, 0).received


@pytest.mark.filterwarnings("ignore::cupycoll.errors.CupycollWarning")
def test_profile_round_trip_env_and_bad_file(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    mine = Profile("x", 1e-6, 2e-9, 3e-6, 4e-9, dict(ZERO_WORK, merge=5e-9), 1e-7,
                   {"dense": 1e-4})
    save_profile(mine, path)
    monkeypatch.setenv("CUPYCOLL_PROFILE", str(path))
    assert load_profile() == mine
    path.write_text("{not json")
    with pytest.warns(cc.errors.CupycollWarning, match="ignoring unreadable profile"):
        assert load_profile() == default_profile()
    for unreadable in (tmp_path, tmp_path / ("x" * 300), "~nosuchuser_zz/p.json"):  # a folder,
        monkeypatch.setenv("CUPYCOLL_PROFILE", str(unreadable))  # names the system refuses
        with pytest.warns(cc.errors.CupycollWarning, match="ignoring unreadable profile"):
            assert load_profile() == default_profile()
    monkeypatch.setenv("CUPYCOLL_PROFILE", str(path))
    shipped = default_profile()
    assert shipped.alpha_native > 0 and shipped.beta_native > 0 and shipped.gamma["merge"] > 0
    good = mine.as_dict()
    for bad in ({**good, "alpha_p2p": "abc"}, {**good, "gamma": [1, 2]}, {**good, "fixed": None},
                {**good, "beta_native": float("nan")}, {**good, "native_curve": [[1, 2, 3]]},
                {**good, "fixed": {"dense": -1e-3}}, {**good, "gamma": {"merge": 1e308}},
                {**good, "native_curve": [[-5, 1e-6]]},
                {**good, "native_curve": [[8, 2e-6], [64, 1e-6]]},  # falls: negative beyond
                {**good, "native_curve": [[64, 1e-6], [8, 2e-6]]},
                {**good, "native_curve": [[8, 1e-6], [8, 2e-6]]},
                {**good, "links": {"inter": [["alpha_p2p", 1e-5]]}},  # pairs, not a table
                {"by_ranks": {"x": good}}):
        path.write_text(json.dumps(bad))  # a wrong price: never a TypeError on every call
        assert load_profile() == default_profile(), bad
    path.write_text(json.dumps({"by_ranks": {"02": good}}))  # a key int() reads as 2
    assert load_profile(size=2) == mine


def test_profiles_of_several_rank_counts_share_a_file(tmp_path):
    """tune at P writes P's profile next to those of other rank counts in the same file; a
    job reads the one measured nearest its P by ratio (ties: the larger; none asked: the
    largest); a profile without a rank count, or an old single-profile file, stays as it was."""
    path = tmp_path / "p.json"

    def measured(ranks, alpha):
        return Profile(f"p{ranks}", 1e-6, 2e-9, alpha, 4e-9, dict(ZERO_WORK), 1e-7,
                       {"dense": 1e-4}, {"ranks": ranks})

    save_profile(measured(4, 40e-6), path)
    assert load_profile(path, size=2) == measured(4, 40e-6)  # one measured: it, at any P
    save_profile(measured(2, 20e-6), path)
    save_profile(measured(8, 80e-6), path)
    save_profile(measured(4, 41e-6), path)  # a new measurement at 4 replaces the old one
    picks = {size: load_profile(path, size=size).alpha_native for size in (1, 2, 3, 4, 5, 6,
                                                                          16, 1024)}
    assert picks == {1: 20e-6, 2: 20e-6, 3: 41e-6, 4: 41e-6, 5: 41e-6, 6: 80e-6, 16: 80e-6,
                     1024: 80e-6}  # 3: log 4/3 < log 3/2; 6: 8/6 < 6/4
    assert load_profile(path).alpha_native == 80e-6
    assert set(json.loads(path.read_text())["by_ranks"]) == {"2", "4", "8"}
    for low, size, high in ((4, 10, 25), (16, 20, 25), (9, 15, 25)):  # size^2 = low * high: a
        path.unlink()  # tie by ratio, to the larger (float logs rounded some to the smaller)
        save_profile(measured(low, 1e-6), path)
        save_profile(measured(high, 2e-6), path)
        assert load_profile(path, size=size).alpha_native == 2e-6, (low, size, high)
    plain = Profile("plain", 1e-6, 2e-9, 3e-6, 4e-9, dict(ZERO_WORK))  # no rank count
    save_profile(plain, path)
    assert load_profile(path, size=4) == plain
    save_profile(measured(2, 20e-6), path)  # joins nothing it cannot place: only P = 2 now
    assert load_profile(path, size=8) == measured(2, 20e-6)
    old = measured(3, 30e-6)  # a file of the single-profile format, at 3 ranks
    path.write_text(json.dumps(old.as_dict()))
    save_profile(measured(2, 20e-6), path)
    assert load_profile(path, size=3) == old and load_profile(path, size=2).alpha_native == 20e-6
    for old in ({**plain.as_dict(), "meta": None}, "a string",  # nothing it can place
                {"by_ranks": {"x": plain.as_dict(), "2.5": {}, "True": {}, "-2": {}}}):
        path.write_text(json.dumps(old))
        save_profile(measured(4, 41e-6), path)
        assert set(json.loads(path.read_text())["by_ranks"]) == {"4"}, old
        assert load_profile(path, size=4) == measured(4, 41e-6)
    path.write_text(json.dumps({"by_ranks": {"2": measured(2, 20e-6).as_dict(), "x": {}}}))
    assert load_profile(path, size=2) == measured(2, 20e-6)  # the bad key left out
    save_profile(dataclasses.replace(plain, meta={"ranks": True}), path)  # no rank count
    assert load_profile(path, size=2) == dataclasses.replace(plain, meta={"ranks": True})
    shipped = {size: default_profile(size) for size in (2, 3, 4, 8, 64)}
    assert all(p.alpha_native > 0 and p.gamma["merge"] > 0 for p in shipped.values())
    assert all(p.meta["ranks"] == min(size, 8) for size, p in shipped.items())  # 2, 3, 4, 8


def test_simulator_rows_cover_every_algorithm_to_1024_ranks():
    rows = sparse_rows([2, 1024], ["ib400", "eth100"], 1 << 20, 0.01, 0)
    assert {r["algorithm"] for r in rows} == set(priced("sparse"))
    assert {(r["P"], r["network"]) for r in rows} == {(p, net) for p in (2, 1024)
                                                       for net in ("ib400", "eth100")}
    for r in rows:
        assert r["predicted_s"] > 0 and r["bytes_per_rank"] > 0 and r["family"] == "sparse"
    big = {r["algorithm"]: r for r in rows if r["P"] == 1024 and r["network"] == "ib400"}
    # allgather receives every other rank's 1% entries (8 B each): 1023 * 10486 * 8 B
    assert big["allgather"]["bytes_per_rank"] >= 1023 * 10486 * 8
    assert sum(r["auto_pick"] for r in rows) == 4  # one pick per (P, network)


def test_simulator_topk_trends_match_oktopk_table1():
    """Ok-Topk paper Table 1: Ok-Topk's bandwidth stays below 6k words whatever P; TopkA's and
    Gaussiank's grow as 2k(P-1) and pass dense's 2n(P-1)/P once P > n/k; gTopk's grows with
    log P; dense's is independent of k."""
    n, density = 1 << 20, 0.01
    k = round(density * n)
    rows = topk_rows([8, 64, 256, 1024], ["ib400"], n, density)
    by = {(r["algorithm"], r["P"]): r["bytes_per_rank"] for r in rows}
    for p in (8, 64, 256, 1024):
        assert by[("oktopk", p)] <= 6 * k * 4
        assert by[("dense", p)] <= 2 * n * 4
    assert by[("topka", 64)] < by[("dense", 64)] < by[("topka", 256)]  # n/k = 100
    assert by[("gtopk", 1024)] == 4 * k * 10 * 4
    assert by[("oktopk", 1024)] < by[("gtopk", 1024)] < by[("topka", 1024)]
    assert set(TOPK_MODELS) == {"oktopk", "topka", "gaussiank", "gtopk", "dense"}


def test_simulate_command_writes_json(tmp_path, capsys):
    from cupycoll._cli import main

    out = tmp_path / "sim.json"
    assert main(["simulate", "--P", "2,8,64", "--networks", "nvlink,eth100", "--n", "65536",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {"family", "algorithm", "P", "network", "predicted_s", "bytes_per_rank"} <= set(
        rows[0])
    assert {r["family"] for r in rows} == {"sparse", "topk"}
    assert not [r for r in rows if r["network"] == "nvlink" and r["P"] > 8]  # one node of 8
    assert "| sparse | eth100 |" in capsys.readouterr().out


def test_candidates_always_hold_the_least_time():
    """measure and learn try the least predicted time whatever its sign, and a time that is
    not finite only where no other is."""
    from cupycoll.sparse.auto import candidates

    assert candidates({"a": 2.0, "b": 1.0, "c": 2.5}, 2.0, 3) == ["b", "a"]
    assert candidates({"a": -1.0, "b": -0.4, "c": 5.0}, 2.0, 3) == ["a", "b"]
    assert candidates({"a": float("nan"), "b": 3.0}, 2.0, 3) == ["b"]
    assert candidates({"a": float("nan")}, 2.0, 3) == ["a"]


def test_choose_prices_a_shape_class_once_per_profile(monkeypatch):
    """A repeated shape class is priced once per profile object: its representative (every
    rank's nnz on the nearest of 4 steps per doubling), with the answer pricing it gives;
    counts drifting within the class reuse it, a count outside it is priced again."""
    calls = []
    real = auto.predicted_times
    monkeypatch.setattr(auto, "predicted_times",
                        lambda shape, profile=None: calls.append(shape) or real(shape, profile))
    monkeypatch.setattr(auto, "_DECISIONS", {})
    prof = default_profile()

    def shape(*nnz):
        return Shape(4, 1 << 20, 0, 4, 4, nnz)

    first = auto.choose(shape(1000, 2000, 3000, 4000), prof)
    assert calls == [shape(1024, 2048, 2896, 4096)]  # 2^10, 2^11, 2^11.5, 2^12
    assert auto.choose(shape(1000, 2000, 3000, 4000), prof) == first and len(calls) == 1
    times = real(calls[0], prof)
    assert first == min(times, key=times.__getitem__)
    other = Profile.from_dict({**prof.as_dict(), "beta_p2p": prof.beta_p2p * 1e3})
    assert auto.choose(shape(1000, 2000, 3000, 4000), other) and len(calls) == 2
    for drifted in ((1050, 1950, 3100, 4001), (960, 2150, 2790, 4300)):  # the same class
        assert auto.choose(shape(*drifted), prof) == first and len(calls) == 2
    auto.choose(shape(1000, 2000, 3000, 5000), prof)  # 2^12.29 -> 2^12.25: another class
    assert len(calls) == 3 and calls[-1].nnz == (1024, 2048, 2896, 4871)


def test_a_communicators_auto_calls_are_remembered_on_it(monkeypatch):
    """Through a communicator (its profile, its nodes) a class is priced once per
    communicator and node layout: a drifted call of the class reuses the pick, another
    communicator or CUPYCOLL_RANKS_PER_NODE prices again."""
    class Comm:  # what choose reads of a communicator (weakly referenced by profile_for)
        size, rank, mpi_comm = 4, 0, None

    calls = []
    real = auto.predicted_times
    monkeypatch.setattr(auto, "predicted_times",
                        lambda shape, profile=None: calls.append(shape) or real(shape, profile))
    monkeypatch.setenv("CUPYCOLL_RANKS_PER_NODE", "4")
    comm, other = Comm(), Comm()

    def shape(*nnz):
        return Shape(4, 1 << 20, 0, 4, 4, nnz)

    first = auto.choose(shape(1000, 2000, 3000, 4000), comm=comm, op="sum")
    assert len(calls) == 1 and calls[0].nnz == (1024, 2048, 2896, 4096)
    assert calls[0].nodes == (0, 0, 0, 0)
    assert auto.choose(shape(1050, 1950, 3100, 4001), comm=comm, op="sum") == first
    assert len(calls) == 1
    auto.choose(shape(1000, 2000, 3000, 4000), comm=other, op="sum")
    assert len(calls) == 2
    # a loop's drift: within 2^(1/2) of the priced call's class the pick is reused, even
    # across classes; beyond it the call is priced and is the new reference
    assert auto.choose(shape(1300, 2700, 2200, 5500), comm=comm, op="sum") == first
    assert len(calls) == 2
    auto.choose(shape(1500, 2000, 3000, 4000), comm=comm, op="sum")  # 1500 > 1.41 x 1024
    assert len(calls) == 3 and calls[-1].nnz == (1448, 2048, 2896, 4096)
    auto.choose(shape(1100, 2000, 3000, 4000), comm=comm, op="sum")  # near 1448, not 1024
    assert len(calls) == 3
    auto.choose(shape(0, 2000, 3000, 4000), comm=comm, op="sum")  # an empty rank: priced
    assert len(calls) == 4
    del calls[2:]
    monkeypatch.setenv("CUPYCOLL_RANKS_PER_NODE", "2")
    auto.choose(shape(1000, 2000, 3000, 4000), comm=comm, op="sum")
    assert len(calls) == 3 and calls[-1].nodes == (0, 0, 1, 1)


def test_the_front_door_decides_a_kind_of_call_once_while_its_counts_drift(monkeypatch):
    """sparse_allreduce decides an explicit algorithm's wire, and estimate's pick with its
    wire, once per kind of call: calls whose every rank's nnz stays within REPRICE_BEYOND of
    the decided call's class reuse the decision, a call beyond it decides again; learn keeps
    each algorithm's wire. Every result against a dense reference (small integers)."""
    from tests._threaded import on_communicators

    decided = []
    real_wire = auto.choose_wire
    monkeypatch.setattr(auto, "choose_wire", lambda name, *a, **k: decided.append(name)
                        or real_wire(name, *a, **k))
    n = 50_000

    def entries(rank, count):
        rng = np.random.default_rng([rank, count])
        idx = np.sort(rng.choice(n, count, replace=False)).astype(np.int64)
        return idx, rng.integers(-3, 4, count).astype(np.float32)

    def dense(counts):
        want = np.zeros(n)
        for rank, count in enumerate(counts):
            idx, val = entries(rank, count)
            want[idx] += val
        return want

    def run(algorithm, mode, steps):
        """Per call, how many ranks decided a wire; and what each rank ran."""
        monkeypatch.setenv("CUPYCOLL_AUTO", mode)
        decisions = []

        def fn(comm):
            for counts in steps:
                idx, val = entries(comm.rank, counts[comm.rank])
                res = cc.sparse_allreduce(idx, val, n, algorithm=algorithm, wire="auto",
                                          comm=comm)
                got = np.zeros(n)
                got[res.indices] = res.values
                assert np.array_equal(got, dense(counts)), (algorithm, mode, counts)
                comm.barrier()
                if comm.rank == 0:
                    decisions.append(len(decided))
                comm.barrier()
            return {key[1] for key in comm.stats.calls}
        ran = [names for names, _ in on_communicators(2, fn)]
        wires = sorted(decided)
        decided.clear()
        return [b - a for a, b in zip([0] + decisions, decisions)], ran, wires

    drift = [(3000, 2000), (3200, 1900), (2800, 2300), (5000, 2000), (4700, 2100)]
    # both ranks decide each new kind of call: the first call, then the one beyond 2^(1/2)
    for algorithm in ("recursive_doubling", "auto"):
        assert run(algorithm, "estimate", drift)[0] == [2, 0, 0, 2, 0], algorithm
    # learn picks an algorithm per call (its trials run three); each one's wire is decided
    # once per rank
    _, ran, wires = run("auto", "learn", [(3000, 2000)] * 14)
    assert len(ran[0]) == 3 and ran[0] == ran[1], ran
    assert wires == sorted(list(ran[0]) * 2), wires


def test_shape_class_keeps_small_counts_zero_and_n():
    """Counts up to 4 and 0 are their own class; a representative never exceeds n."""
    s = Shape(3, 100, 0, 4, 4, (0, 3, 99))
    assert auto.shape_class(s).nnz == (0, 3, 100)  # 99 -> 2^6.75 = 108, at most n
    assert auto.shape_class(Shape(2, 6, 0, 4, 4, (5, 6))).nnz == (5, 6)


def test_simulator_prices_oktopk_two_level_allgather_per_link():
    """ib400 (8 per node): one node (P = 8) keeps the flat phase; past it the allgather goes
    through node leaders, so fewer messages cross nodes and the step is predicted faster than
    the flat phase priced the same way; the bytes stay those of the phase's model."""
    from cupycoll.comm._topology import Topology
    from cupycoll.topk._oktopk_nodes import allgather_nodes_cost
    from cupycoll.topk._oktopk_phases import block_sizes
    from cupycoll.tuner import simulate

    n, density = 1 << 20, 0.01
    k = round(density * n)
    rows = {(r["algorithm"], r["P"]): r for r in topk_rows([8, 64], ["ib400"], n, density)}
    profile = simulate.network_profile("ib400", 64)
    flat = (1.0, 100.0, 10.0)
    assert simulate.oktopk_nodes_price(8, k, n, 8, profile, simulate.Wire(), flat) == flat
    assert simulate.oktopk_nodes_price(64, k, n, 8, profile, simulate.Wire(True), flat) == flat
    two = rows[("oktopk", 64)]
    assert two["messages"] == 2 * 64 + 2 * 6 - 63 + (7 + 7 + 1)
    topo = Topology.of([r // 8 for r in range(64)])
    leader = allgather_nodes_cost(topo, block_sizes(k, 64), 0, lambda c: 8 * c)
    member = allgather_nodes_cost(topo, block_sizes(k, 64), 1, lambda c: 8 * c)
    assert member == {"oktopk.allgather.bcast": (8 * k, 1)}
    assert sum(b for b, _ in leader.values()) == 8 * (k - block_sizes(k, 64)[0])
    words, messages = TOPK_MODELS["oktopk"](64, k, n)
    flat_seconds = profile.alpha_p2p * messages + profile.beta_p2p * 4 * words
    assert two["predicted_s"] - profile.gamma["scan"] * n - profile.fixed["allreduce"] \
        < flat_seconds


def test_simulator_prices_dense_outputs(capsys):
    """``--output dense``: the rows say so; the dense algorithm's dense output moves fewer
    bytes (no presence tail) and is predicted faster than its sparse one (no read-back); the
    CLI's crossover table has a ``coo/dense`` line per network."""
    from cupycoll._cli import main

    rows = sparse_rows([8, 64], ["ib400"], 1 << 24, 0.1, 0, outputs=("sparse", "dense"))
    assert {r["output"] for r in rows} == {"sparse", "dense"}
    by = {(r["output"], r["algorithm"], r["P"]): r for r in rows}
    for p in (8, 64):
        dense, sparse = by[("dense", "dense", p)], by[("sparse", "dense", p)]
        assert dense["predicted_s"] < sparse["predicted_s"]
        assert dense["bytes_per_rank"] < sparse["bytes_per_rank"]
    capsys.readouterr()
    assert main(["simulate", "--P", "8", "--networks", "ib400", "--family", "sparse",
                 "--output", "sparse,dense"]) == 0
    out = capsys.readouterr().out
    assert "| sparse | ib400 | coo |" in out and "| sparse | ib400 | coo/dense |" in out


class _OneRank:
    """A communicator of one rank for the tuner's timing helpers (no MPI needed)."""

    size, rank, xp = 1, 0, np

    def __init__(self):
        self.barriers = 0

    def barrier(self):
        self.barriers += 1


def test_interleaved_shuffles_the_calls_and_times_each_after_a_barrier():
    """Every round runs each call once after a barrier, in an order of its own: a call does
    not always follow the same one (whose caches it would inherit), and the orders are the
    same in every process (every rank draws them alike)."""
    from cupycoll.tuner.calibrate import interleaved

    def orders():
        comm, order = _OneRank(), []
        calls = {name: (lambda name=name: order.append(name)) for name in "abcd"}
        samples = interleaved(calls, 12, 1, comm)
        assert comm.barriers == 12 * 4 and sorted(samples) == list("abcd")
        assert all(s.shape == (12,) and (s >= 0).all() for s in samples.values())
        return order

    order = orders()
    assert order[:4] == list("abcd")  # the warm-up
    rounds = [order[4 + 4 * i:8 + 4 * i] for i in range(12)]
    assert all(sorted(r) == list("abcd") for r in rounds)
    before_a = {r[r.index("a") - 1] for r in rounds if r[0] != "a"}
    assert len(before_a) > 1 and len({tuple(r) for r in rounds}) > 2
    assert orders() == order


def test_interleaved_pause_idles_before_each_barrier_outside_the_samples():
    """``pause``: each call starts at least that long after the one before it ended, and the
    idle time is not in its sample."""
    import time

    from cupycoll.tuner.calibrate import interleaved

    stamps: list[tuple[float, float]] = []

    def call():
        start = time.perf_counter()
        stamps.append((start, time.perf_counter()))

    samples = interleaved({"a": call, "b": call}, 4, 0, _OneRank(), pause=0.02)
    gaps = [later[0] - earlier[1] for earlier, later in zip(stamps, stamps[1:])]
    assert len(gaps) == 7 and min(gaps) >= 0.02
    assert max(max(s) for s in samples.values()) < 0.02


def test_interleaved_prepare_runs_before_each_of_its_calls_outside_the_samples():
    """``prepare``: before every call of its name, the warm-up's too, and not in its sample;
    a call without one runs without."""
    import time

    from cupycoll.tuner.calibrate import interleaved

    log: list[str] = []
    calls = {"a": lambda: log.append("a"), "b": lambda: log.append("b")}
    prepare = {"a": lambda: (log.append("made"), time.sleep(0.02))}
    samples = interleaved(calls, 3, 1, _OneRank(), prepare=prepare)
    assert log.count("made") == log.count("a") == log.count("b") == 4
    assert all(log[i - 1] == "made" for i, name in enumerate(log) if name == "a")
    assert "made" not in [log[i - 1] for i, name in enumerate(log) if name == "b" and i]
    assert max(samples["a"]) < 0.02


def test_a_cold_measurement_sweeps_the_caches_then_reads_its_inputs_before_each_repeat(
        monkeypatch):
    """``_timed(..., cold=inputs)``: before every repeat (the warm-up's too) the sweep reads
    SWEEP_BYTES of its own data, then the inputs, outside the samples; without ``cold`` no
    sweep runs. The sweep's buffer is at least 64 MiB, written (pages that exist to read)."""
    from cupycoll.tuner import calibrate

    log: list[str] = []

    class Input(np.ndarray):
        def sum(self, *args, **kwargs):
            log.append("input")
            return super().sum(*args, **kwargs)

    monkeypatch.setattr(calibrate, "_SWEPT", {np: type("Swept", (), {
        "sum": lambda self: log.append("swept")})()})
    a = np.ones(4).view(Input)
    calibrate._timed(_OneRank(), lambda: log.append("call"), 3, cold=(a,))
    assert log == ["swept", "input", "call"] * 4
    log.clear()
    calibrate._timed(_OneRank(), lambda: log.append("call"), 3)
    assert log == ["call"] * 4
    assert calibrate.SWEEP_BYTES >= 64 << 20
    monkeypatch.setattr(calibrate, "_SWEPT", {})
    monkeypatch.setattr(calibrate, "SWEEP_BYTES", 4096)
    calibrate._sweep(np, ())
    assert calibrate._SWEPT[np].nbytes == 4096 and (calibrate._SWEPT[np] == 1).all()


def test_fixed_cost_is_the_median_of_the_passes_minus_the_model():
    """Each algorithm's fixed cost: the median of its passes' times of the small call, minus
    what alpha, beta and gamma predict for that call (never below 0)."""
    from cupycoll.tuner.calibrate import FIXED_ENTRIES, FIXED_N, _fixed
    from cupycoll.tuner.predict import rank_time

    comm = _OneRank()
    comm.size = 2
    profile = Profile("t", 1e-6, 1e-9, 2e-6, 1e-9, {"merge": 1e-8, "row": 1e-9, "dense": 1e-9,
                                                     "scan": 1e-9})
    passes = [{"allgather": 3e-4, "split": 1e-9}, {"allgather": 1e-4, "split": 1e-9},
              {"allgather": 1.5e-4, "split": 1e-9}]
    fixed = _fixed(comm, passes, profile)
    small = Shape(2, FIXED_N, 0, 4, 4, (FIXED_ENTRIES,) * 2)
    model = max(rank_time("allgather", small, r, profile) for r in range(2))
    assert 0 < model < 1.5e-4
    assert fixed["allgather"] == pytest.approx(1.5e-4 - model)  # not the mean, not the min
    assert fixed["split"] == 0.0


def test_the_fixed_cost_call_merges_as_calls_beyond_the_smallest_do(monkeypatch):
    """The small call ``fixed`` is measured on must not take the few-entry Python fold (a sum
    of at most TINY entries, ~40 us cheaper at P = 2 than the merges of larger calls: a fixed
    cost measured there under-prices them all): its merge (``reduce_parts`` of the ranks'
    blocks, 2 x FIXED_ENTRIES at P = 2) takes numba's pass of the sums below LOOP_SUM elements
    where numba runs, else the one-sort merge of the sums up to SMALL."""
    import numpy as np

    from cupycoll._types import ReduceOp
    from cupycoll.primitives import _numpy_few
    from cupycoll.sparse._common import reduce_parts
    from cupycoll.tuner.calibrate import FIXED_ENTRIES

    assert _numpy_few.TINY < 2 * FIXED_ENTRIES < _numpy_few.LOOP_SUM
    taken = []
    for name in ("tiny_sum", "sorted_sum"):
        real = getattr(_numpy_few, name)
        monkeypatch.setattr(_numpy_few, name,
                            lambda *a, f=real, k=name: taken.append(k) or f(*a))
    parts = [(np.arange(r, 2 * FIXED_ENTRIES, 2), np.ones(FIXED_ENTRIES, np.float32))
             for r in range(2)]
    for numba, want in (("on", []), ("off", ["sorted_sum"])):
        monkeypatch.setenv("CUPYCOLL_NUMBA", numba)
        taken.clear()
        idx, val = reduce_parts(parts, ReduceOp.SUM)
        assert taken == want and idx.tolist() == list(range(2 * FIXED_ENTRIES))
        assert (val == 1).all()


def test_native_collectives_are_priced_each_by_the_measured_curve():
    """A profile's curve prices each native collective by its own booked bytes (linear between
    points, the last segment beyond them, the first point's time below it); without one,
    alpha + beta x bytes. Checked against sums written out here."""
    from cupycoll.sparse._cost import Cost
    from cupycoll.tuner.predict import comm_time

    curve = [[8.0, 10e-6], [16384.0, 40e-6], [1 << 20, 300e-6]]
    prof = Profile("c", 0.0, 0.0, 5e-6, 1e-9, {}, native_curve=curve)
    assert prof.native_time(0) == 10e-6 and prof.native_time(8) == 10e-6
    assert prof.native_time(8196) == pytest.approx(10e-6 + 30e-6 * 8188 / 16376)
    assert prof.native_time(16384) == pytest.approx(40e-6)
    beyond = 300e-6 + 260e-6 * ((2 << 20) - (1 << 20)) / ((1 << 20) - 16384)
    assert prof.native_time(2 << 20) == pytest.approx(beyond)
    cost = Cost().allreduce("a", 2, 16384).allgather("b", 2, 64).allreduce("c", 2, 1 << 20)
    assert cost.native_volumes == [16384, 32, 1 << 20]
    want = 40e-6 + (10e-6 + 30e-6 * 24 / 16376) + 300e-6
    assert comm_time(cost, prof) == pytest.approx(want)
    # the same total bytes in one collective cost what the curve says of that size
    one = Cost().allreduce("a", 2, 16384 + 32 + (1 << 20))
    assert comm_time(one, prof) == pytest.approx(prof.native_time(16384 + 32 + (1 << 20)))
    line = dataclasses.replace(prof, native_curve=[])
    assert comm_time(cost, line) == pytest.approx(3 * 5e-6 + 1e-9 * (16384 + 32 + (1 << 20)))
    joined = Cost().add(Cost().allreduce("a", 2, 8)).add(cost)
    assert joined.native_volumes == [8, 16384, 32, 1 << 20]


def test_median_profile_takes_every_price_from_the_median_run():
    from cupycoll.tuner.calibrate import median_profile

    runs = [Profile(f"r{i}", a, 1e-9 * i, 2 * a, 1e-9, {"merge": m}, fixed={"split": f},
                    meta={"ranks": 2, "run": i},
                    links={"inter": {"alpha_p2p": a, "beta_p2p": 0.0, "alpha_msg": 0.0}})
            for i, (a, m, f) in enumerate([(1e-5, 3e-9, 5e-4), (9e-5, 1e-9, 1e-4),
                                           (2e-5, 2e-9, 9e-4)])]
    median = median_profile(runs)
    assert median.alpha_p2p == 2e-5 and median.alpha_native == 4e-5
    assert median.beta_p2p == pytest.approx(1e-9)
    assert median.gamma == {"merge": 2e-9} and median.fixed == {"split": 5e-4}
    assert median.links["inter"]["alpha_p2p"] == 2e-5
    curves = [dataclasses.replace(r, native_curve=[[8.0, t], [64.0, 3 * t]])
              for r, t in zip(runs, (5e-6, 1e-6, 2e-6))]
    assert median_profile(curves).native_curve == [[8.0, 2e-6], [64.0, 6e-6]]
    assert median.name == "r0" and median.meta == {"ranks": 2, "run": 0}


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("auto_measure.py"))
def test_auto_measure_keeps_the_fastest_candidate(nprocs):
    """CUPYCOLL_AUTO=measure against a dense reference on P ranks: the model's best slowed by a
    sleep, the trials end on another candidate, identically on every rank; mismatched and bad
    modes raise everywhere (tests/workers/auto_measure.py)."""
    out = LAUNCHES.output("auto_measure.py", nprocs)
    assert f"ok auto measure on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", LAUNCHES.ranks("auto_learn.py"))
def test_auto_learn_abandons_a_slowed_pick_and_keeps_the_fastest(nprocs):
    """CUPYCOLL_AUTO=learn against a dense reference on P ranks: the model's pick slowed, the
    record tries the others and chooses another, identically on every rank, with no collective
    added; then the choice slowed too is left; saved and loaded; mismatched modes raise
    everywhere (tests/workers/auto_learn.py)."""
    out = LAUNCHES.output("auto_learn.py", nprocs)
    assert f"ok auto learn on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", [2, 3])
def test_auto_learn_on_emulated_nccl(nprocs):
    """The same on the NCCL emulation tier: each timed call between two timing events on the
    communicator's stream (no host wait when it has run by the next validation), the records
    identical on every rank."""
    out = run_mpi(nprocs, "auto_learn.py", 37 + nprocs, "emulated", timeout=300)
    assert f"ok auto learn on {nprocs} ranks (emulated nccl)" in out


@pytest.mark.parametrize("nprocs", [2, 3])
def test_auto_measure_on_emulated_nccl(nprocs):
    """The same on the NCCL emulation tier: device arrays, a trial timed to the end of its
    device work, the agreement and the table as on MPI."""
    out = run_mpi(nprocs, "auto_measure.py", 17 + nprocs, "emulated", timeout=300)
    assert f"ok auto measure on {nprocs} ranks (emulated nccl)" in out


class _MaxOverOneRank:
    """What measure.record needs of a communicator: a MAX allreduce (of one rank: itself)."""

    xp = np

    def __init__(self):
        self.runs = 0

    def run_fetch(self, verb, send, recv, op, result, op_name=None):
        assert verb == "allreduce" and op_name == "auto.measure" and send is recv is result
        self.runs += 1
        return result


def test_measure_trials_in_turn_and_keep_the_least_median(monkeypatch):
    """Candidates are tried in the model's order, the one with the fewest trials first; after
    SAMPLES + 1 each, the least median without each one's first (warm-up) trial is kept (a
    tie: the model's order) and nothing is timed."""
    from cupycoll.sparse import measure

    comm, trials = _MaxOverOneRank(), measure.Trials(["mask", "dense", "allgather"])
    order, rounds = [], measure.SAMPLES + 1
    assert measure.SAMPLES == 5  # allgather's median is 1.55 with its warm-up, 3 without
    times = {"mask": [0.1] + [3.0] * 5, "dense": [50.0] + [2.0] * 5,
             "allgather": [0.1] * 3 + [3.0] * 3}
    for _ in range(rounds * 3):
        assert trials.pick is None
        name = trials.next()
        order.append(name)
        seconds = times[name][len(trials.seconds.get(name, []))]
        monkeypatch.setattr(measure.time, "perf_counter", lambda: 100.0 + seconds)
        measure.record(comm, trials, name, 100.0)
    assert order == ["mask", "dense", "allgather"] * rounds
    assert trials.pick == "dense" and trials.next() == "dense"  # medians 3, 2, 3
    assert comm.runs == rounds * 3
    tie = measure.Trials(["split", "mask"])
    for name in ["split", "mask"] * rounds:
        measure.record(comm, tie, name, 99.0)
    assert tie.pick == "split"


def test_measure_kinds_bucket_sizes_and_keep_the_rest_exact():
    from cupycoll.sparse import measure

    base = Shape(4, 1000, 0, 4, 4, (100, 100, 100, 100))
    same = dataclasses.replace(base, n=1023, nnz=(120, 100, 100, 100))
    assert measure.kind(base) == measure.kind(same)
    changes = ({"n": 1025}, {"nnz": (300,) * 4}, {"width": 2}, {"value_bytes": 8}, {"op": "max"},
               {"size": 3, "nnz": (1,) * 3}, {"output": "dense"})
    for change in changes:
        assert measure.kind(dataclasses.replace(base, **change)) != measure.kind(base), change
