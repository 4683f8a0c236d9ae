"""``Retriever.retrieve`` end to end over fakes: the short-term state fake, the hash encoder
and qdrant-client's in-process ``:memory:`` store. No server, no model."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from memstream.memory.ranking import RankingParams
from memstream.memory.render import memory_text
from memstream.memory.retrieval import rank_gathered
from memstream.memory.text import extract_entities
from memstream.metrics import Metrics
from memstream.rpc.retrieval import QueryEncoder, Retriever
from memstream.schemas import (
    ConsolidatedMemory,
    Fact,
    RetrievedItem,
    RetrieveRequest,
    RetrieveResponse,
    StoredTurn,
)
from memstream.stores.longterm import LongTermStore, memory_point_id
from memstream.stores.text_encoder import FloatArray
from tests.fakes import FakeShortTermState, HashEncoder
from tests.unit.over_fakes import ENCODER, put_hot

T0 = datetime(2023, 5, 8, 13, 0, tzinfo=UTC)
TENANT, USER = "acme", "u1"

TURNS = [
    ("e1", "My blender arrived with a cracked jug", 0),
    ("e2", "Where is my order A-10293? It has not shipped", 1),
    ("e3", "I like hiking in the mountains on weekends", 2),
    ("e4", "The order A-10293 tracking page shows nothing", 3),
]


async def memorize(
    state: FakeShortTermState, user: str, event_id: str, text: str, day: int
) -> None:
    turn = StoredTurn(
        event_id=event_id,
        session_id="s1",
        role="user",
        text=text,
        ts=T0 + timedelta(days=day),
        entities=extract_entities(text),
    )
    await put_hot(state, TENANT, user, turn)


def order_memory() -> ConsolidatedMemory:
    key = "order:A-10293"
    return ConsolidatedMemory(
        memory_id=memory_point_id(TENANT, USER, key),
        tenant_id=TENANT,
        user_id=USER,
        key=key,
        title="Order A-10293",
        facts=[Fact(text="Order A-10293 has not shipped", source_event_ids=["e2"], ts=T0)],
        keys=[key],
        created_at=T0,
        updated_at=T0 + timedelta(days=3),
        source_event_ids=["e2", "e4"],
    )


@pytest.fixture
async def state() -> FakeShortTermState:
    fake = FakeShortTermState()
    for event_id, text, day in TURNS:
        await memorize(fake, USER, event_id, text, day)
    await memorize(fake, "u2", "x1", "My blender arrived with a cracked jug", 0)
    return fake


def best(response: RetrieveResponse) -> RetrievedItem:
    return max(response.items, key=lambda i: i.score)


def retriever(state: FakeShortTermState, longterm: LongTermStore) -> Retriever:
    return Retriever(
        queries=QueryEncoder(ENCODER),
        state=state,
        longterm=longterm,
        metrics=Metrics(CollectorRegistry()),
        short_term_candidates=0,
        params=RankingParams(neighbour_seeds=0),
    )


async def test_the_turn_that_shares_the_words_comes_first(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    r = retriever(state, longterm)
    got = await r.retrieve(TENANT, RetrieveRequest(user_id=USER, query="cracked blender jug"))
    assert best(got).id == "e1"
    # The context lists turns by day, newest first, not by score.
    assert [i.id for i in got.items] == ["e4", "e3", "e2", "e1"]
    assert {i.id for i in got.items} == {"e1", "e2", "e3", "e4"}  # the user's, nobody else's
    assert all(i.kind == "turn" for i in got.items)
    assert "My blender arrived with a cracked jug" in got.context
    assert got.context_tokens == ENCODER.count_tokens(got.context)


async def test_a_memory_found_by_key_leads_and_covers_its_turns(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    m = order_memory()
    # it shows its newest source too: nothing said since is missing from it
    newest = Fact(text="Its tracking page shows nothing", source_event_ids=["e4"], ts=T0)
    m = m.model_copy(update={"facts": [*m.facts, newest]})
    await longterm.upsert([(m, ENCODER.encode([memory_text(m)])[0])])
    r = retriever(state, longterm)
    got = await r.retrieve(
        TENANT, RetrieveRequest(user_id=USER, query="Has order A-10293 shipped?")
    )
    # Memories come first in the context, then the turns by day, newest first.
    assert [(i.kind, i.id) for i in got.items] == [
        ("memory", m.memory_id),
        ("turn", "e4"),
        ("turn", "e3"),
        ("turn", "e2"),
        ("turn", "e1"),
    ]
    scores = {i.id: i.score for i in got.items}
    # An exact key match is relevance 1 whatever the vectors say (strength 1: no change).
    assert scores[m.memory_id] == scores["e2"] == scores["e4"] == 1.0
    assert max(scores["e1"], scores["e3"]) < 1.0
    assert got.items[0].source_event_ids == ["e2", "e4"]
    assert got.context.startswith("## Memories\nOrder A-10293")


async def test_a_memory_that_does_not_show_its_newest_source_follows_it(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    m = order_memory()  # shows e2's fact only; e4 (newer, the same order) it was fed
    await longterm.upsert([(m, ENCODER.encode([memory_text(m)])[0])])
    got = await retriever(state, longterm).retrieve(
        TENANT, RetrieveRequest(user_id=USER, query="Has order A-10293 shipped?")
    )
    order = [i.id for i in got.items]
    assert order.index("e4") < order.index(m.memory_id)
    assert got.context.startswith("## Recent turns")


async def test_other_users_and_tenants_see_nothing_of_the_user(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    m = order_memory()
    await longterm.upsert([(m, ENCODER.encode([memory_text(m)])[0])])
    r = retriever(state, longterm)
    other = await r.retrieve(TENANT, RetrieveRequest(user_id="u2", query="order A-10293"))
    assert [i.id for i in other.items] == ["x1"]
    stranger = await r.retrieve("globex", RetrieveRequest(user_id=USER, query="order A-10293"))
    assert stranger.items == []
    assert stranger.context == ""


async def test_a_new_turn_is_retrievable_on_the_next_query(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    r = retriever(state, longterm)
    query = RetrieveRequest(user_id=USER, query="refund for the toaster")
    before = await r.retrieve(TENANT, query)
    assert "e5" not in {i.id for i in before.items}
    syncs = r.turn_index.syncs
    await r.retrieve(TENANT, query)
    assert r.turn_index.syncs == syncs  # nothing written: the cached index is used
    await memorize(state, USER, "e5", "I want a refund for the toaster", 4)
    after = await r.retrieve(TENANT, query)
    assert r.turn_index.syncs == syncs + 1  # a new turn version: one re-sync
    assert best(after).id == "e5"


async def test_recency_is_measured_from_the_users_newest_event(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    r = retriever(state, longterm)
    query = "what is the latest on order A-10293"
    own = await r.retrieve(TENANT, RetrieveRequest(user_id=USER, query=query))
    # The same ranking whenever the question is asked: ``now`` defaults to event time.
    pinned = await r.retrieve(
        TENANT, RetrieveRequest(user_id=USER, query=query, now=T0 + timedelta(days=3))
    )
    assert [(i.id, i.score) for i in own.items] == [(i.id, i.score) for i in pinned.items]


class _WaitingEncoder(HashEncoder):
    """Encodes only once the turn index has asked for the user's version (or 5 s passed)."""

    def __init__(self, asked: threading.Event) -> None:
        super().__init__(dim=ENCODER.dim)
        self.asked = asked
        self.overlapped: list[bool] = []
        self.fail = False

    def encode(
        self, texts: Sequence[str], *, query: bool = False, cache: bool = False
    ) -> FloatArray:
        self.overlapped.append(self.asked.wait(5))
        if self.fail:
            raise RuntimeError("encoder down")
        return super().encode(texts, query=query, cache=cache)


