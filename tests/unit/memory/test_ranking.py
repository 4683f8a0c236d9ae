"""Ranking (relevance x strength, covered turns dropped) and the budgeted, layered context."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.ranking import (
    MEMORIES_HEADER,
    TURNS_HEADER,
    Candidate,
    asks_for_latest,
    assemble_context,
    fused_relevance,
    memory_text,
    named_speakers,
    rank,
    recency_factor,
    strength_factor,
    turn_text,
)
from schemas import ConsolidatedMemory, Fact, OpenAction, StoredTurn

T0 = datetime(2026, 11, 3, 14, 5, tzinfo=UTC)


def memory(
    id_: str, relevance: float, strength: float = 1.0, sources: tuple[str, ...] = ()
) -> Candidate:
    return Candidate("memory", id_, f"memory {id_}", relevance, strength, T0, sources)


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


def test_turns_covered_by_a_chosen_memory_are_dropped() -> None:
    candidates = [
        turn("e1", 0.95),
        memory("m1", 0.9, sources=("e1", "e2")),
        turn("e2", 0.8),
        turn("e3", 0.7),
        turn("e4", 0.6),
    ]
    assert [c.id for c, _ in rank(candidates, 3)] == ["m1", "e3", "e4"]


def test_a_memory_pulled_in_by_dropping_turns_covers_its_turns_too() -> None:
    candidates = [
        memory("m1", 0.9, sources=("e1",)),
        turn("e1", 0.8),
        memory("m2", 0.7, sources=("e9",)),
        turn("e9", 0.6),
        turn("e5", 0.5),
    ]
    # dropping e1 lifts e9 into the top 3, but m2 (in the top 3 too) covers it: e5 gets the slot
    assert [c.id for c, _ in rank(candidates, 3)] == ["m1", "m2", "e5"]


def test_turns_outside_the_top_memories_stay() -> None:
    candidates = [memory("m1", 0.9), memory("m2", 0.1, sources=("e1",)), turn("e1", 0.5)]
    assert [c.id for c, _ in rank(candidates, 2)] == ["m1", "e1"]


def test_rank_is_deterministic_on_ties() -> None:
    candidates = [turn("b", 0.5, 1), turn("a", 0.5, 1), memory("m", 0.5), turn("c", 0.5, 9)]
    expected = ["m", "c", "a", "b"]  # memory first, then newer, then by id
    assert [c.id for c, _ in rank(candidates, 10)] == expected
    assert [c.id for c, _ in rank(candidates[::-1], 10)] == expected
    assert rank(candidates, 0) == []


def test_memory_text_is_layered_one_line_each() -> None:
    m = ConsolidatedMemory(
        title="Order A10293: delayed delivery",
        status="Order A10293 has shipped.",
        facts=[Fact(text="Customer waited\na week."), Fact(text="Prefers email.")],
        open_actions=[
            OpenAction(text="Call back about the refund.", due=T0 + timedelta(days=1)),
            OpenAction(text="Send the invoice."),
        ],
        memory_id="m1",
        tenant_id="t",
        user_id="u",
        key="entity:order:A10293",
        created_at=T0,
        updated_at=T0,
    )
    assert memory_text(m).splitlines() == [
        "Order A10293: delayed delivery (updated 2026-11-03 14:05)",
        "Status: Order A10293 has shipped.",
        "- Customer waited a week.",
        "- Prefers email.",
        "- Open: Call back about the refund. (due 2026-11-04 14:05)",
        "- Open: Send the invoice.",
    ]


def test_turn_text_uses_speaker_else_role() -> None:
    t = StoredTurn(event_id="e1", session_id="s2", role="user", text="Where is\nit?", ts=T0)
    assert turn_text(t) == "[2026-11-03 14:05] user (session s2): Where is it?"
    named = t.model_copy(update={"speaker": "customer"})
    assert turn_text(named) == "[2026-11-03 14:05] customer (session s2): Where is it?"


def test_context_is_layered_memories_then_turns_in_time_order() -> None:
    ranked = rank(
        [turn("late", 0.9, 30), memory("m2", 0.5), turn("early", 0.8, 10), memory("m1", 0.7)], 10
    )
    context, used = assemble_context(ranked, 1000, words)
    assert [c.id for c, _ in used] == ["m1", "m2", "early", "late"]
    assert context == (
        f"{MEMORIES_HEADER}\nmemory m1\n\nmemory m2\n\n{TURNS_HEADER}\nturn early\nturn late"
    )


def test_context_skips_what_does_not_fit_and_tries_smaller_items() -> None:
    big = Candidate("memory", "big", "word " * 50, 0.9, 1.0, T0, ())
    ranked = rank([big, memory("m1", 0.5), turn("e1", 0.4)], 10)
    context, used = assemble_context(ranked, 10, words)
    assert [c.id for c, _ in used] == ["m1", "e1"]
    assert words(context) <= 10
    assert assemble_context(ranked, 1, words) == ("", [])


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
    ),
    max_size=15,
)


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
    assert all(c.text.strip() in context for c, _ in used)
    kinds = [c.kind for c, _ in used]
    assert kinds == sorted(kinds, key=lambda k: k != "memory")  # memories before turns


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
