"""The agreement builder (cupycoll._agreement): the vector's layout computed from the fixed
capacities, an error's kind, argument and detail travelling and coming back, and a settled
agreement on simulated ranks: this rank's error, the peer error of the lowest bad rank, the
verb's mismatch message with every differing field, the maxima, the columns and the slots."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cupycoll import _agreement as agreement
from cupycoll.errors import CupycollError, InvalidArgument, InvalidType, MismatchError

MIN = np.iinfo(np.int64).min


def fake(size: int, rank: int) -> SimpleNamespace:
    return SimpleNamespace(size=size, rank=rank, sequence=3, xp=np)


def echo_terms(fields=("a", "b"), maxima=("m",), columns=("c",)) -> agreement.Terms:
    """Terms whose messages show what they were given."""
    return agreement.Terms(
        "sparse_allreduce", fields,
        lambda failure, draft: InvalidArgument("peer", failure, "a peer failed",
                                               rank=failure.rank),
        lambda differs, draft: f"rank {draft.rank}: {differs}", maxima=maxima, columns=columns)


@pytest.mark.parametrize("size", [1, 2, 3, 8, 31, 32, 33, 64])
def test_every_part_has_its_own_words_and_the_length_depends_on_p_alone(size):
    """Fields, maxima, every rank's error, detail and column words and entry slot: disjoint,
    all inside length(P), the slots last; written by every rank, each word written once."""
    terms = echo_terms(tuple("abcdefghij"), ("m", "n", "o"), ("c",))
    written = np.zeros(agreement.length(size), int)
    for rank in range(size):
        draft = terms.draft(fake(size, rank))
        assert draft.vec.shape == (agreement.length(size),)
        if rank == 0:
            draft.agree(range(1, 11))
            for name in terms.maxima:
                draft.maximum(name, 1)
        draft.column("c", 5)
        draft.fail(InvalidArgument("k", 1, "r"), detail=9)
        slot = draft.slot()
        draft.vec[slot:slot + agreement.slot_words(size)] = 1
        written += (draft.vec != MIN).astype(int)
        written[:agreement.HEADER] -= 1  # every rank writes the header
    assert (written[agreement.HEADER:] == 1).all()  # every word once, nothing left over
    assert agreement.length(size) == agreement.slot_start(size, size)
    assert agreement.slot_words(size) * size <= agreement.SLOT_WORDS_TOTAL


@pytest.mark.parametrize("kind", [InvalidType, InvalidArgument, CupycollError])
@pytest.mark.parametrize("argument", [*agreement.ARGUMENTS, "no such argument", None])
@pytest.mark.parametrize("detail", [None, 0, -3, 2**62])
def test_an_error_travels_as_its_kind_argument_and_detail(kind, argument, detail):
    draft = echo_terms().draft(fake(4, 2))
    error = (CupycollError("boom") if kind is CupycollError
             else kind(argument, "got", "reason", rank=2))
    draft.fail(error, detail)
    failure = draft._failure(draft.vec, [2, 3])
    named = argument if argument in agreement.ARGUMENTS and kind is not CupycollError else None
    assert failure == agreement.Failure(2, kind, named, detail, [2, 3])


def test_terms_beyond_the_capacities_are_refused():
    with pytest.raises(ValueError, match="capacities"):
        echo_terms(fields=tuple("abcdefghijk"))
    with pytest.raises(ValueError, match="capacities"):
        echo_terms(columns=("c", "d"))
    with pytest.raises(ValueError, match="capacities"):
        echo_terms(maxima=("m", "n", "o", "p"))
    with pytest.raises(ValueError, match="capacities"):
        agreement.Terms("no such verb", (), None, None)


def settle_on_ranks(p, write):
    """``write(draft, rank)`` on p simulated ranks, then settle: each rank's Agreed or error."""
    from tests._threaded import outcomes

    terms = echo_terms()

    def call(comm):
        comm.sequence = 0
        draft = terms.draft(comm)
        write(draft, comm.rank)
        return draft.settle("test.agree")

    return outcomes(p, call)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_a_settled_agreement_gives_the_maxima_every_column_and_every_slot(p):
    def write(draft, rank):
        draft.agree((7, -2))
        draft.maximum("m", rank % 2)
        draft.column("c", 10 * rank)
        if agreement.slot_words(p):
            draft.vec[draft.slot()] = 100 + rank

    for agreed in settle_on_ranks(p, write):
        assert agreed.maxima == {"m": int(p > 1)}
        assert agreed.columns == {"c": [10 * r for r in range(p)]}
        words = agreement.slot_words(p)
        assert agreed.slots[::words].tolist() == [100 + r for r in range(p)]


@pytest.mark.parametrize("p", [2, 3, 4])
def test_bad_arguments_raise_their_own_error_there_and_the_peer_error_elsewhere(p):
    errors = {}

    def write(draft, rank):
        if rank >= p - 2:  # the last two ranks fail; the lowest of them is named
            errors[rank] = InvalidType("x", "got", "reason", rank=rank)
            draft.fail(errors[rank], detail=rank)
        else:
            draft.agree((1, 2))

    got = settle_on_ranks(p, write)
    for rank, outcome in enumerate(got):
        if rank in errors:
            assert outcome is errors[rank]
        else:
            assert isinstance(outcome, InvalidArgument) and outcome.rank == p - 2
            assert outcome.value == agreement.Failure(p - 2, InvalidType, "x", p - 2,
                                                      [p - 2, p - 1])


@pytest.mark.parametrize("p", [2, 3])
def test_a_disagreement_names_every_differing_field_with_every_ranks_value(p):
    got = settle_on_ranks(p, lambda draft, rank: draft.agree((5 + rank, 2)))
    for rank, outcome in enumerate(got):
        assert isinstance(outcome, MismatchError)
        assert str(outcome) == (
            f"rank {rank}: {[agreement.Differ('a', 5 + rank, 5, 5 + p - 1, (5, 6, 7)[:p])]}")
