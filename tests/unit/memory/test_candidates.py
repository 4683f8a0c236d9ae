"""``memory.candidates.score_candidates``: the retrieval's scoring as a pure function of what
was gathered and ``now`` -- no store, no clock, no RPC types."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt

from memstream.memory.acts import acts_meant
from memstream.memory.candidates import KEY_MATCH_RELEVANCE, score_candidates
from memstream.memory.lexical import LexicalIndex, lexical_text, tokens_of
from memstream.memory.names import Names, names_of
from memstream.memory.profile import attributes_of
from memstream.memory.ranking import Candidate, RankingParams, turn_text
from memstream.memory.turns import promises, reports_something_done, said_as, says_something
from memstream.schemas import ConsolidatedMemory, Fact, OpenAction, StoredTurn

DIM = 4
T0 = datetime(2023, 5, 8, 13, 0, tzinfo=UTC)
# Session neighbours and replies off: one effect at a time.
PARAMS = RankingParams(neighbour_seeds=0, reply_seeds=0)


def unit(*values: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(values)] = values
    out: np.ndarray = v / np.linalg.norm(v)
    return out


@dataclass(frozen=True)
class Rows:
    """A ``TurnRows`` built by hand (in time order), as the RPC's turn index holds one."""

    docs: list[StoredTurn]
    vectors: npt.NDArray[np.float32]
    lexical: LexicalIndex = field(default_factory=LexicalIndex)

    def __post_init__(self) -> None:
        for t in self.docs:
            self.lexical.add(t.event_id, tokens_of(lexical_text(t.speaker or t.role, t.ts, t.text)))

    @property
    def ids(self) -> list[str]:
        return [t.event_id for t in self.docs]

    @property
    def ts(self) -> npt.NDArray[np.float64]:
        return np.array([t.ts.timestamp() for t in self.docs], dtype=np.float64)

    @property
    def positions(self) -> dict[str, int]:
        return {t.event_id: i for i, t in enumerate(self.docs)}

    @property
    def texts(self) -> list[str]:
        return [turn_text(t) for t in self.docs]

    @property
    def speaker_of(self) -> npt.NDArray[np.object_]:
        return np.array([t.speaker or t.role for t in self.docs], dtype=object)

    @property
    def speaker_names(self) -> tuple[str, ...]:
        return tuple(sorted({t.speaker or t.role for t in self.docs}))

    @property
    def salient(self) -> npt.NDArray[np.bool_]:
        return np.array([says_something(t) for t in self.docs], dtype=bool)

    @property
    def promise(self) -> npt.NDArray[np.bool_]:
        return np.array([promises(t) for t in self.docs], dtype=bool)

    @property
    def done(self) -> npt.NDArray[np.bool_]:
        return np.array([reports_something_done(t) for t in self.docs], dtype=bool)

    @property
    def line_keys(self) -> npt.NDArray[np.int64]:
        return np.array([said_as(t) for t in self.docs], dtype=np.int64)

    @property
    def names(self) -> Names:
        return names_of(self.docs)

    @property
    def attribute(self) -> npt.NDArray[np.int8]:
        return attributes_of(self.docs, self.vectors, None)

    @property
    def act(self) -> npt.NDArray[np.int8]:
        return acts_meant(self.vectors, None)  # no exemplars: acts from the words alone

    @property
    def by_entity(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for i, t in enumerate(self.docs):
            for key in t.entities:
                out.setdefault(key, []).append(i)
        return out


def rows(*specs: tuple[str, str, float, np.ndarray, list[str]], role: str = "user") -> Rows:
    """(event id, text, days after T0, vector, entities) per turn; ``role`` of the first."""
    docs = [
        StoredTurn(
            event_id=e,
            session_id="s1",
            role=role if i == 0 else "user",
            text=text,
            ts=T0 + timedelta(days=days),
            entities=entities,
        )
        for i, (e, text, days, _, entities) in enumerate(specs)
    ]
    return Rows(docs, np.stack([v for *_, v, _ in specs]).astype(np.float32))


def memory(key: str, sources: list[str], *, updated: datetime = T0) -> ConsolidatedMemory:
    return ConsolidatedMemory(
        memory_id=f"m-{key}",
        tenant_id="acme",
        user_id="u1",
        key=key,
        title=key,
        facts=[Fact(text=f"{key} fact", source_event_ids=sources[:1], ts=T0)],
        created_at=T0,
        updated_at=updated,
        source_event_ids=sources,
    )


TURNS = rows(
    ("e1", "my blender arrived cracked", 0, unit(1, 0), []),
    ("e2", "order A-10293 has not shipped", 10, unit(0, 1), ["order:a-10293"]),
    ("e3", "hiking in the mountains", 30, unit(0, 0, 1), []),
)


def by_id(found: list[Candidate]) -> dict[str, Candidate]:
    return {c.id: c for c in found}


def score(query: str, vector: np.ndarray, **kwargs: object) -> list[Candidate]:
    defaults: dict[str, object] = {
        "keys": [],
        "turns": TURNS,
        "scored": [],
        "keyed": [],
        "clusters": None,
        "top_k": 10,
        "now": None,
        "params": PARAMS,
    }
    defaults.update(kwargs)
    return score_candidates(query, vector, **defaults)  # type: ignore[arg-type]


def test_the_turn_closest_in_words_and_vector_is_most_relevant() -> None:
    found = by_id(score("blender cracked", unit(1, 0)))
    assert set(found) == {"e1", "e2", "e3"}
    assert found["e1"].relevance > found["e2"].relevance
    assert found["e1"].relevance > found["e3"].relevance
    assert found["e1"].kind == "turn"
    assert found["e1"].source_event_ids == ("e1",)
    assert found["e1"].heading == "[8 May 2023]"
    assert all(c.boost == 1.0 for c in found.values())  # the query does not ask for latest


def test_an_exact_key_match_is_relevance_one_for_turn_and_memory() -> None:
    m = memory("entity:order:a-10293", ["e2"])
    found = by_id(
        score("where is A-10293", unit(1, 0), keys=["order:a-10293"], keyed=[m], scored=[])
    )
    assert found["e2"].relevance == KEY_MATCH_RELEVANCE
    assert found[m.memory_id].relevance == KEY_MATCH_RELEVANCE
    assert found[m.memory_id].kind == "memory"


def test_a_memory_found_by_vector_and_by_key_is_one_candidate() -> None:
    m = memory("topic:blender", ["e3", "e1"])
    found = score("blender", unit(1, 0), scored=[(m, 0.9)], keyed=[m])
    memories = [c for c in found if c.kind == "memory"]
    assert [c.id for c in memories] == [m.memory_id]
    # Its sources best first for this query; its time is its newest source's (e3, day 30).
    assert memories[0].source_event_ids == ("e1", "e3")
    assert memories[0].ts == T0 + timedelta(days=30)
    assert memories[0].shows == ("e3",)


def test_recency_counts_from_now_given_else_from_the_newest_event() -> None:
    # "latest": recency boosts by age from ``now``; 30 days = one half-life -> 0.75.
    latest = "what is the latest on my order"
    own = by_id(score(latest, unit(0, 1)))
    assert own["e3"].boost == 1.0  # the user's newest event is "now"
    assert own["e2"].boost == 0.5 + 0.5 * 0.5 ** (20 / 30)
    assert own["e1"].boost == 0.75
    later = by_id(score(latest, unit(0, 1), now=T0 + timedelta(days=60)))
    assert later["e3"].boost == 0.75
    assert later["e1"].boost == 0.625
    assert [c.relevance for c in later.values()] == [c.relevance for c in own.values()]


def test_the_same_inputs_give_the_same_candidates() -> None:
    m = memory("topic:order", ["e2"])
    first = score("order shipped", unit(0, 1), scored=[(m, 0.7)])
    again = score("order shipped", unit(0, 1), scored=[(m, 0.7)])
    assert first == again


def test_short_term_candidates_keeps_the_newest_turns() -> None:
    found = score("anything", unit(1, 0), short_term_candidates=2)
    assert {c.id for c in found} == {"e2", "e3"}


def test_a_user_with_nothing_has_no_candidates() -> None:
    empty = Rows([], np.zeros((0, DIM), dtype=np.float32))
    assert score("hello", unit(1), turns=empty) == []


def test_small_talk_is_never_a_candidate() -> None:
    chatty = rows(
        ("e1", "my blender arrived cracked", 0, unit(1, 0), []),
        ("e2", "Thanks so much, bye!", 1, unit(1, 0.1), []),
    )
    assert set(by_id(score("thanks blender", unit(1, 0), turns=chatty))) == {"e1"}


def test_a_newer_statement_about_a_memorys_key_competes_as_a_turn_as_relevant_as_it() -> None:
    behind = memory("entity:order:a-10293", ["e2"], updated=T0 + timedelta(days=10))
    behind = behind.model_copy(update={"keys": ["order:a-10293"]})
    later = rows(
        *(
            ("e1", "my blender arrived cracked", 0, unit(1, 0), []),
            ("e2", "order A-10293 has not shipped", 10, unit(0, 1), ["order:a-10293"]),
            ("e4", "order A-10293 was delivered today", 40, unit(0, 0, 1), ["order:a-10293"]),
        )
    )
    # Found by its vector, not by a key the query names: e4 is unlike the query.
    found = by_id(score("where is my parcel", unit(0, 1), turns=later, scored=[(behind, 0.9)]))
    shown = found[behind.memory_id]
    assert found["e4"].relevance >= shown.relevance > 0
    assert shown.ts == T0 + timedelta(days=10)  # the memory keeps its own time: read after e4
    assert "e4" not in shown.shows
    assert "delivered today" not in shown.text
    # Found by key: the newer statement is a key match too.
    keyed = by_id(score("anything new?", unit(1, 0), turns=later, keyed=[behind]))
    assert keyed["e4"].relevance == KEY_MATCH_RELEVANCE
    upto = rows(
        ("e1", "my blender arrived cracked", 0, unit(1, 0), []),
        ("e2", "order A-10293 has not shipped", 10, unit(0, 1), ["order:a-10293"]),
        ("e3", "hiking in the mountains", 30, unit(0, 0, 1), []),
    )
    current = by_id(score("where is my parcel", unit(0, 1), turns=upto, scored=[(behind, 0.9)]))
    assert current["e3"].relevance < current[behind.memory_id].relevance  # nothing lifted


def test_a_promise_shows_open_until_a_later_turn_keeps_it() -> None:
    promise = ("e1", "I'll arrange a collection of the kettle by Friday.", 0, unit(1, 0), [])
    owed = rows(promise, role="assistant")
    body = by_id(score("kettle collection", unit(1, 0), turns=owed))["e1"].body
    assert body.startswith("- Open: I'll arrange a collection of the kettle by Friday.")
    assert "(assistant, due 2023-05-12)" in body  # Friday after Monday 8 May, event time
    kept = rows(
        promise,
        ("e2", "The courier picked the kettle up this morning.", 4, unit(0.8, 0.6), []),
        role="assistant",
    )
    body = by_id(score("kettle collection", unit(1, 0), turns=kept))["e1"].body
    assert body.startswith("- Closed (2023-05-12): I'll arrange a collection")


def test_a_memory_shows_an_open_action_a_later_turn_kept_as_closed() -> None:
    promise = ("e1", "I'll arrange a collection of the kettle by Friday.", 0, unit(1, 0), [])
    kept = ("e2", "The courier picked the kettle up this morning.", 4, unit(0.8, 0.6), [])
    action = OpenAction(text="I'll arrange a collection of the kettle by Friday.", event_id="e1")
    stored = memory("topic:kettle", ["e1"]).model_copy(update={"open_actions": [action]})
    before = by_id(
        score("kettle", unit(1, 0), turns=rows(promise, role="assistant"), keyed=[stored])
    )
    assert "- Open: I'll arrange a collection" in before[stored.memory_id].text
    after = rows(promise, kept, role="assistant")
    text = by_id(score("kettle", unit(1, 0), turns=after, keyed=[stored]))[stored.memory_id].text
    assert "- Closed (2023-05-12): I'll arrange a collection" in text
    assert "- Open:" not in text


def test_a_turn_naming_the_order_by_its_thing_is_a_key_match() -> None:
    named = rows(
        ("e1", "I ordered the oak bookcase (order #40593)", 0, unit(1, 0), ["order:40593"]),
        ("e2", "Order #40593 is lost after Leeds", 5, unit(0, 1), ["order:40593"]),
        ("e3", "The oak bookcase turned up at last", 9, unit(0, 0, 1), []),
        ("e4", "hiking in the mountains", 10, unit(0, 0, 0, 1), []),
    )
    by_key = by_id(score("status of order #40593", unit(1), keys=["order:40593"], turns=named))
    assert by_key["e3"].relevance == KEY_MATCH_RELEVANCE
    by_name = by_id(score("is the oak bookcase here?", unit(0, 0, 0, 1), turns=named))
    assert by_name["e2"].relevance == KEY_MATCH_RELEVANCE  # names only the order number
    assert by_name["e4"].relevance < KEY_MATCH_RELEVANCE


def test_a_newer_statement_by_a_name_never_tied_to_the_asked_number_ranks_right_after_it() -> None:
    # The number is never given a name, the wardrobe never a number: they may be one order,
    # and the wardrobe's newer statement may be its newest state.
    chat = rows(
        ("k1", "Order Z-4411 is at the depot.", 0, unit(0, 1), ["order:z-4411"]),
        ("t1", "The teak wardrobe left the depot on Friday.", 5, unit(1, 1), []),
        ("h1", "We went hiking at a lake.", 6, unit(0, 0, 1), []),
    )
    found = by_id(score("where is order Z-4411?", unit(0, 1), keys=["order:z-4411"], turns=chat))
    assert found["k1"].relevance == KEY_MATCH_RELEVANCE
    assert found["h1"].relevance < found["t1"].relevance < KEY_MATCH_RELEVANCE
    assert round(found["t1"].relevance, 6) < KEY_MATCH_RELEVANCE  # visibly, as a client reads it
    # Asked by something else, the wardrobe's statement keeps its own relevance.
    other = by_id(score("hiking trip", unit(0, 0, 1), turns=chat))
    assert other["t1"].relevance < other["h1"].relevance


def test_a_newer_thing_said_nothing_like_the_asked_order_is_not_brought_to_it() -> None:
    # Both things are newer than the number's last mention and neither is tied to it; only
    # the bench's arrival says something like what the order's own statement said.
    chat = rows(
        ("k1", "Order Q-7302 was handed to the courier.", 0, unit(0, 1), ["order:q-7302"]),
        ("b1", "The cedar bench arrived with a split leg.", 4, unit(1, 2), []),
        ("g1", "The gift card for my account shows no balance.", 5, unit(0, 0, 0, 1), []),
        ("h1", "We went hiking at a lake.", 6, unit(0, 0, 1), []),
    )
    found = by_id(score("any news on order Q-7302?", unit(0, 1), keys=["order:q-7302"], turns=chat))
    assert found["b1"].relevance > found["h1"].relevance  # the product's newer status: lifted
    assert found["g1"].relevance < found["b1"].relevance  # the gift card: left where it was
    assert found["g1"].relevance <= found["h1"].relevance


def conversation(*said: tuple[str, str, str, np.ndarray]) -> Rows:
    """(speaker, session, text, vector) per turn, a minute apart, with unrelated filler
    turns before them so that the fused relevance has a pool to stand out of."""
    filler = [
        ("Sam", "s0", f"the {thing} needed a new coat of paint", unit(0, 0, 0, 1))
        for thing in ("fence", "shed", "gate", "porch", "garage", "bench", "door", "barn")
    ]
    docs = [
        StoredTurn(
            event_id=f"e{i}",
            session_id=session,
            role="user",
            speaker=speaker,
            text=text,
            ts=T0 + timedelta(minutes=i),
        )
        for i, (speaker, session, text, _) in enumerate([*filler, *said])
    ]
    vectors = np.stack([v for *_, v in [*filler, *said]]).astype(np.float32)
    return Rows(docs, vectors)


QUERY = "why did Caroline choose the adoption agency"
ASKED = ("Mel", "s1", "What made you choose that adoption agency?", unit(1, 0))
REPLY = ("Caroline", "s1", "They help LGBTQ+ folks, and their inclusivity spoke to me.")


def test_the_answer_to_a_question_like_the_query_ranks_just_above_the_question() -> None:
    turns = conversation(ASKED, (*REPLY, unit(0, 0, 1)))
    replies = RankingParams(neighbour_seeds=0)  # replies on, as by default
    found = by_id(score(QUERY, unit(1, 0), turns=turns, params=replies))
    asked, reply = found["e8"], found["e9"]
    assert asked.relevance >= replies.reply_seed_min  # the question stands out
    assert reply.relevance > asked.relevance
    assert asked.relevance == replies.question_share * reply.relevance
    off = by_id(score(QUERY, unit(1, 0), turns=turns))
    assert off["e9"].relevance < replies.reply_seed_min < off["e8"].relevance


def test_only_another_speakers_next_turn_in_the_session_is_the_answer() -> None:
    replies = RankingParams(neighbour_seeds=0)
    own = conversation(ASKED, ("Mel", "s1", REPLY[2], unit(0, 0, 1)))  # Mel goes on
    later = conversation(ASKED, ("Caroline", "s2", REPLY[2], unit(0, 0, 1)))  # next session
    statement = ("Mel", "s1", "I chose that adoption agency myself.", unit(1, 0))
    told = conversation(statement, (*REPLY, unit(0, 0, 1)))  # no question asked
    for turns in (own, later, told):
        on = by_id(score(QUERY, unit(1, 0), turns=turns, params=replies))
        off = by_id(score(QUERY, unit(1, 0), turns=turns))
        assert on["e9"].relevance == off["e9"].relevance
        assert on["e8"].relevance == off["e8"].relevance


def test_a_query_naming_a_month_reads_what_happened_in_it_first() -> None:
    painted = rows(
        ("e1", "we painted a lake at sunrise together", 0, unit(1, 0), []),  # 8 May
        ("e2", "we painted a sunset with a palm tree", 60, unit(1, 0), []),  # 7 Jul
        ("e3", "hiking in the mountains", 90, unit(0, 1), []),
    )
    anytime = by_id(score("what did we paint", unit(1, 0), turns=painted))
    assert anytime["e1"].score == anytime["e2"].score  # alike in words and in meaning
    july = by_id(score("what did we paint in July 2023", unit(1, 0), turns=painted))
    assert july["e2"].score > july["e1"].score
    assert july["e1"].boost == PARAMS.outside_period_share
    assert july["e2"].boost == 1.0
