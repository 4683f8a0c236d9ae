"""The consolidation worker's handler (``ConsolidationWorker.run_job``) over fakes: the
short-term state fake, the hash encoder, the extractive consolidator and qdrant-client's
in-process ``:memory:`` store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from memstream.memory.consolidation_jobs import Job
from memstream.memory.vectors import mean_direction
from memstream.metrics import Metrics
from memstream.schemas import StoredTurn
from memstream.stores.llm import ExtractiveConsolidator
from memstream.stores.longterm import ArchivedTurn, LongTermStore, memory_point_id
from memstream.workers.consolidate import ConsolidationWorker
from tests.fakes import FakeShortTermState
from tests.unit.over_fakes import ENCODER, put_hot

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
TENANT, USER = "acme", "u1"
KEY = "entity:order:A-10293"
TEXTS = [
    "Where is my order A-10293? It has not shipped yet",
    "Order A-10293 still shows no tracking number",
    "Can you check order A-10293 again please",
]


def stored(i: int, text: str) -> StoredTurn:
    return StoredTurn(
        event_id=f"e{i}",
        session_id="s1",
        role="user",
        text=text,
        ts=T0 + timedelta(hours=i),
        entities=["order:A-10293"],
    )


async def hot(state: FakeShortTermState, i: int, text: str) -> None:
    await put_hot(state, TENANT, USER, stored(i, text))


def job(
    trigger: str,
    turn_ids: tuple[str, ...] = ("e0", "e1", "e2"),
    key: str = KEY,
    score: float = 4.0,
    ts: datetime = T0 + timedelta(hours=2),  # the trigger fires on its newest turn
) -> Job:
    return Job(TENANT, USER, key, "entity", trigger, turn_ids, score, 0.5, ts)


@pytest.fixture
async def state() -> FakeShortTermState:
    fake = FakeShortTermState()
    for i, text in enumerate(TEXTS):
        await hot(fake, i, text)
    return fake


class Run:
    def __init__(self, state: FakeShortTermState, longterm: LongTermStore) -> None:
        self.registry = CollectorRegistry()
        self.worker = ConsolidationWorker(
            state=state,
            longterm=longterm,
            consolidator=ExtractiveConsolidator(),
            encoder=ENCODER,
            metrics=Metrics(self.registry),
            max_turns=20,
            max_concurrency=2,
        )

    def llm_calls(self) -> float:
        found = self.registry.get_sample_value(
            "memstream_llm_calls_total", {"backend": "extractive", "outcome": "ok"}
        )
        return found or 0.0

    def outcomes(self) -> dict[str, float]:
        names = ("created", "updated", "unchanged", "deferred", "skipped")
        found = {
            n: self.registry.get_sample_value("memstream_consolidations_total", {"outcome": n})
            for n in names
        }
        return {n: v for n, v in found.items() if v}


async def test_a_job_writes_one_memory_from_its_turns_in_event_time(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    run = Run(state, longterm)
    memory = await run.worker.run_job(job("t1"))
    assert memory is not None
    assert memory.memory_id == memory_point_id(TENANT, USER, KEY)
    assert (memory.tenant_id, memory.user_id, memory.key) == (TENANT, USER, KEY)
    assert memory.source_event_ids == ["e0", "e1", "e2"]
    assert memory.keys == ["order:A-10293"]
    assert memory.created_at == memory.updated_at == T0 + timedelta(hours=2)  # newest turn
    assert [x.event_id for x in memory.timeline] == ["e0", "e1", "e2"]
    assert await longterm.get(TENANT, USER, memory.memory_id) == memory
    assert await longterm.count(TENANT, USER) == 1
    assert await state.trigger_done(TENANT, USER, "t1")
    assert run.outcomes() == {"created": 1.0}


async def test_a_done_trigger_is_skipped_and_the_same_evidence_changes_nothing(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    run = Run(state, longterm)
    first = await run.worker.run_job(job("t1"))
    assert await run.worker.run_job(job("t1")) is None  # redelivered
    assert await run.worker.run_job(job("t2")) is None  # another trigger, same turns
    assert await state.trigger_done(TENANT, USER, "t2")
    assert first is not None
    assert await longterm.get(TENANT, USER, first.memory_id) == first
    assert run.outcomes() == {"created": 1.0, "skipped": 1.0, "unchanged": 1.0}
    assert run.llm_calls() == 1.0  # no new turn, no LLM call


async def test_a_trigger_with_no_new_turn_only_raises_the_strength(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    run = Run(state, longterm)
    first = await run.worker.run_job(job("t1", score=1.0))
    assert first is not None
    assert await run.worker.run_job(job("t2", ("e1", "e2"), score=9.0)) is None
    after = await longterm.get(TENANT, USER, first.memory_id)
    assert after is not None
    assert after.strength > first.strength
    assert after == first.model_copy(update={"strength": after.strength})  # nothing else
    assert await state.trigger_done(TENANT, USER, "t2")
    assert run.llm_calls() == 1.0


async def test_new_evidence_updates_the_same_memory(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    run = Run(state, longterm)
    first = await run.worker.run_job(job("t1"))
    await hot(state, 3, "Order A-10293 finally arrived today")
    second = await run.worker.run_job(
        job("t2", ("e0", "e1", "e2", "e3"), ts=T0 + timedelta(hours=3))
    )
    assert first is not None
    assert second is not None
    assert second.memory_id == first.memory_id
    assert second.source_event_ids == ["e0", "e1", "e2", "e3"]
    assert second.updated_at == T0 + timedelta(hours=3)
    assert second.created_at == first.created_at
    assert await longterm.count(TENANT, USER) == 1
    assert run.outcomes() == {"created": 1.0, "updated": 1.0}


async def test_a_trigger_soon_after_the_memorys_newest_turn_waits_for_the_next(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    run = Run(state, longterm)
    first = await run.worker.run_job(job("t1"))
    assert first is not None
    soon = T0 + timedelta(hours=2, seconds=30)  # a burst: inside min_interval_s (60 s)
    await put_hot(
        state,
        TENANT,
        USER,
        stored(3, "Order A-10293 finally arrived today").model_copy(update={"ts": soon}),
    )
    assert await run.worker.run_job(job("t2", ("e0", "e1", "e2", "e3"), ts=soon)) is None
    assert await longterm.get(TENANT, USER, first.memory_id) == first
    assert await state.trigger_done(TENANT, USER, "t2")
    later = T0 + timedelta(hours=5)
    await put_hot(
        state,
        TENANT,
        USER,
        stored(4, "Thanks, order A-10293 is all fine").model_copy(update={"ts": later}),
    )
    third = await run.worker.run_job(job("t3", ("e0", "e1", "e2", "e3", "e4"), ts=later))
    assert third is not None
    assert third.source_event_ids == ["e0", "e1", "e2", "e3", "e4"]  # the waiting turn too
    assert run.outcomes() == {"created": 1.0, "deferred": 1.0, "updated": 1.0}
    assert run.llm_calls() == 2.0


async def test_turns_gone_from_the_hot_tier_come_from_the_archive(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    old = stored(9, "Order A-10293 was placed on Monday")
    old = old.model_copy(update={"ts": T0 - timedelta(days=90)})
    vector = ENCODER.encode([old.text])[0]
    await longterm.upsert_turns([ArchivedTurn(TENANT, USER, old, vector)])
    memory = await Run(state, longterm).worker.run_job(job("t1", ("e9", "e0", "e1", "e2")))
    assert memory is not None
    assert memory.source_event_ids == ["e9", "e0", "e1", "e2"]  # oldest first
    # Its vector is its sources' shared direction, archived and hot alike (no re-encoding).
    hot_turns = await state.turns(TENANT, USER, ["e0", "e1", "e2"])
    sources = np.stack([vector, *(t.vector for t in hot_turns)])
    (hit,) = await longterm.search(TENANT, USER, mean_direction(sources), 1)
    assert hit.memory.memory_id == memory.memory_id
    assert hit.score == pytest.approx(1.0, abs=1e-5)


async def test_a_forgotten_users_job_writes_nothing(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    await state.mark_forgotten(TENANT, USER, (T0 + timedelta(days=1)).timestamp())
    await state.delete_user(TENANT, USER)
    run = Run(state, longterm)
    assert await run.worker.run_job(job("t1")) is None
    assert await longterm.count(TENANT, USER) == 0
    assert await state.trigger_done(TENANT, USER, "t1")  # not retried forever
    assert run.outcomes() == {"skipped": 1.0}


async def test_memories_sharing_an_entity_are_linked_both_ways(
    state: FakeShortTermState, longterm: LongTermStore
) -> None:
    run = Run(state, longterm)
    order = await run.worker.run_job(job("t1"))
    topic = await run.worker.run_job(job("t2", ("e1", "e2"), key="topic:c0"))
    assert order is not None
    assert topic is not None
    assert topic.links == [order.memory_id]
    again = await longterm.get(TENANT, USER, order.memory_id)
    assert again is not None
    assert again.links == [topic.memory_id]
