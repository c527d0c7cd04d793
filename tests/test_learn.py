"""The learning record of ``CUPYCOLL_AUTO=learn`` (cupycoll/sparse/learn.py) fed by hand: the
order of its trials, warm-ups not counted, a far slower candidate abandoned after one timed
call, the model's pick kept unless another is clearly faster, the choice by median, the
others' trials started again at rechecks that grow further apart while the choice stands,
the share of calls spent off the choice,
and saving and loading. The multi-rank behaviour (agreed times, a slowed pick left) is
tests/workers/auto_learn.py's."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from cupycoll.sparse import learn
from cupycoll.wire._pack import Wire


def run(record: learn.Record, speed: dict[str, float], calls: int) -> list[str]:
    """``calls`` timed calls, each algorithm taking ``speed[name]`` seconds; what ran."""
    ran = []
    for _ in range(calls):
        name = record.next()
        ran.append(name)
        record.add(name, speed[name])
    return ran


def test_trials_run_in_the_models_order_then_the_fastest_is_kept():
    record = learn.Record(["a", "b", "c"])
    speed = {"a": 2.0, "b": 1.0, "c": 1.2}
    ran = run(record, speed, 2 + 3 * (1 + learn.SAMPLES))
    trial = 1 + learn.SAMPLES  # a warm-up, then SAMPLES timed calls
    # b and c would leave the pick: it is timed again, its first samples dropped (and, over
    # ABANDON times b there, stopped after that call)
    assert ran[:3 * trial + 1] == ["a"] * trial + ["b"] * trial + ["c"] * trial + ["a"]
    assert record.warmed == ["a", "b", "c"] and record.abandoned == ["a"]
    assert record.seconds == {"a": [2.0], "b": [1.0] * (learn.SAMPLES + 1),
                              "c": [1.2] * learn.SAMPLES}  # the last call ran the choice, b
    assert record.exploring() is None and record.choice() == "b" and ran[-1] == "b"


def first_calls_slow(speed: dict[str, float], slow: dict[str, float], first: int):
    """A speed table whose algorithms in ``slow`` take that many seconds on their ``first``
    calls (a class's first calls: the heap grows, fresh pages are touched), then ``speed``."""
    calls: dict[str, int] = {}

    def seconds(name: str) -> float:
        calls[name] = calls.get(name, 0) + 1
        return slow[name] if name in slow and calls[name] <= first else speed[name]

    return seconds


@pytest.mark.parametrize("later, kept", [(1.0, True), (1.3, False)])
def test_the_models_pick_is_timed_again_before_the_others_leave_it(later, kept):
    """The model's pick, tried first, pays for the class's first calls: its first samples are
    slow, the others' are not. Before they leave it, it is timed again (SAMPLES calls, its
    warm-up done): at its later speed it is kept; still clearly slower, it is left. Either
    way the first trials take at most TRIAL_CALLS calls, and the pick is timed again once."""
    record = learn.Record(["a", "b", "c"])
    seconds = first_calls_slow({"a": later, "b": 1.2, "c": 1.25}, {"a": 1.45}, 1 + learn.SAMPLES)
    ran = []
    for _ in range(learn.TRIAL_CALLS + 2 * learn.RECHECK):
        name = record.next()
        ran.append(name)
        record.add(name, seconds(name))
    trial = 1 + learn.SAMPLES
    assert ran[:learn.TRIAL_CALLS] == (["a"] * trial + ["b"] * trial + ["c"] * trial
                                       + ["a"] * learn.SAMPLES)
    assert record.choice() == ("a" if kept else "b") and "a" not in record.abandoned
    assert record.seconds["a"][:learn.SAMPLES] == [later] * learn.SAMPLES
    settled = ran[learn.TRIAL_CALLS:]
    assert settled.count(record.choice()) >= len(settled) - 2 * learn.SAMPLES  # rechecks


def test_a_record_of_measured_samples_does_not_time_the_pick_again(tmp_path):
    """A neighbour's or a loaded record whose samples leave the model's pick runs the choice
    at once: its samples were not a class's first calls."""
    done = learn.Record(["mask", "split"])
    run(done, {"mask": 1.3, "split": 1.0}, 30)
    assert done.choice() == "split"
    near = learn._neighbour({("x", 9, "sum"): done}, ("x", 10, "sum"))
    assert near.exploring() is None and near.choice() == "split" and near.next() == "split"
    comm = SimpleNamespace(rank=0, size=1, barrier=lambda: None)
    learn.records(comm)[("k",)] = done
    learn.save(comm, str(tmp_path / "learned.json"))
    other = SimpleNamespace(rank=0, size=1, barrier=lambda: None)
    assert learn.load(other, str(tmp_path / "learned.json")) == 1
    loaded = learn.records(other)[("k",)]
    assert loaded.exploring() is None and loaded.next() == "split"


def test_a_far_slower_candidate_stops_after_one_timed_call():
    record = learn.Record(["a", "b", "c"])
    ran = run(record, {"a": 1.0, "b": 1.0 * learn.ABANDON * 1.01, "c": 0.9}, 14)
    assert ran.count("b") == 2 and record.abandoned == ["b"]  # a warm-up and one timed call
    assert record.choice() == "c"


class Recomputed(learn.Record):
    """A record that makes its choice and finds its exploring candidate afresh at every
    call: the reference for the kept ones."""

    def choice(self) -> str:
        self._choice = None
        self._medians.clear()
        return super().choice()

    def exploring(self):
        self._explored = False
        return super().exploring()


@pytest.mark.parametrize("seed", range(6))
def test_the_kept_choice_follows_the_choice_made_afresh(seed):
    """Noisy times whose order changes (a pick that slows down and recovers, rivals close to
    it, far slower ones abandoned): the record that keeps its choice between samples runs
    what the one deciding afresh at every call runs, call for call."""
    rng = np.random.default_rng(seed)
    kept, fresh = learn.Record(["a", "b", "c"]), Recomputed(["a", "b", "c"])
    base = {"a": 1.0, "b": rng.uniform(0.8, 1.3), "c": rng.uniform(0.9, 2.0)}
    for call in range(1500):
        if call % 200 == 0:  # a phase: the algorithms' speeds drift
            base = {name: t * rng.uniform(0.7, 1.4) for name, t in base.items()}
        name = kept.next()
        assert fresh.next() == name, call
        seconds = base[name] * rng.uniform(0.8, 1.25)
        kept.add(name, seconds)
        fresh.add(name, seconds)
    assert kept.seconds == fresh.seconds and kept.abandoned == fresh.abandoned


def test_a_slowed_choice_is_left_and_the_share_off_the_choice_is_bounded():
    record = learn.Record(["a", "b", "c"])
    speed = {"a": 1.0, "b": 1.1, "c": 3.0}
    ran = run(record, speed, 200)
    settled = ran[(1 + learn.SAMPLES) * 3:]
    off = sum(name != "a" for name in settled) / len(settled)
    assert record.choice() == "a" and off <= learn.SAMPLES / learn.RECHECK
    speed["a"] = 5.0  # the choice slows down: its own window shows it within a few calls
    ran = run(record, speed, learn.WINDOW)
    assert record.choice() == "b" and ran[-1] == "b"
    speed["a"] = 1.0  # it recovers: its trials start again at a later recheck
    run(record, speed, 2 * learn.RECHECK * 2)
    assert record.choice() == "a"


@pytest.mark.parametrize("slower, calls", [(1.3, 1), (1.05, learn.SAMPLES)])
def test_a_recheck_stops_after_one_call_of_a_candidate_still_clearly_slower(slower, calls):
    """After the first trials, each recheck tries the runner-up again: one timed call when it
    is still over RETRY_WITHIN times the choice (though within ABANDON), SAMPLES when close."""
    record = learn.Record(["a", "b"])
    speed = {"a": 1.0, "b": slower}
    trials = 2 * (1 + learn.SAMPLES)
    run(record, speed, trials)  # both trials done
    assert record.exploring() is None and record.choice() == "a" and not record.abandoned
    # rechecks at 1, 2, 4 and 8 RECHECK calls, the last one's calls included
    ran = run(record, speed, 8 * learn.RECHECK - trials + learn.SAMPLES)
    assert ran.count("b") == 4 * calls and record.choice() == "a"


def recheck_calls(record: learn.Record, speed: dict[str, float], calls: int) -> list[int]:
    """The calls (numbered from the record's first) at which a recheck's candidate ran, once
    the first trials are done."""
    start, ran = record.calls, run(record, speed, calls)
    pick = record.choice()
    return [start + i + 1 for i, name in enumerate(ran)
            if start + i >= learn.TRIAL_CALLS and name != pick and ran[i - 1] == pick]


def test_rechecks_grow_apart_while_the_choice_stands_and_close_in_when_it_changes():
    """The first recheck comes RECHECK calls in; while each one finds the choice of the last,
    the calls between them double up to RECHECK_MAX (a settled loop explores ever less); a
    changed choice brings them back to RECHECK, so a candidate that became faster after a
    change is found as soon as before."""
    record = learn.Record(["a", "b", "c"])
    speed = {"a": 1.0, "b": 1.3, "c": 1.35}
    at = recheck_calls(record, speed, 6 * learn.RECHECK_MAX)
    r, top = learn.RECHECK, learn.RECHECK_MAX
    assert at[:5] == [r, 2 * r, 4 * r, 8 * r, 8 * r + top]
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert gaps[3:] == [top] * len(gaps[3:]) and len(gaps) >= 6
    off = len(at) / (6 * top)  # one call a recheck here (b, c over RETRY_WITHIN)
    assert off <= 1 / top * 1.5
    record.seconds["a"] = [5.0] * learn.WINDOW  # the choice slowed: the others take over
    record._changed("a")
    assert record.choice() == "b"
    later = recheck_calls(record, {**speed, "a": 5.0}, top + 2 * learn.RECHECK)
    # the recheck after the change finds another choice: the next comes RECHECK calls on
    assert later[0] <= at[-1] + top and later[1] - later[0] == learn.RECHECK


def feed(record: learn.Record, samples: dict[str, list[float]]) -> list[str]:
    """Timed calls taking, for each algorithm, its next time in ``samples`` (cycled); what
    ran, until every list has been used up once."""
    ran, used = [], {name: 0 for name in samples}
    while any(used[name] < len(times) for name, times in samples.items()):
        name = record.next()
        times = samples[name]
        record.add(name, times[used[name] % len(times)])
        used[name] += 1
        ran.append(name)
    return ran


@pytest.mark.parametrize("faster, switches", [
    ([0.97, 1.05, 0.99], False),  # a lower median, but within the pick's own spread
    ([0.80, 0.85, 0.82], True),  # every sample below every sample of the pick
])
def test_the_models_pick_is_left_only_for_a_clearly_faster_candidate(faster, switches):
    """The model's pick (the first candidate) stays unless another is faster in at least
    FASTER_PAIRS of the pairs of their samples: noise does not move a loop off a right
    model; a real gain does."""
    record = learn.Record(["a", "b"])
    feed(record, {"a": [1.0, 1.00, 1.10, 0.95], "b": [1.0] + faster})  # warm-ups first
    if switches:  # b would leave the pick: it is timed again first, as fast as before
        assert record.exploring() == "a" and "a" not in record.seconds
        feed(record, {"a": [1.00, 1.10, 0.95]})
    assert record.exploring() is None and record.median("b") < record.median("a")
    assert record.choice() == ("b" if switches else "a")
    assert learn.clearly_faster(faster, [1.00, 1.10, 0.95]) is switches


def planned(comm, key, speed: dict[str, float], calls: int) -> list[tuple[str, bool]]:
    """``calls`` synchronous calls planned by :func:`learn.plan` (each timed one's time,
    ``speed[name]``, added as the next validation adds it); what ran and whether it was
    timed."""
    record, ran, kept = learn.records(comm)[key], [], learn.Kind(key)
    for _ in range(calls):
        name, token = learn.plan(comm, kept, None, "sum", True)
        ran.append((name, token is not None))
        if token is not None:
            record.add(name, speed[name])
    return ran


def test_a_settled_class_times_one_call_of_its_choice_in_time_every():
    """Trials and rechecks time every call; the choice's own calls, once the trials are done,
    one in TIME_EVERY (the timing is most of learn's cost per call); a choice that slows down
    is still left, its window then spanning more calls."""
    comm, key = SimpleNamespace(), ("k",)
    record = learn.records(comm)[key] = learn.Record(["a", "b"])
    speed = {"a": 1.0, "b": 1.3}
    trials = 2 * (1 + learn.SAMPLES)
    ran = planned(comm, key, speed, trials + 4 * learn.RECHECK)
    assert all(timed for _, timed in ran[:trials]) and record.choice() == "a"
    settled = ran[trials:]
    assert all(timed for name, timed in settled if name == "b")  # the rechecks
    chosen = [timed for name, timed in settled if name == "a"]
    # one in TIME_EVERY calls of the class, whose count the rechecks' calls share
    assert abs(sum(chosen) - len(chosen) / learn.TIME_EVERY) <= 4, (sum(chosen), len(chosen))
    speed["a"] = 5.0
    planned(comm, key, speed, learn.WINDOW * learn.TIME_EVERY + learn.RECHECK)
    assert record.choice() == "b"


def test_one_candidate_needs_no_trials():
    record = learn.Record(["a"])
    assert run(record, {"a": 1.0}, 10) == ["a"] * 10 and record.choice() == "a"


def test_the_records_are_saved_and_loaded_with_their_shape_classes(tmp_path):
    comm = SimpleNamespace(rank=0, size=1, barrier=lambda: None)
    key = (2, None, 4, 4, "sum", "sparse", Wire(True, "bfloat16"), True, 0, 12, 2, 9, "sum")
    record = learn.Record(["mask", "split"])
    run(record, {"mask": 1.0, "split": 2.0}, 12)
    learn.records(comm)[key] = record
    path = tmp_path / "learned.json"
    learn.save(comm, str(path))
    other = SimpleNamespace(rank=0, size=1, barrier=lambda: None)
    assert learn.load(other, str(path)) == 1
    (got_key, got), = learn.records(other).items()
    assert got_key == key and hash(got_key) == hash(key)
    assert got.seconds == record.seconds and got.choice() == "mask" and got.exploring() is None
    assert got.warmed == []  # this process has warmed nothing: the first call is a warm-up


def test_a_table_that_cannot_be_saved_or_read_raises_and_keeps_the_records(tmp_path):
    """save/load name the path on every rank (rank 0's error is broadcast: the others never
    wait for a rank that raised); a failed load leaves the records as they were."""
    from cupycoll.errors import InvalidArgument

    comm = SimpleNamespace(rank=0, size=1)
    learn.records(comm)[("k",)] = learn.Record(["a"])
    with pytest.raises(InvalidArgument, match="'path'.*could not be written.*FileNotFound"):
        learn.save(comm, str(tmp_path / "no such folder" / "learned.json"))
    bad = {"truncated": '{"learned": [{"kind": [2, nu', "not a table": '{"other": 1}',
           "no candidates": '{"learned": [{"kind": [1], "candidates": []}]}',
           "an unknown field": '{"learned": [{"kind": [1], "candidates": ["a"], "x": 1}]}',
           "bad seconds": '{"learned": [{"kind": [1], "candidates": ["mask"], '
                          '"seconds": {"mask": ["slow"]}}]}',
           "timed elsewhere": '{"learned": [{"kind": [1], "candidates": ["mask"], '
                              '"seconds": {"bogus": [1.0]}}]}',
           "a kind not a list": '{"learned": [{"kind": 1, "candidates": ["mask"]}]}'}
    for field, value in (("candidates", '{"mask": 1}'), ("abandoned", '{"mask": 1}'),
                         ("seconds", '{"mask": {}}'), ("seconds", '{"mask": [NaN]}'),
                         ("seconds", '{"mask": [Infinity]}'), ("seconds", '{"mask": [true]}'),
                         ("seconds", '{"mask": [-1.0]}'), ("seconds", '["mask"]'),
                         ("calls", '-1'), ("calls", '1.5'), ("calls", 'true')):
        bad[f"{field} {value}"] = ('{"learned": [{"kind": [1], "candidates": ["mask"], '
                                   f'"{field}": {value}}}]}}')  # a field of the wrong type
    for name in ("bogus", "small", "auto", ""):  # not an algorithm auto picks by price
        bad[name] = '{"learned": [{"kind": [1], "candidates": ["%s"]}]}' % name
        bad["_choice " + name] = ('{"learned": [{"kind": [1], "candidates": ["mask"], '
                                  '"seconds": {"mask": [1.0, 1.0, 1.0]}, "_choice": "%s"}]}'
                                  % name)  # a field save never writes
    for why, text in bad.items():
        path = tmp_path / "bad.json"
        path.write_text(text)
        with pytest.raises(InvalidArgument, match="'path'.*is not a table learn.save wrote"):
            learn.load(comm, str(path))
        assert list(learn.records(comm)) == [("k",)], why
    with pytest.raises(InvalidArgument, match="FileNotFoundError"):
        learn.load(comm, str(tmp_path / "missing.json"))
    read, written = os.pipe()  # an int is no path: never a file descriptor written or closed
    for call in (learn.save, learn.load):
        with pytest.raises(InvalidArgument, match="'path'.*not a file path"):
            call(comm, written)
    os.write(written, b"open")
    assert os.read(read, 4) == b"open"
    os.close(read), os.close(written)


@pytest.mark.parametrize("agreed", [-1, 1500])
def test_a_timed_call_waits_for_the_next_validation_to_count(agreed):
    comm = SimpleNamespace()
    key = ("k",)
    record = learn.records(comm)[key] = learn.Record(["a"], warmed=["a"])
    assert learn.pending_us(comm) == -1
    learn.finish(comm, (record, "a", 0.0, False))
    assert 0 < learn.pending_us(comm) < learn.DISTURBED
    learn.absorb(comm, agreed)
    assert learn.records(comm)[key].seconds == ({} if agreed < 0 else {"a": [0.0015]})


@pytest.mark.parametrize("at", ["start", "end", "elsewhere"])
def test_a_call_while_numba_loads_in_the_background_is_not_counted(monkeypatch, at):
    """A rank whose call ran while numba's import held the interpreter lock (at its start or
    its end) sends DISTURBED; the agreed maximum then drops the time on every rank, and the
    candidate's next timed call counts instead."""
    from cupycoll.primitives import _accel

    comm, key = SimpleNamespace(), ("k",)
    record = learn.records(comm)[key] = learn.Record(["a", "b"], warmed=["a"])
    monkeypatch.setattr(_accel, "loading", lambda: at == "start")
    name, token = learn.plan(comm, learn.Kind(key), None, "sum", True)
    monkeypatch.setattr(_accel, "loading", lambda: at == "end")
    learn.finish(comm, token)
    mine = learn.pending_us(comm)
    assert (mine == learn.DISTURBED) is (at != "elsewhere")
    learn.absorb(comm, learn.DISTURBED if at == "elsewhere" else max(mine, 1500))
    assert name == "a" and record.seconds == {} and learn.pending_us(comm) == -1
    monkeypatch.setattr(_accel, "loading", lambda: False)
    name, token = learn.plan(comm, learn.Kind(key), None, "sum", True)
    learn.finish(comm, token)
    learn.absorb(comm, 1500)
    assert name == "a" and record.seconds == {"a": [0.0015]}


def test_a_time_pending_when_the_records_are_cleared_is_dropped():
    """Records cleared (or loaded: load clears them) between a timed call and the next
    validation: its time is dropped, the next call goes on."""
    comm = SimpleNamespace()
    key = ("k",)
    record = learn.records(comm)[key] = learn.Record(["a"], warmed=["a"])
    learn.finish(comm, (record, "a", 0.0, False))
    learn.records(comm).clear()
    learn.absorb(comm, 1500)
    assert learn.records(comm) == {} and learn.pending_us(comm) == -1 and record.seconds == {}


def test_a_time_pending_when_records_are_loaded_is_dropped(tmp_path):
    """A timed call, then load() of a table holding the same class: the call's time does not
    join the loaded record (whose first call in this process is a warm-up)."""
    comm = SimpleNamespace(rank=0, size=1, barrier=lambda: None)
    key = ("k",)
    record = learn.records(comm)[key] = learn.Record(["mask"], warmed=["mask"])
    learn.save(comm, str(tmp_path / "learned.json"))
    learn.finish(comm, (record, "mask", 0.0, False))
    learn.load(comm, str(tmp_path / "learned.json"))
    learn.absorb(comm, 1500)
    assert learn.pending_us(comm) == -1
    assert learn.records(comm)[key].warmed == [] and learn.records(comm)[key].seconds == {}


def test_a_new_class_next_to_a_finished_one_starts_from_its_record():
    """Half or twice the total nnz (the class's last but one element): its candidates and samples,
    the seconds scaled by the sizes' ratio, no trials of its own; none from a class still in
    its trials, nor from one further away."""
    done = learn.Record(["a", "b"])
    run(done, {"a": 1.0, "b": 2.0}, 10)
    table = {("x", 9, "sum"): done}
    bigger = learn._neighbour(table, ("x", 10, "sum"))
    assert bigger.seconds == {name: [2 * t for t in w] for name, w in done.seconds.items()}
    assert bigger.choice() == "a" and bigger.exploring() is None and bigger is not done
    assert learn._neighbour(table, ("x", 8, "sum")).seconds["b"][0] == 1.0
    for far in (("x", 11, "sum"), ("y", 10, "sum"), ("x", 10, "max")):
        assert learn._neighbour(table, far) is None
    table[("x", 9, "sum")] = learn.Record(["a", "b"])  # still in its trials
    assert learn._neighbour(table, ("x", 10, "sum")) is None


@pytest.mark.parametrize("table", ["learn", "measure"])
def test_a_job_making_new_classes_keeps_the_most_recently_used_ones(table):
    """A job that keeps making shape classes (n or nnz drifting far) holds a bounded number of
    learn's records and measure's trials: the one used least recently goes first, in the order
    of the calls, the same on every rank; a class in use stays; a read (one rank's log line)
    changes nothing."""
    from cupycoll.sparse import measure
    from cupycoll.sparse.auto import _DECISIONS_MAX as bound

    comm = SimpleNamespace()
    table = learn.records(comm) if table == "learn" else measure.measured(comm)
    for key in range(bound + 3):
        table[key] = learn.Record(["a"])
        assert table.use(0) is not None  # the class in use every step
        table.get(4), table.get(5), 5 in table  # reads use nothing
    assert len(table) == bound and list(table)[:2] == [4, 5] and 0 in table


def test_learn_is_auto_s_default_mode(monkeypatch):
    """Without CUPYCOLL_AUTO, auto learns (on MPI and on NCCL, where a call is timed by
    events on the communicator's stream)."""
    from cupycoll._config import setting

    monkeypatch.delenv("CUPYCOLL_AUTO", raising=False)
    assert setting("CUPYCOLL_AUTO") == "learn"


@pytest.mark.parametrize("let_go", ["replaced", "popped", "deleted", "cleared", "evicted"])
def test_a_record_its_table_lets_go_is_looked_up_again(let_go):
    """The front door keeps a kind of call's record (learn.Kind); once the table lets it go
    (replaced, popped, deleted, cleared, evicted: a load clears it) the next call looks the
    class up again and runs the record the table holds now, and the time of a call pending
    for the old record is not added to either."""
    from cupycoll.sparse.auto import _DECISIONS_MAX as bound

    comm, key = SimpleNamespace(), ("k",)
    table = learn.records(comm)
    old = table[key] = learn.Record(["a", "b"], warmed=["a"])  # in its trials: timed
    kept = learn.Kind(key)
    name, token = learn.plan(comm, kept, None, "sum", True)
    assert kept.record is old and name == "a" and token is not None
    learn.finish(comm, token)
    new = learn.Record(["b"], warmed=["b"])
    if let_go == "replaced":
        table[key] = new
    elif let_go == "evicted":
        for other in range(bound):  # the class used least recently goes first
            table[other] = learn.Record(["a"])
        assert key not in table
        table[key] = new
    else:
        {"popped": table.pop, "deleted": table.__delitem__,
         "cleared": lambda _: table.clear()}[let_go](key)
        table[key] = new
    learn.absorb(comm, 1500)
    assert old.seconds == {} and new.seconds == {}
    name, _ = learn.plan(comm, kept, None, "sum", True)
    assert name == "b" and kept.record is new and not new._dropped and old._dropped


def test_a_loop_whose_total_hovers_at_a_power_of_two_keeps_one_class(monkeypatch):
    """A class's total nnz is to a power of two, but a kind of call keeps the class of the
    call that set it while every rank's count stays within REPRICE_BEYOND of that call's
    (learn.Kind): a loop alternating 2,000 and 2,100 entries in all (2^11 between them) runs
    one record; a count beyond it makes the next class. Every result against a dense sum."""
    import cupycoll as cc
    from tests._threaded import on_communicators

    monkeypatch.setenv("CUPYCOLL_AUTO", "learn")
    n = 60_000

    def fn(comm):
        classes = []
        for step, count in enumerate([1000, 1050] * 6 + [1500]):
            counts = [count + rank for rank in range(comm.size)]
            rng = np.random.default_rng([step, comm.rank])
            idx = np.sort(rng.choice(n, counts[comm.rank], replace=False))
            val = rng.integers(-3, 4, idx.size).astype(np.float64)
            res = cc.sparse_allreduce(idx, val, n, comm=comm)
            want = np.zeros(n)
            for rank in range(comm.size):
                other = np.random.default_rng([step, rank])
                want[np.sort(other.choice(n, counts[rank], replace=False))] += \
                    other.integers(-3, 4, counts[rank])
            got = np.zeros(n)
            got[res.indices] = res.values
            assert np.array_equal(got, want)
            classes.append(len(learn.records(comm)))
        return classes

    for classes, _ in on_communicators(2, fn):
        assert classes == [1] * 12 + [2], classes
