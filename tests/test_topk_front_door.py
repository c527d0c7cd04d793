"""The top-k front door's checks and bookkeeping, in process.

Every bad argument raises its exact documented message (format of ``cupycoll.errors``, naming the
rank), an error seen on another rank travels as a code and comes back naming that rank and the
argument, ranks that disagree get the documented MismatchError texts, and ``run`` keeps the
state (selector, wire, step, diagnostics) as documented in ``TopkState``.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from mpi4py import MPI

import cupycoll as cc
from cupycoll.errors import ELSEWHERE, CupycollError, InvalidArgument, InvalidType
from cupycoll.topk import TopkState, api
from cupycoll.topk.selectors import Exact, Gaussian, Threshold

ALGORITHMS = cc.algorithms("topk")


@pytest.fixture(scope="module")
def comm():
    return cc.init("mpi", mpi_comm=MPI.COMM_SELF)


def _host(rank: int = 3, backend: str = "mpi", xp=np):
    """What ``_local_checks`` reads of a communicator: rank, size, backend, array namespace."""
    return types.SimpleNamespace(rank=rank, size=4, backend=backend, xp=xp)


def _check(x, k=2, algorithm="oktopk", selector=None, state=None, argument="x", n=None,
           wire=None, wire_values=None, comm=None):
    return api._local_checks(comm or _host(), x, k, algorithm, selector, state, argument, n,
                             wire, wire_values)


X = np.arange(1.0, 11.0, dtype=np.float32)


def _message(call) -> tuple[type, str]:
    with pytest.raises(CupycollError) as info:
        call()
    return type(info.value), str(info.value)


def test_local_checks_name_each_bad_argument_exactly():
    """Each rule of the front door, on rank 3, with the documented message."""
    t, a = InvalidType, InvalidArgument
    valid = sorted(np.dtype(d).name for d in ("float16", "float32", "float64"))
    cases = [
        (lambda: _check(X, algorithm="nope"), a,
         f"invalid argument 'algorithm' on rank 3: unknown topk algorithm; valid: "
         f"{ALGORITHMS} (got 'nope')"),
        (lambda: _check(X, algorithm=7), a,
         f"invalid argument 'algorithm' on rank 3: unknown topk algorithm; valid: "
         f"{ALGORITHMS} (got 7)"),
        (lambda: _check(X, selector="exact"), t,
         "argument 'selector' on rank 3 must be None or a selector (Exact, Threshold, "
         "Gaussian), got 'str'"),
        (lambda: _check(X, state={}), t,
         "argument 'state' on rank 3 must be None or a TopkState, got 'dict'"),
        (lambda: _check([1.0, 2.0]), t, "argument 'x' on rank 3 must be a numpy/cupy array or "
         "an object with __dlpack__, got 'list'"),
        (lambda: _check(np.arange(10)), t, f"argument 'x' on rank 3 must be an array of one of "
         f"{valid}, got dtype('int64')"),
        (lambda: _check(X.reshape(2, 5)), a,
         "invalid argument 'x' on rank 3: must be a 1-D array (got (2, 5))"),
        (lambda: _check(X, argument="grad", n=12), a,
         "invalid argument 'grad' on rank 3: length must be n = 12 (got 10)"),
        (lambda: _check(X, comm=_host(backend="nccl", xp=object())), t,
         "argument 'x' on rank 3 must be a cupy array (or CUDA DLPack tensor) on the nccl "
         "backend, got 'ndarray'"),
        (lambda: _check(X, k=2.0), t, "argument 'k' on rank 3 must be an int, got 'float'"),
        (lambda: _check(X, k=True), t, "argument 'k' on rank 3 must be an int, got 'bool'"),
        (lambda: _check(X, k=0), a,
         "invalid argument 'k' on rank 3: must satisfy 0 < k <= len(x) = 10 (got 0)"),
        (lambda: _check(X, k=11, argument="grad"), a,
         "invalid argument 'k' on rank 3: must satisfy 0 < k <= len(grad) = 10 (got 11)"),
        (lambda: _check(X, wire="dense"), a, "invalid argument 'wire' on rank 3: unknown wire "
         "format; valid: ['coo', 'compact', 'auto'] (got 'dense')"),
        (lambda: _check(X, wire_values="int8"), a, "invalid argument 'wire_values' on rank 3: "
         "unknown value format; valid: [None, 'bfloat16', 'float16'] (got 'int8')"),
    ]
    for call, cls, text in cases:
        assert _message(call) == (cls, text)


class _DeviceArray:
    """A 1-D float32 array of a device library (what ``as_array`` passes through as cupy's)."""

    __module__ = "cupy.fake"
    __cupycoll_namespace__ = types.SimpleNamespace(name="device library")

    def __init__(self, a: np.ndarray) -> None:
        self.dtype, self.ndim, self.shape = a.dtype, a.ndim, a.shape


def test_local_checks_accept_the_edges_and_return_the_wire_code():
    """k = 1 and k = len(x) (also as numpy ints), every float dtype, a DLPack input, a length
    equal to n; the wire code counts (wire, wire_values) in the documented tables' order."""
    from tests.workers._common import DLPackOnly

    for algorithm in ALGORITHMS:
        for k in (1, 10, np.int32(10), np.int64(1)):
            arr, kk, code = _check(X, k=k, algorithm=algorithm, n=10)
            assert arr is X and kk == int(k) and type(kk) is int and code == 2 * 3
    for dtype in (np.float16, np.float64):
        arr, _, _ = _check(X.astype(dtype), selector=Gaussian(), state=TopkState())
        assert arr.dtype == dtype
    arr, _, _ = _check(X, comm=_host(backend="mpi", xp=object()))  # MPI takes any library
    assert arr is X
    device = _DeviceArray(X)  # nccl takes arrays of its own library
    arr, _, _ = _check(device, comm=_host(backend="nccl", xp=_DeviceArray.__cupycoll_namespace__))
    assert arr is device
    arr, _, _ = _check(DLPackOnly(X), selector=Exact())
    assert type(arr) is np.ndarray and np.shares_memory(arr, X)
    for wire, i in (("coo", 0), ("compact", 1), ("auto", 2)):
        for values, j in ((None, 0), ("bfloat16", 1), ("float16", 2)):
            assert _check(X, wire=wire, wire_values=values)[2] == 3 * i + j


def test_a_peers_error_comes_back_as_its_class_naming_the_rank_and_argument():
    """``_peer_error`` rebuilds from a travelled :class:`Failure` the error the other ranks
    raise: the failing rank's class and argument ("argument" where it named none)."""
    from cupycoll._agreement import Failure

    names = ("x", "k", "algorithm", "selector", "state", "grad", "n", "wire", "wire_values")
    for name in names:
        for cls in (InvalidType, InvalidArgument):
            e = api._peer_error(Failure(5, cls, name, None, [5]), None)
            reason = (f"rank 5 passed an invalid {name!r} (see that rank's error); every rank "
                      "raises")
            assert type(e) is cls and e.argument == name and e.rank == 5
            if cls is InvalidType:
                assert e.got is ELSEWHERE and str(e) == (
                    f"argument {name!r} on rank 5 must be valid on every rank: {reason}")
            else:
                assert e.value is ELSEWHERE and str(e) == (
                    f"invalid argument {name!r} on rank 5: {reason}")
    e = api._peer_error(Failure(2, CupycollError, None, None, [2]), None)
    assert type(e) is CupycollError
    assert str(e) == ("rank 2 passed an invalid 'argument' (see that rank's error); every rank "
                      "raises")
    e = api._peer_error(Failure(0, InvalidArgument, None, None, [0, 1]), None)
    assert type(e) is InvalidArgument and e.argument == "argument" and e.rank == 0


def test_disagreement_messages_name_what_differs():
    from cupycoll._agreement import Differ

    assert api._disagreement(Differ("algorithm", 123, 5, 900, (123, 123, 900)), 1, "gtopk") == (
        "ranks disagree on the algorithm of topk_allreduce (ranks 0-1 asked for 'gtopk', "
        "rank 2 for another one; seen on rank 1)")
    dense, gtopk = api._algorithm_code("dense"), api._algorithm_code("gtopk")
    assert api._disagreement(Differ("algorithm", gtopk, 0, 0, (dense, gtopk, dense)), 1,
                             "gtopk") == ("ranks disagree on the algorithm of topk_allreduce "
                                          "('dense' on ranks 0, 2; 'gtopk' on rank 1; seen on "
                                          "rank 1)")
    assert api._disagreement(Differ("wire", 4, 0, 8, (0, 4, 8)), 2, "oktopk") == (
        "ranks disagree on wire / wire_values in topk_allreduce (coo/None on rank 0; "
        "compact/bfloat16 on rank 1; auto/float16 on rank 2; seen on rank 2)")
    assert api._disagreement(Differ("dtype", 2, 1, 3, (2, 1, 3, 2)), 0, "oktopk") == (
        "ranks disagree on the dtype of x in topk_allreduce (float32 on ranks 0, 3; float16 on "
        "rank 1; float64 on rank 2; seen on rank 0)")
    assert api._disagreement(Differ("k", 7, 6, 9, (6, 9, 7)), 4, "oktopk") == (
        "ranks disagree on the k of topk_allreduce (6 on rank 0; 9 on rank 1; 7 on rank 2; "
        "seen on rank 4)")
    assert api._disagreement(Differ("length of x", 10, 10, 12, (10, 12)), 0, "dense",
                             "TopkCompressor.step") == (
        "ranks disagree on the length of grad of TopkCompressor.step (10 on rank 0; 12 on "
        "rank 1; seen on rank 0)")


def test_validate_on_one_rank_raises_this_ranks_own_error(comm):
    """The failing rank raises its own precise error (the same object, not the decoded one)."""
    for kwargs, argument in (({"k": 0}, "k"), ({"algorithm": "x"}, "algorithm"),
                             ({"selector": 1}, "selector"), ({"n": 3}, "x"),
                             ({"state": {}}, "state"), ({"wire": "raw"}, "wire")):
        args = {"k": 2, "algorithm": "oktopk", **kwargs}
        k, algorithm = args.pop("k"), args.pop("algorithm")
        with pytest.raises(CupycollError) as info:
            api.validate(comm, X, k, algorithm, **args)
        assert info.value.argument == argument and info.value.rank == 0
        assert "another rank" not in str(info.value)
    arr, k = api.validate(comm, X, np.int64(4), "dense", argument="grad", n=10,
                          verb="TopkCompressor.step")
    assert arr is X and k == 4 and type(k) is int


def test_run_keeps_the_state_as_documented(comm):
    """``run``: the given selector replaces the state's, else the state keeps its own, else the
    algorithm's default; the wire is chosen from the keywords; the step advances; ``last``
    records the wire's name and the remainders."""
    x = np.linspace(-1, 1, 50).astype(np.float32)
    defaults = {"oktopk": Threshold, "topka": Exact, "gtopk": Exact, "dense": Exact,
                "gaussiank": Gaussian}
    for algorithm in ALGORITHMS:
        state = TopkState()
        api.run(comm, x, 5, algorithm, None, state, "compact", "bfloat16")
        assert type(state.selector) is defaults[algorithm], algorithm
        assert state.step == 1 and state.wire.values == "bfloat16"
        assert state.wire.compact is False and state.last["wire"] == "coo"  # one rank: coo
        assert "remainders" in state.last
        mine = Gaussian()
        api.run(comm, x, 5, algorithm, mine, state, "coo")
        assert state.selector is mine and state.step == 2 and state.wire.values is None
        api.run(comm, x, 5, algorithm, None, state)
        assert state.selector is mine and state.step == 3
    outcome = api.run(comm, x, 3, "dense", None, None)  # no state: a fresh one
    want = np.sort(np.argsort(-np.abs(x), kind="stable")[:3])
    assert np.asarray(outcome.result.indices).tolist() == want.tolist()


def test_front_door_validates_under_its_name_with_the_algorithm_from_the_environment(
        comm, monkeypatch):
    """The call validates under ``topk_allreduce`` on the communicator given (not the default
    one); ``algorithm`` defaults to CUPYCOLL_TOPK_ALGORITHM, a keyword wins over it; selector,
    state and wire keywords reach the run."""
    seen = []
    real = api.validate
    mine = comm.dup()

    def validate(on, *args, **kwargs):
        seen.append((on, on._verb, args[2]))
        return real(on, *args, **kwargs)

    monkeypatch.setattr(api, "validate", validate)
    monkeypatch.setenv("CUPYCOLL_TOPK_ALGORITHM", "gtopk")
    res = cc.topk_allreduce(X, 3, comm=mine)
    assert seen == [(mine, "topk_allreduce", "gtopk")]
    assert res.indices.tolist() == [7, 8, 9] and res.values.tolist() == [8.0, 9.0, 10.0]
    assert res.n == 10 and mine._verb is None
    seen.clear()
    state, selector = TopkState(), Gaussian()
    res = cc.topk_allreduce(X, 3, comm=mine, algorithm="dense", selector=selector, state=state,
                            wire="compact", wire_values="bfloat16")
    assert seen == [(mine, "topk_allreduce", "dense")]
    assert state.selector is selector and state.step == 1
    assert state.wire.values == "bfloat16" and state.last["wire"] == "coo"  # one rank
    with pytest.raises(InvalidArgument) as info:
        cc.topk_allreduce(X, 3, comm=mine, wire="bogus")
    assert info.value.argument == "wire"


def test_an_unknown_algorithm_names_where_it_came_from(comm, monkeypatch):
    """An unknown top-k algorithm from ``CUPYCOLL_TOPK_ALGORITHM`` names the variable (the
    caller passed none), the same name passed as ``algorithm`` names the keyword: in
    topk_allreduce and in a compressor's step."""
    monkeypatch.setenv("CUPYCOLL_TOPK_ALGORITHM", "bogus")
    calls = (lambda **k: cc.topk_allreduce(X, 3, comm=comm, **k),
             lambda **k: cc.TopkCompressor(10, 0.3, comm=comm, **k).step(X))
    for fn in calls:
        for keywords, named in (({}, "CUPYCOLL_TOPK_ALGORITHM"),
                                ({"algorithm": "bogus"}, "algorithm")):
            with pytest.raises(InvalidArgument) as info:
                fn(**keywords)
            assert info.value.argument == named and "'bogus'" in str(info.value), info.value


def test_an_async_compressor_step_validates_here_and_runs_on_the_duplicate(comm, monkeypatch):
    """``TopkCompressor.step(async_op=True)`` agrees on its arguments on the compressor's own
    communicator under ``TopkCompressor.step`` (a bad gradient raises at the call, not at the
    wait) and runs the algorithm on the background duplicate; the update is the dense top-k
    average of the gradient (P = 1: the gradient itself)."""
    seen, real = [], api.validate
    mine = comm.dup()

    def validate(on, *args, **kwargs):
        seen.append((on, on._verb))
        return real(on, *args, **kwargs)

    monkeypatch.setattr(cc.topk.compressor, "validate", validate)
    ran = []
    real_run = cc.topk.compressor.run
    monkeypatch.setattr(cc.topk.compressor, "run",
                        lambda on, *a: ran.append(on) or real_run(on, *a))
    comp = cc.TopkCompressor(10, 0.3, algorithm="dense", comm=mine)
    with pytest.raises(InvalidArgument) as info:
        comp.step(np.zeros(9, np.float32), async_op=True)
    assert info.value.argument == "grad" and comp.steps == 0
    upd = comp.step(X, async_op=True).wait()
    assert seen == [(mine, "TopkCompressor.step")] * 2
    assert len(ran) == 1 and ran[0] is not mine
    assert upd.indices.tolist() == [7, 8, 9] and upd.values.tolist() == [8.0, 9.0, 10.0]
    assert comp.residual.tolist() == X[:7].tolist() + [0.0] * 3


def test_run_chooses_the_auto_wire_from_the_communicators_profile(monkeypatch):
    """On P > 1 ranks ``wire="auto"`` is priced with the communicator's profile (no profile
    is read otherwise); k and n of the call go into the documented rule; the algorithm's
    remainders land in ``state.last``."""
    from cupycoll._registry import Algorithm
    from cupycoll.topk._common import TopkOutcome
    from cupycoll.tuner import Profile, profile as profile_module

    pays = Profile("pays", 0.0, 1e-9, 0.0, 0.0, {"code": 0.0})
    never = Profile("never", 0.0, 0.0, 0.0, 0.0, {"code": 1.0})
    asked = []
    remainders = [(np.array([1]), np.array([0.5]))]

    def algorithm(on, x, k, state):
        return TopkOutcome(None, None, None, remainders)

    toy = Algorithm("topk", "toy", algorithm, selector=Exact)
    monkeypatch.setattr(api, "record", lambda family, name, rank=None: toy)
    x = np.zeros(4096, np.float32)
    for size, wire, profile, compact in ((3, "auto", pays, True), (3, "auto", never, False),
                                         (2, "auto", pays, True), (2, "coo", pays, False),
                                         (2, "compact", never, True),
                                         (1, "auto", pays, False)):
        comm = types.SimpleNamespace(size=size, rank=0)
        monkeypatch.setattr(profile_module, "profile_for",
                            lambda c, p=profile: asked.append(c) or p)
        asked.clear()
        state = TopkState()
        api.run(comm, x, 40, "stub", None, state, wire, "float16")
        assert state.wire.compact is compact and state.wire.values == "float16", (size, wire)
        assert asked == ([comm] if wire == "auto" and size > 1 else []), (size, wire)
        assert state.last["remainders"] is remainders and state.last["wire"] == state.wire.name
        assert type(state.selector) is Exact and state.step == 1
    # n and k reach the rule: at 4096 entries k = 4096 codes as a bitmap, k = 2 does not pay
    edge = _priced_edge(2, 4096)
    for gamma, compact in ((edge * 0.999, True), (edge * 1.001, False)):
        monkeypatch.setattr(profile_module, "profile_for",
                            lambda c, g=gamma: Profile("e", 0.0, 1e-9, 0.0, 0.0, {"code": g}))
        state = TopkState()
        api.run(types.SimpleNamespace(size=4, rank=0), x, 2, "stub", None, state, "auto")
        assert state.wire.compact is compact


def _priced_edge(k: int, n: int) -> float:
    """gamma at which compact stops paying for k of n (beta 1e-9; docs: wire choice)."""
    from cupycoll.wire._model import expected_index_nbytes

    index_bytes = 4 if n < 2**31 else 8
    return (k * index_bytes - expected_index_nbytes(k, n, index_bytes)) * 1e-9 / (2 * k)


def _outcomes(p, call):
    from tests._threaded import outcomes

    return outcomes(p, call)


@pytest.mark.parametrize("p", [2, 3])
def test_ranks_raise_together_on_a_bad_argument_or_a_disagreement(p):
    """One collective validation (ranks simulated by threads): the bad rank raises its own
    error, the others the same type naming the lowest bad rank and the argument; ranks that
    disagree all raise MismatchError naming the first field that differs and its range (a
    state's or compressor's settings that decide the collectives among them)."""
    from cupycoll.errors import MismatchError

    def topk(**per_rank):
        return lambda comm: cc.topk_allreduce(
            per_rank.get("x", {}).get(comm.rank, X), per_rank.get("k", {}).get(comm.rank, 3),
            comm=comm, algorithm=per_rank.get("algorithm", {}).get(comm.rank, "dense"),
            selector=per_rank.get("selector", {}).get(comm.rank),
            state=per_rank.get("state", {}).get(comm.rank),
            wire=per_rank.get("wire", {}).get(comm.rank, "coo"))

    bad = p - 1
    got = _outcomes(p, topk(k={bad: 0}))
    for r, e in enumerate(got):
        assert type(e) is InvalidArgument and e.argument == "k" and e.rank == bad, (r, e)
        assert ("(got 0)" in str(e)) is (r == bad)
        if r != bad:
            assert str(e) == (f"invalid argument 'k' on rank {bad}: rank {bad} passed an invalid "
                              "'k' (see that rank's error); every rank raises")
    got = _outcomes(p, topk(selector={1: "exact"}, k={0: 99}))
    assert type(got[0]) is InvalidArgument and got[0].argument == "k" and got[0].rank == 0
    assert type(got[1]) is InvalidType and got[1].argument == "selector" and got[1].rank == 1
    for e in got[2:]:
        assert type(e) is InvalidArgument and e.argument == "k" and e.rank == 0
    got = _outcomes(p, topk(state={0: {}}))
    assert all(isinstance(e, InvalidType) and e.argument == "state" for e in got), got
    rest = "ranks 1-2" if p == 3 else "rank 1"  # the ranks but rank 0
    not_1 = "ranks 0, 2" if p == 3 else "rank 0"  # the ranks but rank 1
    ks = "; ".join(f"{3 + r} on rank {r}" for r in range(p))
    fields = [  # (keyword per rank, expected message of rank r)
        ({"x": {1: np.arange(12.0, dtype=np.float32)}},
         lambda r: f"ranks disagree on the length of x of topk_allreduce (10 on {not_1}; 12 on "
                   f"rank 1; seen on rank {r})"),
        ({"k": {r: 3 + r for r in range(p)}},
         lambda r: f"ranks disagree on the k of topk_allreduce ({ks}; seen on rank {r})"),
        ({"x": {0: X.astype(np.float64)}},
         lambda r: "ranks disagree on the dtype of x in topk_allreduce ("
                   + ("float32 on ranks 1-2; float64 on rank 0" if p == 3 else
                      "float64 on rank 0; float32 on rank 1") + f"; seen on rank {r})"),
        ({"algorithm": {1: "gtopk"}},
         lambda r: f"ranks disagree on the algorithm of topk_allreduce ('dense' on {not_1}; "
                   f"'gtopk' on rank 1; seen on rank {r})"),
        ({"wire": {0: "compact"}},
         lambda r: "ranks disagree on wire / wire_values in topk_allreduce ("
                   + (f"coo/None on {rest}; compact/None on rank 0" if p == 3 else
                      "compact/None on rank 0; coo/None on rank 1") + f"; seen on rank {r})"),
    ]
    for per_rank, message in fields:
        for r, e in enumerate(_outcomes(p, topk(**per_rank))):
            assert type(e) is MismatchError and str(e) == message(r), (per_rank, r, e)
    settings = "ranks disagree on the settings that decide the call's collectives (rank"
    for per_rank in ({"state": {r: TopkState(tau_prime=5 if r == 1 else 32) for r in range(p)},
                      "algorithm": {r: "oktopk" for r in range(p)}},
                     {"state": {r: TopkState(step=r) for r in range(p)}}):
        for r, e in enumerate(_outcomes(p, topk(**per_rank))):
            assert type(e) is MismatchError and str(e).startswith(settings), (r, e)
    for keyword, value, shown in (("warmup_steps", 1, "'warmup'"),
                                  ("measure_xi", True, "'measure_xi'"), ("tau", 3, "'tau'")):
        got = _outcomes(p, lambda comm: cc.TopkCompressor(
            10, 0.3, comm=comm, **({keyword: value} if comm.rank == 1 else {})).step(X))
        for r, e in enumerate(got):
            assert type(e) is MismatchError and str(e).startswith(settings), (keyword, r, e)
            assert shown in str(e), e
    got = _outcomes(p, lambda comm: cc.TopkCompressor(10, 0.3, comm=comm).step(
        X, async_op=comm.rank == 1))  # the asynchronous step would run on another communicator
    for r, e in enumerate(got):
        assert type(e) is MismatchError and str(e).startswith(settings), (r, e)
        assert "'async_op'" in str(e), e
    got = _outcomes(p, lambda comm: cc.TopkCompressor(10, 0.3, comm=comm).step(
        X, async_op="no" if comm.rank == bad else False))
    for r, e in enumerate(got):
        assert type(e) is InvalidType and e.argument == "async_op" and e.rank == bad, (r, e)


def test_the_wire_asked_for_reaches_every_ranks_run():
    """On 2 simulated ranks, ``wire="compact"`` is the call's wire on every rank (dense
    top-k: the exact top 3 of the sum)."""
    def call(comm):
        state = TopkState()
        res = cc.topk_allreduce(X * (comm.rank + 1), 3, comm=comm, algorithm="dense",
                                state=state, wire="compact", wire_values="bfloat16")
        return res, state

    for res, state in _outcomes(2, call):
        assert res.indices.tolist() == [7, 8, 9] and res.values.tolist() == [24.0, 27.0, 30.0]
        assert state.wire == type(state.wire)(True, "bfloat16") and state.last["wire"] == "compact"


def test_a_rank_in_another_verb_and_the_failing_rank_of_a_large_job():
    """Ranks that validate different verbs at the same point all raise MismatchError naming
    both verbs; the validation is booked as ``topk.validate``; on 17 ranks a type error on
    rank 0 (the smallest error code) is still reported as rank 0's."""
    from tests._threaded import assert_mixed_verbs

    assert_mixed_verbs(
        0, lambda comm: cc.topk_allreduce(X, 3, comm=comm, algorithm="dense"),
        lambda comm: cc.sparse_allreduce(np.array([1], np.int32), np.ones(1), 8, comm=comm))
    got = _outcomes(17, lambda comm: cc.topk_allreduce([1.0] if comm.rank == 0 else X, 3,
                                                         comm=comm, algorithm="dense"))
    for r, e in enumerate(got):
        assert type(e) is InvalidType and e.argument == "x" and e.rank == 0, (r, e)


class _DeviceTensorWithoutCuPy:
    """A GPU tensor's DLPack face where CuPy cannot be imported (simulated in the test)."""

    def __dlpack__(self, **kw):
        raise AssertionError("never asked")

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


def test_an_argument_failing_in_a_foreign_way_raises_on_every_rank(monkeypatch):
    """A GPU tensor on one rank where CuPy is missing is InvalidType naming 'x' there and on
    the others; any other exception while checking travels as InvalidArgument 'arguments' (no
    rank waits for a collective the failing rank never joins)."""
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    got = _outcomes(3, lambda comm: cc.topk_allreduce(
        _DeviceTensorWithoutCuPy() if comm.rank == 1 else X, 3, comm=comm))
    for r, e in enumerate(got):
        assert type(e) is InvalidType and e.argument == "x" and e.rank == 1, (r, e)
    assert "CuPy installed" in str(got[1])
    monkeypatch.setattr(api, "check_run_settings", lambda rank: 1 / (rank != 1))
    got = _outcomes(3, lambda comm: cc.topk_allreduce(X, 3, comm=comm))
    for r, e in enumerate(got):
        assert type(e) is InvalidArgument and e.argument == "arguments" and e.rank == 1, (r, e)
    assert "ZeroDivisionError" in str(got[1])
