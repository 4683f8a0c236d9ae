"""A customer asks about the same order in three sessions days apart, through the real
processors (``memstream up``: broker, encode, memorize, consolidate, Qdrant Edge, RPC).

Exactly one memory must result: created in the first session, then updated in place (same
id, higher version) with the newest status, the older statuses kept in its history, and
turns of all three sessions among its sources.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from memstream.schemas import ConsolidatedMemory, Feedback, InteractionEvent
from memstream.settings import Settings
from memstream.streaming.broker import EventPublisher
from tests.integration.process import MemstreamProcess, wait_for

pytestmark = pytest.mark.integration

ORDER = "A-55123"
DAY1 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
SESSIONS: list[tuple[datetime, list[tuple[str, str]]]] = [
    (
        DAY1,
        [
            ("user", f"Hi, my order {ORDER} has not arrived yet; it was due on Monday."),
            ("assistant", f"I checked order {ORDER}: it is delayed at the regional warehouse."),
            ("user", f"Please keep me posted about order {ORDER}, I need it for a gift."),
        ],
    ),
    (
        DAY1 + timedelta(days=3),
        [
            ("user", f"Any news on my order {ORDER}? It still is not here."),
            ("assistant", f"Good news: order {ORDER} has shipped from the warehouse today."),
            ("user", f"Great, I will watch the door for order {ORDER}."),
        ],
    ),
    (
        DAY1 + timedelta(days=8),
        [
            ("user", f"The tracking page for order {ORDER} has not moved, can you check?"),
            ("assistant", f"Order {ORDER} was delivered this morning to your front porch."),
            ("user", f"Found the parcel, order {ORDER} is here and complete."),
        ],
    ),
]


def session_events(user: str, index: int) -> list[InteractionEvent]:
    start, turns = SESSIONS[index]
    return [
        InteractionEvent(
            event_id=f"{user}-s{index + 1}-t{i + 1}",
            tenant_id="demo",
            user_id=user,
            session_id=f"{user}-s{index + 1}",
            role=role,  # type: ignore[arg-type]
            text=text,
            ts=start + timedelta(minutes=2 * i),
        )
        for i, (role, text) in enumerate(turns)
    ]


def publish(
    settings: Settings, messages: Sequence[InteractionEvent | Feedback], topic: str = "events"
) -> None:
    async def send() -> None:
        publisher = EventPublisher(settings.kafka.broker)
        await publisher.start()
        try:
            await publisher.publish_many(
                settings.kafka.topic(topic),
                [(f"{m.tenant_id}:{m.user_id}", m.model_dump_json().encode()) for m in messages],
            )
        finally:
            await publisher.close()

    asyncio.run(send())


def memories(process: MemstreamProcess, user: str) -> list[ConsolidatedMemory]:
    with process.client() as http:
        response = http.get(f"/v1/users/{user}/memories", params={"limit": 100})
    assert response.status_code == 200, response.text
    return [ConsolidatedMemory.model_validate(m) for m in response.json()["memories"]]


def test_one_order_over_three_sessions_is_one_updated_memory(running: MemstreamProcess) -> None:
    user = f"u-{uuid.uuid4().hex[:6]}"
    expected_status = ["delayed", "shipped", "delivered"]
    versions: list[int] = []
    ids: set[str] = set()
    for index, status in enumerate(expected_status):
        publish(running.settings, session_events(user, index))

        def consolidated(index: int = index, status: str = status) -> ConsolidatedMemory | None:
            about = [m for m in memories(running, user) if f"order:{ORDER}" in m.keys]
            sources = {e.event_id for e in session_events(user, index)}
            for memory in about:
                if status in memory.status and sources <= set(memory.source_event_ids):
                    return memory
            return None

        memory = wait_for(consolidated, 120, f"session {index + 1} consolidated ({status})")
        versions.append(memory.version)
        ids.add(memory.memory_id)

    final = memories(running, user)
    assert len(final) == 1, [(m.key, m.title) for m in final]
    memory = final[0]
    assert ids == {memory.memory_id}  # updated in place every time, never a second memory
    assert memory.key == f"entity:order:{ORDER}"
    assert versions == sorted(versions)
    assert versions[0] < versions[-1]
    assert "delivered" in memory.status
    superseded = [h.value for h in memory.history if h.attribute == "status"]
    assert any("delayed" in v for v in superseded), memory.history
    assert any("shipped" in v for v in superseded), memory.history
    sessions = {event_id.rsplit("-t", 1)[0] for event_id in memory.source_event_ids}
    assert sessions == {f"{user}-s1", f"{user}-s2", f"{user}-s3"}

    # A retrieval that used it, reported on memstream.feedback (twice: at-least-once), boosts
    # its strength once, through the consolidate role's feedback consumer.
    feedback = Feedback(
        feedback_id=f"{user}-r1",
        tenant_id="demo",
        user_id=user,
        memory_ids=[memory.memory_id],
        ts=DAY1 + timedelta(days=9),
    )
    publish(running.settings, [feedback, feedback], topic="feedback")

    def boosted() -> ConsolidatedMemory | None:
        now = memories(running, user)[0]
        return now if now.feedback_ids else None

    after = wait_for(boosted, 60, "the feedback boost")
    assert after.strength == pytest.approx(memory.strength * 1.2, rel=1e-4)
    assert after.feedback_ids == [feedback.feedback_id]
