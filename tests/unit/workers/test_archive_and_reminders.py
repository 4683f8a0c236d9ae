"""The archive and reminder workers' handlers, and ``forget_user``, over fakes: the
short-term state fake and qdrant-client's in-process ``:memory:`` store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memstream.memory.turns import stored_turn
from memstream.schemas import (
    ConsolidatedMemory,
    EncodedEvent,
    InteractionEvent,
    OpenAction,
    Reminder,
    StoredTurn,
)
from memstream.stores.forget import forget_user
from memstream.stores.longterm import LongTermStore, memory_point_id
from memstream.stores.short_term import UserUpdate
from memstream.workers.archive import ArchiveWorker
from memstream.workers.reminders import ReminderWorker
from tests.fakes import FakeShortTermState
from tests.unit.over_fakes import ENCODER

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
TENANT, USER = "acme", "u1"


def encoded(i: int, user: str = USER, hours: float | None = None) -> EncodedEvent:
    text = f"Message number {i} about order A-{1000 + i}"
    event = InteractionEvent(
        event_id=f"e{i}",
        tenant_id=TENANT,
        user_id=user,
        session_id="s1",
        role="user",
        text=text,
        ts=T0 + timedelta(hours=i if hours is None else hours),
    )
    # Not unit length on purpose: the archive stores the normalised vector.
    vector = 3.0 * ENCODER.encode([text])[0]
    return EncodedEvent(event=event, embedding=vector.tolist(), model_id=ENCODER.model_id)


async def test_the_archive_keeps_every_turn_but_a_forgotten_users_older_ones(
    longterm: LongTermStore,
) -> None:
    state = FakeShortTermState()
    await state.mark_forgotten(TENANT, "u2", (T0 + timedelta(hours=1)).timestamp())
    worker = ArchiveWorker(state=state, longterm=longterm)
    batch = [encoded(0), encoded(1), encoded(0, "u2"), encoded(1, "u2"), encoded(2, "u2")]
    assert await worker.archive(batch) == 3
    mine = await longterm.get_turns(TENANT, USER, ["e0", "e1"])
    assert [a.turn.event_id for a in mine] == ["e0", "e1"]
    expected = ENCODER.encode([batch[0].event.text])[0].astype(np.float16).astype(np.float32)
    assert np.allclose(mine[0].vector, expected, atol=1e-3)
    assert mine[0].turn.cluster_id is None  # the archive stores no cluster
    theirs = await longterm.get_turns(TENANT, "u2", ["e0", "e1", "e2"])
    assert [a.turn.event_id for a in theirs] == ["e2"]  # stamped after the forget
    assert await worker.archive(batch[:2]) == 2  # again: the same points, replaced
    assert await longterm.count_turns(TENANT, USER) == 2


async def test_the_archive_drops_a_turn_posted_before_the_forget_whatever_its_stamp(
    longterm: LongTermStore,
) -> None:
    forget_at = T0 + timedelta(hours=1)
    state = FakeShortTermState()
    await state.mark_forgotten(TENANT, USER, forget_at.timestamp())
    worker = ArchiveWorker(state=state, longterm=longterm)
    ahead = encoded(7)  # stamped 7 h: after the forget
    before, after = ((forget_at + timedelta(seconds=s)).timestamp() for s in (-2, 2))
    assert await worker.archive([ahead], [before]) == 0
    assert await longterm.count_turns(TENANT, USER) == 0
    assert await worker.archive([ahead], [after]) == 1  # posted after: a new conversation


async def test_the_archive_releases_the_turns_that_left_the_hot_tier_once_it_has_them(
    longterm: LongTermStore,
) -> None:
    """Memorize can evict a turn before or after the archive writes it: either way Redis lets
    it go only once the archive holds it, and never a turn the archive lacks."""
    state = FakeShortTermState(max_turns=2)
    batch = [encoded(i) for i in range(4)]
    worker = ArchiveWorker(state=state, longterm=longterm)
    assert await worker.archive(batch[:1]) == 1  # e0 archived while still hot
    for e in batch:  # memorize evicts e0 and e1; e1 is not archived yet
        vector = np.asarray(e.embedding, dtype=np.float32)
        await state.apply(TENANT, USER, UserUpdate(e.event.event_id, stored_turn(e.event), vector))
    assert await state.leaving([(TENANT, USER)]) == [["e0", "e1"]]
    assert await worker.archive(batch[2:3]) == 1  # e2: releases e0, which it archived before
    assert await state.leaving([(TENANT, USER)]) == [["e1"]]
    assert len(await state.turns(TENANT, USER, ["e0", "e1"])) == 1  # e1 still readable
    assert await worker.archive(batch[1:2]) == 1
    assert await state.leaving([(TENANT, USER)]) == [[]]
    assert [a.turn.event_id for a in await longterm.get_turns(TENANT, USER, ["e0", "e1"])] == [
        "e0",
        "e1",
    ]


def memory_with(actions: list[OpenAction]) -> ConsolidatedMemory:
    key = "entity:order:A-1"
    return ConsolidatedMemory(
        memory_id=memory_point_id(TENANT, USER, key),
        tenant_id=TENANT,
        user_id=USER,
        key=key,
        title="Order A-1",
        open_actions=actions,
        created_at=T0,
        updated_at=T0,
    )


async def test_each_due_reminder_is_sent_once_and_a_failed_send_is_retried(
    longterm: LongTermStore,
) -> None:
    due, later = T0 + timedelta(hours=1), T0 + timedelta(days=3)
    m = memory_with(
        [
            OpenAction(text="Call back about the refund", due=due),
            OpenAction(text="Check the delivery", due=later),
            OpenAction(text="No date"),
        ]
    )
    await longterm.upsert([(m, ENCODER.encode([m.title])[0])])
    worker = ReminderWorker(longterm=longterm, state=FakeShortTermState(), max_late=timedelta(1))
    sent: list[Reminder] = []

    async def send(reminder: Reminder) -> None:
        sent.append(reminder)

    async def broken(reminder: Reminder) -> None:
        raise ConnectionError("broker down")

    now = T0 + timedelta(hours=2)
    with pytest.raises(ConnectionError):
        await worker.emit_due(now, broken)
    assert await worker.emit_due(now, send) == 1  # the failed claim was released
    assert await worker.emit_due(now, send) == 0  # and is not sent twice
    assert [(r.action.text, r.due, r.ts) for r in sent] == [
        ("Call back about the refund", due, now)
    ]
    assert await worker.emit_due(later, send) == 1
    assert [r.action.text for r in sent] == ["Call back about the refund", "Check the delivery"]


async def test_forget_user_deletes_everywhere_and_leaves_a_tombstone(
    longterm: LongTermStore,
) -> None:
    state = FakeShortTermState()
    event = encoded(0).event
    turn = StoredTurn(event_id="e0", session_id="s1", role="user", text=event.text, ts=event.ts)
    await state.apply(TENANT, USER, UserUpdate("e0", turn, ENCODER.encode([event.text])[0]))
    await ArchiveWorker(state=state, longterm=longterm).archive([encoded(0), encoded(1)])
    m = memory_with([])
    await longterm.upsert([(m, ENCODER.encode([m.title])[0])])
    at = (T0 + timedelta(days=1)).timestamp()

    gone = await forget_user(state, longterm, TENANT, USER, at)
    assert gone.redis_keys_deleted > 0
    assert (gone.memories_deleted, gone.turns_deleted) == (1, 2)
    assert await state.forgotten_at(TENANT, USER) == at
    assert await state.turns_state(TENANT, USER) == (None, 0)
    assert await longterm.count(TENANT, USER) == 0
    assert await longterm.count_turns(TENANT, USER) == 0
    again = await forget_user(state, longterm, TENANT, USER, at)
    assert (again.redis_keys_deleted, again.memories_deleted, again.turns_deleted) == (0, 0, 0)
