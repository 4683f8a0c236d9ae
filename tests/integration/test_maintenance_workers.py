"""Strength (feedback boosts, decay), links and reminders on real Valkey and Qdrant Edge.

Each worker is driven twice with the same input, the way an at-least-once broker and a
periodic timer do: the second time must change nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from memstream.memory.links import LinkParams
from memstream.memory.strength import StrengthParams
from memstream.schemas import ConsolidatedMemory, Feedback, OpenAction, Reminder, StoredTurn
from memstream.stores.embedded import EmbeddedRedis
from memstream.stores.longterm import memory_point_id
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from memstream.stores.redis_state import RedisState
from memstream.stores.short_term import UserUpdate
from memstream.streaming.locks import UserLocks
from memstream.workers.consolidate import ConsolidationWorker
from memstream.workers.reminders import ReminderWorker
from memstream.workers.strength import StrengthWorker, feedback_id

pytestmark = pytest.mark.integration

DIM = 8
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def memory_factory(
    key: str, *, keys: list[str] | None = None, **update: object
) -> ConsolidatedMemory:
    memory = ConsolidatedMemory(
        title=key,
        memory_id=memory_point_id("acme", "u1", key),
        tenant_id="acme",
        user_id="u1",
        key=key,
        keys=keys or [],
        created_at=T0,
        updated_at=T0,
    )
    return memory.model_copy(update=update)


def unit(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i] = 1.0
    return v


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[QdrantEdgeStore]:
    opened = QdrantEdgeStore(tmp_path / "edge")
    await opened.ensure_collection(DIM)
    yield opened
    await opened.close()


@pytest.fixture
async def state(redis_server: EmbeddedRedis) -> AsyncIterator[RedisState]:
    opened = RedisState.from_url(redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    yield opened
    await opened.close()


async def say(state: RedisState, at: datetime, user_id: str = "u1") -> None:
    """One turn of the user stamped ``at``: it moves the user's event-time clock."""
    turn = StoredTurn(event_id=uuid.uuid4().hex, session_id="s1", role="user", text="hello", ts=at)
    await state.apply(
        "acme", user_id, UserUpdate(event_id=turn.event_id, turn=turn, vector=unit(0))
    )


async def test_feedback_boosts_once_per_message(store: QdrantEdgeStore, state: RedisState) -> None:
    used, other = memory_factory("topic:a"), memory_factory("topic:b")
    await store.upsert([(used, unit(0)), (other, unit(1))])
    worker = StrengthWorker(store, state, UserLocks(), StrengthParams())
    feedback = Feedback(tenant_id="acme", user_id="u1", memory_ids=[used.memory_id], ts=T0)
    assert await worker.apply_feedback(feedback) == 1
    assert await worker.apply_feedback(feedback) == 0  # redelivered: no second boost
    again = feedback.model_copy(update={"ts": T0 + DAY})  # another retrieval
    assert feedback_id(again) != feedback_id(feedback)
    assert await worker.apply_feedback(again) == 1
    stored = await store.get("acme", "u1", used.memory_id)
    assert stored is not None
    assert stored.strength == pytest.approx(1.44)
    untouched = await store.get("acme", "u1", other.memory_id)
    assert untouched == other
    # Another user's feedback naming this memory's id changes nothing.
    stranger = Feedback(tenant_id="acme", user_id="u2", memory_ids=[used.memory_id], ts=T0)
    assert await worker.apply_feedback(stranger) == 0


async def test_decay_counts_in_the_users_event_time(
    store: QdrantEdgeStore, state: RedisState
) -> None:
    memory = memory_factory("topic:a", strength=2.0)
    quiet = memory_factory("topic:a", strength=2.0).model_copy(
        update={"user_id": "u2", "memory_id": memory_point_id("acme", "u2", "topic:a")}
    )
    await store.upsert([(memory, unit(0)), (quiet, unit(0))])
    worker = StrengthWorker(store, state, UserLocks(), StrengthParams())
    # The wall clock is years past T0, yet a user's memories age only as the user speaks.
    assert await worker.decay_all() == 0
    await say(state, T0 + 10 * DAY + timedelta(hours=3))
    await say(state, T0 + 2 * DAY, user_id="u2")
    assert await worker.decay_all() == 2
    await say(state, T0 + 10 * DAY + timedelta(hours=4))
    assert await worker.decay_all() == 0  # no whole interval since the last run
    quiet_after = await store.get("acme", "u2", quiet.memory_id)
    assert quiet_after is not None
    assert quiet_after.strength == pytest.approx(2.0 * 0.99**2)
    stored = await store.get("acme", "u1", memory.memory_id)
    assert stored is not None
    assert stored.strength == pytest.approx(2.0 * 0.99**10)
    assert stored.decayed_to == T0 + 10 * DAY
    hits = await store.search("acme", "u1", unit(0), 1)
    assert hits[0].score == pytest.approx(1.0, abs=1e-3)  # the vector stayed


async def test_reminders_are_emitted_once_when_due(
    store: QdrantEdgeStore, state: RedisState
) -> None:
    due = OpenAction(text="Email the return label", due=T0 + DAY)
    later = OpenAction(text="Call back about the refund", due=T0 + 5 * DAY)
    memory = memory_factory("entity:order:A-1", open_actions=[due, later])
    await store.upsert([(memory, unit(0))])
    worker = ReminderWorker(store, state, max_late=timedelta(days=7))
    sent: list[Reminder] = []

    async def send(reminder: Reminder) -> None:
        sent.append(reminder)

    assert await worker.emit_due(T0, send) == 0  # nothing due yet
    assert await worker.emit_due(T0 + DAY + timedelta(minutes=1), send) == 1
    assert await worker.emit_due(T0 + 2 * DAY, send) == 0  # already sent
    assert [r.action.text for r in sent] == [due.text]

    async def broken(reminder: Reminder) -> None:
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        await worker.emit_due(T0 + 5 * DAY, broken)
    # The failed send released its claim: the next run sends it.
    assert await worker.emit_due(T0 + 5 * DAY, send) == 1
    assert [r.action.text for r in sent] == [due.text, later.text]


async def test_links_are_stored_both_ways(store: QdrantEdgeStore) -> None:
    order = memory_factory("entity:order:A-1", keys=["order:A-1"])
    close = memory_factory("topic:c1")
    far = memory_factory("topic:c2")
    await store.upsert([(order, unit(0)), (close, unit(1)), (far, unit(2))])
    worker = ConsolidationWorker.__new__(ConsolidationWorker)  # only the link steps are used
    worker.longterm = store
    worker.links = LinkParams(similarity=0.8)
    fresh = memory_factory("topic:new", keys=["order:A-1"])
    vector = unit(1) * 0.9 + unit(3) * np.float32(np.sqrt(1 - 0.81))
    linked = await worker._link(fresh, vector)
    assert set(linked.links) == {order.memory_id, close.memory_id}
    await store.upsert([(linked, vector)])
    await worker._link_back(linked)
    for memory in (order, close):
        stored = await store.get("acme", "u1", memory.memory_id)
        assert stored is not None
        assert stored.links == [fresh.memory_id]
    assert await store.get("acme", "u1", far.memory_id) == far
