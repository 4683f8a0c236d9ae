"""Ranking (relevance x bounded strength) and the budgeted, layered context in which a
memory earns its place."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.memory.ranking import (
    MEMORIES_HEADER,
    TURNS_HEADER,
    Candidate,
    asks_for_latest,
    assemble_context,
    fused_relevance,
    lift_neighbours,
    lift_replies,
    linear_quantile,
    named_speakers,
    rank,
    recency_factor,
    recency_factors,
    split_turn_text,
    strength_factor,
    strip_names,
    turn_day,
    turn_line,
    turn_text,
)
from memstream.schemas import StoredTurn

T0 = datetime(2026, 11, 3, 14, 5, tzinfo=UTC)


def memory(
    id_: str,
    relevance: float,
    strength: float = 1.0,
    sources: tuple[str, ...] = (),
    minutes: int = 60,
) -> Candidate:
    """A memory whose newest line is ``minutes`` after T0 (newer than the turns by default)."""
    ts = T0 + timedelta(minutes=minutes)
    return Candidate("memory", id_, f"memory {id_}", relevance, strength, ts, sources)


def turn(id_: str, relevance: float, minutes: int = 0, text: str | None = None) -> Candidate:
    ts = T0 + timedelta(minutes=minutes)
    return Candidate("turn", id_, text or f"turn {id_}", relevance, 1.0, ts, (id_,))


def words(text: str) -> int:
    return len(text.split())


def test_score_is_relevance_times_bounded_strength() -> None:
    ranked = rank([memory("weak", 0.7, 0.5), memory("strong", 0.6, 1.0), turn("e1", 0.5)], 3)
    weak = 0.7 * (1 + 0.25 * math.tanh(math.log(0.5)))  # 0.595: strength 0.5 costs 15%
    assert [(c.id, round(s, 6)) for c, s in ranked] == [
        ("strong", 0.6),
        ("weak", round(weak, 6)),
        ("e1", 0.5),
    ]


@given(strength=st.floats(0.0, 1e6))
def test_strength_cannot_overwhelm_relevance(strength: float) -> None:
    factor = strength_factor(strength)
    assert 0.75 <= factor <= 1.25
    # a memory used a thousand times still loses to a turn twice as relevant
    assert memory("m", 0.4, strength).score < turn("e", 0.8).score


def test_strength_factor_is_monotonic_and_neutral_at_one() -> None:
    assert strength_factor(1.0) == 1.0
    assert (
        strength_factor(0.1)
        < strength_factor(0.5)
        < 1.0
        < strength_factor(1.2)
        < strength_factor(5)
    )


def test_fused_relevance_keeps_a_lone_lexical_standout() -> None:
    dense = np.linspace(0.2, 0.5, 40)  # a pool of turns; the best by cosine is the last
    lexical = np.zeros(40)
    lexical[20] = 9.0  # only a mid-cosine turn shares the question's rare word
    fused = fused_relevance(dense, lexical)
    assert int(np.argmax(fused)) == 20
    assert all(0.0 < r < 1.0 for r in fused)
    assert fused_relevance([0.5, 0.5], [0.0, 0.0]).tolist() == [0.5, 0.5]  # nothing to tell apart


def test_recency_only_when_the_query_asks_for_the_latest() -> None:
    assert asks_for_latest("what is the latest on my refund?")
    assert asks_for_latest("where is my order currently")
    assert asks_for_latest("我的订单最近怎么样")
    assert not asks_for_latest("what did Melanie do last weekend?")
    assert not asks_for_latest("when did I order the blender")
    assert recency_factor(T0, T0, 30) == 1.0
    assert recency_factor(T0 - timedelta(days=30), T0, 30) == 0.75
    assert 0.5 <= recency_factor(T0 - timedelta(days=3000), T0, 30) < 0.51


def test_recency_factors_is_recency_factor_for_many() -> None:
    ages = [0.0, 1.5, 30.0, 400.0, -2.0]  # days; a turn after "now" counts as new
    times = [T0 - timedelta(days=a) for a in ages]
    many = recency_factors([t.timestamp() for t in times], T0.timestamp(), 30)
    one = [recency_factor(t, T0, 30) for t in times]
    np.testing.assert_allclose(many, one, rtol=1e-12)


def test_named_speakers_are_whole_words() -> None:
    assert named_speakers("What did Caroline research?", ["Caroline", "Melanie"]) == {"Caroline"}
    assert named_speakers("what did carolines dog do", ["Caroline"]) == set()


def test_exploration_gives_a_mid_strength_recent_memory_a_place() -> None:
    old = T0 - timedelta(days=10)
    candidates = [
        Candidate("turn", f"e{i}", f"turn {i}", 0.9 - i / 100, 1.0, old, (f"e{i}",))
        for i in range(10)
    ] + [Candidate("turn", f"x{i}", "noise", 0.1, 1.0, old, (f"x{i}",)) for i in range(20)]
    fresh = Candidate("memory", "fresh", "memory fresh", 0.6, 1.0, T0)
    assert "fresh" not in [c.id for c, _ in rank([*candidates, fresh], 10)]
    explored = [c.id for c, _ in rank([*candidates, fresh], 10, exploration_share=0.1)]
    assert explored[-1] == "fresh"
    assert len(explored) == 10
    assert rank([*candidates, fresh], 10, exploration_share=0.1) == rank(
        [fresh, *candidates[::-1]], 10, exploration_share=0.1
    )


def test_turns_a_memory_was_built_from_keep_their_places() -> None:
    candidates = [
        turn("e1", 0.95),
        memory("m1", 0.9, sources=("e1", "e2")),
        turn("e2", 0.8),
        turn("e3", 0.7),
    ]
    assert [c.id for c, _ in rank(candidates, 3)] == ["e1", "m1", "e2"]


def test_rank_is_deterministic_on_ties() -> None:
    candidates = [turn("b", 0.5, 1), turn("a", 0.5, 1), memory("m", 0.5), turn("c", 0.5, 9)]
    expected = ["m", "c", "a", "b"]  # memory first, then newer, then by id
    assert [c.id for c, _ in rank(candidates, 10)] == expected
    assert [c.id for c, _ in rank(candidates[::-1], 10)] == expected
    assert rank(candidates, 0) == []


def test_turn_text_uses_speaker_else_role_and_the_day() -> None:
    t = StoredTurn(event_id="e1", session_id="s2", role="user", text="Where is\nit?", ts=T0)
    assert turn_text(t) == "[3 Nov 2026] user: Where is it?"
    named = t.model_copy(update={"speaker": "customer"})
    assert turn_text(named) == "[3 Nov 2026] customer: Where is it?"
    assert f"{turn_day(named)} {turn_line(named)}" == turn_text(named)


def test_strip_names_leaves_what_the_turns_vectors_can_match() -> None:
    names = {"Caroline", "Melanie"}
    assert strip_names("When did Caroline's mom visit Melanie?", names) == "When did mom visit ?"
    assert strip_names("caroline", names) == "caroline"  # nothing would be left
    assert strip_names("Carolineville trip", names) == "Carolineville trip"  # whole words


def test_lift_neighbours_never_lowers_and_reaches_the_share() -> None:
    relevance = np.array([0.9, 0.1, 0.5, 0.95])
    out = lift_neighbours(relevance, [[1], [0, 2], [1, 3], [2]], seeds=1, share=0.5)
    np.testing.assert_allclose(out, [0.9, 0.1, 0.5, 0.95])  # seed 3's neighbour is above half
    out = lift_neighbours(relevance, [[1], [0, 2], [1, 3], [2]], seeds=2, share=0.9)
    np.testing.assert_allclose(out, [0.9, 0.81, 0.855, 0.95])
    assert relevance[1] == 0.1  # a new array


def test_only_a_standout_seed_lifts_and_only_neighbours_with_some_relevance() -> None:
    relevance = np.array([0.97, 0.2, 0.8, 0.6, 0.9, 0.7, 0.1, 0.1, 0.1])
    neighbours = [[1, 2], [0], [0], [4], [3, 5], [4], [], [], []]
    out = lift_neighbours(relevance, neighbours, seeds=2, share=0.95, own_quantile=0.5)
    # The median is 0.6: the 0.2 reply is about something else and stays; 0.8 is lifted.
    np.testing.assert_allclose(out[[1, 2]], [0.2, 0.95 * 0.97])
    np.testing.assert_allclose(out[[3, 5]], 0.95 * 0.9)  # no seed_min: the 0.9 seed lifts
    strict = lift_neighbours(
        relevance, neighbours, seeds=2, share=0.95, seed_min=0.95, own_quantile=0.5
    )
    np.testing.assert_allclose(strict[[3, 5]], [0.6, 0.7])  # a weak seed lifts nothing
    assert strict[2] == out[2]
    assert lift_neighbours(np.array([]), [], seeds=3, share=0.9, own_quantile=0.5).size == 0


def test_a_standout_question_hands_its_relevance_to_its_reply() -> None:
    relevance = np.array([0.97, 0.3, 0.92, 0.5, 0.5, 0.1])
    reply_of = [1, -1, 3, -1, -1, 4]  # 0 and 2 ask and are answered by 1 and 3; 5 is weak
    out = lift_replies(relevance, reply_of, seeds=10, seed_min=0.9, question_share=0.99)
    np.testing.assert_allclose(out, [0.99 * 0.97, 0.97, 0.99 * 0.92, 0.92, 0.5, 0.1])
    assert relevance[1] == 0.3  # a new array
    one = lift_replies(relevance, reply_of, seeds=1, seed_min=0.9, question_share=0.99)
    np.testing.assert_allclose(one[[2, 3]], [0.92, 0.5])  # only the best seed lifts
    # A reply already more relevant than its question keeps its own relevance.
    kept = lift_replies(np.array([0.95, 0.99]), [1, -1], seeds=2, seed_min=0.9, question_share=1)
    np.testing.assert_allclose(kept, [0.95, 0.99])
    assert lift_replies(np.array([]), [], seeds=3, seed_min=0.9, question_share=0.99).size == 0


def test_context_is_layered_memories_then_turns_newest_first() -> None:
    ranked = rank(
        [turn("late", 0.9, 30), memory("m2", 0.5), turn("early", 0.8, 10), memory("m1", 0.7)], 10
    )
    context, used = assemble_context(ranked, 1000, words)
    assert [c.id for c, _ in used] == ["m1", "m2", "late", "early"]
    assert context == (
        f"{MEMORIES_HEADER}\nmemory m1\n\nmemory m2\n\n{TURNS_HEADER}\nturn late\nturn early"
    )


def test_a_memory_older_than_a_turn_shown_is_read_after_the_turns() -> None:
    ranked = rank([turn("late", 0.9, 30), memory("m1", 0.7, minutes=20), turn("early", 0.8)], 10)
    context, used = assemble_context(ranked, 1000, words)
    # m1 holds nothing said after minute 20: the turn of minute 30 may supersede it.
    assert [c.id for c, _ in used] == ["late", "early", "m1"]
    assert context == f"{TURNS_HEADER}\nturn late\nturn early\n\n{MEMORIES_HEADER}\nmemory m1"


def long_memory(
    id_: str, relevance: float, strength: float = 1.0, shows: tuple[str, ...] = ("x",)
) -> Candidate:
    text = f"memory {id_} " + "fact " * 6  # 8 words: more than two 3-word turns
    return Candidate("memory", id_, text, relevance, strength, T0, shows, shows=shows)


def test_a_memory_enters_only_when_as_relevant_as_the_turns_it_displaces() -> None:
    turns = [turn("e1", 0.6, text="a b c"), turn("e2", 0.5, text="d e f")]
    # The memory's strength puts it first by score, but e1 is more relevant: e1 stays.
    strong = long_memory("m1", 0.55, strength=5.0)
    assert strong.score > turns[0].score
    _, used = assemble_context(rank([strong, *turns], 10), 10, words)
    assert [c.id for c, _ in used] == ["e1", "e2"]
    # As relevant as everything it pushes out: the memory gets the room.
    better = long_memory("m1", 0.7)
    _, used = assemble_context(rank([better, *turns], 10), 10, words)
    assert [c.id for c, _ in used] == ["m1"]


def test_a_memory_that_only_repeats_turns_in_the_context_stays_out() -> None:
    turns = [turn("e1", 0.9), turn("e2", 0.8)]
    repeats = long_memory("m1", 0.7, shows=("e1", "e2"))
    adds = long_memory("m2", 0.6, shows=("e1", "e9"))
    _, used = assemble_context(rank([*turns, repeats, adds], 10), 1000, words)
    assert [c.id for c, _ in used] == ["m2", "e1", "e2"]  # same time: by id


def test_context_skips_what_does_not_fit_and_tries_smaller_items() -> None:
    big = Candidate("memory", "big", "word " * 50, 0.9, 1.0, T0, ())
    ranked = rank([big, memory("m1", 0.5), turn("e1", 0.4)], 10)
    context, used = assemble_context(ranked, 10, words)
    assert [c.id for c, _ in used] == ["m1", "e1"]
    assert words(context) <= 10
    assert assemble_context(ranked, 1, words) == ("", [])


def day_turn(id_: str, relevance: float, minutes: int, day: str) -> Candidate:
    ts = T0 + timedelta(minutes=minutes)
    text = f"{day} Ana: turn {id_}"
    return Candidate(
        "turn", id_, text, relevance, 1.0, ts, (id_,), heading=day, body=text[len(day) + 1 :]
    )


def test_a_days_turns_share_one_heading_and_the_budget_counts_it_once() -> None:
    ranked = rank(
        [
            day_turn("a", 0.9, 0, "[3 Nov 2026]"),
            day_turn("b", 0.8, 1, "[3 Nov 2026]"),
            day_turn("c", 0.7, 2000, "[4 Nov 2026]"),
        ],
        10,
    )
    context, used = assemble_context(ranked, 1000, words)
    assert context == (
        f"{TURNS_HEADER}\n[4 Nov 2026]\nAna: turn c\n[3 Nov 2026]\nAna: turn b\nAna: turn a"
    )
    assert [c.id for c, _ in used] == ["c", "b", "a"]  # newest first
    assert assemble_context(ranked, 1000, words, additive_lines=True) == (context, used)
    # The section (3 words), one heading (3) and two lines (3 each) fit in 12 words, where
    # two standalone lines ("[3 Nov 2026] Ana: turn a", 6 words each) would not.
    for additive in (False, True):
        small, kept = assemble_context(ranked, 12, words, additive_lines=additive)
        assert [c.id for c, _ in kept] == ["b", "a"]
        assert words(small) == 12


def test_only_one_section_when_there_are_only_turns() -> None:
    context, _ = assemble_context(rank([turn("e1", 0.5)], 5), 100, words)
    assert context == f"{TURNS_HEADER}\nturn e1"


_texts = st.lists(
    st.sampled_from(["order", "A10293", "delayed", "ok", "退款", "x\ny"]), max_size=12
).map(" ".join)
_candidates = st.lists(
    st.builds(
        Candidate,
        kind=st.sampled_from(["memory", "turn"]),
        id=st.text("abcdef", min_size=1, max_size=3),
        text=_texts,
        relevance=st.floats(0, 1),
        strength=st.floats(0.1, 2),
        ts=st.integers(0, 10_000).map(lambda m: T0 + timedelta(minutes=m)),
        source_event_ids=st.lists(st.text("abcdef", min_size=1, max_size=3), max_size=3).map(tuple),
        heading=st.sampled_from(["", "[3 Nov 2026]", "[4 Nov 2026]"]),
        body=_texts,
    ),
    max_size=15,
)


def shown(c: Candidate) -> str:
    """What of ``c`` the context holds: a turn under a day heading shows its line."""
    if c.kind == "turn" and c.heading:
        return (c.body or c.text).strip()
    return c.text.strip()


@settings(max_examples=200, deadline=None, database=None)
@given(candidates=_candidates, budget=st.integers(0, 120), top_k=st.integers(0, 15))
def test_context_never_exceeds_the_budget(
    candidates: list[Candidate], budget: int, top_k: int
) -> None:
    ranked = rank(candidates, top_k)
    assert len(ranked) <= top_k
    context, used = assemble_context(ranked, budget, words)
    assert words(context) <= budget
    assert all(any(u is c for c, _ in ranked) for u, _ in used)
    assert all(shown(c) in context for c, _ in used)
    kinds = [c.kind for c, _ in used]
    newest_turn = max((c.ts for c, _ in used if c.kind == "turn"), default=None)
    behind = newest_turn is not None and any(
        c.ts < newest_turn for c, _ in used if c.kind == "memory"
    )
    # memories before turns, unless one is older than a turn shown
    assert kinds == sorted(kinds, key=lambda k: (k == "memory") == behind)


@settings(max_examples=200, deadline=None, database=None)
@given(candidates=_candidates, budget=st.integers(0, 120), top_k=st.integers(0, 15))
def test_additive_counting_admits_exactly_what_recounting_does(
    candidates: list[Candidate], budget: int, top_k: int
) -> None:
    ranked = rank(candidates, top_k)
    plain = assemble_context(ranked, budget, words)
    assert assemble_context(ranked, budget, words, additive_lines=True) == plain
    # A counter that is not additive over lines (newlines cost a char): the plain path runs.
    fast = assemble_context(ranked, budget, len, additive_lines=True)
    assert fast == assemble_context(ranked, budget, len)
    assert len(fast[0]) <= budget


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.one_of(st.sampled_from([0.0, 0.5, 1.0, 0.25, 0.75]), st.floats(0.0, 1.0)),
)
def test_linear_quantile_is_numpys_bit_for_bit(values: list[float], q: float) -> None:
    x = np.asarray(values, dtype=np.float64)
    assert linear_quantile(x, q) == float(np.quantile(x, q))


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=40),
    st.sampled_from(["", "Caroline", "O'Brien ]"]),
    st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2100, 1, 1)),
)
def test_split_turn_text_gives_the_day_and_the_line(text: str, speaker: str, ts: datetime) -> None:
    turn = StoredTurn(
        event_id="e1", session_id="s1", role="user", speaker=speaker, text=text or "x", ts=ts
    )
    assert split_turn_text(turn_text(turn)) == (turn_day(turn), turn_line(turn))


def test_a_turn_that_no_longer_fits_whole_shows_its_excerpt() -> None:
    day = "[3 Nov 2026]"
    long_line = "ann: we went to the lake. it rained all day and the tent leaked badly."
    cut = "ann: we went to the lake. …"
    first = turn("e1", 0.9, text=f"{day} ann: the lake trip was fun")
    second = replace(
        turn("e2", 0.8, text=f"{day} {long_line}"), heading=day, body=long_line, excerpt=cut
    )
    first = replace(first, heading=day, body="ann: the lake trip was fun")
    for additive in (False, True):
        roomy, used = assemble_context(rank([first, second], 2), 40, words, additive_lines=additive)
        assert long_line in roomy  # whole whenever it fits
        assert [c.body for c, _ in used] == ["ann: the lake trip was fun", long_line]
        assert [c.cut for c, _ in used] == [False, False]
        tight, used = assemble_context(rank([first, second], 2), 20, words, additive_lines=additive)
        assert cut in tight
        assert "rained" not in tight
        assert [c.id for c, _ in used] == ["e1", "e2"]
        assert [c.cut for c, _ in used] == [False, True]
        assert words(tight) <= 20