async def test_the_reads_that_need_no_vector_run_while_the_query_encodes(
    state: FakeShortTermState, longterm: LongTermStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = threading.Event()
    real = state.turns_state

    async def turns_state(tenant_id: str, user_id: str) -> tuple[bytes | None, int]:
        asked.set()
        return await real(tenant_id, user_id)

    monkeypatch.setattr(state, "turns_state", turns_state)
    encoder = _WaitingEncoder(asked)
    r = retriever(state, longterm)
    r.queries = QueryEncoder(encoder)
    got = await r.retrieve(TENANT, RetrieveRequest(user_id=USER, query="cracked blender jug"))
    assert encoder.overlapped == [True]  # the Redis read went while the encoder ran
    assert best(got).id == "e1"
    asked.clear()
    encoder.fail = True
    with pytest.raises(RuntimeError, match="encoder down"):
        await r.retrieve(TENANT, RetrieveRequest(user_id=USER, query="another question"))
    await asyncio.sleep(0)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert all(t.done() for t in pending)  # nothing of the failed retrieval left running


async def test_a_slow_retrieval_logs_when_each_step_finished(
    state: FakeShortTermState, longterm: LongTermStore, caplog: pytest.LogCaptureFixture
) -> None:
    query = RetrieveRequest(user_id=USER, query="cracked blender jug")
    quiet = retriever(state, longterm)  # the default threshold: far above this retrieval
    with caplog.at_level("WARNING", logger="memstream.rpc"):
        await quiet.retrieve(TENANT, query)
    assert not caplog.records
    slow = retriever(state, longterm)
    slow.slow_ms = 1e-6  # every retrieval is over it
    with caplog.at_level("WARNING", logger="memstream.rpc"):
        for _ in range(3):  # within a second: one line, not three
            await slow.retrieve(TENANT, query)
        slow._slow_logged_at -= 1.0  # as if a second went by
        await slow.retrieve(TENANT, query)
    first, second = (record.getMessage() for record in caplog.records)
    assert first.startswith("slow retrieval: ")
    steps = ["lookups", "vector", "search", "turns", "ranked"]
    assert [s for s in steps if f"{s} " in first] == steps
    assert "4 turns, 0 memories (1 slow retrievals since the last line)" in first
    assert "(3 slow retrievals since the last line)" in second


class _Overlapping(HashEncoder):
    """A HashEncoder whose calls take a while and count how many ran at once."""

    def __init__(self, runners: int) -> None:
        super().__init__()
        self.runners = runners
        self.inside = self.most_inside = self.calls = 0
        self._count = threading.Lock()

    def encode(
        self, texts: Sequence[str], *, query: bool = False, cache: bool = False
    ) -> FloatArray:
        with self._count:
            self.inside += 1
            self.calls += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            threading.Event().wait(0.02)
            return super().encode(texts, query=query, cache=cache)
        finally:
            with self._count:
                self.inside -= 1


@pytest.mark.parametrize("runners", [1, 2])
async def test_query_encoder_keeps_one_batch_in_flight_per_runner(runners: int) -> None:
    encoder = _Overlapping(runners)
    queries = QueryEncoder(encoder, max_batch=2)
    texts = [f"question {i}" for i in range(8)]
    vectors = await asyncio.gather(*(queries.encode("acme", t) for t in texts))
    assert encoder.most_inside == runners
    for text, vector in zip(texts, vectors, strict=True):
        assert vector.tobytes() == HashEncoder().encode([text])[0].tobytes()


async def test_query_cache_is_per_tenant_so_one_cannot_learn_anothers_questions() -> None:
    encoder = _Overlapping(1)
    queries = QueryEncoder(encoder)
    await queries.encode("acme", "where is my refund")
    assert queries.cached("acme", "where is my refund") is not None
    # Another tenant asking the same words misses (and pays the encode), as for a new text.
    assert queries.cached("globex", "where is my refund") is None
    before = encoder.calls
    await queries.encode("globex", "where is my refund")
    assert encoder.calls > before


async def test_what_was_gathered_ranks_the_same_after_a_later_write(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    """Gather, then rank: a sync between the two (a new turn sharing the query's words)
    changes nothing of what was gathered, so the ranking may run whenever it likes."""
    r = retriever(state, longterm)
    request = RetrieveRequest(user_id=USER, query="cracked blender jug")
    answered = await r.retrieve(TENANT, request)
    gathered, _ = await r._gather(TENANT, request, {})
    await memorize(state, USER, "e5", "The new blender jug cracked as well", 4)
    assert "e5" in (await r.turn_index.get(TENANT, USER)).positions  # synced meanwhile
    ranked = rank_gathered(
        gathered, r.params, count_tokens=r.count_tokens, additive_lines=r.count_tokens.by_line
    )
    assert [(c.id, round(s, 6)) for c, s in ranked.items] == [
        (i.id, i.score) for i in answered.items
    ]
    assert ranked.context == answered.context


async def test_a_turn_shown_cut_says_it_is_an_excerpt(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    filler = " ".join(f"The weather on day {n} was mild and grey." for n in range(12))
    long_turn = f"{filler} The blender jug arrived cracked along the handle. {filler}"
    await memorize(state, USER, "e5", long_turn, 4)
    r = retriever(state, longterm)
    ask = RetrieveRequest(user_id=USER, query="cracked blender jug handle", budget_tokens=48)
    got = await r.retrieve(TENANT, ask)
    shown = {i.id: i for i in got.items}
    assert shown["e5"].excerpt
    assert "arrived cracked along the handle" in shown["e5"].text
    assert "day 11" not in shown["e5"].text
    assert "arrived cracked along the handle" in got.context
    assert "day 11" not in got.context
    roomy = await r.retrieve(TENANT, ask.model_copy(update={"budget_tokens": 2048}))
    whole = {i.id: i for i in roomy.items}["e5"]
    assert not whole.excerpt
    assert "day 11" in whole.text
