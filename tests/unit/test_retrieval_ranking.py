"""The RPC's candidate scoring (``memory.candidates.score_candidates``) on a hand-made user
whose turns are a real ``stores.turn_index.UserTurns``: event time for recency, session
neighbours, and memories ranked by the turns they bring in."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from memstream.memory.candidates import score_candidates
from memstream.memory.lexical import LexicalIndex
from memstream.memory.ranking import Candidate, RankingParams
from memstream.schemas import ConsolidatedMemory, Fact, RetrieveRequest, StoredTurn
from memstream.stores.short_term import TurnWithVector
from memstream.stores.turn_index import UserTurns, index_turn

DIM = 4
T0 = datetime(2023, 5, 8, 13, 0, tzinfo=UTC)  # an old conversation: years before the clock


def ranking_params(params: RankingParams | None = None) -> RankingParams:
    """The ranking parameters of the RPC under test (no neighbour lift unless asked)."""
    return params or RankingParams(neighbour_seeds=0)


def unit(*values: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(values)] = values
    return v / np.linalg.norm(v)


def user(rows: list[tuple[str, str, str, float, np.ndarray]]) -> UserTurns:
    """(event id, session, text, days after T0, vector) per turn, in time order."""
    lexical = LexicalIndex()
    built = []
    for event_id, session, text, days, vector in rows:
        t = StoredTurn(
            event_id=event_id,
            session_id=session,
            role="user",
            text=text,
            ts=T0 + timedelta(days=days),
            speaker="Ana",
        )
        index_turn(lexical, t)
        built.append(TurnWithVector(t, vector))
    return UserTurns.build(b"v", built, lexical, DIM)


def candidates(
    params: RankingParams,
    turns: UserTurns,
    query: str,
    memories: tuple[ConsolidatedMemory, ...] = (),
    **kw: Any,
) -> dict[str, Candidate]:
    request = RetrieveRequest(user_id="u", query=query, top_k=10, **kw)
    scored = [(m, 0.5) for m in memories]  # found by vector, not by key
    found = score_candidates(
        request.query, unit(1.0), [], turns, scored, [], None, top_k=10, now=request.now,
        params=params,
    )  # fmt: skip
    return {c.id: c for c in found}


def test_recency_counts_from_the_users_newest_event_not_the_clock() -> None:
    turns = user(
        [
            ("old", "1", "parcel status pending", 0, unit(1.0)),
            ("new", "2", "parcel status delivered", 60, unit(1.0)),
        ]
    )
    found = candidates(ranking_params(), turns, "what is the latest parcel status?")
    assert found["new"].boost == 1.0  # the newest event is "now", though 2023 is long gone
    assert 0.5 < found["old"].boost < 1.0
    # A "now" the request passes moves it: both turns are then older.
    later = candidates(
        ranking_params(), turns, "latest parcel status?", now=T0 + timedelta(days=120)
    )
    assert later["new"].boost < 1.0
    assert later["old"].boost < later["new"].boost


def test_a_memory_is_timed_by_what_it_shows_and_ranked_by_the_turns_it_brings() -> None:
    turns = user(
        [
            ("a", "1", "parcel delivered at the door", 0, unit(1.0)),
            ("b", "1", "lovely weather today", 1, unit(0.0, 1.0)),
        ]
    )
    m = ConsolidatedMemory(
        memory_id="m1",
        tenant_id="t",
        user_id="u",
        key="topic:parcel",
        title="Parcel delivery",
        facts=[Fact(text="parcel delivered at the door", source_event_ids=["a"])],
        created_at=datetime(2026, 12, 1, tzinfo=UTC),  # a replay's wall clock
        updated_at=datetime(2026, 12, 1, tzinfo=UTC),
        source_event_ids=["b", "a"],
        strength=50.0,
    )
    found = candidates(ranking_params(), turns, "parcel delivered", (m,))
    memory = found["m1"]
    # as current as its newest shown line ("a"), not its newest source ("b", not shown)
    assert memory.ts == turns.docs[0].ts
    assert memory.source_event_ids == ("a", "b")  # best first for this query
    assert memory.shows == ("a",)
    # No more relevant than the weakest turn it brings into the ranking.
    assert memory.relevance <= found["b"].relevance


def test_session_neighbours_of_the_best_hits_are_lifted() -> None:
    rows = [
        ("q", "1", "where did you go hiking", 0, unit(1.0)),
        ("a", "1", "the mountains near home", 0.01, unit(0.0, 1.0)),
        ("x", "2", "nothing related here", 1, unit(0.0, 0.0, 1.0)),
        ("y", "2", "still nothing here", 1.01, unit(0.0, 0.0, 0.0, 1.0)),
    ]
    turns = user(rows)
    plain = candidates(ranking_params(), turns, "where did you go hiking")
    lifted = candidates(
        ranking_params(
            RankingParams(
                neighbour_seeds=1,
                neighbour_share=0.95,
                neighbour_seed_min=0.0,  # a 4-turn user: no hit stands 3 deviations out
                neighbour_own_quantile=0.0,
            )
        ),
        turns,
        "where did you go hiking",
    )
    assert lifted["a"].relevance > plain["a"].relevance
    assert lifted["a"].relevance >= 0.95 * lifted["q"].relevance - 1e-9
    assert lifted["x"].relevance == plain["x"].relevance  # another session: untouched


def test_the_named_speaker_is_left_to_the_speaker_bonus_not_bm25() -> None:
    rows = [
        ("short", "1", "it rained", 0, unit(1.0, 1.0)),
        ("hike", "1", "we went hiking in the hills near the lake", 0.01, unit(1.0, 1.0)),
        ("other", "2", "nothing related to it", 1, unit(0.0, 1.0)),
    ]
    turns = user(rows)  # every turn is Ana's: the bonus lifts all of them alike
    named = candidates(ranking_params(), turns, "did Ana go hiking")
    plain = candidates(ranking_params(), turns, "did go hiking")
    for event_id in ("short", "hike", "other"):
        assert math.isclose(named[event_id].relevance, plain[event_id].relevance, rel_tol=1e-9)
    # BM25 over ``speaker (date): text`` would have rewarded the shortest turn for the name.
    assert named["hike"].relevance > named["short"].relevance


def test_turns_carry_their_day_for_the_contexts_headings() -> None:
    turns = user([("a", "1", "parcel delivered at the door", 0, unit(1.0))])
    found = candidates(ranking_params(), turns, "parcel")["a"]
    assert (found.heading, found.body) == ("[8 May 2023]", "Ana: parcel delivered at the door")
    assert found.text == f"{found.heading} {found.body}"
